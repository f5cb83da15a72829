"""Smoke test of ``benchmarks/bench_compare.py su-floor`` on a tiny dataset: the script runs and
prints its table, and the over-seeded start reaches the reference where no noise is involved."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_compare.py"


def test_su_floor_runs_and_prints_every_start(capsys):
    spec = importlib.util.spec_from_file_location("bench_compare", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.su_floor(2, n=4000, k=3)
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): float(line.split("|")[2]) for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| start")}
    assert set(rows) == {"Su sphere packing, T = 2", "Su sphere packing, converged",
                         "uniform in the box, converged", "over-seeded (3k), T = 2, reduced"}
    assert all(v >= 0.99 for v in rows.values())
    assert rows["over-seeded (3k), T = 2, reduced"] < 1.1
