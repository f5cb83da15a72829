"""The data files people have, through the ``fedsketch`` command (the installed program; the
app in-process where many runs are needed): ``sketch``, ``evaluate``, ``compare`` and
``simulate`` read pandas' CSV and ``.npy`` and Parquet files as the records they hold, take
``--header/--no-header`` and ``--columns``, and name the line and column of bad input.
(The device daemon's ``FEDSKETCH_COLUMNS``: tests/service/test_round_processes.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from fedsketch.common.data.synthetic import gmm
from fedsketch.common.sketch.sketchfile import load_sketch
from fedsketch.server.cli.main import app

FEDSKETCH = str(Path(sys.executable).with_name("fedsketch"))
SKETCH = ["--m", "30", "--r", "30", "--scale", "1", "--epsilon", "inf", "--seed", "3", "--quiet"]


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """The installed ``fedsketch`` program."""
    res = subprocess.run([FEDSKETCH, *args], capture_output=True, text=True, timeout=300)
    if check:
        assert res.returncode == 0, res.stderr
    return res


def invoke(*args: str, check: bool = True):
    """The same command line in this process (no start-up cost)."""
    res = CliRunner().invoke(app, list(args))
    if check:
        assert res.exit_code == 0, res.output
    return res


def write_csv(path: Path, x: np.ndarray, header: str | None, index: bool) -> Path:
    """``x`` as pandas' ``to_csv`` writes it (values in their shortest round-trip form)."""
    with path.open("w") as fh:
        if header is not None:
            fh.write(header + "\n")
        fh.writelines((f"{i}," if index else "") + ",".join(map(repr, row)) + "\n"
                      for i, row in enumerate(x.tolist()))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The same 300 × 3 records as a C-order .npy, and as pandas and Parquet would hold them."""
    folder = tmp_path_factory.mktemp("files")
    x = np.random.default_rng(7).normal(size=(300, 3)) * 4
    np.save(folder / "c.npy", x)
    np.save(folder / "f.npy", np.asfortranarray(x))
    pq.write_table(pa.table({"name": [f"r{i}" for i in range(300)], "c": x[:, 2], "a": x[:, 0],
                             "b": x[:, 1]}), folder / "x.parquet", row_group_size=64)
    return {"c.npy": folder / "c.npy", "f.npy": folder / "f.npy", "x.parquet": folder / "x.parquet",
            "index.csv": write_csv(folder / "index.csv", x, ",0,1,2", index=True),
            "numeric.csv": write_csv(folder / "numeric.csv", x, "0,1,2", index=False),
            "named.csv": write_csv(folder / "named.csv", x, "a,b,c", index=False)}


def sketch(src: Path, out: Path, *extra: str, how=run) -> tuple[np.ndarray, int, str]:
    res = how("sketch", str(src), "--out", str(out), *SKETCH, *extra)
    loaded = load_sketch(out)
    return loaded.payload, loaded.n, res.stderr


@pytest.mark.slow
def test_sketch_reads_every_layout_as_the_same_records(files, tmp_path):
    """Without noise the sketch is a function of the records: every file below gives the bytes
    of the C-order .npy (Parquet with --columns in the file's other order, its text column left
    out), and the reader's decisions are printed."""
    want, n, _ = sketch(files["c.npy"], tmp_path / "c.npz")
    assert n == 300
    cases = {"f.npy": (), "index.csv": (), "numeric.csv": (), "named.csv": ("--header",),
             "x.parquet": ("--columns", "a,b,c")}
    said = {}
    for name, extra in cases.items():
        got, n, said[name] = sketch(files[name], tmp_path / f"{name}.npz", *extra)
        assert n == 300 and np.array_equal(got, want), name
    assert "pandas' index column, not read" in said["index.csv"]
    assert "line 1 (0,1,2) is taken as column names" in said["numeric.csv"]
    assert said["f.npy"].startswith(f"note: {files['f.npy']}: Fortran-ordered")


def test_no_header_and_columns_change_what_is_read(files, tmp_path):
    _, n, stderr = sketch(files["numeric.csv"], tmp_path / "s.npz", "--no-header", how=invoke)
    assert n == 301 and "note:" not in stderr  # the line 0,1,2 is a record
    swapped, _, _ = sketch(files["named.csv"], tmp_path / "t.npz", "--columns", "b,a,c", how=invoke)
    plain, _, _ = sketch(files["named.csv"], tmp_path / "u.npz", how=invoke)
    assert not np.array_equal(swapped, plain)
    res = run("sketch", str(files["x.parquet"]), "--out", str(tmp_path / "v.npz"), *SKETCH,
              check=False)
    assert res.returncode == 1 and res.stderr == (
        f"error: {files['x.parquet']}: column 'name' (string) does not hold numbers; choose "
        "numeric columns with --columns\n")


def test_errors_name_the_line_and_the_column_from_1(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n\n3,x\n")
    out = tmp_path / "s.npz"
    res = run("sketch", str(bad), "--out", str(out), *SKETCH, check=False)
    assert res.returncode == 1 and not out.exists()
    assert res.stderr == (f"error: {bad}, line 4, column 2 ('b') holds 'x', which is not a "
                          "number; fix or drop that line\n")
    res = run("sketch", str(tmp_path / "bad.csv"), "--out", str(out), *SKETCH, "--no-header",
              check=False)
    assert res.stderr == (f"error: {bad}, line 1, column 1 holds 'a', which is not a number; fix "
                          "or drop that line\n")


def test_evaluate_reads_named_columns(files, tmp_path):
    centroids = tmp_path / "c.json"
    centroids.write_text(json.dumps({"centroids": [[0, 0, 0], [1, 1, 1]]}))
    sse = [json.loads(invoke("evaluate", "--data", str(files[name]), "--centroids", str(centroids),
                          "--json", *extra).stdout)["sse_per_n"]
           for name, extra in (("c.npy", ()), ("x.parquet", ("--columns", "a,b,c")),
                               ("named.csv", ("--columns", "a,b,c")))]
    assert sse[0] == pytest.approx(sse[1], rel=1e-12) == pytest.approx(sse[2], rel=1e-12)
    res = invoke("evaluate", "--data", str(files["x.parquet"]), "--centroids", str(centroids),
                 "--columns", "a,b", check=False)
    assert res.exit_code == 1 and "centroids have dimension 3" in res.stderr


def test_compare_reads_named_columns(files):
    args = ["compare", "kmeans", "--k", "2", "--bounds", "-20:20", "--methods", "kmeans",
            "--epsilons", "1", "--trials", "1", "--json", "--quiet"]
    rows = [json.loads(invoke(*args, "--data", str(files[name]), *extra).stdout)
            for name, extra in (("c.npy", ()), ("x.parquet", ("--columns", "a,b,c")))]
    assert rows[0][0]["median"] == pytest.approx(rows[1][0]["median"], rel=1e-9)
    res = invoke(*args, "--data", str(files["named.csv"]), "--columns", "a,z", check=False)
    assert res.exit_code == 1 and "has no column 'z' (its columns: 'a', 'b', 'c')" in res.stderr


@pytest.mark.slow
def test_simulate_splits_named_parquet_columns(tmp_path):
    x, _, _ = gmm(4000, 3, 3, 3.0, seed=1)
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"id": np.arange(4000), "when": [f"day {i}" for i in range(4000)],
                             "u": x[:, 0], "v": x[:, 1], "w": x[:, 2]}), path, row_group_size=500)
    res = run("simulate", "--data", str(path), "--columns", "u,v,w", "--bounds", "-12:12", "--k", "3",
              "--devices", "3", "--m", "60", "--r", "60", "--scale", "1.5", "--epsilon", "20",
              "--replicates", "2", "--rounds", "0", "--json")
    report = json.loads(res.stdout)
    assert report["records"] == 4000 and np.asarray(report["centroids"]).shape == (3, 3)
    assert report["relative_sse"] < 1.3
    res = run("simulate", "--data", str(path), "--bounds", "-12:12", "--k", "3", check=False)
    assert res.returncode == 1 and "column 'when' (string) does not hold numbers" in res.stderr
