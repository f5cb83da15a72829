"""Golden outputs: a change that is meant to keep behaviour (a move, a refactor) must keep them bit
for bit. They were last recorded when releases became integer vectors with exact samplers.

Three groups, all compared exactly (``np.array_equal`` on the stored arrays, ``==`` on scalars):

* **portable**: the noise terms and released integers of every privacy path on a fixed feature
  sum (exact samplers fed by a seeded bit stream: integer arithmetic only), the wire bound
  ``max_abs_entry``, and Ω‖ξ's hash. These are the same on every machine, so they always run.
* **kernel-bound**: a sketch file written by ``fedsketch sketch`` (float32 trigonometry), a
  masked feature sum (r < m, seeded masks), seeded CL-OMPR on the sketch, and each centralized
  mechanism with seeded privacy noise. These depend on numpy's SIMD dispatch and OpenBLAS's
  kernels; they are compared only on a machine whose signature (numpy version, OpenBLAS core
  type, numpy's widest SIMD target) matches the one recorded, and skipped with that reason
  elsewhere.

``python tests/test_golden.py`` rewrites ``tests/golden/`` (only ever from the code the goldens
describe: a behaviour change must show up as a failing test first).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import threadpoolctl
from conftest import seeded_words
from typer.testing import CliRunner

from fedsketch.common.data.synthetic import gmm, spectrum, subspaces
from fedsketch.common.dp import exact
from fedsketch.common.features import GRID
from fedsketch.common.sketch.frequencies import FrequencySpec, draw_frequencies
from fedsketch.common.sketch.privacy import PrivacySpec, privatize
from fedsketch.common.sketch.sketchfile import load_sketch
from fedsketch.common.sketch.sketching import FeatureSum, feature_sum
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.study import StudySpec
from fedsketch.common.study.wire import max_abs_entry
from fedsketch.server.bench import kmeans, pca, subspace
from fedsketch.server.bench.task import Task
from fedsketch.server.cli.main import app
from fedsketch.server.decode.clompr import clompr

GOLDEN = Path(__file__).resolve().parent / "golden"
M = 16


def signature() -> str:
    """What decides the kernel-bound goldens' bits: numpy, OpenBLAS's core type, numpy's SIMD."""
    kernels = sorted({i.get("architecture") for i in threadpoolctl.threadpool_info()
                      if i["internal_api"] == "openblas"})
    from numpy._core._multiarray_umath import __cpu_features__ as features

    simd = [f for f in ("AVX512_SPR", "AVX512_ICL", "AVX512_SKX", "AVX512F", "AVX2", "SSE42")
            if features.get(f)][:1]
    return f"numpy {np.__version__}; openblas {','.join(kernels)}; simd {','.join(simd)}"


def _seeded_noise(monkeypatch_or_none, start: int) -> None:
    """Seed every privacy draw: the exact samplers' OS bits, and the bench's generators."""
    seeds = iter(range(start, start + 10_000))
    fake = lambda: np.random.default_rng(next(seeds))  # noqa: E731
    for module, name, value in ((exact, "random_words", seeded_words(start)),
                                (pca, "noise_rng", fake), (subspace, "noise_rng", fake)):
        if monkeypatch_or_none is None:
            setattr(module, name, value)
        else:
            monkeypatch_or_none.setattr(module, name, value)


# ---- portable ------------------------------------------------------------------------------------

def _feature_sum(feature: str, r: int) -> FeatureSum:
    i = np.arange(M, dtype=np.int64)
    n = 37
    top = GRID[feature] * n  # |S| ≤ γn
    return FeatureSum(feature, M, r, n, (i * 7919) % (2 * top + 1) - top,
                      (i * 104729) % (2 * top + 1) - top)


PATHS = [(f, r, nb, delta) for f in ("complex", "quantized") for r in (1, M)
         for nb in ("replace_one", "add_remove") for delta in (0.0, 1e-6)]


def portable(monkeypatch=None) -> tuple[dict, dict[str, np.ndarray]]:
    scalars: dict = {}
    arrays: dict[str, np.ndarray] = {}
    for i, (feature, r, nb, delta) in enumerate(PATHS):
        _seeded_noise(monkeypatch, 1000 * i)
        rel = privatize(_feature_sum(feature, r), PrivacySpec(0.7, delta, nb))
        key = f"{feature}-{r}-{nb}-{delta:g}"
        scalars[key] = {"n": rel.n, "variance": rel.variance, "mechanism": rel.mechanism()}
        arrays[f"release/{key}"] = rel.sketch
        arrays[f"payload/{key}"] = rel.payload
        sketch = SketchSpec(FrequencySpec(d=3, m=M, scale=1.5, seed=4), feature, r,
                            PrivacySpec(0.7, delta, nb))
        freqs = draw_frequencies(sketch.frequencies)
        study = StudySpec.create("golden", sketch, 2, [-4.0] * 3, [4.0] * 3)
        scalars[key]["max_abs_entry"] = [max_abs_entry(study, n) for n in (1.0, 37.0, 1e4)]
        scalars[key]["omega_sha256"] = freqs.sha256
    return scalars, arrays


# ---- kernel-bound --------------------------------------------------------------------------------

def _mechanisms(monkeypatch=None) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    x, _, _ = gmm(4000, 3, 2, separation=2.5, seed=1)
    x = np.asarray(x, dtype=np.float64)
    lo, hi = np.full(2, -12.0), np.full(2, 12.0)
    for j, (name, method) in enumerate(sorted(kmeans.METHODS.items())):
        _seeded_noise(monkeypatch, 50_000 + 1000 * j)
        res = method(Task(x, 3, 1.0, delta=1e-6, lo=lo, hi=hi, rng=np.random.default_rng(j)))
        out[f"kmeans/{name}"] = np.asarray(res.output)
    xp, _ = spectrum(2000, (4.0, 2.0, 1.0, 0.5, 0.25), seed=2)
    for j, (name, method) in enumerate(sorted(pca.METHODS.items())):
        _seeded_noise(monkeypatch, 60_000 + 1000 * j)
        res = method(Task(xp, 2, 1.0, delta=0.05, norm_bound=6.0, rng=np.random.default_rng(j)))
        out[f"pca/{name}"] = np.asarray(res.output)
    xs, _, _ = subspaces(1500, 5, 2, 1, noise=0.05, seed=3)
    for j, (name, method) in enumerate(sorted(subspace.METHODS.items())):
        _seeded_noise(monkeypatch, 70_000 + 1000 * j)
        res = method(Task(xs, 2, 2.0, delta=1e-6, norm_bound=3.0, q=1,
                          rng=np.random.default_rng(j)))
        out[f"subspace/{name}"] = np.asarray(res.output)
    return out


def kernel_bound(folder: Path, monkeypatch=None) -> dict[str, np.ndarray]:
    x, _, _ = gmm(3000, 3, 2, separation=3.0, seed=7)
    np.save(folder / "x.npy", np.asarray(x, dtype=np.float32))
    arrays: dict[str, np.ndarray] = {}
    runner = CliRunner()
    for feature in ("complex", "quantized"):
        out = folder / f"{feature}.npz"
        res = runner.invoke(app, ["sketch", str(folder / "x.npy"), "--out", str(out), "--m", "64",
                                  "--r", "64", "--feature", feature, "--scale", "1.5",
                                  "--epsilon", "inf", "--seed", "3", "--quiet"])
        assert res.exit_code == 0, res.output
        loaded = load_sketch(out)
        arrays[f"sketch/{feature}"] = loaded.sketch
        freqs = draw_frequencies(loaded.spec.frequencies)
        dec = clompr(loaded.sketch, freqs.omega, freqs.xi, 3, np.full(2, -10.0), np.full(2, 10.0),
                     harmonic=4 / math.pi if feature == "quantized" else 1.0, replicates=2,
                     rng=np.random.default_rng(11))
        arrays[f"decode/{feature}/centroids"] = dec.centroids
        arrays[f"decode/{feature}/weights"] = dec.weights
        arrays[f"decode/{feature}/residual"] = np.array([dec.residual])
        masked = feature_sum([np.load(folder / "x.npy")], freqs, feature, 8, mask_seed=5, workers=1)
        arrays[f"masked/{feature}"] = np.stack([masked.re, masked.im]).astype(np.float64)
    arrays.update(_mechanisms(monkeypatch))
    return arrays


# ---- the tests -----------------------------------------------------------------------------------

def _stored() -> tuple[dict, np.lib.npyio.NpzFile]:
    meta = json.loads((GOLDEN / "golden.json").read_text())
    return meta, np.load(GOLDEN / "golden.npz")


def _assert_same(arrays: dict[str, np.ndarray], stored) -> None:
    missing = sorted(set(arrays) ^ {k for k in stored.files if k.split("/")[0] in
                                    {a.split("/")[0] for a in arrays}})
    assert not missing, f"golden keys differ: {missing}"
    differ = [k for k, v in arrays.items() if not np.array_equal(v, stored[k])]
    assert not differ, f"not bit-identical to the goldens: {differ}"


def test_portable_outputs_are_bit_identical(monkeypatch):
    meta, stored = _stored()
    scalars, arrays = portable(monkeypatch)
    assert json.loads(json.dumps(scalars)) == meta["portable"]
    _assert_same(arrays, stored)


@pytest.mark.slow
def test_kernel_bound_outputs_are_bit_identical(monkeypatch, tmp_path):
    meta, stored = _stored()
    if signature() != meta["signature"]:
        pytest.skip(f"goldens recorded on '{meta['signature']}', this machine is '{signature()}'")
    _assert_same(kernel_bound(tmp_path, monkeypatch), stored)


if __name__ == "__main__":
    import tempfile

    GOLDEN.mkdir(exist_ok=True)
    scalars, arrays = portable()
    with tempfile.TemporaryDirectory() as tmp:
        arrays.update(kernel_bound(Path(tmp)))
    np.savez(GOLDEN / "golden.npz", **arrays)
    (GOLDEN / "golden.json").write_text(json.dumps(
        {"signature": signature(), "portable": scalars}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(arrays)} arrays and {len(scalars)} paths to {GOLDEN}", file=sys.stderr)
