"""GPU access: NVML behind a small interface, the cuda bandwidth probe, nvbandwidth runs and the
parsers of the reference tools' saved outputs, and the measure-once cache."""
