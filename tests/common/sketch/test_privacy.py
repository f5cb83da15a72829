"""Privacy calibration, tested statistically: every release is an integer vector on the public
grid, its noise has the law and scale of its plan, the sensitivities hold against worst-case
neighbouring datasets, and the noise is a function of OS random bits only."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import seeded_words
from scipy import stats

from fedsketch.common.dp import exact
from fedsketch.common.dp.budget import add_remove_split
from fedsketch.common.dp.calibration import (
    _gauss_delta,
    dgauss_sigma,
    dlap_param,
    dlap_variance,
    gauss_sigma_analytic,
    gauss_sigma_classical,
    l1_sensitivity,
    l2_sensitivity,
)
from fedsketch.common.features import GRID
from fedsketch.common.sketch.frequencies import FrequencySpec, draw_frequencies
from fedsketch.common.sketch.privacy import PrivacySpec, privatize
from fedsketch.common.sketch.sketching import FeatureSum, feature_sum

FEATURES = ("complex", "quantized")


def _data(n: int, d: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (n, d)).astype(np.float32)


@pytest.fixture(scope="module")
def big_sums() -> dict[str, FeatureSum]:
    """m = 20000, r = m, n = 64 records: 40000 integer noise coordinates per release."""
    freqs = draw_frequencies(FrequencySpec(d=3, m=20000, scale=1.0, seed=1))
    x = _data(64, 3)
    return {f: feature_sum([x], freqs, f) for f in FEATURES}


def _noise(fs: FeatureSum, privacy: PrivacySpec, releases: int = 1) -> np.ndarray:
    clean = np.concatenate([fs.re, fs.im])
    out = []
    for _ in range(releases):
        rel = privatize(fs, privacy)
        assert rel.payload.dtype == np.int64 and isinstance(rel.n, int)
        out.append(rel.payload - clean)
    return np.concatenate(out)


# --- discrete Laplace on the replace-one sum (MECHANISMS §1.1, §1.5, §1.10) ---------------------


@pytest.mark.parametrize("feature", FEATURES)
def test_replace_one_discrete_laplace(big_sums, feature):
    fs = big_sums[feature]
    eps = 2.0
    a = math.exp(-eps / l1_sensitivity(feature, fs.r, "replace_one"))  # Δ1 = 2rκ
    rel = privatize(fs, PrivacySpec(eps))
    assert rel.noise[0].scale == pytest.approx(a, rel=1e-12) and rel.n == fs.n
    # The normalized sketch is exactly the integer payload scaled by 1/(γ α n √m).
    scaled = rel.payload / (fs.grid * fs.alpha * fs.n * math.sqrt(fs.m))
    np.testing.assert_allclose(rel.sketch.real, scaled[: fs.m], rtol=1e-12)
    w = _noise(fs, PrivacySpec(eps), releases=5)
    # 200000 draws: relative s.e. of the variance ≈ √(5/200000) = 0.5 %; 3 % is 6 s.e., and a
    # scale off by √2 moves the variance by 100 %.
    assert np.var(w) == pytest.approx(dlap_variance(a), rel=0.03)
    assert np.mean(np.abs(w)) == pytest.approx(2 * a / (1 - a * a), rel=0.03)
    # Once scaled, the same noise level as the float mechanism b = c_f√m/(nε) (§1.1, §1.5),
    # up to the grid's κ/(√2γ) for complex (0.13 %).
    c_f = {"complex": 2 * math.sqrt(2), "quantized": 4.0}[feature]
    b = c_f * math.sqrt(fs.m) / (fs.n * eps)
    assert math.sqrt(rel.variance) == pytest.approx(math.sqrt(2) * b, rel=0.002)


def test_infinite_epsilon_is_clean(big_sums):
    fs = big_sums["complex"]
    rel = privatize(fs, PrivacySpec(math.inf))
    np.testing.assert_array_equal(rel.sketch, fs.clean_sketch())
    assert rel.noise == ()


def test_the_noise_is_a_function_of_os_bits_only(big_sums, monkeypatch):
    """Fed the same bit stream, two releases are identical; consecutive releases read fresh bits;
    numpy's generators are never touched."""
    fs = big_sums["quantized"]

    def forbidden(*args, **kwargs):
        raise AssertionError("privacy noise drew from a numpy generator")

    monkeypatch.setattr(exact, "random_words", seeded_words(1))
    monkeypatch.setattr(np.random, "default_rng", forbidden)
    monkeypatch.setattr(np.random, "Generator", forbidden)
    for privacy in (PrivacySpec(1.0), PrivacySpec(1.0, 1e-6, "add_remove")):
        first, second = privatize(fs, privacy), privatize(fs, privacy)
        assert not np.array_equal(first.payload, second.payload)  # fresh bits per release
        monkeypatch.setattr(exact, "random_words", seeded_words(2))
        again = privatize(fs, privacy)
        monkeypatch.setattr(exact, "random_words", seeded_words(2))
        np.testing.assert_array_equal(privatize(fs, privacy).payload, again.payload)
        assert not np.array_equal(again.payload, first.payload)


# --- add/remove with a private count (§1.7) --------------------------------------------------


def test_add_remove_count_noise():
    """The released count is the integer n + DLap(e^{−ε2}), for both maps."""
    freqs = draw_frequencies(FrequencySpec(d=2, m=50, scale=1.0))
    x = _data(500, 2)
    eps = 1.0
    _, eps2 = add_remove_split(eps, 50)
    a = math.exp(-eps2)
    for feature in FEATURES:
        fs = feature_sum([x], freqs, feature)
        dens = np.array(
            [privatize(fs, PrivacySpec(eps, neighbouring="add_remove")).n for _ in range(400)]
        )
        assert dens.dtype == np.int64
        # mean |DLap(a)| = 2a/(1−a²) ≈ 1/ε2 = 101; s.e. 5 % over 400 draws; a factor 2 would fail.
        assert np.mean(np.abs(dens - 500)) == pytest.approx(2 * a / (1 - a * a), rel=0.2)


def test_no_records_is_refused_under_replace_one_and_released_under_add_remove():
    """Under add/remove a device with no records releases noise and a noisy count like any
    other (declining would reveal n = 0); under replace-one n is public and 0 is refused."""
    fs = feature_sum([], draw_frequencies(FrequencySpec(d=2, m=50, scale=1.0)), "complex")
    with pytest.raises(ValueError, match="no records"):
        privatize(fs, PrivacySpec(1.0))
    rel = privatize(fs, PrivacySpec(1.0, neighbouring="add_remove"))
    assert rel.payload.shape == (100,) and rel.payload.any()  # noise only


@pytest.mark.parametrize("feature", FEATURES)
def test_add_remove_integer_noise(big_sums, feature):
    fs = big_sums[feature]
    eps = 2.0
    eps1, _ = add_remove_split(eps, fs.m)
    a = math.exp(-eps1 / l1_sensitivity(feature, fs.r, "add_remove"))  # Δ1 = rκ
    w = _noise(fs, PrivacySpec(eps, neighbouring="add_remove"), releases=5)
    assert np.var(w) == pytest.approx(dlap_variance(a), rel=0.03)


# --- Gaussian (§1.6, §0.4) ----------------------------------------------------------------------


def test_analytic_gaussian_is_tight_and_beats_classical():
    for eps, delta in [(0.1, 1e-5), (0.5, 1e-6), (0.9, 1e-3)]:
        s = gauss_sigma_analytic(1.0, eps, delta)
        assert _gauss_delta(s, 1.0, eps) <= delta
        assert _gauss_delta(s * (1 - 1e-6), 1.0, eps) > delta  # smallest such σ
        assert s < gauss_sigma_classical(1.0, eps, delta)
    # Linear in Δ2.
    assert gauss_sigma_analytic(3.0, 1.0, 1e-5) == pytest.approx(
        3 * gauss_sigma_analytic(1.0, 1.0, 1e-5), rel=1e-9
    )
    # Known value (Balle & Wang 2018, Δ = 1, ε = 1, δ = 1e-5): σ ≈ 3.73.
    assert gauss_sigma_analytic(1.0, 1.0, 1e-5) == pytest.approx(3.73, abs=0.01)


@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.parametrize("relation", ["replace_one", "add_remove"])
def test_discrete_gaussian_scale(big_sums, feature, relation):
    """N_Z(0, σ²) on the integers, σ from Δ2 of the encoded sum (§1.6, §1.10)."""
    fs = big_sums[feature]
    eps, delta = 0.5, 1e-6
    privacy = PrivacySpec(eps, delta, relation)
    eps_sum = eps if relation == "replace_one" else add_remove_split(eps, fs.m)[0]
    sigma = dgauss_sigma(l2_sensitivity(feature, fs.r, relation), eps_sum, delta)
    w = _noise(fs, privacy)
    assert privatize(fs, privacy).noise[0].scale == pytest.approx(sigma, rel=1e-12)
    assert np.std(w) == pytest.approx(sigma, rel=0.03)  # s.e. 0.35 %; √2 would fail
    assert stats.kstest(w / sigma, "norm").pvalue > 1e-4 or sigma < 3


# --- sensitivity against worst-case neighbours (§1.2) ------------------------------------------


def _neighbour_sum(freqs, feature, r, x, x_prime, relation):
    """Clean feature sum of the neighbour of X, with the same mask per record slot as X."""
    if relation == "replace_one":
        y = x.copy()
        y[0] = x_prime
        return feature_sum([y], freqs, feature, r, mask_seed=7, workers=1)
    return feature_sum([x, x_prime[None, :]], freqs, feature, r, mask_seed=7, workers=1)


@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.parametrize("relation", ["replace_one", "add_remove"])
@pytest.mark.parametrize("r", [1, 7, 60])
def test_worst_case_neighbours_within_sensitivity(feature, relation, r):
    """The encoded sums of neighbouring datasets differ by at most Δ1 in L1 and Δ2 in L2 (grid
    steps), and the bounds are nearly attained."""
    m, d, n = 60, 2, 40
    freqs = draw_frequencies(FrequencySpec(d=d, m=m, scale=0.5, seed=3))
    rng = np.random.default_rng(11)
    x = _data(n, d, seed=5)
    base = feature_sum([x], freqs, feature, r, mask_seed=7, workers=1)
    l1_max = l2_max = 0.0
    for _ in range(150):
        x_prime = rng.normal(0, 3, d).astype(np.float32)
        b = _neighbour_sum(freqs, feature, r, x, x_prime, relation)
        da = np.concatenate([b.re - base.re, b.im - base.im]).astype(np.float64)
        l1_max = max(l1_max, np.abs(da).sum())
        l2_max = max(l2_max, np.linalg.norm(da))
    l1_bound = l1_sensitivity(feature, r, relation)
    l2_bound = l2_sensitivity(feature, r, relation)
    assert l1_max <= l1_bound
    assert l2_max <= l2_bound * (1 + 1e-12)
    # With one entry per record the worst case is reached by some candidate, so a bound twice
    # too large would fail; with more entries the random candidates still reach about half of it.
    floor = 0.85 if r == 1 else 0.45
    assert l1_max >= floor * l1_bound
    assert l2_max >= floor * l2_bound


def test_dlap_param_and_validation():
    assert dlap_param(1.0, 4.0) == pytest.approx(math.exp(-0.25))
    assert GRID == {"complex": 1024, "quantized": 1}
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        PrivacySpec(0.0)
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        PrivacySpec(-1.0)
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        PrivacySpec(float("nan"))
    with pytest.raises(ValueError, match="delta must be in"):
        PrivacySpec(1.0, delta=1.0)
    with pytest.raises(ValueError, match="unknown neighbouring"):
        PrivacySpec(1.0, neighbouring="swap")
    with pytest.raises(ValueError, match="classical Gaussian"):
        gauss_sigma_classical(1.0, 1.5, 1e-5)
