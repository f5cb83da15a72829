"""``fedsketch simulate``: the data split, and whole simulations in-process and with real
daemon processes (small, to stay fast)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedsketch.common.data.synthetic import gmm
from fedsketch.server.sim.config import SimConfig
from fedsketch.server.sim.simulate import run_simulation, split_records

FEDSKETCH = str(Path(sys.executable).with_name("fedsketch"))


def test_iid_split_is_a_partition_of_near_equal_parts():
    parts = split_records(np.zeros(1003, dtype=int), 10, "iid", np.random.default_rng(0))
    assert sorted(np.concatenate(parts).tolist()) == list(range(1003))
    assert {p.size for p in parts} == {100, 101}


def test_dirichlet_split_skews_clusters_and_keeps_every_record():
    labels = np.repeat(np.arange(5), 2000)
    rng = np.random.default_rng(1)
    skewed = split_records(labels, 20, "dirichlet:0.1", rng)
    flat = split_records(labels, 20, "dirichlet:1000", rng)
    assert sorted(np.concatenate(skewed).tolist()) == list(range(10_000))
    assert min(p.size for p in skewed) >= 1

    def top_share(parts):  # mean share of a device's largest cluster
        return np.mean([np.bincount(labels[p], minlength=5).max() / p.size for p in parts])

    assert top_share(skewed) > 0.8 and top_share(flat) < 0.35


@pytest.mark.parametrize("scheme", ["dirichlet:0", "dirichlet:x", "shards"])
def test_bad_partition_is_refused(scheme):
    with pytest.raises(ValueError, match="partition|concentration"):
        split_records(np.zeros(10, dtype=int), 2, scheme, np.random.default_rng(0))


def test_in_process_simulation_reports_everything():
    cfg = SimConfig(devices=5, records=30_000, k=3, d=3, m=60, epsilon=20.0, r=60, scale=1.5,
                    separation=3.0, replicates=2)
    report = run_simulation(cfg)
    assert report["devices"] == 5 and report["records"] == 30_000
    assert report["relative_sse"] < 1.15
    assert np.asarray(report["centroids"]).shape == (3, 3)
    verdict = report["identifiability"]
    assert verdict["status"] == "identified" and min(verdict["z"]) > verdict["threshold"]
    assert set(report["seconds"]) == {"data_and_kmeans_reference", "setup", "enroll",
                                      "devices", "decode"}
    # each contribution carries 2m int64 (960 bytes) plus ids, hash and a 64-byte signature; each
    # device also sends 2 or 3 registrations of 175 bytes (join, confirm, re-check at the spend)
    assert 5 * (960 + 64 + 2 * 175) < report["bytes_sent"] < 5 * (1300 + 3 * 175)


def test_simulation_with_refinement_rounds_refines_the_start():
    """Three rounds after a sketch of ε = 1 on 5 devices: the report gives each ε, every round
    ended with new centres, and they bring a poor start (few frequencies, a too narrow kernel:
    relative SSE ≈ 10) close to k-means; the devices' budget (all of ε) covered the whole
    study."""
    cfg = SimConfig(devices=5, records=30_000, k=3, d=3, m=30, epsilon=4.0, r=30, scale=0.5,
                    separation=3.0, replicates=1, rounds=3, round_share=0.75)
    report = run_simulation(cfg)
    ref = report["refinement"]
    assert ref["sketch_epsilon"] == pytest.approx(1.0) and ref["epsilon"] == [1.0, 1.0, 1.0]
    assert ref["refined_rounds"] == 3 and ref["round_states"] == ["done"] * 3
    assert report["relative_sse"] < 1.03 < ref["start_relative_sse"]


@pytest.mark.parametrize("secure", [False, True])
def test_simulation_with_scale_auto_runs_round_0_first(secure):
    """--scale auto: the study's round 0 picks σ (its report says how) and the sketch round that
    follows decodes close to k-means; under secure aggregation too (the driver keeps stepping
    the devices once round 0 has closed)."""
    cfg = SimConfig(devices=4, records=30_000, k=3, d=3, m=60, epsilon=20.0, r=60, scale=None,
                    separation=3.0, replicates=2, secure_aggregation=secure,
                    stage_timeout=30.0)  # a stage ends once every device sent; no dropouts here
    report = run_simulation(cfg)
    cal = report["calibration"]
    assert cal["reliable"] and cal["epsilon"] == pytest.approx(2.0) and 0.1 < cal["sigma"] < 10
    assert report["devices"] == 4 and report["relative_sse"] < 1.15
    # the report's config says what was used: round 0's σ, the range it searched (the box ±15's
    # default, h/60:5h/3), and the synthetic mixture's bound and separation
    used = report["config"]
    assert used["scale"] == cal["sigma"] and used["scale_auto"] is True
    assert used["scale_range"] == [pytest.approx(0.25), pytest.approx(25.0)]
    assert (used["bound"], used["separation"], used["box"]) == (15.0, 3.0, [[-15.0] * 3, [15.0] * 3])


@pytest.mark.slow
def test_simulation_with_daemon_processes_json():
    res = subprocess.run(
        [FEDSKETCH, "simulate", "--devices", "2", "--records", "20000", "--k", "3", "--d", "3",
         "--m", "60", "--r", "60", "--scale", "auto", "--rounds", "0", "--epsilon", "20",
         "--feature", "quantized", "--replicates", "2", "--processes", "--json"],
        capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert {"relative_sse", "centroids", "devices", "records", "seconds", "bytes_sent"} <= set(
        report)
    assert report["devices"] == 2 and report["config"]["processes"] is True
    assert report["relative_sse"] < 1.3
    assert report["calibration"]["reliable"]  # round 0 ran, then the daemons sent the sketch


def test_simulate_refuses_bad_arguments():
    res = subprocess.run([FEDSKETCH, "simulate", "--devices", "3", "--records", "2"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and res.stderr.startswith("error:")
    res = subprocess.run([FEDSKETCH, "simulate", "--epsilon", "0"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1 and "epsilon" in res.stderr
    for args, words in ((["--max-colluders", "0.1"], "apply to --secure-aggregation only"),
                        (["--secure-aggregation", "--devices", "4", "--threshold", "2"],
                         "threshold 2 is too low")):
        res = subprocess.run([FEDSKETCH, "simulate", *args], capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 1 and words in res.stderr, res.stderr


def test_simulate_splits_a_data_file_over_the_devices(tmp_path):
    """A CSV of 6,000 records in an off-centre box, dealt out by cluster (dirichlet:0.2) to 4
    devices: the study uses the file's n and d and the box given, and decodes near k-means. A
    box that cuts the data in half (clipping every record into [0, 1]) costs accuracy, so the
    box really is the one given."""
    x = gmm_records(6000) + 100.0
    path = tmp_path / "records.csv"
    np.savetxt(path, x, delimiter=",", header="a,b,c", comments="")
    base = [FEDSKETCH, "simulate", "--data", str(path), "--k", "3", "--devices", "4", "--m", "60",
            "--r", "60", "--scale", "1.5", "--epsilon", "20", "--replicates", "2",
            "--partition", "dirichlet:0.2", "--json"]
    res = subprocess.run([*base, "--bounds", "85:115"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["records"] == 6000 and np.asarray(report["centroids"]).shape == (3, 3)
    assert report["config"]["box"] == [[85.0] * 3, [115.0] * 3]
    # a file's run: no synthetic bound or separation, the fixed σ given, no range searched
    used = report["config"]
    assert (used["bound"], used["separation"], used["scale"], used["scale_auto"],
            used["scale_range"]) == (None, None, 1.5, False, None)
    assert report["relative_sse"] < 1.2
    assert report["identifiability"]["status"] == "identified"
    clipped = subprocess.run([*base, "--bounds", "99:101"], capture_output=True, text=True, timeout=300)
    assert clipped.returncode == 0, clipped.stderr
    assert json.loads(clipped.stdout)["relative_sse"] > 1.5


def test_simulate_data_file_arguments_are_checked(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, gmm_records(50))
    for args, words in ((["--data", str(path)], "--data needs the study's public box"),
                        (["--data", str(path), "--bounds", "-9:9"],
                         "--data needs the study's public scale --scale"),
                        (["--data", str(path), "--bounds", "-9:9", "--records", "50"],
                         "come from the --data file"),
                        (["--bounds", "-9:9"], "--bounds sets the box of a --data file"),
                        (["--data", str(path), "--bounds", "-9:9", "--scale", "1", "--k", "60"],
                         "50 records cannot make 60 clusters"),
                        (["--data", str(tmp_path / "none.npy"), "--bounds", "-9:9", "--scale", "1"],
                         "none.npy")):
        res = subprocess.run([FEDSKETCH, "simulate", *args], capture_output=True, text=True, timeout=60)
        assert res.returncode == 1 and words in res.stderr, res.stderr


def gmm_records(n: int) -> np.ndarray:
    """n records of a 3-cluster mixture in d = 3."""
    return gmm(n, 3, 3, 3.0, 4)[0].astype(np.float64)


def test_simulate_table_says_what_relative_sse_1_means():
    """The table view ends with one line saying what relative SSE 1.0 is."""
    res = subprocess.run([FEDSKETCH, "simulate", "--devices", "2", "--records", "2000", "--k", "3",
                          "--d", "2", "--m", "40", "--epsilon", "10", "--rounds", "0", "--replicates", "1"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1].startswith("relative SSE 1.0 = as good as non-private k-means")


def test_simulate_bounds_auto_reads_the_box_in_a_box_round_and_reports_it(tmp_path):
    """``--bounds auto`` on a table whose columns lie 100× apart, in their own units (no box
    given): the study's box round reads the box across the 4 devices at --box-fraction of ε,
    ``--json`` reports it (``box``: its ε and explanation; ``config``: the box used and σ's range
    derived from it), the box holds the bulk of every column, and the study decodes near
    k-means in those units."""
    x = gmm_records(20_000) * np.array([10.0, 1000.0, 0.1]) + np.array([300.0, 5000.0, 1.0])
    path = tmp_path / "records.npy"
    np.save(path, x)
    res = subprocess.run([FEDSKETCH, "simulate", "--data", str(path), "--bounds", "auto", "--k", "3",
                          "--devices", "4", "--m", "200", "--scale", "auto", "--epsilon", "4",
                          "--box-fraction", "0.1", "--replicates", "2", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    box, used = report["box"], report["config"]
    assert box["epsilon"] == pytest.approx(0.4) and box["explanation"].startswith("a private box")
    assert used["box"] == [box["lo"], box["hi"]] and used["auto_box"] and used["box_fraction"] == 0.1
    lo, hi = np.array(box["lo"]), np.array(box["hi"])
    # Edge bins below the read's significance level (box["tau"], 245 records here) are left out,
    # and the 4 devices' fresh noise decides each time whether one more bin clears it: over 24
    # runs the miles column clipped 0.9 %, 1.8 % or 3.3 % (one to three 8-levels-an-octave bins
    # of its tails; kelvin 0 %), so 5 % allows one bin more than seen. The third column's low
    # tail (0.08 to 0.2, 6 % of its records) spreads over 1.4 octaves near zero, 11 bins each
    # below τ at ε_box = 0.4: it clips 0.04–5.9 % (measured; the local sketch's second, linear
    # histogram would read them, benchmarks/RESULTS.md §12)
    outside = np.mean((x < lo) | (x > hi), axis=0)
    assert np.all(outside[:2] <= 0.05) and outside[2] <= 0.08, outside
    q = np.quantile(x, [0.005, 0.995], axis=0)
    assert np.all(hi - lo <= 3 * (q[1] - q[0])), (lo, hi, q)
    half = np.mean((hi - lo) / 2)  # σ's range follows the box read: h/60 : 5h/3
    assert used["scale_range"] == [pytest.approx(half / 60), pytest.approx(5 * half / 3)]
    assert report["relative_sse"] < 1.3


def test_simulation_plans_m_when_not_given():
    """No m: the study's m is planned from N/L records per device, L, d, k and the sketch's ε
    (a plain study: one noise draw per device), and the report's config says which m it used."""
    from fedsketch.common.study.sizing import study_size

    cfg = SimConfig(devices=3, records=9000, k=3, d=3, epsilon=2.0, scale=2.0, separation=3.0,
                    replicates=1, rounds=0)
    report = run_simulation(cfg)
    want = study_size(3000, 3, 3, 3, 2.0)
    assert report["config"]["m"] == want.m and report["config"]["m_planned"] is True
    assert want.m != 1000 and report["relative_sse"] < 1.3
    assert report["config"]["round_share"] is None  # no rounds here
