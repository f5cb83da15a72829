"""The top-level package ``fedsketch``: its public names and version, ``fedsketch --version`` and
completion, lazy imports, and the functions sketch/decode/evaluate against the command line."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import fedsketch
from fedsketch import (
    Decoding,
    Evaluation,
    NotIdentifiableWarning,
    Sketch,
    decode,
    evaluate,
    load_sketch,
    sketch,
)
from fedsketch.cli import app
from fedsketch.common.data.synthetic import gmm

ROOT = Path(__file__).resolve().parents[2]
FEDSKETCH = str(Path(sys.executable).with_name("fedsketch"))


def python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_every_public_name_is_importable_and_documented():
    for name in fedsketch.__all__:
        value = getattr(fedsketch, name)
        assert name == "__version__" or value.__doc__, name
    assert set(fedsketch.__all__) <= set(dir(fedsketch))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        fedsketch.nothing  # noqa: B018


def test_version_is_pyprojects():
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert fedsketch.__version__ == version
    res = subprocess.run([FEDSKETCH, "--version"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == f"fedsketch {version}"


def test_shell_completion_is_offered():
    # typer reads the shell from the process tree (shellingham): run from a bash that stays the
    # parent (a second command keeps bash from exec'ing it), whatever runs the suite (make's sh)
    res = subprocess.run(["bash", "-c", f"{FEDSKETCH} --show-completion; exit $?"], capture_output=True,
                         text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "SHELL": "/bin/bash"})
    assert res.returncode == 0, res.stderr
    assert "_FEDSKETCH_COMPLETE=complete_bash" in res.stdout
    assert "--install-completion" in CliRunner().invoke(app, ["--help"]).output


def test_imports_are_lazy_and_work_from_another_folder(tmp_path):
    """A device importing fedsketch.client loads neither the API nor scikit-learn; the functions
    load without scikit-learn; the mapping of api/ to ``fedsketch`` holds outside the repository."""
    res = python("import sys, fedsketch.client.agent, fedsketch.server.decode.pipeline\n"
                 "assert 'fedsketch.steps' not in sys.modules and 'sklearn' not in sys.modules\n"
                 "from fedsketch import sketch, decode, evaluate\n"
                 "assert 'sklearn' not in sys.modules\n"
                 "import fedsketch\n"
                 "print(fedsketch.__file__)", tmp_path)
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.strip()) == ROOT / "api" / "__init__.py"


def test_the_functions_work_without_scikit_learn(tmp_path):
    """Only CompressiveKMeans and evaluate's reference need scikit-learn (blocked here)."""
    res = python("import sys; sys.modules['sklearn'] = None\n"
                 "import numpy as np, fedsketch\n"
                 "x = np.random.default_rng(0).normal(size=(2000, 2))\n"
                 "out = fedsketch.decode(fedsketch.sketch(x, epsilon=1.0, m=40, scale=1.0), 2, (-4, 4))\n"
                 "ev = fedsketch.evaluate(x, out)\n"
                 "assert ev.kmeans_sse_per_n is None and ev.relative_sse is None and ev.sse_per_n > 0\n"
                 "from fedsketch import CompressiveKMeans", tmp_path)
    assert res.returncode == 1 and res.stderr.strip().endswith(
        "ImportError: CompressiveKMeans needs scikit-learn: pip install scikit-learn "
        "(or pip install 'fedsketch[bench]')"), res.stderr


@pytest.fixture(scope="module")
def mixture() -> tuple[np.ndarray, np.ndarray]:
    x, _, centres = gmm(20_000, 3, 2, 3.0, 5)
    return x, centres


def test_array_file_and_chunks_give_the_same_sketch(mixture, tmp_path):
    """At ε = ∞ and r = m a sketch is a function of its records and public seed: an array, its
    .npy file, a list of chunks, a one-shot generator and a DataFrame all give the same integers."""
    x, _ = mixture
    np.save(tmp_path / "x.npy", x)
    args = dict(epsilon=math.inf, m=60, scale=1.5, seed=4)
    pandas = pytest.importorskip("pandas")
    made = [sketch(x, **args), sketch(tmp_path / "x.npy", **args), sketch(np.array_split(x, 7), **args),
            sketch((c for c in np.array_split(x, 3)), **args), sketch(pandas.DataFrame(x), **args),
            sketch(x[:2000].tolist(), **args)]
    assert all(isinstance(s, Sketch) for s in made)
    for other in made[1:-1]:
        assert np.array_equal(other.payload, made[0].payload) and other.spec == made[0].spec
    assert made[-1].n == 2000 and made[-1].spec.frequencies.d == 2  # nested lists: one table
    assert made[0].n == x.shape[0] and made[0].epsilon_spent == math.inf


def test_a_dataframe_is_read_column_by_column(mixture):
    """pandas' nullable columns (Float64, Int64: what read_parquet or convert_dtypes gives) read
    as numbers, a missing value in them as a NaN (refused), and a text column is named."""
    pandas = pytest.importorskip("pandas")
    x, _ = mixture
    args = dict(epsilon=math.inf, m=60, scale=1.5, seed=4)
    frame = pandas.DataFrame(x, columns=["a", "b"])
    nullable = sketch(frame.astype("Float64"), **args)
    assert np.array_equal(nullable.payload, sketch(x, **args).payload)
    with pytest.raises(ValueError, match=r"column 'name' \(\w+\) does not hold numbers"):
        sketch(frame.assign(name="clinic"), **args)
    holed = frame.astype("Float64")
    holed.loc[3, "b"] = None
    with pytest.raises(ValueError, match=r"row index 3 \(counted from 0\) holds a NaN"):
        sketch(holed, **args)


def test_a_sketch_prints_in_a_few_lines(mixture):
    """A notebook shows repr(sketch): its spec and count, not 2m integers of payload."""
    made = sketch(mixture[0], epsilon=math.inf, m=1000, scale=1.5)
    assert "payload" not in repr(made) and "n=20000" in repr(made) and len(repr(made)) < 1000


def test_a_parquet_or_csv_file_is_read_by_column_names(mixture, tmp_path):
    """columns= and header= are the commands' --columns and --header: a Parquet file with the
    records' columns beside a text column, and a headerless CSV, give the array's sketch; given
    beside records in memory they are refused, not ignored."""
    x, _ = mixture
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"label": ["a"] * len(x), "u": x[:, 0], "v": x[:, 1]}), tmp_path / "x.parquet",
                   row_group_size=5000)
    np.savetxt(tmp_path / "x.csv", x, delimiter=",", fmt="%.17g")
    args = dict(epsilon=math.inf, m=60, scale=1.5, seed=4)
    want = sketch(x, **args).payload
    assert np.array_equal(sketch(tmp_path / "x.parquet", columns=["u", "v"], **args).payload, want)
    assert np.array_equal(sketch(tmp_path / "x.csv", header=False, **args).payload, want)
    assert evaluate(tmp_path / "x.parquet", np.zeros((1, 2)), columns=("u", "v")).sse_per_n == pytest.approx(
        evaluate(x, np.zeros((1, 2))).sse_per_n)
    with pytest.raises(ValueError, match="not a number|numeric|label"):
        sketch(tmp_path / "x.parquet", **args)  # the text column is not a record's
    with pytest.raises(ValueError, match="apply to a data file"):
        sketch(x, columns=["u"], **args)


def test_the_function_and_the_command_make_the_same_file(mixture, tmp_path):
    x, _ = mixture
    np.save(tmp_path / "x.npy", x)
    res = CliRunner().invoke(app, ["sketch", str(tmp_path / "x.npy"), "--out", str(tmp_path / "cli.npz"),
                                   "--m", "60", "--r", "60", "--epsilon", "inf", "--seed", "2",
                                   "--bounds", "-12:12", "--quiet"])
    assert res.exit_code == 0, res.output
    mine = sketch(x, epsilon=math.inf, m=60, seed=2, bounds="-12:12")
    mine.save(tmp_path / "api.npz")
    cli, api = load_sketch(tmp_path / "cli.npz"), load_sketch(tmp_path / "api.npz")
    assert np.array_equal(cli.payload, api.payload) and cli.spec == api.spec
    assert cli.calibration == api.calibration and cli.calibration is not None  # scale auto, both
    # and the command decodes the function's file as the function does
    res = CliRunner().invoke(app, ["decode", str(tmp_path / "api.npz"), "--k", "3", "--bounds", "-12:12",
                                   "--seed", "1", "--json", "--quiet"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == decode(tmp_path / "api.npz", 3, "-12:12", seed=1).to_dict()


@pytest.mark.blas
def test_decode_and_evaluate_find_the_mixture(mixture):
    x, centres = mixture
    out = decode(sketch(x, epsilon=math.inf, m=60, seed=1, bounds=(-12, 12)), 3, (-12, 12), seed=0)
    assert isinstance(out, Decoding) and out.identifiability.status == "identified"
    assert out.weights.sum() == pytest.approx(1.0)
    nearest = np.min(np.linalg.norm(out.centroids[:, None] - centres[None], axis=2), axis=1)
    assert nearest.max() < 0.3, (out.centroids, centres)
    ev = evaluate(x, out)
    assert isinstance(ev, Evaluation)
    d2 = np.min(((x[:, None].astype(np.float64) - out.centroids[None]) ** 2).sum(axis=2), axis=1)
    assert ev.sse_per_n == pytest.approx(d2.mean(), rel=1e-9)
    assert ev.relative_sse == pytest.approx(ev.sse_per_n / ev.kmeans_sse_per_n) and ev.relative_sse < 1.05
    chunked = evaluate(np.array_split(x, 4), out.centroids)  # the same, up to float summation order
    assert chunked.to_dict() == pytest.approx(ev.to_dict(), rel=1e-9)


def test_finite_epsilon_draws_fresh_noise_whatever_the_seed(mixture):
    x, _ = mixture
    a, b = (sketch(x, epsilon=1.0, m=60, scale=1.5, seed=3) for _ in range(2))
    assert a.spec == b.spec and a.epsilon_spent == b.epsilon_spent == 1.0
    assert not np.array_equal(a.payload, b.payload)


def test_noise_alone_warns_not_identifiable():
    x = np.random.default_rng(0).uniform(-1, 1, size=(200, 2))
    s = sketch(x, epsilon=0.05, m=40, scale=1.0)
    with pytest.warns(NotIdentifiableWarning, match="cannot be told from noise"):
        out = decode(s, 4, (-1, 1), seed=0)
    assert out.identifiability.status == "not identifiable"


def test_an_unreliable_auto_scale_warns_in_the_apis_words():
    x = np.random.default_rng(1).uniform(-1, 1, size=(300, 2))
    with pytest.warns(UserWarning, match="scale='auto'") as caught:
        sketch(x, epsilon=0.01, m=40, scale="auto", scale_range=(0.1, 10.0))
    text = " ".join(str(w.message) for w in caught if "scale='auto'" in str(w.message))
    assert "too noisy" in text and "bounds=" in text and "--" not in text


@pytest.mark.parametrize(("data", "kwargs", "message"), [
    (np.array([[0.0, 1.0], [np.nan, 2.0]]), {}, "row index 1 (counted from 0) holds a NaN"),
    ([np.zeros((3, 2)), np.array([[0.0, np.inf]])], {"bounds": "-5:5"},
     "row index 3 (counted from 0) holds a NaN or an"),
    (np.zeros(5), {}, "2-D array"),
    (np.array([["a", "b"]]), {}, "real numbers"),
    ((c for c in [np.zeros((3, 2))]), {}, "one-shot iterator"),
    (iter([]), {"scale": 1.0}, "no records"),
    (np.zeros((3, 2)), {"bounds": (1, 0)}, "lo < hi"),
    (np.zeros((3, 2)), {"bounds": "nonsense"}, "LO:HI"),
    (np.zeros((3, 2)), {"scale": "big"}, "scale must be a positive number or 'auto'"),
    (np.zeros((3, 2)), {"law": "cauchy"}, "unknown law"),
])
def test_bad_input_is_refused_by_name(data, kwargs, message):
    """(A list of chunks with scale "auto" needs a box or a range: σ's range follows the box.)"""
    with pytest.raises(ValueError, match=re.escape(message)):
        sketch(data, epsilon=1.0, m=20, **kwargs)


def test_a_tampered_sketch_is_not_decoded(mixture):
    made = sketch(mixture[0][:500], epsilon=math.inf, m=20, scale=1.0)
    bad = Sketch(made.payload, made.n, made.spec, "0" * 64, made.mechanism, made.calibration,
                 made.epsilon_spent)
    with pytest.raises(ValueError, match="frequencies hash mismatch"):
        decode(bad, 2, (-5, 5))
