"""The ``nccl-tests`` probe: one run of a collective's ``NAME_perf`` binary on the target, at one
size over N GPUs, with NCCL saying what it chose (``NCCL_DEBUG=INFO``, subsystems INIT, ENV and
GRAPH), bounded by a timeout that kills its process group; on a remote target through its
agent, as every command runs there."""

from __future__ import annotations

import errno
from collections.abc import Mapping

import msgspec

from ..host import CommandTimeout, Host, HostError, Request, Which
from ..progress import report_progress

NCCL_TESTS_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,GRAPH",
                  "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
"""What every run sets: NCCL says its version, what it took from the environment, its rings
and each connection's transport; CUDA numbers the GPUs in PCI order (rank i is the i-th GPU)."""
OWN_ENV = tuple(NCCL_TESTS_ENV)
SLOW_HINT = ("a collective that hangs is often a peer path that does not work (try "
             "NCCL_P2P_DISABLE=1 once to tell), or raise the nccl section's timeout: SECONDS")


def binary(collective: str) -> str:
    """nccl-tests' binary of a collective: ``all_reduce`` -> ``all_reduce_perf``."""
    return f"{collective}_perf"


class Ran(msgspec.Struct, frozen=True):
    text: str
    """stdout and stderr, as the run printed them (NCCL prints its INFO lines on stdout)."""
    shown: str
    returncode: int


class NcclTestsProbe:
    """Runs one collective at one size; a HostError says why it could not."""

    def reads(self, collective: str, tests_dir: str | None = None) -> tuple[Request, ...]:
        return () if tests_dir else (Which(binary(collective)),)

    def run(self, host: Host, collective: str, size: str, gpus: int,
            env: Mapping[str, str], timeout: float, tests_dir: str | None = None) -> Ran:
        """``tests_dir``: nccl-tests' build directory inside the root (else the binary is
        found as ``which`` finds a command)."""
        name = binary(collective)
        if tests_dir:
            name = f"{tests_dir}/{name}"
        argv = [name, "-b", size, "-e", size, "-g", str(gpus)]
        report_progress(f"running {' '.join(argv)}")
        try:  # not found is the run's own answer: no round trip to ask first
            done = host.run(argv, env={**env, **NCCL_TESTS_ENV}, timeout=timeout)
        except CommandTimeout:
            raise HostError(f"{' '.join(argv)} did not finish within {timeout:g} s; its "
                            f"process group was killed: {SLOW_HINT}") from None
        except HostError as exc:
            if exc.errno != errno.ENOENT:
                raise
            raise HostError(f"{exc}: build nccl-tests (https://github.com/NVIDIA/nccl-tests, "
                            "make) and put its build/ on PATH or name it in tests_dir:, or "
                            "judge a saved run with from: FILE", errno.ENOENT) from None
        text = done.stdout + (("\n" + done.stderr) if done.stderr else "")
        return Ran(text, done.shown, done.returncode)
