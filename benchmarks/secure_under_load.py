"""Secure rounds under CPU load (issue 30, must-show 1): does a secure ``fedsketch simulate``
finish at the default stage timeout with busy processes beside it?

It starts ``--loops`` busy-loop processes (default 8: four per core on the 2-core build machine;
each is ``while True: pass`` in its own interpreter, so each wants a whole core), then runs the
given ``fedsketch simulate`` arguments ``--runs`` times in turn (default 20), each with ``--json``
added and the stage timeout left at its default. For each run it records the exit code, the
wall seconds (spawn to exit, :func:`time.perf_counter`), the devices the sum counted and the
dropouts (devices asked for less devices counted, from the JSON report), the 1-minute load
average when the run ended (:func:`os.getloadavg`), and, for a run that failed, its last
``error:`` line. Then it kills the loops (each by its own process id) and prints one table in
benchmarks/RESULTS.md's format, and a summary line: runs that exited 0, median and largest
wall seconds, the load average range.

The loops are killed on any exit of the script, an exception, Ctrl-C or SIGTERM included. Run it on a
machine nobody else is using for timing, or say in the note what else ran.

Usage: python benchmarks/secure_under_load.py [--loops 8] [--runs 20] [--timeout 3600]
           [-- SIMULATE-ARGUMENTS ...]
(default arguments: the must-show command, ``--devices 100 --records 1000000 --k 10 --d 10
--m 1000 --epsilon 0.5 --secure-aggregation``). Tiny check:
``python benchmarks/secure_under_load.py --loops 2 --runs 2 -- --devices 10 --records 20000
--k 3 --d 3 --m 100 --epsilon 1 --secure-aggregation``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

#: The installed console script, next to the interpreter (the venv's bin/).
FEDSKETCH = str(Path(sys.executable).with_name("fedsketch"))
#: The must-show command's arguments (after ``fedsketch simulate``).
DEFAULT_ARGS = ["--devices", "100", "--records", "1000000", "--k", "10", "--d", "10", "--m", "1000",
                "--epsilon", "0.5", "--secure-aggregation"]
BUSY = "while True:\n    pass\n"


@dataclass(frozen=True)
class Run:
    """One run of the command: exit code, wall seconds, devices asked for and counted in the sum
    (None without a JSON report), the 1-minute load average at its end, and its error line."""

    code: int
    seconds: float
    asked: int | None
    counted: int | None
    load: float
    error: str

    @property
    def dropouts(self) -> int | None:
        return None if self.asked is None or self.counted is None else self.asked - self.counted


def _asked(args: list[str]) -> int | None:
    """The ``--devices`` value of the simulate arguments (None if absent)."""
    for i, a in enumerate(args):
        if a == "--devices" and i + 1 < len(args):
            return int(args[i + 1])
        if a.startswith("--devices="):
            return int(a.split("=", 1)[1])
    return None


def run_once(args: list[str], timeout: float) -> Run:
    """Run ``fedsketch simulate ARGS --json`` once (module docstring)."""
    start = time.perf_counter()
    try:
        done = subprocess.run([FEDSKETCH, "simulate", *args, "--json"], capture_output=True,
                              text=True, timeout=timeout)
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = -1, "", f"error: no exit within {timeout:g} s ({exc.cmd[1]})"
    seconds = time.perf_counter() - start
    counted = None
    if code == 0:
        try:
            counted = int(json.loads(out.strip().splitlines()[-1])["devices"])
        except (ValueError, KeyError, IndexError, TypeError):
            pass
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    if code == 0:
        error = ""
    else:
        error = lines[-1] if lines else (err.strip().splitlines() or ["(no output)"])[-1]
    return Run(code, seconds, _asked(args), counted, os.getloadavg()[0], error)


def start_loops(n: int) -> list[subprocess.Popen]:
    """``n`` busy-loop processes (each ``while True: pass`` in its own interpreter)."""
    return [subprocess.Popen([sys.executable, "-c", BUSY], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]


def stop_loops(loops: list[subprocess.Popen]) -> None:
    """Kill each loop this script started, by its own process id, and reap it."""
    for p in loops:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
        p.wait()


def table(runs: list[Run], loops: int, args: list[str]) -> str:
    """The runs as a RESULTS.md table, and a summary line."""
    rows = ["| run | exit code | wall s | devices counted | dropouts | load avg (1 min) | error |",
            "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(runs, 1):
        rows.append(f"| {i} | {r.code} | {r.seconds:.1f} | "
                    f"{'-' if r.counted is None else r.counted} | "
                    f"{'-' if r.dropouts is None else r.dropouts} | {r.load:.1f} | "
                    f"{r.error.replace('|', '/')[:160]} |")
    ok = sum(r.code == 0 for r in runs)
    walls = [r.seconds for r in runs]
    loads = [r.load for r in runs]
    rows.append("")
    rows.append(f"`fedsketch simulate {' '.join(args)}` at the default stage timeout beside "
                f"{loops} busy loops: **{ok} of {len(runs)}** runs exited 0; wall s "
                f"median {statistics.median(walls):.1f}, largest {max(walls):.1f}; 1-minute load "
                f"average {min(loads):.1f}–{max(loads):.1f}.")
    return "\n".join(rows)


def _exit_on_term(signum: int, frame: object) -> None:
    """SIGTERM ends the script as Ctrl-C does, so that its loops are killed too."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, sim = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", type=int, default=8, help="busy-loop processes (default 8)")
    parser.add_argument("--runs", type=int, default=20, help="runs of the command (default 20)")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds one run may take before it counts as failed (default 3600)")
    opts = parser.parse_args(ours)
    if opts.loops < 0 or opts.runs < 1:
        parser.error("--loops must be >= 0 and --runs >= 1")
    args = sim or DEFAULT_ARGS
    if "--stage-timeout" in args or any(a.startswith("--stage-timeout=") for a in args):
        parser.error("the point is the default stage timeout: drop --stage-timeout")
    previous = signal.signal(signal.SIGTERM, _exit_on_term)
    loops = start_loops(opts.loops)
    runs: list[Run] = []
    try:
        for i in range(opts.runs):
            runs.append(run := run_once(args, opts.timeout))
            print(f"run {i + 1}/{opts.runs}: exit {run.code}, {run.seconds:.1f} s, load "
                  f"{run.load:.1f}{'; ' + run.error if run.error else ''}", file=sys.stderr,
                  flush=True)
    finally:
        stop_loops(loops)
        signal.signal(signal.SIGTERM, previous)
    print(table(runs, opts.loops, args))
    return 0 if all(r.code == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
