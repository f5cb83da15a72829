"""A device daemon that restarts in the middle of a secure-aggregation round goes on with it from
its ledger (:mod:`fedsketch.client.secure_session`): same keys, same bytes, one masked input,
one signed survivor list. Real coordinator over TLS on loopback, real ledger files; a restart is
a new agent on the same ledger file, the old one's memory gone."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from test_secagg_round import secure_spec, spy_total

from fedsketch.client.agent import Agent
from fedsketch.client.ledger import DEFAULT_SOURCE, Ledger
from fedsketch.client.localdata import LocalData
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import wire as sw
from fedsketch.server.bench.metrics import split


@pytest.fixture(scope="module")
def parts():
    x, _, _ = gmm(8_000, 3, 3, 3.0, seed=5)
    return np.array_split(x, 4)


def test_a_device_restarted_after_every_message_stays_in_the_round(coordinator_round, parts):
    """No dropout is tolerated (4 of 4 must send). One device restarts after each message it
    sends, before the coordinator moves on: every stage gets its message, each re-send after a
    restart is byte for byte the first, its input is in the sum, it spent once, and once the
    round is over its ledger keeps no secret of it."""
    r = coordinator_round
    study = r.create(secure_spec(4, timeout=30.0)).study_id
    seen = spy_total(r, study)
    agents = [r.agent(f"s{i}", part) for i, part in enumerate(parts)]
    path, data = agents[0].ledger.path, LocalData(lambda: split(parts[0]), 3)
    sent: dict[int, list[bytes]] = {}

    def restarted(old: Agent) -> Agent:
        old.ledger.close()
        new = Agent(r.channel(), Ledger(path), lambda: data, DEFAULT_SOURCE)
        new.ensure_enrolled(r.target, None, "s0")  # enrolled: the stored identity
        send = new._stage_send

        def recording(identity, study_id, stage, body):
            send(identity, study_id, stage, body)
            sent.setdefault(stage, []).append(body)
        new._stage_send = recording
        return new

    agents[0] = restarted(agents[0])
    stop = time.monotonic() + 60
    while r.store.get_study(study).state in ("open", "collecting"):
        assert time.monotonic() < stop
        for i, a in enumerate(agents):
            before = sum(map(len, sent.values()))
            a.step()
            if i == 0 and sum(map(len, sent.values())) > before:
                agents[0] = restarted(agents[0])  # killed right after its message went out
                agents[0].step()  # up again before the others move the stage on
        time.sleep(0.01)
    assert r.wait(study).state == pb.DONE
    assert set(sent) == set(sw.STAGES)
    assert all(len(set(bodies)) == 1 for bodies in sent.values()), {s: len(b) for s, b in sent.items()}
    assert seen["devices"] == 4
    book = agents[0].ledger
    assert [s.study_id for s in book.spends()] == [study] and book.find(study).acked_at is not None
    agents[0].step()
    assert book.sessions(DEFAULT_SOURCE) == {}


def test_a_stored_session_that_does_not_load_drops_out_of_the_round(coordinator_round, parts, caplog):
    """A session row the daemon cannot read (here: truncated) is dropped with a warning and the
    restarted daemon's pass goes on: the round is still at REGISTER, so the device registers
    again (the same message) and keeps a new, readable session."""
    r = coordinator_round
    study = r.create(secure_spec(4, timeout=30.0)).study_id
    device = r.agent("t0", parts[0])
    device.step()
    first = device.ledger.sessions(DEFAULT_SOURCE)[study]
    device.ledger.save_session(study, DEFAULT_SOURCE, first[:40])
    restarted = Agent(r.channel(), device.ledger, device.data, DEFAULT_SOURCE)
    restarted.ensure_enrolled(r.target, None, "t0")
    restarted.step()
    stored = device.ledger.sessions(DEFAULT_SOURCE)[study]
    assert json.loads(stored)["replies"] == json.loads(first)["replies"]
    assert "unreadable secure session" in caplog.text and "drops out of the round" in caplog.text
