"""The utility planner: its noise is the mechanism's (measured over repeated releases, local and
secure; ×√2 or ×2 fail), its signal is the decoder's (a centroid's NNLS weight on a noiseless
mixture's sketch), and its verdict tells a clearly good study from a hopeless one, including the
README's old operator example."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsketch.common.data.synthetic import gmm
from fedsketch.common.dp.plan import noise_plan
from fedsketch.common.dp.samplers import dlap_noise_share
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions
from fedsketch.common.sketch.box import Box
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.sketching import normalized_sketch
from fedsketch.common.sketch.spec import SketchSpec, release_sketch
from fedsketch.common.study.planner import HOPELESS, SAFETY, WORKS, atom_weight, plan_study, residual_noise
from fedsketch.common.study.refine import split_study_epsilon
from fedsketch.common.study.study import StudySpec
from fedsketch.server.decode.identify import _unit_weights, decoder_threshold

M, D = 60, 2
BOX = Box(np.full(D, -15.0), np.full(D, 15.0))


def _study(eps: float, devices: int, *, secure: bool = False, m: int = M, r: int = M, d: int = D,
           k: int = 3, rounds: int = 0, records: int = 10**6) -> StudySpec:
    sketch_eps, refine = split_study_epsilon(eps, rounds)
    sketch = SketchSpec(FrequencySpec(d=d, m=m, scale=2.0, seed=3), "complex", r, PrivacySpec(sketch_eps))
    sa = None
    if secure:
        sa = SecAggSpec.assuming(Assumptions.from_fractions(devices, 0.1, 0.0), records, None, 30.0, None)
    return StudySpec.create("t", sketch, k, [-15.0] * d, [15.0] * d, min_devices=devices,
                            secure_aggregation=sa, refine=refine,
                            max_device_records=min(records, 10**6))


def _measured_variance(sketches: list[np.ndarray]) -> float:
    dev = np.array(sketches) - np.mean(sketches, axis=0)
    return float(np.mean(np.concatenate([dev.real, dev.imag]) ** 2)) * len(sketches) / (len(sketches) - 1)


def test_local_noise_is_one_draw_per_device():
    """Sixty sums of four devices' real releases (500 records each, r = m): the variance of the
    summed sketch's coordinates is the plan's noise_sd² within 9 % (7,200 deviations; the
    planner with one draw instead of four, or a √2 error on the sd, fails)."""
    x = gmm(2000, 3, D, 2.5, 0)[0].astype(np.float64)
    spec = _study(0.5, 4)
    sketches = []
    for _ in range(60):
        total = sum(release_sketch(spec.sketch, [part], BOX).payload for part in np.array_split(x, 4))
        sketches.append(normalized_sketch(total[:M], total[M:], 1024, 1.0, 2000))
    plan = plan_study(spec, 500, threshold=1.0)
    assert plan.draws == 4
    assert _measured_variance(sketches) == pytest.approx(plan.noise_sd ** 2, rel=0.09)


def test_secure_noise_is_devices_over_h_min_draws():
    """Ten devices' noise shares under secure aggregation (h_min = 9 of L = 10), summed, 300
    times: the variance per coordinate, normalized as the aggregate of 10 × 1,000 records is, is
    the plan's noise_sd² within 6 % (36,000 deviations of a Laplace-like law). One draw (h_min =
    L) would be 10 % low, L draws 10× high."""
    spec = _study(0.5, 10, secure=True, records=10_000)
    assert spec.assumptions.min_honest == 9
    term = noise_plan("complex", M, M, spec.sketch.privacy)[0]
    sums = [sum(dlap_noise_share(term.epsilon, term.sensitivity, 9, 2 * M) for _ in range(10))
            for _ in range(300)]
    sketches = [normalized_sketch(s[:M], s[M:], 1024, 1.0, 10_000) for s in sums]
    plan = plan_study(spec, 1000, threshold=1.0)
    assert plan.draws == pytest.approx(10 / 9)
    assert _measured_variance(sketches) == pytest.approx(plan.noise_sd ** 2, rel=0.06)


def test_atom_weight_is_the_decoder_s_weight_of_a_cluster():
    """The signal model: on the noiseless sketch of three equal unit-variance clusters (σ = 2, so
    the assumed spread σ/2 is theirs), the NNLS weight of each true centre's unit atom is
    atom_weight = κ̄/k within 10 % (point clusters, κ̄ = 1, would be 1.3× off)."""
    x, labels, centres = gmm(60_000, 3, D, 4.0, 1)
    spec = SketchSpec(FrequencySpec(d=D, m=400, scale=2.0, seed=3), "complex", 400, PrivacySpec(math.inf))
    s = release_sketch(spec, [x.astype(np.float64)], BOX).sketch
    weights = _unit_weights(np.concatenate([s.real, s.imag]), spec, np.asarray(centres))
    share = np.bincount(labels, minlength=3) / labels.size
    expected = atom_weight(spec, 3) * 3 * share
    assert weights == pytest.approx(expected, rel=0.10)


def test_old_readme_example_is_hopeless_and_the_new_one_works():
    """The README's operator example before the planner (d = k = 10, box ±15, σ = 2, ε = 0.5 with
    three refinement rounds, so 0.1 for the sketch, m = 1000, r = 1, 10 devices) with 10,000
    records per device measured relative SSE 7.0: the planner says hopeless. The example the
    README now gives (20 devices of 100,000 records, ε = 1) works."""
    old = _study(0.5, 10, m=1000, r=1, d=10, k=10, rounds=3)
    threshold = decoder_threshold(old.sketch, np.array(old.lo), np.array(old.hi))
    plan = plan_study(old, 10_000, threshold)
    assert plan.verdict == HOPELESS
    assert plan.z < threshold / 3
    assert plan.records_needed > 5 * 10_000
    new = _study(1.0, 20, m=1000, r=1, d=10, k=10, rounds=3)
    good = plan_study(new, 100_000, threshold)
    assert good.verdict == WORKS
    assert good.z > 5 * threshold


def test_records_needed_reaches_the_safe_z():
    """At records_needed per device, the predicted z is SAFETY × threshold (the closed form of
    v(N) = A/N² + B/N), here with subsampling (r = 1 of m); the summary names it and secure
    aggregation."""
    spec = _study(0.3, 8, m=200, r=1)
    plan = plan_study(spec, 1000, threshold=9.0)
    again = plan_study(spec, plan.records_needed, threshold=9.0)
    assert plan.verdict == HOPELESS
    assert again.z == pytest.approx(9.0 * SAFETY, rel=1e-9)
    assert again.verdict == WORKS
    assert f"About {plan.records_needed:,.0f} records per device" in plan.summary()
    assert "secure aggregation (about one noise draw instead of 8)" in plan.summary()


def test_residual_noise_share():
    """The noise norm is √(2m·v) for the study's draws; a residual equal to it is all noise, one
    twice as large a quarter noise."""
    spec = _study(0.5, 4)
    norm, text = residual_noise(spec, 1.0, 4, 2000)
    assert norm == pytest.approx(math.sqrt(2 * M) * plan_study(spec, 500, 1.0).noise_sd)
    assert "100 % of the residual" in residual_noise(spec, norm, 4, 2000)[1]
    assert "25 % of the residual" in residual_noise(spec, 2 * norm, 4, 2000)[1]
