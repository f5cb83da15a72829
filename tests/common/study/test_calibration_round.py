"""Round 0's release and the sketch round's spec (fedsketch.common.study.calibration_round): what the
coordinator accepts of a calibration payload, and what a device accepts of a sketch round."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import study_spec

from fedsketch.common.sketch.box import Box
from fedsketch.common.study.calibration_round import (
    CalibrationPlan,
    SketchRound,
    check_calibration,
    release_calibration,
    split_auto,
)
from fedsketch.common.study.study import StudySpec
from fedsketch.common.study.wire import PayloadError


def auto(neighbouring: str = "replace_one") -> StudySpec:
    plan, rest = split_auto(10.0)
    base = study_spec(epsilon=rest, neighbouring=neighbouring)
    freqs = replace(base.sketch.frequencies, scale=plan.placeholder)
    return StudySpec.create("t", replace(base.sketch, frequencies=freqs), 3, base.lo, base.hi,
                            calibration=plan, max_device_records=1000)


@pytest.mark.parametrize("neighbouring", ["replace_one", "add_remove"])
def test_a_release_passes_and_what_the_mechanism_cannot_make_is_refused(neighbouring):
    spec = auto(neighbouring)
    x = np.random.default_rng(0).normal(size=(500, 3))
    n, kind, payload = release_calibration(spec, [x], Box(spec.lo, spec.hi))
    assert check_calibration(spec, kind, payload, n).shape == (2, 64)
    huge = np.frombuffer(payload, "<i8").copy()
    huge[0] = 2**40  # beyond γ·n plus the DLap radius at ε_0 (about 6·10^6 steps)
    cases = [("int32_pairs", payload, n, "travels as int64_pairs"),
             (kind, payload[:-8], n, "the study needs"),
             (kind, huge.tobytes(), n, "exceeds"),
             (kind, payload, 5000, "outside")]
    for bad_kind, data, count, message in cases:
        with pytest.raises(PayloadError, match=message):
            check_calibration(spec, bad_kind, data, count)


def test_a_sketch_round_fits_its_study_only():
    spec = auto()
    cal = {"sigma": 2.0, "choice": "fit"}
    rnd = SketchRound("st-1", "0" * 64, 2.0, "1" * 64, None, cal, spec.min_devices)
    assert SketchRound.from_json(rnd.to_json()) == rnd
    study = rnd.study(spec)
    assert (study.sketch.frequencies.scale, study.calibration, study.refine) == (2.0, None, None)
    assert study.total_epsilon == spec.sketch.privacy.epsilon
    for changes, message in (({"sigma": 20.0, "calibration": {"sigma": 20.0}}, "search range"),
                             ({"min_devices": 2}, "quorum of 2"),
                             ({"secure_aggregation": {"threshold": 1}}, "secure aggregation")):
        with pytest.raises(ValueError, match=message):
            replace(rnd, **changes).study(spec)
    with pytest.raises(ValueError, match="declares no calibration"):
        rnd.study(study)
    with pytest.raises(ValueError, match="state its σ"):
        replace(rnd, calibration={"sigma": 3.0})
    with pytest.raises(ValueError, match="placeholder"):
        replace(spec, calibration=CalibrationPlan(1.0, sigma_lo=0.5))
