"""Test support: fake host trees (with fake tools as real files) and counting hosts, for the
tests, the bundled example host and the benchmarks."""
