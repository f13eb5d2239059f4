"""A benchmark's envelope: what happened to the host while a benchmark ran, judged by the
spec's limits into a verdict with reasons, kept beside the benchmark's result.

The facts of one sample (``facts.py``), the verdict from samples (``verdict.py``, pure), the
background sampler (``sampling.py``), the host's half without NVML (``hostside.py``), the window
around one benchmark (``window.py``), the command that wraps a benchmark that is not pytest
(``__main__.py``). The state digest stays a digest of settings: the envelope sits beside it.
"""
