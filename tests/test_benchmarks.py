"""Smoke tests of the benchmark scripts at tiny sizes: each runs to the end as a process and
prints its results table; ``bench_compare.py su-floor`` is also checked for its numbers. The
figures themselves are measured at full size and recorded in benchmarks/RESULTS.md."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_su_floor_runs_and_prints_every_start(capsys):
    spec = importlib.util.spec_from_file_location("bench_compare", BENCHMARKS / "bench_compare.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.su_floor(2, n=4000, k=3)
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): float(line.split("|")[2]) for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| start")}
    assert set(rows) == {"Su sphere packing, T = 2", "Su sphere packing, converged",
                         "uniform in the box, converged", "over-seeded (5k), T = 2, reduced"}
    assert all(v >= 0.99 for v in rows.values())
    assert rows["over-seeded (5k), T = 2, reduced"] < 1.1


@pytest.mark.slow
@pytest.mark.parametrize(("script", "args", "row"), [
    ("bench_sketch.py", ["--runs", "1", "--n", "20000"], "| sketch r = 1, quantized, from file"),
    ("bench_decode.py", ["--runs", "1"], "| CL-OMPR, k = d = 10"),
    ("bench_pipeline.py", ["--runs", "1", "--n", "20000"], "| relative SSE (median)"),
    ("bench_accuracy.py", ["nonprivate", "--seeds", "1", "--n", "20000", "--replicates", "1"],
     "| quantized m=10kd"),
])
def test_benchmark_runs_at_a_tiny_size(tmp_path, script, args, row):
    res = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert any(line.startswith(row) for line in res.stdout.splitlines()), res.stdout[-2000:]
