"""``simulate --hostile``: hostile devices in a secure study (real coordinator, TLS gRPC on
loopback, the real device code with the simulator's one change). An inflated or random input
fails the study without publishing, by the aggregate check, and says so; a replayed input is
not caught (the report says so), and an honest run with the same seed publishes."""

from __future__ import annotations

import pytest

from fedsketch.server.sim.config import SimConfig
from fedsketch.server.sim.hostile import parse_hostile
from fedsketch.server.sim.simulate import run_simulation

SMALL = dict(devices=6, records=6000, k=3, d=2, m=200, rounds=0, secure_aggregation=True,
             stage_timeout=20.0)


@pytest.mark.parametrize("kind", ["inflate", "random"])
def test_an_inflated_or_random_secure_input_fails_the_study_by_the_aggregate_check(kind):
    report = run_simulation(SimConfig(**SMALL, hostile=f"1:{kind}"))
    assert report["relative_sse"] is None
    defended = report["hostile"]
    assert defended["defence"] == "study failed" and defended["devices"] == [5]
    assert "the aggregate is out of range: the secure sum of 6 devices" in defended["study_failed"]


def test_a_replayed_input_is_not_caught_and_an_honest_run_publishes():
    replay = run_simulation(SimConfig(**SMALL, hostile="1:replay"))
    assert replay["hostile"]["defence"] == "nothing caught"
    assert replay["relative_sse"] is not None
    honest = run_simulation(SimConfig(**SMALL))
    assert honest["hostile"] is None and honest["relative_sse"] < 2.0


@pytest.mark.parametrize("text", ["1:steal", "x:inflate", "6:inflate", "0:random", "²:inflate",
                                  "１:inflate"])
def test_bad_hostile_arguments_are_refused(text):
    with pytest.raises(ValueError, match="--hostile"):
        parse_hostile(text, 6)
