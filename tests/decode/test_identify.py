"""The noise check behind "identified" / "not identifiable": the noise variance it assumes is the
release's (privacy noise and subsampling, measured over repeated releases; a factor of 2 fails),
decodings of pure noise are never "identified", a clean signal always is, and ``decode`` says so
(a warning, the JSON's "identifiability", exit status 3 with ``--strict``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from fedsketch.cli import app
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.sketch.box import Box
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.sketching import normalized_sketch
from fedsketch.common.sketch.spec import SketchSpec, release_sketch
from fedsketch.common.study.planner import noise_variance
from fedsketch.server.cli.errors import NOT_IDENTIFIABLE_EXIT
from fedsketch.server.decode.identify import IDENTIFIED, NOT_IDENTIFIABLE, assess
from fedsketch.server.decode.pipeline import decode_centroids

BOX = Box(np.full(2, -15.0), np.full(2, 15.0))


def _spec(m: int, r: int, eps: float, relation: str = "replace_one", feature: str = "complex") -> SketchSpec:
    return SketchSpec(FrequencySpec(d=2, m=m, scale=2.0, seed=3), feature, r,
                      PrivacySpec(eps, 0.0, relation))


def _mixture(n: int) -> np.ndarray:
    return gmm(n, 3, 2, 2.5, 0)[0].astype(np.float64)


@pytest.mark.parametrize(("feature", "relation"), [("complex", "replace_one"), ("quantized", "add_remove")])
def test_privacy_part_of_the_variance_is_the_release_s(feature, relation):
    """With r = m there is no subsampling: the variance of a sketch coordinate over 40 releases
    of the same records is noise_variance's (±9 % at 4 sd for 40·2m = 9,600 deviations; ×2 or ×√2
    fail). The payloads are scaled by the true n: under add/remove the noisy count rescales the
    whole sketch, which moves no atom and is not part of v."""
    n = 2000
    x = _mixture(n)
    spec = _spec(60, 60, 0.5, relation, feature)
    releases = [release_sketch(spec, [x], BOX) for _ in range(40)]
    sketches = np.array([normalized_sketch(r.payload[:60], r.payload[60:], r.grid, r.alpha, n)
                         for r in releases])
    dev = sketches - sketches.mean(axis=0)
    measured = float(np.mean(np.concatenate([dev.real, dev.imag]) ** 2)) * 40 / 39
    assert measured == pytest.approx(noise_variance(spec, n), rel=0.09)


@pytest.mark.parametrize(("feature", "eps"), [("complex", math.inf), ("quantized", math.inf),
                                              ("complex", 0.5)])
def test_subsampling_part_of_the_variance(feature, eps):
    """r = 1 of m = 50: each release draws other entries for each record; the coordinates'
    variance over 60 releases is noise_variance's within 9 %: (1 − α)q/(αnm) with q = 1/2 for the
    complex map (records spread over many phases), q = 1 for the quantized map's ±1 parts, and at
    ε = 0.5 the privacy noise on top (about 40 % of v there: dropping either term fails)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-15, 15, (4000, 2))
    spec = _spec(50, 1, eps, feature=feature)
    sketches = np.array([release_sketch(spec, [x], BOX).sketch for _ in range(60)])
    dev = sketches - sketches.mean(axis=0)
    measured = float(np.mean(np.concatenate([dev.real, dev.imag]) ** 2)) * 60 / 59
    assert measured == pytest.approx(noise_variance(spec, 4000), rel=0.09)


def test_a_sum_of_releases_carries_one_draw_per_release():
    """Forty sums of four releases of 500 records each (r = m): the variance of the summed
    sketch, normalized by N = 2,000, is noise_variance(spec, N, draws = 4) within 9 % (one draw
    instead of four would be 4× off)."""
    x = _mixture(2000)
    spec = _spec(60, 60, 0.5)
    sketches = []
    for _ in range(40):
        total = sum(release_sketch(spec, [part], BOX).payload for part in np.array_split(x, 4))
        sketches.append(normalized_sketch(total[:60], total[60:], 1024, 1.0, 2000))
    dev = np.array(sketches) - np.mean(sketches, axis=0)
    measured = float(np.mean(np.concatenate([dev.real, dev.imag]) ** 2)) * 40 / 39
    assert measured == pytest.approx(noise_variance(spec, 2000, draws=4), rel=0.09)


def test_pure_noise_is_never_identified_and_a_clean_signal_always_is():
    """Twelve decodings of sketches that are pure Gaussian noise of the stated variance: every one
    is "not identifiable" (an atom of noise clears the threshold with probability < 1.1 %, and a
    decoding needs all three to). A mixture of 200,000 records at ε = 1: "identified", z in the
    hundreds."""
    spec = _spec(60, 60, 1.0)
    lo, hi = BOX.lo, BOX.hi
    v = 1e-4
    rng = np.random.default_rng(1)
    for _ in range(12):
        noise = (rng.standard_normal(60) + 1j * rng.standard_normal(60)) * math.sqrt(v)
        out = decode_centroids(noise, spec, 3, lo, hi, replicates=1, rng=rng)
        verdict = assess(noise, spec, out.centroids, lo, hi, v)
        assert verdict.status == NOT_IDENTIFIABLE, verdict
        assert "cannot be told from noise" in verdict.reason
    x = _mixture(200_000)
    release = release_sketch(spec, [x], BOX)
    out = decode_centroids(release.sketch, spec, 3, lo, hi, replicates=1, rng=rng)
    verdict = assess(release.sketch, spec, out.centroids, lo, hi, noise_variance(spec, release.n))
    assert verdict.status == IDENTIFIED and min(verdict.z) > 10 * verdict.threshold


def test_a_noiseless_full_sketch_has_nothing_to_judge():
    spec = _spec(60, 60, math.inf)
    assert noise_variance(spec, 1000) == 0.0
    verdict = assess(np.ones(60, complex), spec, np.zeros((3, 2)), BOX.lo, BOX.hi, 0.0)
    assert verdict.status == IDENTIFIED and verdict.z == ()
    json.dumps(verdict.to_dict(), allow_nan=False)


def test_decode_says_so_and_strict_fails(tmp_path):
    """300 records at ε = 0.5: the centroids are noise. decode warns ("unreliable", the verdict on
    what it returns) and exits 0; its JSON says "not identifiable" as the verdict's detail;
    --strict exits 3. 200,000 records: "identified", not unreliable, exit 0."""
    runner = CliRunner()
    np.save(tmp_path / "small.npy", _mixture(300))
    np.save(tmp_path / "big.npy", _mixture(200_000))
    for name, eps in (("small", "0.5"), ("big", "1")):
        res = runner.invoke(app, ["sketch", str(tmp_path / f"{name}.npy"),
                                  "--out", str(tmp_path / f"{name}.npz"), "--m", "60", "--epsilon", eps,
                                  "--bounds", "-15:15", "--scale", "2", "-q"])
        assert res.exit_code == 0, res.output
    args = ["decode", str(tmp_path / "small.npz"), "--k", "3", "--bounds", "-15:15", "-q"]
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["identifiability"]["status"] == NOT_IDENTIFIABLE
    assert out["verdict"]["status"] == "unreliable"
    assert out["verdict"]["identifiability"]["status"] == NOT_IDENTIFIABLE
    assert "warning: unreliable: some centroids cannot be told from the sketch's noise" in res.stderr
    assert "the sketch's signal is" in res.stderr  # the second finding, also unreliable
    strict = runner.invoke(app, [*args, "--strict"])
    assert strict.exit_code == NOT_IDENTIFIABLE_EXIT == 3
    assert "error: unreliable" in strict.stderr
    big = runner.invoke(app, ["decode", str(tmp_path / "big.npz"), "--k", "3", "--bounds", "-15:15", "-q",
                              "--json", "--strict"])
    assert big.exit_code == 0, big.output
    assert json.loads(big.stdout)["identifiability"]["status"] == IDENTIFIED
    assert json.loads(big.stdout)["verdict"]["status"] != "unreliable"
