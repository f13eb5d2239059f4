"""Fix safety: planned changes with their originals, the only code that carries them out (the
fixer), the journal written before each change, the root's locks, rollback and persistence."""


class LockUnavailable(Exception):
    """The root's lock cannot be had: a --fix run stops; the message says why.

    Here rather than in ``locking``, which raises it: a verify run catches it around every
    check (``plugin/items.py``) but takes no lock, so it does not load the locks' module."""
