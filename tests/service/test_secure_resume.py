"""A secure-aggregation round rebuilt from the store (:meth:`SecAggRound.resume`) is the round
the coordinator holds in memory, after every message of every stage; a coordinator restarted on
the store in the middle of a secure refinement round resumes it, and the study ends with every
round (real TLS on loopback, in-process devices that keep their sessions across the restart);
a stage whose timeout passed while the coordinator was down stays open a grace after the restart.
The same with real processes and SIGKILL: ``test_secure_crash.py``."""

from __future__ import annotations

import hashlib
import json
import math
import time

import grpc
import numpy as np
import pytest
from conftest import OPERATOR_TOKEN
from test_secagg_round import secure_spec, spy_total
from test_secure_refine import secure_refined, sketch_all_four

from fedsketch.common.data.synthetic import gmm
from fedsketch.common.net.tls import secure_channel, server_tls
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.secagg import wire as sw
from fedsketch.server.errors import Code, Refusal
from fedsketch.server.service.api import build_server
from fedsketch.server.service.coordinator import Coordinator
from fedsketch.server.service.secure_round import SecAggRound


@pytest.fixture(scope="module")
def parts():
    x, _, _ = gmm(8_000, 3, 3, 3.0, seed=11)
    return np.array_split(x, 4)


def state(r: SecAggRound) -> tuple:
    """Everything a round routes, decides or waits on."""
    return (r.stage, {s: {u: digest for u, (digest, _) in box.items()} for s, box in r._inbox.items()},
            r._outbox, r._shared_body, r._params, r._records, r._survivors)


def test_a_round_rebuilt_from_the_store_is_the_round_in_memory(coordinator_round, parts):
    """After each device's step, from REGISTER to the unmasked sum, a round resumed from the
    store routes the same bytes, holds the same messages and waits for the same deadline (REGISTER:
    its first registration, stored a moment before the round read its clock), a message re-sent
    to a stage that closed since is acknowledged again (different bytes refused) and one larger
    than the stage allows is refused and not kept; once over, the
    store holds the sum the coordinator decoded, the sum of the inputs before the masks that
    the devices recorded in their ledgers. Devices in the round poll often (``waiting``) until it
    ends."""
    r = coordinator_round
    study = r.create(secure_spec(4, timeout=60.0)).study_id
    live = r.coordinator.rounds[study]
    seen = spy_total(r, study)
    agents = [r.agent(f"r{i}", part) for i, part in enumerate(parts)]
    compared = set()
    stop = time.monotonic() + 60
    while not live.finished:
        assert time.monotonic() < stop
        for a in agents:
            a.step()
            if live.finished:
                break
            resumed = SecAggRound.resume(study, live.spec, r.store, None, None)
            assert state(resumed) == state(live) and resumed.members() == live.members()
            assert math.isclose(resumed.deadline, live.deadline, abs_tol=0.5)
            compared.add(live.stage)
            if live.stage == pb.SHARE_KEYS:  # a REGISTER whose ack was lost, sent again
                kept = r.store.stage_messages(study)
                bloated = sw.dump(dict.fromkeys(live._params.device_ids, "A" * 2100))
                with pytest.raises(Refusal, match=r"more than this round takes \(8,192\)"):
                    live.receive(next(u for u in live._params.device_ids
                                      if u not in live._inbox[pb.SHARE_KEYS]), pb.SHARE_KEYS, bloated)
                assert r.store.stage_messages(study) == kept  # refused: nothing kept
                first = kept[0]
                assert live.receive(first.device_id, pb.REGISTER, first.body) is True
                with pytest.raises(Refusal) as late:
                    live.receive(first.device_id, pb.REGISTER, b'{"n":1}')
                assert late.value.code == Code.CONFLICT
    assert compared == set(sw.STAGES)
    assert all(a.waiting for a in agents)  # in a live round: the daemon polls at its base rate
    assert r.wait(study).state == pb.DONE
    for a in agents:
        a.step()  # the study is no longer listed: the session ends
        assert not a.waiting
    kept = r.store.secure_round(study)
    assert kept.ended and (kept.devices, kept.records) == (seen["devices"], seen["records"]) == (
        4, 8_000.0)
    assert np.array_equal(np.frombuffer(kept.total, "<i8"), seen["total"])
    premasks = [np.frombuffer(a.ledger.find(study).premask, "<i8") for a in agents]
    assert np.array_equal(sum(premasks), seen["total"])  # each device's x + e, as it recorded it
    assert r.store.stage_messages(study) == []


def test_a_coordinator_restarted_during_a_secure_refinement_round_resumes_it(coordinator_round,
                                                                            parts):
    """Round 1 of a secure study with two rounds: the coordinator stops once round 1's SHARE_KEYS
    is open and one device's shares are kept; a new coordinator on the same store (a new port,
    the devices' sessions kept) finishes round 1 and round 2, each device spending once on the
    sketch and each round. The sketch's round, over before the restart, keeps its roster (who may
    read the study and its rounds)."""
    r = coordinator_round
    created = r.create(secure_refined(50.0))
    study = created.study_id
    agents = [r.agent(f"f{i}", part, budget=500.0) for i, part in enumerate(parts)]
    sketch_all_four(r, created, agents)
    def at_share_keys() -> bool:
        rounds = r.store.rounds(study)
        kept = rounds and r.store.secure_round(rounds[0].study_id)
        return bool(kept) and kept.stage == pb.SHARE_KEYS and any(
            m.stage == pb.SHARE_KEYS for m in r.store.stage_messages(rounds[0].study_id))

    stop = time.monotonic() + 60
    while not at_share_keys():  # checked after each step: the fourth device's shares close it
        assert time.monotonic() < stop
        for a in agents:
            a.step()
            if at_share_keys():
                break
    sketch_members = r.coordinator.round_of(study).members()
    assert sorted(sketch_members) == sorted(a.ledger.identity().device_id for a in agents)
    r.coordinator.stop()  # the fixture's server and coordinator end; the store stays
    server, restarted, port = build_server(
        r.store, hashlib.sha256(OPERATOR_TOKEN.encode()).hexdigest(), "127.0.0.1:0",
        server_tls(r.certs.server_cert, r.certs.server_key))
    try:
        # the sketch's round had ended: its roster is the store's, so its devices still read it
        assert restarted.round_of(study).members() == sketch_members
        for a in agents:
            a.stub = pb_grpc.DeviceStub(secure_channel(f"localhost:{port}", r.certs.ca_cert))
        while r.store.get_study(study).state != "done":
            assert time.monotonic() < stop + 60
            for a in agents:
                a.step()
            time.sleep(0.02)
    finally:
        server.stop(grace=None).wait()
        restarted.stop()
    assert [row.state for row in r.store.rounds(study)] == ["done", "done"]
    assert json.loads(r.store.get_result(study))["refined_rounds"] == 2
    for a in agents:
        assert sorted(s.round for s in a.ledger.spends()) == [0, 1, 2]


class Unavailable(grpc.RpcError):
    """What a device sees when the coordinator dies after storing its message, before the ack."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection lost"


def test_a_device_whose_acks_are_lost_resends_the_same_bytes_and_stays_in(coordinator_round,
                                                                          parts):
    """One device loses the acknowledgement of its message at every stage (the call fails with
    UNAVAILABLE after the coordinator kept it): its next pass re-sends the same bytes, which the
    round acknowledges as a re-send, so it stays in the round and its input is in the sum."""
    r = coordinator_round
    study = r.create(secure_spec(4, timeout=10.0)).study_id
    seen = spy_total(r, study)
    agents = [r.agent(f"l{i}", part) for i, part in enumerate(parts)]
    flaky, sent = agents[0], {}
    send = flaky._stage_send

    def lose_first_ack(identity, study_id, stage, body):
        send(identity, study_id, stage, body)
        sent.setdefault(stage, []).append(body)
        if len(sent[stage]) == 1:
            raise Unavailable()

    flaky._stage_send = lose_first_ack
    stop = time.monotonic() + 60
    while r.store.get_study(study).state in ("open", "collecting"):
        assert time.monotonic() < stop
        for a in agents:
            try:
                a.step()
            except grpc.RpcError as exc:  # the daemon logs it and tries again after a backoff,
                assert a is flaky and exc.code() == grpc.StatusCode.UNAVAILABLE
                a.step()  # here before the others move the stage on
    assert r.wait(study).state == pb.DONE
    assert set(sent) == set(sw.STAGES) and all(len(b) == 2 and b[0] == b[1] for b in sent.values())
    assert seen["devices"] == 4 and flaky.ledger.find(study).acked_at is not None


def test_a_round_that_cannot_be_rebuilt_fails_its_study_and_the_coordinator_starts(
        coordinator_round, parts):
    """A kept REGISTER that this coordinator's checks refuse (here written past them, straight
    into the store): the restarted coordinator fails that study with the reason, resumes the
    other secure study and serves."""
    r = coordinator_round
    broken = r.create(secure_spec(4, timeout=60.0)).study_id
    fine = r.create(secure_spec(4, timeout=60.0)).study_id
    agents = [r.agent(f"b{i}", part, budget=5000.0) for i, part in enumerate(parts[:2])]
    agents[0].step()  # prepares its input for both studies
    agents[0].step()  # registers with both
    device = agents[1].ledger.identity().device_id
    r.store.add_stage_message(broken, pb.REGISTER, device, b'{"n": -5}')
    r.coordinator.stop()
    restarted = Coordinator(r.store)
    restarted.start()
    try:
        row = r.store.get_study(broken)
        assert row.state == "failed" and "could not be resumed after a restart" in row.detail
        assert restarted.round_of(fine).stage == pb.REGISTER
        assert len(restarted.round_of(fine)._inbox[pb.REGISTER]) == 1
    finally:
        restarted.stop()


def test_a_stage_whose_timeout_passed_while_the_coordinator_was_down_stays_open_a_grace(
        coordinator_round, parts):
    """REGISTER (one device of four, 1 s timeout) runs out while the coordinator is stopped: the
    restarted one keeps it open min(stage_timeout, 10 s) = 1 s from its start, for devices that
    retried meanwhile, and then closes it (too few registered: the study fails)."""
    r = coordinator_round
    study = r.create(secure_spec(4, timeout=1.0)).study_id
    g0 = r.agent("g0", parts[0])
    g0.step()  # prepares its input
    g0.step()  # registers
    r.coordinator.stop()
    time.sleep(1.2)  # REGISTER's timeout passes while nobody serves
    begun = time.time()
    restarted = Coordinator(r.store)
    restarted.start()
    try:
        resumed = restarted.round_of(study)
        assert resumed.stage == pb.REGISTER and not resumed.finished
        assert begun + 1.0 <= resumed.deadline <= time.time() + 1.0
        stop = time.monotonic() + 10
        while r.store.get_study(study).state != "failed":
            assert time.monotonic() < stop
            time.sleep(0.05)
        assert "aborted at REGISTER" in r.store.get_study(study).detail
    finally:
        restarted.stop()
