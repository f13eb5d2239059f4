"""Fake tools as real files in a fake host tree: a ``modprobe`` that edits the tree the way the
kernel would (or fails the way a real one does), an ``nvbandwidth`` that replays recorded rates
by the reading GPU's MaxReadReq or one that prints a saved output and counts its runs,
pciutils' ``setpci``, and nvbandwidth's text output. Each script
is written under the tree's root and runs there as the real tool would."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

FAKE_TOOL_START = r"""#!/bin/sh
''':'
# sh runs these lines and Python reads them as a string. The fake tool runs under the system's
# python3 when there is one, else under the first python3 on PATH: `#!/usr/bin/env python3`
# always takes the first on PATH, and a pyenv shim there costs ~100 ms a start (the system's
# python3 ~15 ms). -I -S: the standard library is all it needs.
for python in /usr/bin/python3 /usr/local/bin/python3; do
    [ -x "$python" ] && exec "$python" -I -S "$0" "$@"
done
exec python3 -I -S "$0" "$@"
'''
"""
"""How a fake tool's script starts: it must work on a fresh Debian CI machine (/usr/bin/python3)
and on a machine whose only python3 is a pyenv or conda one, and start fast on both."""

MODPROBE = FAKE_TOOL_START + r'''
"""A fake modprobe for a pytest-gpuhost fake host tree (written by pytest_gpuhost.fakehost).

It edits the tree it lives in (ROOT/usr/sbin/modprobe) the way the kernel would: proc/modules,
sys/module/NAME and dev/kmsg. Modules listed in FAILURES fail as they do on a real host.
"""
import json, os, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = json.loads(__CONFIG__)

def kmsg(lines):
    path = ROOT / "dev/kmsg"
    if not path.exists():
        return
    seq = 0
    for line in path.read_text().splitlines():
        head = line.split(";", 1)[0].split(",")
        if len(head) >= 4 and head[1].isdigit():
            seq = max(seq, int(head[1]))
    usec = int(time.monotonic() * 1e6)
    with open(path, "a") as out:
        for prio, text in lines:
            seq += 1
            out.write(f"{prio},{seq},{usec},-;{text}\n")

def loaded(name):
    for line in (ROOT / "proc/modules").read_text().splitlines():
        if line.split(" ", 1)[0] == name:
            return True
    return False

def main(argv):
    options, names = [], []
    for index, arg in enumerate(argv):
        if arg == "--":  # the end of the options: every later argument is a name
            names += argv[index + 1:]
            break
        (options if arg.startswith("-") else names).append(arg)
    remove = "-r" in options
    names = [a.replace("-", "_") for a in names]
    if len(names) != 1:
        print("modprobe: ERROR: fake modprobe takes one module name", file=sys.stderr)
        return 1
    name = names[0]
    release = (ROOT / "proc/sys/kernel/osrelease").read_text().strip()
    if name not in CONFIG["available"]:
        print(f"modprobe: FATAL: Module {name} not found in directory /lib/modules/{release}",
              file=sys.stderr)
        return 1
    if remove:
        if not loaded(name):
            return 0
        lines = (ROOT / "proc/modules").read_text().splitlines(keepends=True)
        (ROOT / "proc/modules").write_text("".join(l for l in lines if l.split(" ", 1)[0] != name))
        for child in sorted((ROOT / "sys/module" / name).rglob("*"), reverse=True):
            child.unlink() if child.is_file() else child.rmdir()
        (ROOT / "sys/module" / name).rmdir()
        return 0
    if loaded(name):
        return 0
    failure = CONFIG["failures"].get(name)
    if failure:
        kmsg([(4, text) for text in failure["kmsg"]])
        print(failure["stderr"], file=sys.stderr)
        return 1
    with open(ROOT / "proc/modules", "a") as out:
        out.write(f"{name} 16384 0 - Live 0x0000000000000000\n")
    (ROOT / "sys/module" / name).mkdir(parents=True, exist_ok=True)
    (ROOT / "sys/module" / name / "initstate").write_text("live\n")
    values = dict(CONFIG["parameters"].get(name, {}))
    for conf in sorted((ROOT / "etc/modprobe.d").glob("*.conf")):
        for line in conf.read_text().splitlines():
            fields = line.split("#", 1)[0].split()
            if len(fields) > 2 and fields[0] == "options" and fields[1] == name:
                values.update(option.partition("=")[::2] for option in fields[2:])
    for parameter, value in values.items():
        path = ROOT / "sys/module" / name / "parameters" / parameter
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    if CONFIG["messages"].get(name):
        kmsg([(6, CONFIG["messages"][name])])
    return 0

sys.exit(main(sys.argv[1:]))
'''

NVBANDWIDTH = FAKE_TOOL_START + r'''
"""A fake nvbandwidth for a pytest-gpuhost fake host tree (written by pytest_gpuhost.fakehost).

It replays bandwidths recorded on the real box for each MaxReadReq setting: it reads every GPU's
Device Control from the tree's config space, so a --fix that raises MaxReadReq shows in the next
measurement, as it does on the hardware. While ACS redirect (ReqRedir, CmpltRedir or EgressCtrl)
is on at a bridge on either GPU's path, the copy is sent up to the root complex and reads at
acs_factor of that. Prints what ``nvbandwidth -j`` prints. In a container's tree, the GPUs it
measures are the host's: CONFIG's "hardware" is the host's tree, relative to this one.
"""
import json, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = json.loads(__CONFIG__)
HARDWARE = ROOT / CONFIG.get("hardware", ".")

def max_read_request(address):
    config = (HARDWARE / "sys/bus/pci/devices" / address / "config").read_bytes()
    offset = config[0x34] & 0xFC
    while offset:
        if config[offset] == 0x10:
            devctl = int.from_bytes(config[offset + 8:offset + 10], "little")
            return 128 << ((devctl >> 12) & 7)
        offset = config[offset + 1] & 0xFC
    raise SystemExit(f"{address}: no PCI Express capability")

def table(address):
    mrrs = max_read_request(address)
    known = sorted(int(size) for size in CONFIG["p2p"])
    return CONFIG["p2p"][str(min(known, key=lambda size: abs(size - mrrs)))]

def redirected(address):
    for bridge in CONFIG["paths"].get(address, []):
        config = (HARDWARE / "sys/bus/pci/devices" / bridge / "config").read_bytes()
        offset = 0x100
        while 0x100 <= offset < len(config) - 8:
            header = int.from_bytes(config[offset:offset + 4], "little")
            if header & 0xFFFF == 0x000D:
                if int.from_bytes(config[offset + 6:offset + 8], "little") & 0x2C:
                    return True
                break
            offset = (header >> 20) & 0xFFC
    return False

def rate(source, target):
    value = table(target)[f"{source}->{target}"]
    if redirected(source) or redirected(target):
        value *= CONFIG["acs_factor"]
    return round(value, 2)

def matrix(test):
    gpus = CONFIG["gpus"]
    if test == "device_to_device_memcpy_read_ce":  # row s reads from column t: data t -> s
        return [[None if s == t else rate(t, s) for t in gpus] for s in gpus]
    return [[CONFIG[test][gpu] for gpu in gpus]]

def main(argv):
    tests = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-t" and i + 1 < len(argv)]
    cases = []
    for test in tests or CONFIG["tests"]:
        if test not in CONFIG["tests"]:
            cases.append({"name": test, "status": "Not Found"})
            continue
        rows = matrix(test)
        cells = [["N/A" if v is None else f"{v:.4f}" for v in row] for row in rows]
        values = [v for row in rows for v in row if v is not None]
        cases.append({"name": test, "status": "Passed", "bandwidth_matrix": cells,
                      "bandwidth_description": CONFIG["tests"][test],
                      "sum": round(sum(values), 4), "average": round(sum(values) / len(values), 4)})
    print(json.dumps({"nvbandwidth": {"git_version": "v0.8", "Driver Version": CONFIG["driver"],
                                      "CUDA Runtime Version": 13000, "testcases": cases}},
                     indent=1))
    return 0

sys.exit(main(sys.argv[1:]))
'''

LXC_ATTACH = FAKE_TOOL_START + r'''
"""A fake lxc-attach for a pytest-gpuhost fake host tree (written by pytest_gpuhost.fakehost).

``lxc-attach -n CTID -- CMD...`` enters container CTID of the tree it lives in
(ROOT/usr/bin/lxc-attach): it runs CMD with the container's own tree,
ROOT/var/lib/lxc/CTID/rootfs, in place of the root CMD names. pytest-gpuhost's agent takes its
root as its last argument (``python3 -c BOOTSTRAP /``), so the container's ``/`` is that tree,
as a real lxc-attach makes it the container's root. A container that has no tree is refused
as lxc-attach refuses a container that is not running.
"""
import os, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

def main(argv):
    name, command = None, []
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            command = argv[index + 1:]
            break
        if arg in ("-n", "--name") and index + 1 < len(argv):
            name = argv[index + 1]
            index += 1
        elif arg.startswith("--name="):
            name = arg.split("=", 1)[1]
        index += 1
    if not name or not command:
        print("lxc-attach: usage: lxc-attach -n CTID -- COMMAND...", file=sys.stderr)
        return 1
    rootfs = ROOT / "var/lib/lxc" / name / "rootfs"
    if "/" in name or not rootfs.is_dir():
        print(f"lxc-attach: {name}: attach.c: get_attach_context: Connection refused - Failed "
              "to get init pid", file=sys.stderr)
        return 1
    if len(command) > 1 and command[-1].startswith("/"):
        command[-1] = os.path.join(str(rootfs), command[-1].lstrip("/")).rstrip("/") or "/"
    os.execvp(command[0], command)

sys.exit(main(sys.argv[1:]))
'''

SAVED_NVBANDWIDTH = FAKE_TOOL_START + r'''
"""A fake nvbandwidth that logs each run (its arguments, a line of ROOT/nvbandwidth.log), refuses
to overlap another run (exit 3: what a second measurement at once would do to the first) and
prints ROOT/nvbandwidth.json, a saved -j output; a run lasts HOLD_S at least."""
import fcntl, os, sys, time
from pathlib import Path
HOLD_S = __HOLD_S__
root = Path(__file__).resolve().parents[2]
busy = os.open(root / "nvbandwidth.busy", os.O_CREAT | os.O_RDWR)
try:
    fcntl.flock(busy, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    print("two nvbandwidth runs at once", file=sys.stderr)
    sys.exit(3)
with open(root / "nvbandwidth.log", "a") as out:
    out.write(" ".join(sys.argv[1:]) + "\n")
time.sleep(HOLD_S)
sys.stdout.write((root / "nvbandwidth.json").read_text())
'''


def saved_nvbandwidth_script(hold_s: float = 0.0) -> str:
    """A fake nvbandwidth (ROOT/usr/bin/nvbandwidth) that counts its runs in ROOT/nvbandwidth.log,
    fails a run that overlaps another, and prints ROOT/nvbandwidth.json; each run holds the
    tool ``hold_s`` (a window in which a second run at once would be caught)."""
    return SAVED_NVBANDWIDTH.replace("__HOLD_S__", repr(float(hold_s)))


def nvbandwidth_script(config: Mapping[str, object]) -> str:
    """The fake nvbandwidth of ``config`` (``FakeHost.nvbandwidth``)."""
    import json

    return NVBANDWIDTH.replace("__CONFIG__", repr(json.dumps(config, sort_keys=True)))


def nvbandwidth_config(script: str) -> dict[str, object]:
    """The config a fake nvbandwidth was written with (``nvbandwidth_script``)."""
    import ast
    import json

    line = next(line for line in script.splitlines() if line.startswith("CONFIG = json.loads("))
    loaded: dict[str, object] = json.loads(ast.literal_eval(line[len("CONFIG = json.loads("):-1]))
    return loaded


PEERMEM_FAILURE = {
    "stderr": "modprobe: ERROR: could not insert 'nvidia_peermem': Invalid argument",
    "kmsg": [
        "nvidia_peermem: disagrees about version of symbol ib_register_peer_memory_client",
        "nvidia_peermem: Unknown symbol ib_register_peer_memory_client (err -22)",
    ],
}



SETPCI = """#!/bin/sh
# A fake host tree's pciutils (written by pytest_gpuhost.fakehost). pytest-gpuhost never runs
# it: --fix --fix-persist names it in the udev rule that sets each GPU's MaxReadReq when its
# driver binds (udev runs it at boot, by this path), and so looks for it here.
echo "setpci: a fake host tree's stand-in; nothing is changed" >&2
exit 0
"""


def nvbandwidth_text(tests: Mapping[str, tuple[str, Sequence[Sequence[float | None]]]], *,
                     devices: Sequence[str], version: str = "v0.8",
                     driver: str = "580.95.05") -> str:
    """Text as nvbandwidth prints it: a header, the devices, then per test ``Running NAME.``, the
    matrix (``N/A`` where nothing was measured) and ``SUM NAME``."""
    lines = [f"nvbandwidth Version: {version}", f"Built from Git version: {version}", "",
             "CUDA Runtime Version: 13000", "CUDA Driver Version: 13000",
             f"Driver Version: {driver}", ""]
    lines += [f"Device {i}: {name}" for i, name in enumerate(devices)] + [""]
    for name, (description, rows) in tests.items():
        columns = len(rows[0])
        lines += [f"Running {name}.", description,
                  " " * 2 + "".join(f"{c:>10}" for c in range(columns))]
        for index, row in enumerate(rows):
            cells = "".join(f"{'N/A' if v is None else f'{v:.2f}':>10}" for v in row)
            lines.append(f"{index:>2}{cells}")
        total = sum(v for row in rows for v in row if v is not None)
        lines += ["", f"SUM {name} {total:.2f}", ""]
    return "\n".join(lines)
