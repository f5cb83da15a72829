"""The noise plan is the one source of every release's noise: the release records exactly its
terms, the terms trace the whole budget, and the sensitivities are those of MECHANISMS §1.5–1.7
and §1.10 on the encoded integer sum."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from fedsketch.common.dp.calibration import (
    dgauss_sigma,
    gauss_sigma_analytic,
    l1_sensitivity,
    l2_sensitivity,
    noise_radius,
    zcdp_delta,
)
from fedsketch.common.dp.plan import integer_sum_term, noise_plan
from fedsketch.common.dp.samplers import draw
from fedsketch.common.features import ENTRY_L1, ENTRY_L2, GRID
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec, privatize
from fedsketch.common.sketch.sketching import FeatureSum
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.study import StudySpec
from fedsketch.common.study.wire import max_abs_entry

M = 12
PATHS = [(f, r, nb, delta) for f in ("complex", "quantized") for r in (1, 5, M)
         for nb in ("replace_one", "add_remove") for delta in (0.0, 1e-6)]


def _sum(feature: str, r: int, n: int = 29) -> FeatureSum:
    i = np.arange(M, dtype=np.int64)
    return FeatureSum(feature, M, r, n, i % 7 - 3, i % 5 - 2)


@pytest.mark.parametrize(("feature", "r", "nb", "delta"), PATHS)
def test_the_release_records_its_plan_and_the_plan_spends_the_budget(feature, r, nb, delta):
    privacy = PrivacySpec(0.9, delta, nb)
    fs = _sum(feature, r)
    terms = noise_plan(feature, M, r, privacy)
    assert privatize(fs, privacy).noise == terms
    assert math.fsum(t.epsilon for t in terms) == pytest.approx(privacy.epsilon, rel=1e-15)
    assert len(terms) == (2 if nb == "add_remove" else 1)
    assert (terms[0].law == "discrete_gaussian") == (delta > 0)
    if nb == "add_remove":  # the count is always an integer with pure DLap(e^{−ε2}) noise
        assert terms[1].law == "discrete_laplace" and terms[1].sensitivity == 1
        assert terms[1].epsilon == pytest.approx(0.9 / (2 * M + 1))


def test_the_exact_circle_maximum_is_within_the_bound_kappa():
    """κ_γ bounds |round(γ cos t)| + |round(γ sin t)| over a dense grid of phases, by at most 1."""
    t = np.linspace(0, 2 * np.pi, 2_000_001)
    g = GRID["complex"]
    worst = int((np.abs(np.rint(g * np.cos(t))) + np.abs(np.rint(g * np.sin(t)))).max())
    assert worst <= ENTRY_L1["complex"] <= worst + 1
    assert worst == math.floor(math.sqrt(2) * g) + 1  # 1449 at γ = 1024
    modulus = np.hypot(np.rint(g * np.cos(t)), np.rint(g * np.sin(t))).max()
    assert modulus <= ENTRY_L2["complex"] < modulus + 2


def test_sensitivities_are_those_of_the_encoded_sum():
    assert l1_sensitivity("quantized", 7, "replace_one") == 28  # 4r (§1.5)
    assert l1_sensitivity("quantized", 7, "add_remove") == 14  # 2r (§1.7)
    assert l1_sensitivity("complex", 3, "replace_one") == 2 * 3 * 1450
    assert l1_sensitivity("complex", 3, "add_remove") == 3 * 1450
    assert l2_sensitivity("quantized", 4, "replace_one") == pytest.approx(2 * math.sqrt(2) * 2)
    assert l2_sensitivity("quantized", 4, "add_remove") == pytest.approx(math.sqrt(2) * 2)
    assert l2_sensitivity("complex", 9, "replace_one") == pytest.approx(6 * ENTRY_L2["complex"])
    with pytest.raises(ValueError, match="unknown neighbouring"):
        l1_sensitivity("quantized", 1, "swap")


def test_the_integer_release_matches_the_float_mechanism_it_replaces():
    """Normalized by γ·α·n·√m, the complex map's DLap scale tends to c_f√m/(nε), c_f = 2√2 (§1.1):
    the grid costs κ/(√2·γ) − 1 = 0.13 % more noise at γ = 1024."""
    m, r, n, eps = 100, 100, 1000, 0.5
    (term,) = noise_plan("complex", m, r, PrivacySpec(eps))
    scale_in_sketch_units = term.sensitivity / eps / (GRID["complex"] * n * math.sqrt(m))
    float_scale = 2 * math.sqrt(2) * math.sqrt(m) / (n * eps)
    assert 1.0 < scale_in_sketch_units / float_scale < 1.0014


def test_discrete_gaussian_calibration():
    """σ meets δ through the zCDP conversion, is the smallest such σ (to 1e-9), and is within
    10 % above the continuous analytic σ."""
    for eps, delta in [(0.1, 1e-6), (1.0, 1e-5), (3.0, 1e-9)]:
        sigma = dgauss_sigma(2.0, eps, delta)
        assert zcdp_delta(4.0 / (2 * sigma**2), eps) <= delta
        assert zcdp_delta(4.0 / (2 * (sigma * (1 - 1e-9)) ** 2), eps) > delta
        assert 1.0 < sigma / gauss_sigma_analytic(2.0, eps, delta) < 1.1
    # the conversion itself: ρ-zCDP gives ε = ρ + 2√(ρ ln(1/δ)) at most (Bun–Steinke), tighter here
    rho, delta = 0.05, 1e-6
    assert zcdp_delta(rho, rho + 2 * math.sqrt(rho * math.log(1 / delta))) <= delta


def test_secure_aggregation_and_the_payload_check_read_the_same_plan():
    privacy = PrivacySpec(1.3)
    sketch = SketchSpec(FrequencySpec(d=2, m=M, scale=1.0, seed=1), "quantized", 3, privacy)
    study = StudySpec.create("dp", sketch, 2, [-1.0] * 2, [1.0] * 2)
    (term,) = noise_plan("quantized", M, 3, privacy)
    assert term == integer_sum_term("quantized", 1.3, 3, "replace_one")
    assert study.noise_param() == term.scale == math.exp(-1.3 / 12)
    assert max_abs_entry(study, 50.0) == 50 + noise_radius(term.scale, 2 * M) + 1
    complex_study = StudySpec.create("dp", SketchSpec(sketch.frequencies, "complex", 3, privacy),
                                     2, [-1.0] * 2, [1.0] * 2)
    (cterm,) = noise_plan("complex", M, 3, privacy)
    assert max_abs_entry(complex_study, 50.0) == 1024 * 50 + noise_radius(cterm.scale, 2 * M) + 1


def test_draw_follows_the_law_of_the_term():
    privacy = PrivacySpec(2.0, neighbouring="add_remove")
    num, count = noise_plan("quantized", M, 2, privacy)
    assert draw(num, 5).dtype == np.int64 and draw(count, 1).shape == (1,)
    (gauss,) = noise_plan("complex", M, 2, PrivacySpec(2.0, 1e-5))
    x = draw(gauss, 200_000)
    assert x.dtype == np.int64 and np.std(x) == pytest.approx(gauss.scale, rel=0.02)


def test_the_add_remove_split_adds_up_exactly():
    """ε1 + ε2 = ε in exact rational arithmetic (the samplers read them as rationals)."""
    from fractions import Fraction

    from fedsketch.common.dp.budget import add_remove_split

    rng = np.random.default_rng(3)
    for eps, m in zip(10 ** rng.uniform(-4, 2, 2000), rng.integers(1, 100_000, 2000), strict=True):
        eps1, eps2 = add_remove_split(float(eps), int(m))
        assert Fraction(eps1) + Fraction(eps2) == Fraction(float(eps)) and eps2 > 0


def test_the_payload_check_bounds_the_count_and_the_aggregate_cannot_wrap():
    """A claimed count beyond the study's per-device cap (2^40 at most) or outside what the
    add/remove mechanism can release is refused, payload entries are bounded by the cap, and
    summing payloads that would leave int64 fails loudly instead of wrapping."""
    from fedsketch.common.study.wire import MAX_RECORDS, PayloadError, check_count, count_radius
    from fedsketch.server.decode.pipeline import average_sketch

    sketch = SketchSpec(FrequencySpec(d=2, m=M, scale=1.0, seed=1), "complex", 3, PrivacySpec(1.3))
    study = StudySpec.create("dp", sketch, 2, [-1.0] * 2, [1.0] * 2, max_device_records=MAX_RECORDS)
    check_count(study, MAX_RECORDS)
    with pytest.raises(PayloadError, match="at most 1,099,511,627,776 records per device"):
        check_count(study, MAX_RECORDS + 1)
    capped = StudySpec.create("dp", sketch, 2, [-1.0] * 2, [1.0] * 2, max_device_records=500)
    check_count(capped, 500)
    for n in (501, 1e300, 1e308, -1e308, 0, 2.5, float("nan"), float("inf")):
        with pytest.raises(PayloadError):
            check_count(capped, n)
    assert max_abs_entry(capped, 1e300) == max_abs_entry(capped, 500)
    noisy = StudySpec.create("dp", replace(sketch, privacy=PrivacySpec(1.3, 0.0, "add_remove")),
                             2, [-1.0] * 2, [1.0] * 2, max_device_records=10**5)
    radius = count_radius(noisy) + 1
    for n in (-radius, 10**5 + radius):
        check_count(noisy, n)
    for n in (-radius - 1, 10**5 + radius + 1):
        with pytest.raises(PayloadError, match="noisy count's possible range"):
            check_count(noisy, n)
    # the true count is at most the cap, whatever noisy count is declared
    assert max_abs_entry(noisy, 10**5 + radius) == max_abs_entry(noisy, 10**5 - radius)
    assert max_abs_entry(noisy, 0) < max_abs_entry(noisy, 10**5)
    big = np.full((2, M), 2**62, dtype=np.int64)
    with pytest.raises(ValueError, match="overflow int64"):
        average_sketch(study, [(1.0, big), (1.0, big)])
    half = big // 2
    assert average_sketch(study, [(1.0, half), (1.0, half)])[1:] == (2, 2.0)
