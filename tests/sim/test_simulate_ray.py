"""``simulate --backend ray``: the devices as Ray actors on a local Ray started here (two CPUs,
so two actors), a plain and a secure study, each against the in-process backend on the same
data and seeds. The releases carry noise from OS random bits, so the two backends agree in
distribution, not bit for bit: the same devices and records, and centroids that both match the
mixture's clusters closely (ε = 20 per device: the noise moves a centroid by a few hundredths)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from fedsketch.server.sim.config import SimConfig
from fedsketch.server.sim.ray_devices import init_ray
from fedsketch.server.sim.simulate import pooled_data, run_simulation, split_records

ray = pytest.importorskip("ray")
FEDSKETCH = str(Path(sys.executable).with_name("fedsketch"))


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray on the machine's two cores, started as ``simulate --backend ray`` starts one
    (:func:`init_ray`: Ray's 30 s waits for its GCS server and its raylet were each too short once
    beside other jobs on a 2-core machine, in fresh-clone CI runs)."""
    init_ray(num_cpus=2)
    yield
    ray.shutdown()


def matched_distance(a: list, b: list) -> float:
    """Largest distance between centroids of ``a`` and ``b`` matched one to one."""
    cost = np.linalg.norm(np.asarray(a)[:, None] - np.asarray(b)[None], axis=2)
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].max())


@pytest.mark.slow
@pytest.mark.parametrize("secure", [False, True])
def test_ray_backend_matches_the_in_process_backend(local_ray, secure):
    cfg = SimConfig(devices=6, records=30_000, k=3, d=3, m=60, epsilon=20.0, r=60, scale=1.5,
                    separation=3.0, replicates=2, secure_aggregation=secure, partition="dirichlet:0.5",
                    stage_timeout=60.0 if secure else None)
    data = pooled_data(cfg)
    here = run_simulation(cfg, data)
    on_ray = run_simulation(SimConfig(**{**cfg.__dict__, "backend": "ray"}), data)
    assert here["ray"] is None
    rep = on_ray["ray"]
    assert rep["actors"] == 2 and rep["devices_per_actor"] == [3, 3]
    assert rep["rss_growth_per_device_bytes"] >= 0 and min(rep["peak_rss_bytes"]) > 0
    assert (on_ray["devices"], on_ray["records"]) == (here["devices"], here["records"]) == (6, 30_000)
    assert on_ray["config"]["backend"] == "ray" and here["config"]["backend"] == "inprocess"
    for report in (here, on_ray):
        assert report["relative_sse"] < 1.1
        assert report["identifiability"]["status"] == "identified"
    assert matched_distance(here["centroids"], on_ray["centroids"]) < 0.3
    if not secure:  # 2m int64 per contribution and 2 or 3 registrations, as in-process
        assert 6 * (960 + 64 + 2 * 175) < on_ray["bytes_sent"] < 6 * (1300 + 3 * 175)


@pytest.mark.slow
def test_ray_backend_leaves_the_chosen_devices_silent(local_ray):
    """--dropout on Ray: the device the simulator chose (as in-process: its seed) goes silent
    from the masked input on, the stage proceeds at its timeout, and the result holds the
    other five devices' records exactly."""
    cfg = SimConfig(devices=6, records=30_000, k=3, d=3, m=60, epsilon=20.0, r=60, scale=1.5,
                    separation=3.0, replicates=2, secure_aggregation=True, partition="dirichlet:0.5",
                    dropout=1 / 6, stage_timeout=20.0, backend="ray")
    data = pooled_data(cfg)
    parts = split_records(data.labels, 6, cfg.partition, np.random.default_rng(cfg.seed))
    silent = np.random.default_rng(cfg.seed).choice(6, 1, replace=False)[0]
    report = run_simulation(cfg, data)
    assert report["devices"] == 5 and report["records"] == 30_000 - parts[silent].size
    assert report["relative_sse"] < 1.2


def test_ray_backend_options_are_checked():
    bad = [(["--backend", "spark"], "--backend must be one of inprocess, ray"),
           (["--backend", "ray", "--processes"], "choose one"),
           (["--address", "auto"], "--address names a Ray cluster: add --backend ray"),
           # an unreachable cluster: ray.init retried it for minutes, deaf to SIGINT
           (["--backend", "ray", "--address", "127.0.0.1:1"], "cannot reach Ray at 127.0.0.1:1"),
           (["--backend", "ray", "--address", "nowhere"], "--address takes HOST:PORT")]
    for args, message in bad:
        res = subprocess.run([FEDSKETCH, "simulate", "--devices", "2", "--records", "200", *args],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode != 0 and message in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
