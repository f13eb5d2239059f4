"""pytest-gpuhost: the tuning of a GPU server, expressed as pytest assertions."""

__version__ = "0.1.0"
