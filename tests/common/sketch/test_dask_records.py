"""A device bigger than one machine: ``fedsketch sketch DIR --engine dask`` sums each Parquet
partition's exact integer features on the workers of a real Dask ``LocalCluster`` (two worker
processes, started here) and releases once on the device. At ε = ∞ and r = m its sketch equals
the single-process sketch of the same records integer for integer, clipped records and σ's
calibration included; bad folders get one error line."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from fedsketch.cli import app
from fedsketch.common.data.dataformat import DataError
from fedsketch.common.sketch.dask_records import DaskRecords
from fedsketch.common.sketch.sketchfile import load_sketch

pytest.importorskip("dask.distributed", reason="the dask extra is not installed")

#: Partition sizes: uneven, none a multiple of the sketch's 256-record block, one empty.
SIZES = (1000, 3, 2600, 777, 0, 4099, 1500, 2021)
BOX = "-5:5"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """The same records as eight Parquet partitions (a folder) and as one .npy file; some lie
    outside the box (clipped), and the columns are named."""
    folder = tmp_path_factory.mktemp("dask")
    x = np.random.default_rng(11).normal(size=(sum(SIZES), 3)) * 2.5
    x[::97, 1] = 40.0  # outside ±5: clipped
    np.save(folder / "all.npy", x)
    parts = folder / "parts"
    parts.mkdir()
    start = 0
    for i, size in enumerate(SIZES):
        rows = x[start:start + size]
        start += size
        table = pa.table({name: rows[:, j] for j, name in enumerate(("a", "b", "c"))})
        pq.write_table(table, parts / f"part-{i:02d}.parquet")
    return folder


def sketch(*args: str) -> dict:
    res = CliRunner().invoke(app, ["sketch", *args, "--json", "--quiet"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("scale", ["1.5", "auto"])
def test_dask_sketch_equals_the_single_process_sketch(cluster, dataset, tmp_path, scale):
    common = ["--m", "64", "--r", "64", "--epsilon", "inf", "--scale", scale, "--bounds", BOX,
              "--seed", "5"]
    one = sketch(str(dataset / "all.npy"), "--out", str(tmp_path / "one.npz"), *common)
    many = sketch(str(dataset / "parts"), "--out", str(tmp_path / "many.npz"), *common,
                  "--engine", "dask", "--scheduler", cluster)
    a, b = load_sketch(tmp_path / "one.npz"), load_sketch(tmp_path / "many.npz")
    assert a.n == b.n == sum(SIZES)
    assert one["clipped"] == many["clipped"] > 0
    assert one["scale"] == many["scale"]
    assert a.payload.dtype == b.payload.dtype == np.int64
    np.testing.assert_array_equal(a.payload, b.payload)
    assert np.abs(a.payload).max() > 0


def test_a_private_dask_sketch_is_noised_once_on_the_device(cluster, dataset, tmp_path):
    """At finite ε the release carries the mechanism's noise terms (drawn here, on the device),
    the public record count, and its masks r < m drawn on the workers."""
    out = sketch(str(dataset / "parts"), "--out", str(tmp_path / "p.npz"), "--m", "64", "--r", "4",
                 "--epsilon", "1", "--scale", "1.5", "--bounds", BOX, "--engine", "dask",
                 "--scheduler", cluster)
    released = load_sketch(tmp_path / "p.npz")
    assert released.n == sum(SIZES) and out["n"] == sum(SIZES)
    assert [t["target"] for t in out["noise"]] and all(t["scale"] > 0 for t in out["noise"])
    assert released.spec.r == 4 and released.epsilon_spent == pytest.approx(1.0)


def test_a_partition_with_other_columns_is_refused(dataset, tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    for name in ("part-0.parquet", "part-1.parquet"):
        (folder / name).write_bytes((dataset / "parts" / "part-00.parquet").read_bytes())
    pq.write_table(pa.table({"a": [1.0], "b": [2.0]}), folder / "part-2.parquet")
    with pytest.raises(DataError, match="part-2.parquet: columns"):
        DaskRecords(folder)
    res = CliRunner().invoke(app, ["sketch", str(folder), "--out", str(tmp_path / "x.npz"),
                                   "--engine", "dask", "--scale", "1", "--epsilon", "1"])
    assert res.exit_code == 1 and "error:" in res.output and "columns" in res.output
    assert not (tmp_path / "x.npz").exists()


@pytest.mark.parametrize(("args", "words"), [
    (["--engine", "dask"], "no .parquet or .pq file"),
    (["--engine", "spark"], "--engine must be one of local, dask"),
    (["--scheduler", "tcp://127.0.0.1:1"], "--scheduler is for --engine dask"),
    # checked when the records are opened (a daemon's start), not at the first sum
    (["--engine", "dask", "--scheduler", "garbage"], "cannot reach the Dask scheduler at 'garbage'"),
    (["--engine", "dask", "--scheduler", "tls://127.0.0.1:1"], "cannot reach the Dask scheduler"),
])
def test_bad_engine_arguments_get_one_line(tmp_path, args, words):
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(app, ["sketch", str(tmp_path / "empty"), "--out", str(tmp_path / "x.npz"),
                                   "--scale", "1", "--epsilon", "1", *args])
    assert res.exit_code == 1, res.output
    assert words in res.output and "Traceback" not in res.output
