"""A device's stored secure round under damage and misuse (review of the device restart): a
session resumed while the data did not open, damaged rows, another source's daemon on the same
ledger, secrets after the round, a row moved to another study, and one listing that leaves the
study out. Real coordinator over TLS on loopback, real ledger files."""

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
from fedsketch.client.secure_session import Session
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.server.bench.metrics import split


@pytest.fixture(scope="module")
def parts():
    x, _, _ = gmm(8_000, 3, 3, 3.0, seed=5)
    return np.array_split(x, 4)


def stage_of(r, study):
    return r.operator().ShowStudy(pb.StudyRef(study_id=study), metadata=(
        ("authorization", "Bearer test-operator-token"),)).stage



def test_a_session_resumed_while_the_data_was_unreadable_reaches_masked_input_cleanly(
        coordinator_round, parts):
    r = coordinator_round
    study = r.create(secure_spec(4, timeout=30.0)).study_id
    agents = [r.agent(f"f1_{i}", part) for i, part in enumerate(parts)]
    run_until(r, study, agents, lambda: stage_of(r, study) == pb.ADVERTISE_KEYS)
    data = LocalData(lambda: split(parts[0]), 3)
    calls = []

    def flaky():  # the file is briefly unreadable when the daemon comes back up, fine after
        calls.append(1)
        if len(calls) == 1:
            raise OSError("data file not mounted yet")
        return data

    path = agents[0].ledger.path
    agents[0].ledger.close()
    agents[0] = Agent(r.channel(), Ledger(path), flaky, DEFAULT_SOURCE)
    agents[0].ensure_enrolled(r.target, None, "x")
    refusals = []
    stop = time.monotonic() + 60
    while r.store.get_study(study).state in ("open", "collecting"):
        assert time.monotonic() < stop
        for i, a in enumerate(agents):
            out = a.step()
            if i == 0:
                refusals += list(out.refused.values())
        time.sleep(0.01)
    assert not any("AttributeError" in str(x) or "cannot handle" in str(x) for x in refusals), refusals
    # the data opened again long before MASKED_INPUT: the device should be in the sum
    assert agents[0].ledger.find(study) is not None, refusals


MUTATIONS = {
    "replies is a list (AttributeError)": lambda doc: doc.update(replies=[]),
    "n is 1e999 (OverflowError)": lambda doc: doc.update(n=float("inf")),
    "done holds 1e999 (OverflowError)": lambda doc: doc.update(done=[float("inf")]),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_corrupted_session_row_is_dropped_not_fatal(coordinator_round, parts, mutation, caplog):
    r = coordinator_round
    study = r.create(secure_spec(4, timeout=30.0)).study_id
    device = r.agent(f"f2_{abs(hash(mutation))}", parts[0])
    device.step()  # registered: a row is stored
    doc = json.loads(device.ledger.sessions(DEFAULT_SOURCE)[study])
    MUTATIONS[mutation](doc)
    device.ledger.save_session(study, DEFAULT_SOURCE, json.dumps(doc).encode())  # json writes Infinity
    restarted = Agent(r.channel(), device.ledger, device.data, DEFAULT_SOURCE)
    restarted.ensure_enrolled(r.target, None, "x")
    restarted.step()  # expected: the row dropped with a warning, the pass goes on
    assert "unreadable secure session" in caplog.text


def test_a_deeply_nested_row_is_unreadable_not_a_recursion_error():
    with pytest.raises(ValueError):
        Session.load("st-x", b"[" * 200_000 + b"]" * 200_000, None)


def test_another_sources_daemon_does_not_overwrite_this_sources_session(coordinator_round, parts):
    r = coordinator_round
    study = r.create(secure_spec(4, timeout=30.0)).study_id
    a = r.agent("f3", parts[0])
    a.ledger.declare("other", 1000.0)
    a.step()
    mine = a.ledger.sessions(DEFAULT_SOURCE)[study]
    other_data = LocalData(lambda: split(parts[1][:1000]), 3)  # the other source's own records
    b = Agent(r.channel(), Ledger(a.ledger.path), lambda: other_data, "other")
    b.ensure_enrolled(r.target, None, "x")
    b.step()
    assert a.ledger.sessions(DEFAULT_SOURCE).get(study) == mine


def test_a_dropped_session_leaves_no_secret_in_the_ledger_files(coordinator_round, parts):
    r = coordinator_round
    study = r.create(secure_spec(4, timeout=30.0)).study_id
    agents = [r.agent(f"f4_{i}", part) for i, part in enumerate(parts)]
    secrets = set()

    def grab():
        row = agents[0].ledger.sessions(DEFAULT_SOURCE).get(study)
        if row is not None and (client := json.loads(row)["client"]) is not None:
            secrets.update({client["c_sk"], client["s_sk"], client["b"]})
        return False

    stop = time.monotonic() + 60
    while r.store.get_study(study).state in ("open", "collecting"):
        assert time.monotonic() < stop
        for a in agents:
            a.step()
        grab()
        time.sleep(0.01)
    r.wait(study)  # decoded: a round that has ended, not one still decoding, is forgotten
    agents[0].step()  # the round is no longer listed and has ended: the row is dropped
    assert agents[0].ledger.sessions(DEFAULT_SOURCE) == {} and secrets
    files = [Path(agents[0].ledger.path), Path(agents[0].ledger.path + "-wal")]
    raw = b"".join(f.read_bytes() for f in files if f.exists())
    found = [s for s in secrets if s.encode() in raw]
    assert not found, f"{len(found)} of {len(secrets)} round secrets still in the ledger files"


def test_a_session_row_does_not_load_for_another_study(coordinator_round, parts):
    r = coordinator_round
    spec = secure_spec(4, timeout=30.0)
    study = r.create(spec).study_id
    agents = [r.agent(f"f5_{i}", part) for i, part in enumerate(parts)]
    run_until(r, study, agents, lambda: stage_of(r, study) == pb.SHARE_KEYS)
    row = agents[0].ledger.sessions(DEFAULT_SOURCE)[study]
    assert json.loads(row)["client"] is not None
    identity = agents[0].ledger.identity()
    with pytest.raises(ValueError):
        Session.load("st-0000000000000000", row, identity)



class OmitOnce:
    """The device's stub, but one ListStudies reply leaves ``study`` out once ``when()`` holds."""

    def __init__(self, stub, study, when):
        self._stub, self._study, self._when, self.omitted = stub, study, when, False

    def __getattr__(self, name):
        return getattr(self._stub, name)

    def ListStudies(self, request, timeout=None):  # noqa: N802
        reply = self._stub.ListStudies(request, timeout=timeout)
        if not self.omitted and self._when():
            self.omitted = True
            keep = [s for s in reply.studies if s.study_id != self._study]
            del reply.studies[:]
            reply.studies.extend(keep)
        return reply


def test_one_reply_that_omits_the_study_does_not_make_the_device_forget_its_round(
        coordinator_round, parts):
    r = coordinator_round
    study = r.create(secure_spec(4, timeout=30.0)).study_id
    agents = [r.agent(f"f6_{i}", part) for i, part in enumerate(parts)]
    agents[0].stub = OmitOnce(agents[0].stub, study, lambda: stage_of(r, study) == pb.MASKED_INPUT)
    stop = time.monotonic() + 60
    while r.store.get_study(study).state in ("open", "collecting"):
        assert time.monotonic() < stop
        for a in agents:
            a.step()
        time.sleep(0.01)
    assert agents[0].stub.omitted
    assert r.wait(study).state == pb.DONE, r.wait(study).detail
