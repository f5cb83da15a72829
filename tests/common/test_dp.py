"""The noise plan is the one source of every release's noise: the release records exactly its
terms, the terms trace the whole budget, and the sensitivities are those of MECHANISMS §1."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsketch.common.dp.calibration import (
    complex_l1_sensitivity,
    gaussian_l2_sensitivity,
    noise_radius,
    quantized_l1_sensitivity,
)
from fedsketch.common.dp.plan import integer_sum_term, noise_plan
from fedsketch.common.dp.samplers import draw
from fedsketch.common.features import C_F, MAX_ENTRY_CHANGE
from fedsketch.common.frequencies import FrequencySpec
from fedsketch.common.privacy import PrivacySpec, privatize
from fedsketch.common.sketching import FeatureSum
from fedsketch.common.spec import SketchSpec
from fedsketch.common.study import StudySpec
from fedsketch.common.wire import max_abs_entry

M = 12
PATHS = [(f, r, nb, delta) for f in ("complex", "quantized") for r in (1, 5, M)
         for nb in ("replace_one", "add_remove") for delta in (0.0, 1e-6)]


def _sum(feature: str, r: int, n: int = 29) -> FeatureSum:
    i = np.arange(M, dtype=np.int64)
    if feature == "quantized":
        return FeatureSum(feature, M, r, n, i % 7 - 3, i % 5 - 2)
    return FeatureSum(feature, M, r, n, np.cos(i) * 3.0, np.sin(i) * 2.0)


@pytest.mark.parametrize(("feature", "r", "nb", "delta"), PATHS)
def test_the_release_records_its_plan_and_the_plan_spends_the_budget(feature, r, nb, delta):
    privacy = PrivacySpec(0.9, delta, nb)
    fs = _sum(feature, r)
    terms = noise_plan(feature, M, r, privacy, fs.n)
    assert privatize(fs, privacy).noise == terms
    assert math.fsum(t.epsilon for t in terms) == pytest.approx(privacy.epsilon, rel=1e-15)
    assert len(terms) == (2 if nb == "add_remove" and delta == 0 else 1)
    assert all(t.law == "gaussian" for t in terms) == (delta > 0)


def test_sensitivities_are_those_of_mechanisms_section_1():
    assert quantized_l1_sensitivity(7, "replace_one") == 28.0
    assert quantized_l1_sensitivity(7, "add_remove") == 14.0
    assert complex_l1_sensitivity(16, 4.0, "replace_one") == pytest.approx(C_F["complex"])
    assert complex_l1_sensitivity(16, 4.0, "add_remove") == pytest.approx(2 * C_F["complex"])
    g = MAX_ENTRY_CHANGE["quantized"]
    assert gaussian_l2_sensitivity("quantized", 16, 4, 2.0, "replace_one") == pytest.approx(g)
    assert gaussian_l2_sensitivity("quantized", 16, 4, 2.0, "add_remove") == pytest.approx(
        math.sqrt((g / 2) ** 2 * 4 + 1))
    with pytest.raises(ValueError, match="unknown neighbouring"):
        quantized_l1_sensitivity(1, "swap")


def test_secure_aggregation_and_the_payload_check_read_the_same_plan():
    privacy = PrivacySpec(1.3)
    sketch = SketchSpec(FrequencySpec(d=2, m=M, scale=1.0, seed=1), "quantized", 3, privacy)
    study = StudySpec.create("dp", sketch, 2, [-1.0] * 2, [1.0] * 2)
    (term,) = noise_plan("quantized", M, 3, privacy, 50.0)
    assert term == integer_sum_term(1.3, 3, "replace_one")
    assert study.noise_param() == term.scale == math.exp(-1.3 / 12)
    assert max_abs_entry(study, 50.0) == 50.0 + noise_radius(term.scale, 2 * M) + 1


def test_draw_follows_the_law_of_the_term():
    privacy = PrivacySpec(2.0, neighbouring="add_remove")
    num, count = noise_plan("quantized", M, 2, privacy, 10.0)
    rng = np.random.default_rng(0)
    assert draw(num, rng, 5).dtype == np.int64 and draw(count, rng, 1).shape == (1,)
    (gauss,) = noise_plan("complex", M, 2, PrivacySpec(2.0, 1e-5), 10.0)
    x = draw(gauss, rng, 200_000)
    assert np.std(x) == pytest.approx(gauss.scale, rel=0.02)

