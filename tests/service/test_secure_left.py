"""A device out of a secure round keeps nothing of it but that it left (review findings 4 and 5):
its exact input x and noise share e are erased from the ledger, row, pages and write-ahead log,
as soon as it leaves and as soon as its masked input is sent; a daemon restarted after leaving
before its REGISTER was taken does not register again. Real coordinator over TLS on loopback,
real ledger files."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from test_secagg_round import secure_spec
from test_secure_charges import run_until

from fedsketch.client.agent import Agent
from fedsketch.client.ledger import DEFAULT_SOURCE, Ledger
from fedsketch.client.localdata import LocalData
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.server.bench.metrics import split


@pytest.fixture(scope="module")
def parts():
    x, _, _ = gmm(8_000, 3, 3, 3.0, seed=5)
    return np.array_split(x, 4)


def stored(agent: Agent, study: str) -> dict:
    return json.loads(agent.ledger.sessions(DEFAULT_SOURCE)[study])


def file_bytes(agent: Agent) -> bytes:
    path = Path(agent.ledger.path)
    return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())



def test_x_and_e_are_erased_once_the_masked_input_is_sent(coordinator_round, parts):
    """Once MASKED_INPUT is in the session's ``done``, the stored session holds neither x nor e,
    and neither's bytes are anywhere in the ledger file or its write-ahead log (the spend keeps
    x + e only)."""
    r = coordinator_round
    study = r.create(secure_spec(4, timeout=30.0)).study_id
    agents = [r.agent(f"m{i}", part) for i, part in enumerate(parts)]
    agents[0].step()  # prepares its input: x and e are in the session
    row = stored(agents[0], study)
    x, e = row["input"], row["noise"]
    assert x is not None and e is not None and x.encode() in file_bytes(agents[0])
    run_until(r, study, agents,
              lambda: pb.MASKED_INPUT in agents[0]._sessions[study].done)
    row = stored(agents[0], study)
    assert row["input"] is None and row["noise"] is None and row["client"] is not None
    raw = file_bytes(agents[0])
    assert x.encode() not in raw and e.encode() not in raw  # (x + e, kept by the spend, is
    # x's own words at this study's ε = 1000, where e is all but 0: raw words are not checked)
    run_until(r, study, agents, lambda: False)
    assert r.wait(study).state == pb.DONE  # the round went on without them


def test_a_device_that_leaves_the_round_keeps_only_that_it_left(coordinator_round, parts):
    """A device whose keys are lost (its session has no client at SHARE_KEYS) leaves the round:
    the stored session is marked left and holds no x, e or client state, in the row, the file's
    pages or its write-ahead log, though the coordinator never says the round ended."""
    r = coordinator_round
    study = r.create(secure_spec(4, dropouts=1, timeout=30.0)).study_id
    agents = [r.agent(f"l{i}", part) for i, part in enumerate(parts)]
    run_until(r, study, agents, lambda: r.store.secure_round(study) is not None
              and r.store.secure_round(study).stage == pb.SHARE_KEYS)
    row = stored(agents[0], study)
    x, client = row["input"], row["client"]
    assert x is not None and client is not None
    agents[0]._sessions[study].client = None  # its keys are gone: it cannot take part
    agents[0].step()
    row = stored(agents[0], study)
    assert row["left"] is True
    assert row["input"] is None and row["noise"] is None and row["client"] is None
    raw = file_bytes(agents[0])
    assert x.encode() not in raw and client["b"].encode() not in raw


def test_a_restarted_daemon_does_not_register_again_for_a_round_it_left(coordinator_round, parts):
    """Left at REGISTER before the coordinator took it (the agent could not handle the study),
    then restarted: the new daemon sends no REGISTER (the coordinator would count a ghost)."""
    r = coordinator_round
    study = r.create(secure_spec(4, timeout=30.0)).study_id
    a = r.agent("g0", parts[0])
    a.step()  # prepared, not registered yet
    a._leave_session(study, a._sessions[study], "test")
    a.ledger.close()
    data = LocalData(lambda: split(parts[0]), 3)
    new = Agent(r.channel(), Ledger(a.ledger.path), lambda: data, DEFAULT_SOURCE)
    new.ensure_enrolled(r.target, None, "g0")
    sent = []
    new._stage_send = lambda identity, sid, stage, body: sent.append(stage)
    for _ in range(3):
        new.step()
    assert sent == []
    assert r.store.stage_messages(study) == []


def test_a_device_that_sent_no_masked_input_signs_and_unmasks_nothing(coordinator_round, parts):
    """A coordinator that routes the survivor list to a device whose masked input it never got
    (here: the list another survivor fetched, handed to device 0) gets no signature from it:
    the device leaves the round, and the store holds no CONSISTENCY message of it."""
    r = coordinator_round
    study = r.create(secure_spec(4, dropouts=1, timeout=30.0)).study_id
    agents = [r.agent(f"n{i}", part) for i, part in enumerate(parts)]
    run_until(r, study, agents, lambda: r.store.secure_round(study) is not None
              and r.store.secure_round(study).stage == pb.MASKED_INPUT)
    run_until(r, study, agents[1:], lambda: r.store.secure_round(study).stage == pb.CONSISTENCY)
    other = agents[1]
    agents[0]._stage_fetch = lambda identity, sid, stage: other._stage_fetch(
        other.ledger.identity(), sid, stage)
    refused: dict[str, str] = {}
    for _ in range(100):  # the survivor list may not be fetchable the moment CONSISTENCY opens
        refused = agents[0].step().refused
        if study in refused:
            break
        time.sleep(0.1)
    assert "sent no masked input: it signs and unmasks nothing" in refused.get(study, ""), refused
    assert stored(agents[0], study)["left"] is True
    me = agents[0].ledger.identity().device_id
    assert me not in {m.device_id for m in r.store.stage_messages(study)
                      if m.stage == pb.CONSISTENCY}
