"""The ``nvbandwidth`` probe: NVIDIA's binary, run on the target (``-j``: JSON), its output
parsed by ``bandwidth``. Under ``auto`` it is here where the target has it on its PATH."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..host import CommandTimeout, HostError, Which
from ..progress import long_step

if TYPE_CHECKING:
    from ..host import Request
    from .bandwidth import Measurements
    from .probe import Measuring, ProbeSettings

NVBANDWIDTH_ENV = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
SLOW_HINT = ("links slower than expected make it slower (try a smaller size, or raise the p2p "
             "section's timeout: SECONDS); if a GPU fell off the bus, the kernel log says so "
             "(Xid 79)")


class NvbandwidthProbe:
    def reads(self, section: ProbeSettings) -> tuple[Request, ...]:
        return (Which("nvbandwidth"),)

    def auto_reads(self) -> tuple[Request, ...]:
        return (Which("nvbandwidth"),)

    def here(self, measuring: Measuring) -> str | None:
        return "nvbandwidth" if measuring.host.which("nvbandwidth") is not None else None

    def measure(self, measuring: Measuring, source: str | None) -> Measurements:
        from .bandwidth import (
            D2H_TEST,
            H2D_TEST,
            P2P_TESTS,
            ParseError,
            parse_output,
            to_measurements,
        )

        section, wanted = measuring.section, measuring.wanted
        tests = ([P2P_TESTS[0]] if wanted["pairs"] else []) + \
                ([H2D_TEST] if wanted["h2d"] else []) + \
                ([D2H_TEST] if wanted["d2h"] else [])
        argv = ["nvbandwidth", "-j", "-b", str(max(1, section.size // 2**20))]
        for test in tests:
            argv += ["-t", test]
        # CUDA ordinal i = the i-th GPU in PCI order, our mapping when the output names no bus ids.
        try:
            with long_step(f"{measuring.host.describe()} {' '.join(argv)}",
                           f"running {' '.join(argv)} (every pair, serially)"):
                done = measuring.host.run(argv, env=NVBANDWIDTH_ENV, timeout=section.timeout)
        except CommandTimeout:
            raise HostError(f"{' '.join(argv)} did not finish within {section.timeout:g} "
                            f"s and was killed: {SLOW_HINT}") from None
        if done.returncode != 0:
            raise HostError(f"{done.shown} exited {done.returncode}: "
                            f"{(done.stderr or done.stdout).strip()[-500:]}")
        try:
            output = parse_output(done.stdout)
        except ParseError as exc:
            raise HostError(f"{done.shown} printed no usable JSON: {exc}") from exc
        return to_measurements(output, measuring.gpus, "ran " + done.shown)
