"""What the coordinator counts of a secure round against a device's declared budget (review
findings 2 and 3): a registration while the device is still in the running round (``running``),
nothing once the round dropped it or it declined, the round's cost for good once it masked;
a refusal names running rounds apart from stored releases and is a retry on the device while
they run; ``device budget --verify --coordinator`` reports an ended round's spend the ledger
lost. In-process coordinator over TLS on loopback, real gRPC, real ledger files."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest
from test_secagg_round import secure_spec

from fedsketch.client.ledger_verify import verify
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import wire as sw


@pytest.fixture(scope="module")
def parts():
    x, _, _ = gmm(8_000, 3, 3, 3.0, seed=5)
    return np.array_split(x, 6)


def stage(r, study):
    row = r.store.secure_round(study)
    return pb.REGISTER if row is None else row.stage


def run_until(r, study, agents, until, timeout=60.0):
    """Step ``agents`` until ``until()`` holds, checked before every step (a stage that opens
    mid-pass is not stepped through: checked only between passes, the round could run past
    SHARE_KEYS to MASKED_INPUT within one pass, and did once under load)."""
    stop = time.monotonic() + timeout
    while r.store.get_study(study).state in ("open", "collecting"):
        assert time.monotonic() < stop
        for a in agents:
            if until():
                return
            a.step()
        time.sleep(0.01)


def charges(r, agent):
    return [(c.study_id, c.epsilon, c.secure, c.running)
            for c in r.store.account(agent.ledger.identity().device_id).charges]


def test_a_device_the_round_dropped_or_that_declined_is_not_charged(coordinator_round, parts):
    """Six devices of declared ε = 1 register in a round of ε = 0.6 (two dropouts allowed).
    While the round is at ADVERTISE_KEYS each is charged 0.6, running. Device 0 leaves and
    reports that it declines: it is no longer charged. Device 1 sends no ADVERTISE_KEYS: once
    SHARE_KEYS opens, the round has dropped it and it is no longer charged either; the others
    are, and once they masked, for good."""
    r = coordinator_round
    study = r.create(secure_spec(6, epsilon=0.6, dropouts=2, timeout=30.0)).study_id
    agents = [r.agent(f"c{i}", part, budget=1.0) for i, part in enumerate(parts)]
    run_until(r, study, agents, lambda: stage(r, study) == pb.ADVERTISE_KEYS)
    assert all(charges(r, a) == [(study, 0.6, True, True)] for a in agents)
    listed = {s.study_id: s for s in agents[0].stub.ListStudies(
        agents[0]._read(agents[0].ledger.identity(), "ListStudies")).studies}
    agents[0]._leave_session(study, agents[0]._sessions[study], "test")  # the device declines
    agents[0]._unreported[study] = (listed[study], pb.OTHER)  # and reports it (signed)
    agents[0]._report_refusals(agents[0].ledger.identity(), {study})
    assert charges(r, agents[0]) == []
    assert charges(r, agents[1]) == [(study, 0.6, True, True)]
    run_until(r, study, [agents[0], *agents[2:]], lambda: stage(r, study) == pb.SHARE_KEYS)
    assert charges(r, agents[1]) == []  # dropped at ADVERTISE_KEYS
    assert charges(r, agents[2]) == [(study, 0.6, True, True)]
    run_until(r, study, agents[2:], lambda: stage(r, study) == pb.CONSISTENCY)
    assert charges(r, agents[2]) == [(study, 0.6, True, False)]  # masked: spent, not running
    assert charges(r, agents[0]) == charges(r, agents[1]) == []
    run_until(r, study, agents[2:], lambda: False)
    assert r.wait(study).state == pb.DONE
    assert charges(r, agents[2]) == [(study, 0.6, True, False)]
    assert charges(r, agents[0]) == charges(r, agents[1]) == []


def test_a_refusal_names_running_rounds_and_is_a_retry_while_they_run(coordinator_round, parts):
    """A device in a running round of ε = 0.6 (declared 1.0) whose ledger has room (its owner
    raised the local budget) registers in a second round of 0.6: the coordinator refuses it,
    naming the running round apart from stored releases (there are none), and the device takes
    it as a retry (the study is not refused for good)."""
    r = coordinator_round
    spec = secure_spec(6, epsilon=0.6, dropouts=2, timeout=60.0)
    first = r.create(spec).study_id
    agents = [r.agent(f"d{i}", part, budget=1.0) for i, part in enumerate(parts)]
    run_until(r, first, agents, lambda: stage(r, first) == pb.ADVERTISE_KEYS)
    a = agents[0]
    identity = a.ledger.identity()
    second = r.create(spec).study_id
    with pytest.raises(grpc.RpcError) as caught:
        a._stage_send(identity, second, pb.REGISTER, sw.register_body(2000))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    text = caught.value.details()
    assert text.startswith("declared_budget_exceeded")
    assert "stored releases of 0 studies from it worth ε = 0" in text
    assert f"registered in 1 running secure rounds worth ε = 0.6 ({first})" in text
    a.ledger._conn.execute("UPDATE sources SET epsilon = 10.0")  # the owner's local budget
    refused = {}
    for _ in range(4):  # prepare, register (refused), prepare again, register again (refused)
        refused.update(a.step().refused)
    assert "declared_budget_exceeded" in refused[second]
    assert second not in a._refused  # tried again next pass
    assert r.store.stage_messages(second) == []


def test_verify_reports_an_ended_rounds_spend_the_ledger_lost(coordinator_round, parts, tmp_path):
    """A round that finished with the device's masked input: the coordinator keeps its charge
    (not running). The device's spend rows are deleted: ``verify`` against the coordinator
    reports the secure study as lost (it listed it as a running round before)."""
    r = coordinator_round
    study = r.create(secure_spec(6, epsilon=0.6, timeout=30.0)).study_id
    agents = [r.agent(f"v{i}", part, budget=1.0) for i, part in enumerate(parts)]
    run_until(r, study, agents, lambda: False)
    assert r.wait(study).state == pb.DONE
    assert charges(r, agents[0]) == [(study, 0.6, True, False)]
    book = agents[0].ledger
    holds, problems = verify(book, r.target, r.certs.ca_cert)
    assert problems == [], problems
    book._conn.execute("DELETE FROM spends")
    holds, problems = verify(book, r.target, r.certs.ca_cert)
    assert any(study in p and "does not record" in p for p in problems), (holds, problems)
    assert not any(study in h for h in holds), holds
