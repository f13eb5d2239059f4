"""The package's version, as the reports, the journal and a capture record it: a module of its
own, so that what records it never imports the package's ``__init__`` (which registers the
plugin, and so imports every layer)."""

__version__ = "0.1.0"
