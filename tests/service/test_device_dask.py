"""``fedsketch device run --engine dask``: a device whose records are a folder of Parquet
partitions sums them on a real Dask ``LocalCluster`` (two worker processes, started here) and
releases once, on the device. The daemon's data feed gives the single-process integers at ε = ∞
(r = m), a real daemon process contributes every record to a real coordinator's study (round 0
and the sketch), and a study it cannot serve on the cluster (refinement rounds, here) is
declined in words before anything is spent."""

from __future__ import annotations

import math
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_round_processes import CoordinatorProcess, cli, wait_done

from fedsketch.client import daemon
from fedsketch.client.ledger import Ledger
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.sketch.box import Box, Tally
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.spec import SketchSpec, release_sketch

pytest.importorskip("dask.distributed", reason="the dask extra is not installed")
pytestmark = pytest.mark.slow

#: Partition sizes: uneven, one empty.
SIZES = (1000, 3, 2600, 777, 0, 4099, 1500, 2021)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Paper 004's mixture (k = 3, d = 3) as eight Parquet partitions and as one .npy file;
    a few records lie outside the box ±12 (clipped)."""
    folder = tmp_path_factory.mktemp("device-dask")
    x, _, _ = gmm(sum(SIZES), 3, 3, 3.0, seed=4)
    x[::211, 2] = 50.0
    np.save(folder / "all.npy", x)
    (folder / "parts").mkdir()
    for i, rows in enumerate(np.split(x, np.cumsum(SIZES)[:-1])):
        pq.write_table(pa.table({c: rows[:, j] for j, c in enumerate("abc")}),
                       folder / "parts" / f"part-{i}.parquet")
    return folder


def spent(ledger) -> list[str]:
    """The studies a device's ledger recorded a spend for."""
    book = Ledger(ledger)
    try:
        return [s.study_id for s in book.spends()]
    finally:
        book.close()


def test_the_daemons_dask_feed_gives_the_single_process_integers(cluster, dataset):
    spec = SketchSpec(FrequencySpec(d=3, m=48, seed=3, scale=1.5), "complex", 48,
                      PrivacySpec(math.inf, 0.0, "replace_one"))
    box = Box([-12.0] * 3, [12.0] * 3)
    here, there = Tally(), Tally()
    one = release_sketch(spec, daemon.local_data(dataset / "all.npy").chunks(), box, tally=here)
    feed = daemon.local_data(dataset / "parts", engine="dask", scheduler=cluster)
    assert (feed.n, feed.d) == (sum(SIZES), 3)
    many = release_sketch(spec, feed.chunks(), box, tally=there)
    assert one.n == many.n == sum(SIZES)
    assert here.clipped == there.clipped > 0 and here.records == there.records
    np.testing.assert_array_equal(one.payload, many.payload)
    assert one.payload.dtype == np.int64 and np.abs(one.payload).max() > 0


def dask_daemon(c: CoordinatorProcess, folder, ledger, token: str | None, scheduler: str,
                check: bool = True):
    """One pass (``--once``) of a daemon whose records are the Parquet ``folder`` on Dask."""
    return cli("device", "run", "--coordinator", c.target, "--ca", str(c.certs / "ca.pem"),
               "--data", str(folder), "--ledger", str(ledger), "--budget", "10", "--once",
               *(["--token", token] if token else []), "--engine", "dask", "--scheduler",
               scheduler, check=check)


def test_a_dask_daemon_contributes_round_0_and_the_sketch(cluster, dataset, tmp_path, cli_certs):
    """A --scale auto study: the daemon's first pass sends round 0's calibration sketches, a later
    pass (once round 0 has chosen σ) the sketch, both summed on the cluster; the result holds
    every record of the eight partitions, and the ledger two spends."""
    c = CoordinatorProcess(tmp_path, cli_certs)
    c.start()
    try:
        study = c.op("create-study", "--name", "t", "--d", "3", "--k", "3", "--bounds", "-12:12",
                     "--rounds", "0", "--scale", "auto", "--epsilon", "5", "--m", "60", "--r", "60",
                     "--min-devices", "1", "--replicates", "2").stdout.strip()
        token = c.op("tokens", "--count", "1").stdout.split()[0]
        logs = dask_daemon(c, dataset / "parts", tmp_path / "ledger", token, cluster).stderr
        for _ in range(120):  # round 0 is decoded, then the sketch round opens: pass again
            if len(spent(tmp_path / "ledger")) == 2:
                break
            time.sleep(0.5)
            logs += dask_daemon(c, dataset / "parts", tmp_path / "ledger", None, cluster).stderr
        assert logs.count("submitted study") == 2, logs
        res = wait_done(c, study)
        assert res["records"] == sum(SIZES) and np.asarray(res["centroids"]).shape == (3, 3)
        assert len(spent(tmp_path / "ledger")) == 2
    finally:
        c.kill()


def test_a_dask_daemon_declines_refinement_rounds_before_spending(cluster, dataset, tmp_path,
                                                                  cli_certs):
    c = CoordinatorProcess(tmp_path, cli_certs)
    c.start()
    try:
        study = c.op("create-study", "--name", "t", "--d", "3", "--k", "3", "--bounds", "-12:12",
                     "--rounds", "2", "--scale", "1.5", "--epsilon", "5", "--m", "60",
                     "--min-devices", "1").stdout.strip()
        token = c.op("tokens", "--count", "1").stdout.split()[0]
        run = dask_daemon(c, dataset / "parts", tmp_path / "ledger", token, cluster, check=False)
        assert "--engine dask sums the records for a plain study's sketch (and its round 0) only; " \
               "this study asks for refinement rounds" in run.stderr
        assert "submitted" not in run.stderr
        assert study and spent(tmp_path / "ledger") == []
    finally:
        c.kill()


@pytest.mark.parametrize(("args", "words"), [
    (["--engine", "spark"], "--engine must be one of local, dask"),
    (["--scheduler", "tcp://127.0.0.1:1"], "--scheduler is for --engine dask"),
])
def test_bad_engine_arguments_stop_the_daemon_in_one_line(dataset, tmp_path, args, words):
    res = cli("device", "run", "--coordinator", "localhost:1", "--insecure", "--data",
              str(dataset / "all.npy"), "--ledger", str(tmp_path / "ledger"), "--budget", "1",
              "--once", *args, check=False)
    assert res.returncode == 1 and words in res.stderr and "Traceback" not in res.stderr
