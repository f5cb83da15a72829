"""The command line: an end-to-end run as real processes, and one-line refusals of bad input
that leave no output file behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fedsketch.server.cli.main import app

FEDSKETCH = str(Path(sys.executable).with_name("fedsketch"))
runner = CliRunner()


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([FEDSKETCH, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    out = folder / "x.npy"
    res = run("synth", "gmm", "--n", "40000", "--k", "4", "--d", "3", "--separation", "2.5",
              "--seed", "1", "--out", str(out), "--labels", str(folder / "y.npy"), "--quiet")
    assert res.returncode == 0, res.stderr
    return out


def test_pipeline_synth_sketch_decode_evaluate(data, tmp_path):
    x = np.load(data)
    assert x.shape == (40000, 3) and x.dtype == np.float32
    assert np.load(data.with_name("y.npy")).shape == (40000,)
    sk = tmp_path / "s.npz"
    res = run("sketch", str(data), "--m", "120", "--epsilon", "inf", "--seed", "3",
              "--out", str(sk), "--quiet")
    assert res.returncode == 0, res.stderr
    res = run("decode", str(sk), "--k", "4", "--bounds", "-12:12", "--replicates", "2",
              "--seed", "0", "--json", "--quiet")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert np.array(out["centroids"]).shape == (4, 3)
    assert sum(out["weights"]) == pytest.approx(1.0)
    assert out["residual"] >= 0
    cj = tmp_path / "c.json"
    cj.write_text(res.stdout)
    res = run("evaluate", "--data", str(data), "--centroids", str(cj), "--json")
    assert res.returncode == 0, res.stderr
    ev = json.loads(res.stdout)
    assert set(ev) == {"sse_per_n", "kmeans_sse_per_n", "relative_sse"}
    assert ev["relative_sse"] == pytest.approx(ev["sse_per_n"] / ev["kmeans_sse_per_n"])
    assert ev["relative_sse"] < 1.1  # noiseless CKM on well-separated clusters


def test_sketch_file_contents(data, tmp_path):
    from fedsketch.common.sketch.sketchfile import load_sketch

    sk = tmp_path / "q.npz"
    res = runner.invoke(app, ["sketch", str(data), "--m", "50", "--feature", "quantized",
                              "--r", "5", "--epsilon", "2", "--out", str(sk), "--quiet"])
    assert res.exit_code == 0, res.output
    f = load_sketch(sk)
    assert f.spec.feature == "quantized" and f.spec.r == 5 and f.n == 40000
    assert f.payload is not None and f.payload.dtype == np.int64 and f.payload.shape == (100,)
    assert f.mechanism["noise"][0]["law"] == "discrete_laplace"
    assert f.mechanism["noise"][0]["sensitivity"] == 20  # Δ1 = 4r


@pytest.mark.parametrize("feature", ["complex", "quantized"])
@pytest.mark.parametrize(("relation", "delta"), [("replace_one", "0"), ("replace_one", "1e-6"),
                                                 ("add_remove", "0"), ("add_remove", "1e-6")])
def test_sketch_files_hold_only_integers(data, tmp_path, feature, relation, delta):
    """Every value a sketch file releases is an integer on the public grid: the payload, the
    count, and nothing else but the JSON spec (MECHANISMS §1.10)."""
    from fedsketch.common.sketch.sketchfile import load_sketch

    sk = tmp_path / "s.npz"
    res = runner.invoke(app, ["sketch", str(data), "--m", "20", "--feature", feature,
                              "--epsilon", "1", "--delta", delta, "--neighbouring", relation,
                              "--out", str(sk), "--quiet"])
    assert res.exit_code == 0, res.output
    with np.load(sk) as raw:
        assert sorted(raw.files) == ["n", "payload", "spec"]
        assert raw["payload"].dtype == np.int64 and raw["n"].dtype == np.int64
        meta = json.loads(str(raw["spec"]))
    assert meta["grid"] == {"complex": 1024, "quantized": 1}[feature]
    assert meta["epsilon_spent"] == 1.0
    f = load_sketch(sk)
    laws = [t["law"] for t in f.mechanism["noise"]]
    assert laws[0] == ("discrete_gaussian" if delta != "0" else "discrete_laplace")
    assert laws[1:] == (["discrete_laplace"] if relation == "add_remove" else [])
    if relation == "replace_one":
        assert f.n == 40000


def _bad(tmp_path: Path, name: str, body) -> Path:
    p = tmp_path / name
    body(p)
    return p


BAD_SKETCH = [
    ("nan", lambda p: np.save(p, np.array([[0.0, np.nan, 1.0]])), [], "record 1, column 2 holds a NaN"),
    ("inf", lambda p: np.save(p, np.array([[0.0, 1.0, np.inf]])), [], "record 1, column 3 holds an infinity"),
    ("empty", lambda p: p.write_bytes(b""), [], "empty file"),
    ("ok", None, ["--law", "cauchy"], "unknown law"),
    ("ok", None, ["--feature", "cosine"], "unknown feature map"),
    ("ok", None, ["--r", "0"], "r must be in 1..m"),
    ("ok", None, ["--r", "51"], "r must be in 1..m"),
    ("ok", None, ["--epsilon", "0"], "epsilon must be > 0"),
    ("ok", None, ["--epsilon", "-1"], "epsilon must be > 0"),
    ("ok", None, ["--delta", "1.5"], "delta must be in"),
    ("ok", None, ["--neighbouring", "swap"], "unknown neighbouring"),
    ("ok", None, ["--scale", "-1"], "--scale must be"),
]


@pytest.mark.parametrize("kind, make, extra, message", BAD_SKETCH)
def test_sketch_refuses_bad_input(tmp_path, data, kind, make, extra, message):
    src = data if make is None else _bad(tmp_path, f"{kind}.npy", make)
    out = tmp_path / "out.npz"
    res = runner.invoke(app, ["sketch", str(src), "--m", "50", "--out", str(out), "--quiet", *extra])
    assert res.exit_code == 1
    assert message in res.output and res.output.count("\n") == 1 and res.output.startswith("error:")
    assert not out.exists() and not list(tmp_path.glob(".out.npz*"))


@pytest.mark.parametrize("bounds", [None, "-4:4"])
def test_sketch_clips_a_huge_record_into_the_box(tmp_path, bounds):
    """A finite record of 1e38 (and one of 1e300 in a float64 file): clipped into the box, the
    release holds finite integers, and the count is printed locally, not stored."""
    x = np.random.default_rng(0).uniform(-3, 3, (500, 3))
    x[3] = [1e38, 0.0, 0.0]
    x[9] = [0.0, -1e300, 0.0]
    x[12] = [0.0, 0.0, 5.0]  # inside the default box, outside [-4, 4]
    src, out = tmp_path / "x.npy", tmp_path / "s.npz"
    np.save(src, x)
    extra = [] if bounds is None else ["--bounds", bounds]
    res = runner.invoke(app, ["sketch", str(src), "--m", "20", "--scale", "1", "--epsilon", "1",
                              "--out", str(out), "--quiet", *extra])
    assert res.exit_code == 0, res.output
    clipped = 2 if bounds is None else 3
    assert f"{clipped:,} of 500 records lay outside the box" in res.output
    from fedsketch.common.sketch.sketchfile import load_sketch
    f = load_sketch(out)
    assert f.payload.dtype == np.int64 and np.all(np.abs(f.payload) < 2**40)
    with np.load(out, allow_pickle=False) as z:
        assert not any("clip" in key for key in z.files)


@pytest.fixture(scope="module")
def sketch_file(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sk") / "s.npz"
    res = runner.invoke(app, ["sketch", str(data), "--m", "50", "--epsilon", "inf",
                              "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--k", "51", "--bounds", "-5:5"], "k must be in 1..m"),
        (["--k", "3", "--bounds", "5:-5"], "lo < hi"),
        (["--k", "3", "--bounds", "2:2"], "lo < hi"),
        (["--k", "3", "--bounds", "a:b"], "--bounds must be"),
        (["--k", "3", "--bounds", "missing.json"], "--bounds must be"),
    ],
)
def test_decode_refuses_bad_input(sketch_file, args, message):
    res = runner.invoke(app, ["decode", str(sketch_file), "--quiet", *args])
    assert res.exit_code == 1 and message in res.output and res.output.startswith("error:")


def test_decode_bounds_json(sketch_file, tmp_path):
    good = tmp_path / "b.json"
    good.write_text(json.dumps({"lo": [-9, -9, -9], "hi": [9, 9, 9]}))
    res = runner.invoke(app, ["decode", str(sketch_file), "--k", "4", "--bounds", str(good),
                              "--json", "--quiet"])
    assert res.exit_code == 0, res.output
    c = np.array(json.loads(res.stdout)["centroids"])
    assert np.all(np.abs(c) <= 9)
    bad = tmp_path / "b2.json"
    bad.write_text(json.dumps({"lo": [-9, -9], "hi": [9, 9]}))  # wrong dimension
    res = runner.invoke(app, ["decode", str(sketch_file), "--k", "4", "--bounds", str(bad)])
    assert res.exit_code == 1 and "bounds JSON" in res.output


def test_decode_refuses_tampered_frequencies(sketch_file, tmp_path):
    raw = dict(np.load(sketch_file))
    meta = json.loads(str(raw["spec"]))
    meta["spec"]["frequencies"]["seed"] += 1  # spec no longer matches the stored Ω hash
    raw["spec"] = np.array(json.dumps(meta))
    bad = tmp_path / "t.npz"
    np.savez(bad, **raw)
    res = runner.invoke(app, ["decode", str(bad), "--k", "3", "--bounds", "-5:5"])
    assert res.exit_code == 1 and "hash mismatch" in res.output


def test_evaluate_refuses_wrong_dimension(data, tmp_path):
    cj = tmp_path / "c.json"
    cj.write_text(json.dumps({"centroids": [[0.0, 1.0]]}))
    res = runner.invoke(app, ["evaluate", "--data", str(data), "--centroids", str(cj)])
    assert res.exit_code == 1 and "dimension 2" in res.output
    cj.write_text("{not json")
    res = runner.invoke(app, ["evaluate", "--data", str(data), "--centroids", str(cj)])
    assert res.exit_code == 1 and "not JSON" in res.output


def test_synth_refuses_bad_arguments(tmp_path):
    out = tmp_path / "x.npy"
    res = runner.invoke(app, ["synth", "gmm", "--n", "3", "--k", "5", "--out", str(out)])
    assert res.exit_code == 1 and "n must be ≥ k" in res.output
    assert not out.exists()
    res = runner.invoke(app, ["synth", "gmm", "--out", str(tmp_path / "no" / "x.npy")])
    assert res.exit_code == 1 and "does not exist" in res.output
