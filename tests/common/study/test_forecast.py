"""The planner's forecast of the verdict (fedsketch.common.study.forecast) for a whole study: good
where the last round's noise is small, unreliable where it swamps the clusters, and never good
with one refinement round, whose verdict has no over-seeded cells to measure the spread by."""

from __future__ import annotations

import numpy as np

from fedsketch.common.study.forecast import forecast
from fedsketch.common.study.verdict import CAVEATS, GOOD, UNRELIABLE
from fedsketch.server.decode.identify import decoder_threshold
from fedsketch.server.sim.config import SimConfig
from fedsketch.server.sim.simulate import _study_spec


def _forecast(records: int, epsilon: float, rounds: int, devices: int = 1):
    box = ((-6.0,) * 3, (6.0,) * 3)
    spec = _study_spec(SimConfig(devices=devices, records=records, k=5, d=3, m=300, epsilon=epsilon,
                                 scale=None, seed=0, box=box, rounds=rounds))
    threshold = decoder_threshold(spec.sketch, np.array(box[0]), np.array(box[1]))
    return forecast(spec, records / devices, threshold, devices)


def test_many_records_forecast_good_and_few_unreliable():
    """10⁶ records on one device at ε = 2 with three rounds: good; 200 records on 10 devices at ε =
    0.1: unreliable, with the records that would make it good in the reason."""
    good = _forecast(1_000_000, 2.0, 3)
    assert good.status == GOOD, good.reason
    bad = _forecast(200, 0.1, 3, devices=10)
    assert bad.status == UNRELIABLE and "would make it good" in bad.reason


def test_one_round_is_never_forecast_good():
    """The same well-off study with one refinement round: caveats, saying why."""
    one = _forecast(1_000_000, 2.0, 1)
    assert one.status == CAVEATS and "over-seeded" in one.reason, one.reason
