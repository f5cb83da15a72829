"""A device late for a stage of a secure round leaves it saying why: the pass returns the reason,
the device logs it, and reports its code (OTHER) to the coordinator, signed; it spends nothing,
and the others finish the round. Real coordinator over TLS on loopback, in-process devices.

The stage timeout is the secure tests' (test_secagg_round.STAGE_TIMEOUT, a wide bound for the
punctual devices); the late device misses its stage only because the test holds it back until
the coordinator has moved on."""

from __future__ import annotations

import logging
import re
import time

import numpy as np
import pytest
from conftest import META
from test_secagg_round import drive, secure_spec

from fedsketch.common.data.synthetic import gmm
from fedsketch.common.pb import fedsketch_pb2 as pb


@pytest.fixture(scope="module")
def parts():
    x, _, _ = gmm(8_000, 3, 3, 3.0, seed=7)
    return np.array_split(x, 4)


def stage_of(r, study_id: str) -> int:
    return r.operator().ShowStudy(pb.StudyRef(study_id=study_id), metadata=META).stage


@pytest.mark.parametrize("late_at, words", [  # the next stage, or the one after it if the
    # others' passes ran on into it as the late stage closed
    (pb.ADVERTISE_KEYS, "the round went on to (SHARE_KEYS|MASKED_INPUT) without this device's keys"),
    (pb.MASKED_INPUT, r"the coordinator has nothing for this device at (CONSISTENCY|UNMASK) \("),
])
def test_a_device_late_for_a_stage_says_why_and_reports_it(coordinator_round, parts, caplog,
                                                         late_at, words):
    r = coordinator_round
    study = r.create(secure_spec(4, threshold=3, dropouts=1)).study_id
    agents = [r.agent(f"late{late_at}_{i}", part) for i, part in enumerate(parts)]
    late = agents[3]
    caplog.set_level(logging.INFO, logger="fedsketch.device")
    stop = time.monotonic() + 120
    while stage_of(r, study) != late_at:  # everyone punctual up to the late stage
        assert time.monotonic() < stop, "the round did not reach the late stage"
        for agent in agents:
            agent.step()
    while stage_of(r, study) == late_at:  # the late device is held back until the stage closes
        assert time.monotonic() < stop, "the late stage did not close"
        for agent in agents[:3]:
            agent.step()
        time.sleep(0.05)
    out = late.step()
    assert re.match(words, out.refused[study]), out.refused
    assert re.search(f"refused study {study}: {words}", caplog.text)
    assert late.step().refused == {}  # out of the round for good: said once
    refusals = [(f.device_id, f.reason) for f in r.store.refusals(study, 10)[0]]
    assert refusals == [(late.ledger.identity().device_id, "other")]
    s = drive(r, study, agents[:3])
    assert s.state == pb.DONE, s.detail
    assert late.ledger.spends() == [] and [len(a.ledger.spends()) for a in agents[:3]] == [1, 1, 1]
