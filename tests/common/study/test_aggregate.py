"""The aggregate check (fedsketch.common.study.aggregate): honest sums pass, at the worst case the
mechanism allows, and the measured false-alarm rate of its noise radius stays below its stated
tail; inflated, random and miscounted sums fail with the reason."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import study_spec

from fedsketch.common.dp.calibration import noise_radius
from fedsketch.common.dp.plan import integer_sum_term
from fedsketch.common.dp.samplers import dlap_noise_share
from fedsketch.common.features import ENTRY_L1
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions
from fedsketch.common.sketch.box import Box
from fedsketch.common.sketch.frequencies import draw_frequencies
from fedsketch.common.sketch.privacy import privatize
from fedsketch.common.sketch.sketching import feature_sum
from fedsketch.common.study.aggregate import (
    VIOLATION,
    AggregateError,
    check_cells_sum,
    check_sketch_sum,
    sketch_bound,
)
from fedsketch.common.study.refine import RefineSpec, RoundSpec, round_cells
from fedsketch.common.study.secure_rounds import SecureRound

L, D, CAP = 6, 1, 400


def secure_spec(epsilon: float = 1.0, feature: str = "complex"):
    trust = Assumptions(L, D, 0)
    return study_spec(epsilon=epsilon, feature=feature, r=1, min_devices=L, max_device_records=CAP,
                      secure_aggregation=SecAggSpec.assuming(trust, L * CAP),
                      refine=RefineSpec((epsilon,)))


def encoded(spec, x: np.ndarray) -> np.ndarray:
    """A device's exact encoded sum (2m,) of records ``x``, as the device computes it."""
    box = Box(spec.lo, spec.hi)
    fs = feature_sum(box.centred([x.astype(np.float32)]),
                     box.reduce(draw_frequencies(spec.sketch.frequencies)), spec.sketch.feature,
                     spec.sketch.r)
    return np.concatenate([fs.re, fs.im]).astype(np.int64)


def one_point(spec, n: int, where: float = 3.0) -> np.ndarray:
    """n records at one point: every record's feature adds up in phase (the clean sum's worst
    case, |entry| close to γ·n)."""
    return np.full((n, spec.sketch.frequencies.d), where)


@pytest.mark.parametrize("a, dim, shape", [(0.5, 50, 1.0), (0.9, 20, 2.5), (0.97, 8, 6.0)])
def test_measured_false_alarm_rate_stays_below_the_stated_tail(a, dim, shape):
    """The radius at a tail of 1/16 per study (measurable; the check uses 2^-40): over 4,000
    simulated studies of dim coordinates of NB(ρ, a) − NB(ρ, a) noise, the share with some
    entry beyond it is below 1/16 plus four binomial standard deviations."""
    tail, studies = 1 / 16, 4000
    t = noise_radius(a, dim, shape, log_tail=math.log(tail))
    rng = np.random.default_rng(7)
    z = (rng.negative_binomial(shape, 1 - a, (studies, dim))
         - rng.negative_binomial(shape, 1 - a, (studies, dim)))
    rate = float((np.abs(z).max(axis=1) > t).mean())
    assert rate <= tail + 4 * math.sqrt(tail * (1 - tail) / studies)


def test_honest_secure_sums_at_the_cap_pass_and_inflated_or_random_ones_fail():
    """L devices at the cap, all records at one point, with their exact noise shares: the check
    passes in 20 rounds. One device inflating its input 100× or sending
    uniform words fails it, and says why."""
    spec = secure_spec()
    clean = encoded(spec, one_point(spec, CAP))
    kappa = ENTRY_L1["complex"]  # the worst case indeed: each record's r = 1 entry near κ
    assert np.abs(clean).sum() > 0.6 * kappa * CAP
    term = integer_sum_term("complex", 1.0, spec.sketch.r, "replace_one")
    h_min = spec.assumptions.min_honest
    for _ in range(20):
        total = sum(clean + dlap_noise_share(term.epsilon, term.sensitivity, h_min, clean.size)
                    for _ in range(L))
        check_sketch_sum(spec, total, L * CAP, L, secure=True)
    honest = sum(clean for _ in range(L - 1))
    with pytest.raises(AggregateError, match=VIOLATION):
        check_sketch_sum(spec, honest + 100 * encoded(spec, one_point(spec, 50)), (L - 1) * CAP
                         + 50, L, secure=True)
    words = np.random.default_rng(1).integers(0, 2**40, clean.size)  # a 41-bit modulus's words
    with pytest.raises(AggregateError, match="secure sum of 6 devices"):
        check_sketch_sum(spec, honest + words - 2**39, L * CAP, L, secure=True)


def test_plain_sums_of_private_releases_pass_and_one_beyond_fails():
    """K plain releases (each its own full noise draw) at the cap pass the plain bound; the
    same sum with one entry past γ·N + t fails."""
    spec = study_spec(epsilon=1.0, r=1, max_device_records=CAP)
    box = Box(spec.lo, spec.hi)
    freqs = box.reduce(draw_frequencies(spec.sketch.frequencies))
    fs = feature_sum(box.centred([one_point(spec, CAP).astype(np.float32)]), freqs, "complex",
                     spec.sketch.r)
    total = sum(privatize(fs, spec.sketch.privacy).payload for _ in range(5))
    check_sketch_sum(spec, total, 5 * CAP, 5, secure=False)
    total[3] = sketch_bound(spec, 5 * CAP, 5, secure=False) + 1
    with pytest.raises(AggregateError, match="the sum of 5 devices"):
        check_sketch_sum(spec, total, 5 * CAP, 5, secure=False)


def test_secure_cells_pass_honestly_and_fail_when_inflated_or_miscounted():
    """A refinement round's summed cells from L honest devices at the cap, all records at one
    point (exact shares), pass;
    one device's sums ×100, cells of 400 records from one that registered 20, or counts moved
    from one cell to another, fail."""
    spec = secure_spec()
    rnd = RoundSpec("st-x", "0" * 64, 1, ((3.0, 3.0, 3.0), (-3.0, -3.0, -3.0)), L, None,
                    secure_aggregation={})
    protocol = SecureRound(spec, rnd)
    x = np.repeat([[5.0] * 3, [-5.0] * 3], CAP // 2, axis=0)  # each cell's offsets in phase
    counts, sums, _ = round_cells(Box(spec.lo, spec.hi), rnd, [x])
    exact = np.concatenate([counts, sums.ravel()]).astype(np.int64)
    for _ in range(5):
        total = sum(exact + protocol.noise_shares() for _ in range(L))
        check_cells_sum(spec, rnd, *protocol.cells(total), L * CAP, L, secure=True)
    honest = sum(exact for _ in range(L - 1))
    inflated = honest + np.concatenate([counts, 100 * sums.ravel()])
    with pytest.raises(AggregateError, match="sum of .* steps in cell"):
        check_cells_sum(spec, rnd, *protocol.cells(inflated), L * CAP, L, secure=True)
    with pytest.raises(AggregateError, match="counts 2,400 records in its cells"):  # 20 declared
        check_cells_sum(spec, rnd, *protocol.cells(honest + exact), (L - 1) * CAP + 20, L,
                        secure=True)
    moved = honest + np.concatenate([counts + [-10 * CAP, 10 * CAP], sums.ravel()])
    with pytest.raises(AggregateError, match="has a cell count of"):  # the total is right
        check_cells_sum(spec, rnd, *protocol.cells(moved), L * CAP, L, secure=True)
