"""The limit a fleet's read is measured against: what ``pdsh -f N -w HOSTS cat FILES`` does, one
ssh login and one ``cat`` of the same files per target, ``N`` at once.

    python bench/pdsh_like.py -f 4 -F ssh_config -i KEY targets.txt FILE...

``targets.txt``: one target a line, ``USER@HOST PORT ROOT``; each target's ``cat`` reads
``ROOT/FILE`` for every ``FILE``. A thread pool of ``ssh -F CONFIG -i KEY -p PORT USER@HOST
cat ...`` processes (pdsh's ssh module runs one ssh a host the same way), the user's
configuration as given, no connection sharing. Exit 1 where a target's ``cat`` failed,
naming it; its output is thrown away, as a sweep that only wants to know it read everything
would.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def read_one(config: str, key: str, line: str, files: list[str]) -> str:
    """One target's login and ``cat``: '' where it read every file, else what went wrong."""
    address, port, root = line.split()
    paths = " ".join(shlex.quote(f"{root.rstrip('/')}/{name}") for name in files)
    done = subprocess.run(["ssh", "-F", config, "-i", key, "-p", port, address, f"cat {paths}"],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, timeout=120, check=False)
    return "" if done.returncode == 0 else f"{line}: exit {done.returncode}: " \
        f"{done.stderr.decode(errors='replace').strip()[-300:]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-f", type=int, default=4, help="targets at once (pdsh's -f)")
    parser.add_argument("-F", required=True, help="ssh's configuration file")
    parser.add_argument("-i", required=True, help="the identity file given to ssh")
    parser.add_argument("targets", type=Path)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    lines = [line for line in args.targets.read_text().splitlines() if line.strip()]
    with ThreadPoolExecutor(args.f) as pool:
        failed = [problem for problem in pool.map(
            lambda line: read_one(args.F, args.i, line, args.files), lines) if problem]
    for problem in failed:
        print(problem, file=sys.stderr)
    print(f"{len(lines) - len(failed)} of {len(lines)} targets read")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
