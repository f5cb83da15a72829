"""Privacy calibration, tested statistically: noise scales against their formulas, sensitivities
against worst-case neighbouring datasets, discrete noise against its pmf and variance."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fedsketch.common.dp.budget import add_remove_split
from fedsketch.common.dp.calibration import (
    _gauss_delta,
    dlap_param,
    dlap_variance,
    gauss_sigma_analytic,
    gauss_sigma_classical,
)
from fedsketch.common.dp.samplers import discrete_laplace
from fedsketch.common.features import C_F, MAX_ENTRY_CHANGE
from fedsketch.common.frequencies import FrequencySpec, draw_frequencies
from fedsketch.common.privacy import PrivacySpec, noise_rng, privatize
from fedsketch.common.sketching import FeatureSum, feature_sum

FEATURES = ("complex", "quantized")


def _data(n: int, d: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (n, d)).astype(np.float32)


@pytest.fixture(scope="module")
def big_sums() -> dict[str, FeatureSum]:
    """m = 20000, r = m, n = 64 records: 40000 real noise coordinates per release."""
    freqs = draw_frequencies(FrequencySpec(d=3, m=20000, scale=1.0, seed=1))
    x = _data(64, 3)
    return {f: feature_sum([x], freqs, f) for f in FEATURES}


# --- Laplace / discrete Laplace on the replace-one sketch (MECHANISMS §1.1, §1.5) -------------


def test_replace_one_complex_laplace_scale(big_sums):
    fs = big_sums["complex"]
    eps = 0.5
    rel = privatize(fs, PrivacySpec(eps))
    w = np.concatenate([(rel.sketch - fs.clean_sketch()).real, (rel.sketch - fs.clean_sketch()).imag])
    expected = C_F["complex"] * math.sqrt(fs.m) / (fs.n * eps)  # b = c_f √m/(n ε)
    b_hat = np.mean(np.abs(w))  # MLE of the Laplace scale; relative s.e. 1/√40000 = 0.5 %
    assert b_hat == pytest.approx(expected, rel=0.03)
    assert rel.noise[0].scale == pytest.approx(expected, rel=1e-12)
    # The shape is Laplace, not Gaussian with the same scale: KS against Lap(b).
    assert stats.kstest(w, "laplace", args=(0, expected)).pvalue > 1e-4
    assert rel.payload is None and rel.n == fs.n


def test_replace_one_quantized_discrete_laplace(big_sums):
    fs = big_sums["quantized"]
    eps = 2.0
    a = math.exp(-eps / (4 * fs.r))
    noise = []
    for _ in range(5):
        rel = privatize(fs, PrivacySpec(eps))
        assert rel.payload is not None and rel.payload.dtype == np.int64
        noise.append(rel.payload - np.concatenate([fs.re, fs.im]))
        # The float sketch is exactly the integer payload scaled by 1/(α n √m).
        scaled = rel.payload / (fs.alpha * fs.n * math.sqrt(fs.m))
        np.testing.assert_allclose(rel.sketch.real, scaled[: fs.m], rtol=1e-12)
    w = np.concatenate(noise)
    assert rel.noise[0].scale == pytest.approx(a, rel=1e-12)
    # 200000 draws: relative s.e. of the variance ≈ √(5/200000) = 0.5 %; 3 % is 6 s.e.
    assert np.var(w) == pytest.approx(dlap_variance(a), rel=0.03)
    assert np.mean(np.abs(w)) == pytest.approx(2 * a / (1 - a * a), rel=0.03)
    # Same noise level as the continuous mechanism once scaled (MECHANISMS §1.5).
    b = C_F["quantized"] * math.sqrt(fs.m) / (fs.n * eps)
    scaled_sd = math.sqrt(dlap_variance(a)) / (fs.alpha * fs.n * math.sqrt(fs.m))
    assert scaled_sd == pytest.approx(math.sqrt(2) * b, rel=0.01)


def test_discrete_laplace_pmf():
    a = 0.6
    w = discrete_laplace(noise_rng(), a, 400_000)
    assert w.dtype == np.int64
    for k in (0, 1, -1, 2, -2, 5):
        p = (1 - a) / (1 + a) * a ** abs(k)
        se = math.sqrt(p * (1 - p) / w.size)
        assert abs(np.mean(w == k) - p) < 5 * se, k
    assert np.var(w) == pytest.approx(dlap_variance(a), rel=0.03)


def test_noise_is_fresh_each_release(big_sums):
    fs = big_sums["complex"]
    a, b = privatize(fs, PrivacySpec(1.0)), privatize(fs, PrivacySpec(1.0))
    assert not np.array_equal(a.sketch, b.sketch)


def test_infinite_epsilon_is_clean(big_sums):
    fs = big_sums["complex"]
    rel = privatize(fs, PrivacySpec(math.inf))
    np.testing.assert_array_equal(rel.sketch, fs.clean_sketch())
    assert rel.noise == ()


# --- add/remove with a private count (§1.7) --------------------------------------------------


def test_add_remove_complex_scales(big_sums):
    fs = big_sums["complex"]
    eps = 0.5
    eps1, eps2 = add_remove_split(eps, fs.m)
    assert eps1 + eps2 == pytest.approx(eps, rel=1e-15)
    rel = privatize(fs, PrivacySpec(eps, neighbouring="add_remove"))
    num_clean = np.concatenate([fs.re, fs.im]) / (fs.alpha * math.sqrt(fs.m))
    num = np.concatenate([rel.sketch.real, rel.sketch.imag]) * max(rel.n, 1.0)
    b_expected = (C_F["complex"] / 2) * math.sqrt(fs.m) / eps1
    assert np.mean(np.abs(num - num_clean)) == pytest.approx(b_expected, rel=0.03)
    assert rel.noise[1].scale == pytest.approx(1 / eps2)


def test_add_remove_count_noise():
    """The released count is n + Lap(1/ε2) (complex) or n + DLap(e^{−ε2}) (quantized)."""
    freqs = draw_frequencies(FrequencySpec(d=2, m=50, scale=1.0))
    x = _data(500, 2)
    eps = 1.0
    _, eps2 = add_remove_split(eps, 50)
    for feature in FEATURES:
        fs = feature_sum([x], freqs, feature)
        dens = np.array(
            [privatize(fs, PrivacySpec(eps, neighbouring="add_remove")).n for _ in range(400)]
        )
        # mean |Lap(1/ε2)| = 1/ε2 = 101; s.e. 5 % over 400 draws; a factor 2 would fail.
        assert np.mean(np.abs(dens - 500)) == pytest.approx(1 / eps2, rel=0.2)
        if feature == "quantized":
            assert np.all(dens == np.round(dens))


def test_add_remove_quantized_integer_noise(big_sums):
    fs = big_sums["quantized"]
    eps = 2.0
    eps1, _ = add_remove_split(eps, fs.m)
    a = math.exp(-eps1 / (2 * fs.r))
    w = np.concatenate(
        [privatize(fs, PrivacySpec(eps, neighbouring="add_remove")).payload
         - np.concatenate([fs.re, fs.im]) for _ in range(5)]
    )
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
def test_replace_one_gaussian_scale(big_sums, feature):
    fs = big_sums[feature]
    eps, delta = 0.5, 1e-6
    rel = privatize(fs, PrivacySpec(eps, delta))
    diff = rel.sketch - fs.clean_sketch()
    w = np.concatenate([diff.real, diff.imag])
    delta2 = MAX_ENTRY_CHANGE[feature] * math.sqrt(fs.m) / (fs.n * math.sqrt(fs.r))
    sigma = gauss_sigma_analytic(delta2, eps, delta)
    assert np.std(w) == pytest.approx(sigma, rel=0.03)
    assert stats.kstest(w / sigma, "norm").pvalue > 1e-4


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
    m, d, n = 60, 2, 40
    freqs = draw_frequencies(FrequencySpec(d=d, m=m, scale=0.5, seed=3))
    rng = np.random.default_rng(11)
    x = _data(n, d, seed=5)
    alpha = r / m
    base = feature_sum([x], freqs, feature, r, mask_seed=7, workers=1)
    l1_max = l2_max = 0.0
    for _ in range(150):
        x_prime = rng.normal(0, 3, d).astype(np.float32)
        b = _neighbour_sum(freqs, feature, r, x, x_prime, relation)
        da = np.concatenate([b.re - base.re, b.im - base.im]).astype(np.float64)
        if relation == "replace_one":
            release_diff = da / (alpha * n * math.sqrt(m))  # normalized sketch, n public
        else:
            release_diff = da / (alpha * math.sqrt(m))  # numerator (1/α)Σ z⊙b
        l1_max = max(l1_max, np.abs(release_diff).sum())
        l2_max = max(l2_max, np.linalg.norm(release_diff))
        if feature == "quantized":
            assert np.abs(da).sum() <= (4 if relation == "replace_one" else 2) * r
    if relation == "replace_one":
        l1_bound = C_F[feature] * math.sqrt(m) / n
        l2_bound = MAX_ENTRY_CHANGE[feature] * math.sqrt(m) / (n * math.sqrt(r))
    else:
        l1_bound = C_F[feature] / 2 * math.sqrt(m)
        l2_bound = MAX_ENTRY_CHANGE[feature] / 2 * math.sqrt(m / r)
    assert l1_max <= l1_bound * (1 + 1e-6)
    assert l2_max <= l2_bound * (1 + 1e-6)
    # The bounds are nearly attained: with one entry per record the worst case is reached by
    # some candidate, so a bound twice too large would fail; with more entries the random
    # candidates still reach about half of it, so a constant √m too large would fail.
    floor = 0.85 if r == 1 else 0.45
    assert l1_max >= floor * l1_bound
    assert l2_max >= floor * l2_bound


def test_dlap_param_and_validation():
    assert dlap_param(1.0, 4.0) == pytest.approx(math.exp(-0.25))
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


def test_noise_generator_is_not_seeded_by_callers():
    """Two generators from the CSPRNG never coincide (128-bit seeds)."""
    a, b = noise_rng().integers(0, 2**63, 4), noise_rng().integers(0, 2**63, 4)
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("feature", FEATURES)
def test_add_remove_gaussian_scale(big_sums, feature):
    """One analytic-Gaussian σ on (numerator, count), Δ2 = √(g′²·m/r + 1), g′ = g/2 (§1.6)."""
    fs = big_sums[feature]
    eps, delta = 0.5, 1e-6
    rel = privatize(fs, PrivacySpec(eps, delta, "add_remove"))
    num_clean = np.concatenate([fs.re, fs.im]) / (fs.alpha * math.sqrt(fs.m))
    num = np.concatenate([rel.sketch.real, rel.sketch.imag]) * max(rel.n, 1.0)
    g = MAX_ENTRY_CHANGE[feature] / 2
    sigma = gauss_sigma_analytic(math.sqrt(g * g * fs.m / fs.r + 1.0), eps, delta)
    assert rel.noise[0].scale == pytest.approx(sigma, rel=1e-12)
    assert np.std(num - num_clean) == pytest.approx(sigma, rel=0.03)
