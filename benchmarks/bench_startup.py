"""Start-up time of the ``fedsketch`` command: wall seconds from spawning the process to its exit.

Times, in one run and interleaved (so that load from other jobs falls on all of them alike):

- ``python -c pass``: the interpreter alone, the floor every command pays;
- ``fedsketch --help``;
- ``fedsketch --version``;
- ``fedsketch device budget --ledger X`` on a fresh ledger (created once, before the timing).

Each is run ``--runs`` times (default 15) through :mod:`subprocess` (``fedsketch`` is the console
script next to the interpreter, the venv's), timed with :func:`time.perf_counter`, stdout and
stderr discarded. It prints the median and the quartiles of each in seconds, and each command's
median as a ratio to ``python -c pass``'s and as a difference from it (the command's own cost).

With ``--peer PATH`` (another install's ``fedsketch`` script, e.g. a checkout from before the
lazy imports), the three commands are timed for it too, in the same interleaved run.

Usage: python benchmarks/bench_startup.py [--runs 15] [--peer PATH]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: The installed console script, next to the interpreter (the venv's bin/).
FEDSKETCH = [str(Path(sys.executable).with_name("fedsketch"))]


def wall(argv: list[str]) -> float:
    """Seconds from spawning ``argv`` to its exit (it must exit 0)."""
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--peer", type=Path, help="another install's fedsketch script")
    args = parser.parse_args()
    scripts = {"fedsketch": FEDSKETCH} | ({"peer": [str(args.peer)]} if args.peer else {})
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Path(tmp) / "ledger.sqlite"
        subprocess.run([*FEDSKETCH, "device", "init", "--ledger", str(ledger), "--budget", "1"],
                       check=True, stdout=subprocess.DEVNULL)
        commands = {"python -c pass": [sys.executable, "-c", "pass"]}
        for label, script in scripts.items():
            commands |= {f"{label} --help": [*script, "--help"],
                         f"{label} --version": [*script, "--version"],
                         f"{label} device budget": [*script, "device", "budget", "--ledger", str(ledger)]}
        for argv in commands.values():  # warm the file cache once
            wall(argv)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, argv in commands.items():
                times[name].append(wall(argv))
    floor = statistics.median(times["python -c pass"])
    print(f"{args.runs} runs each, interleaved; wall seconds")
    print(f"{'command':<26} {'median':>8} {'q1':>8} {'q3':>8} {'× python':>9} {'− python':>9}")
    for name, values in times.items():
        q1, _, q3 = statistics.quantiles(values, n=4)
        med = statistics.median(values)
        print(f"{name:<26} {med:8.3f} {q1:8.3f} {q3:8.3f} {med / floor:9.1f} {med - floor:9.3f}")


if __name__ == "__main__":
    main()
