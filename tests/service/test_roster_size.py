"""A roster larger than the quorum, and a collection window (issue 10, roster finding B): a
roster device that never sends, crashed or hostile (registering is free), neither holds a study
open forever nor, with a roster larger than the quorum, fails it. Real coordinator (TLS on
loopback, SQLite), real agents."""

from __future__ import annotations

import json
import time

import grpc
import numpy as np
import pytest
from conftest import META, study_spec

from fedsketch.client import agent as agent_module
from fedsketch.client.agent import Agent
from fedsketch.client.ledger import Ledger
from fedsketch.client.localdata import LocalData
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.net import signing
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.study.refine import RefineSpec
from fedsketch.server.bench.metrics import split


@pytest.fixture(scope="module")
def parts():
    x, _, _ = gmm(6_000, 3, 3, 3.0, seed=7)
    return np.array_split(x, 5)


def test_a_silent_roster_device_costs_a_larger_roster_nothing(coordinator_round, parts):
    """Quorum 2, roster 3, window 1.5 s. A device joins and falls silent; two more join (the
    second fills the quorum and sends at once; the third still joins a filled roster and sends);
    a fourth finds the roster full and spends nothing. The window ends and the study decodes
    from the two that sent."""
    study = coordinator_round.create(study_spec(min_devices=2, roster=3, collect_seconds=1.5))
    silent, first, late, extra = (coordinator_round.agent(f"r{i}", parts[i]) for i in range(4))
    assert silent.step().registered == [study.study_id]  # ... and never steps again
    out = first.step()
    assert (out.registered, out.submitted) == ([], [study.study_id])  # it filled the quorum
    assert late.step().submitted == [study.study_id]
    refused = extra.step().refused[study.study_id]
    assert "roster" in refused and "full (3 devices)" in refused
    assert extra.ledger.spends() == []
    shown = coordinator_round.operator().ShowStudy(pb.StudyRef(study_id=study.study_id),
                                                   metadata=META)
    assert (shown.state, shown.registered, shown.contributions) == (pb.COLLECTING, 3, 2)
    done = coordinator_round.wait(study.study_id, timeout=30)
    assert done.state == pb.DONE
    assert coordinator_round.store.get_study(study.study_id).contributions == 2
    log = [entry[3] for entry in coordinator_round.store.audit_log(1000)]
    assert any("collection window of 1.5 s ended" in line for line in log)


def test_the_window_ends_a_study_whose_quorum_never_sends(coordinator_round, parts):
    """At roster = quorum, a silent roster device still cannot hold a study without a deadline
    open forever: the window ends it as failed (the device that sent is told how many did)."""
    study = coordinator_round.create(study_spec(min_devices=2, collect_seconds=1.0))
    silent, sender = (coordinator_round.agent(f"w{i}", parts[i]) for i in range(2))
    silent.step()
    assert sender.step().submitted == [study.study_id]
    failed = coordinator_round.wait(study.study_id, timeout=30)
    assert failed.state == pb.FAILED
    assert "collection window of 1 s ended: 1 of 2 devices contributed" in failed.detail


def test_a_study_closes_once_its_whole_roster_has_sent_whatever_its_deadline(coordinator_round,
                                                                             parts):
    """Nothing more can come once every roster place has sent, so a deadline an hour away does
    not keep the result waiting."""
    study = coordinator_round.create(study_spec(min_devices=2, roster=2,
                                                deadline=time.time() + 3600))
    first, second = (coordinator_round.agent(f"d{i}", parts[i]) for i in range(2))
    assert first.step().registered == [study.study_id]
    assert second.step().submitted == [study.study_id]
    assert first.step().submitted == [study.study_id]
    assert coordinator_round.wait(study.study_id, timeout=5).state == pb.DONE


def test_a_spec_refuses_a_bad_roster_or_window():
    """A roster below the quorum, a window that is not a positive number, and a roster above
    the quorum with nothing to end its collection are refused; specs without them read and hash
    as before."""
    with pytest.raises(ValueError, match="roster takes min_devices = 3"):
        study_spec(min_devices=3, roster=2)
    with pytest.raises(ValueError, match="roster takes"):
        study_spec(min_devices=3, roster=3.0)
    for bad in (0.0, True, "60", float("nan")):
        with pytest.raises(ValueError, match="collect_seconds must be finite and > 0"):
            study_spec(collect_seconds=bad)
    with pytest.raises(ValueError, match="needs a collection window or a deadline"):
        study_spec(min_devices=2, roster=3).check_new()
    spec = study_spec(min_devices=2, roster=5, collect_seconds=60.0)
    assert spec.capacity == 5 and type(spec).from_json(spec.to_json()) == spec
    plain = study_spec()
    assert "roster" not in plain.to_json() and "collect_seconds" not in plain.to_json()


def test_a_round_takes_its_study_s_roster_and_decodes_without_the_device_that_left(
        coordinator_round, parts):
    """Quorum 3, roster 4: all four send the sketch (the whole roster: it decodes at once), one
    never comes back; each round fills at three, closes at its deadline and decodes, so the
    study is refined twice instead of being published with its start."""
    r = coordinator_round
    study = r.create(study_spec(refine=RefineSpec((1.0, 1.0), 2.0), min_devices=3, roster=4,
                                collect_seconds=600.0))
    agents = [r.agent(f"f{i}", parts[i]) for i in range(4)]
    stop = time.monotonic() + 60
    while r.store.get_study(study.study_id).state != "decoding":
        assert time.monotonic() < stop
        for a in agents:
            a.step()
    while (s := r.store.get_study(study.study_id)).state not in ("done", "failed"):
        assert time.monotonic() < stop + 60
        for a in agents[:3]:
            a.step()
        time.sleep(0.05)
    full = json.loads(r.store.get_result(study.study_id))
    assert s.state == "done" and full["refined_rounds"] == 2
    rounds = r.store.rounds(study.study_id)
    assert [(row.capacity, row.min_devices, row.contributions) for row in rounds] == [(4, 3, 3)] * 2
    assert all(len(a.ledger.spends()) == 3 for a in agents[:3])


def roster_message(study: pb.Study, device_id: str, key: bytes,
                   domain: bytes = signing.LEAVE_DOMAIN, ticket: bool = False) -> pb.Registration:
    """A registration (asking for a ticket if ``ticket``) or, by default, a leave of
    ``device_id`` signed with ``key``."""
    digest = signing.registration_digest(study.study_id, device_id, study.spec_sha256, domain)
    return pb.Registration(study_id=study.study_id, device_id=device_id, join_only=not ticket,
                           spec_sha256=study.spec_sha256, signature=signing.sign(key, digest))


def test_a_device_leaves_a_roster_and_its_place_goes_to_another(coordinator_round, parts):
    """Roster (and quorum) of two, filled by a and c; b finds it full. c leaves, signed: the
    roster stays filled (input stays open) and b takes c's place at once. Nobody can leave in
    another device's name, a registration's signature is not a leave, a second leave changes
    nothing; a device holding an input ticket (it may have spent) or that contributed cannot
    leave, nor can anyone leave a study that ended."""
    r = coordinator_round
    study = r.create(study_spec(min_devices=2))
    a, b, c = (r.agent(f"l{i}", parts[i]) for i in range(3))
    ids = {x: x.ledger.identity() for x in (a, b, c)}
    stub = r.device_stub()
    for x in (a, c):
        stub.Register(roster_message(study, ids[x].device_id, ids[x].private_key,
                                     signing.REGISTRATION_DOMAIN))
    with pytest.raises(grpc.RpcError) as err:
        stub.Register(roster_message(study, ids[b].device_id, ids[b].private_key,
                                     signing.REGISTRATION_DOMAIN))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "full" in err.value.details()
    for forged in (roster_message(study, ids[c].device_id, ids[b].private_key),
                   roster_message(study, ids[c].device_id, ids[c].private_key,
                                  signing.REGISTRATION_DOMAIN)):
        with pytest.raises(grpc.RpcError) as err:
            stub.Leave(forged)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    leave = roster_message(study, ids[c].device_id, ids[c].private_key)
    assert (stub.Leave(leave).left, stub.Leave(leave).left) == (True, False)
    row = r.store.get_study(study.study_id)
    assert (row.registered, row.roster_full) == (1, True)
    joined = stub.Register(roster_message(study, ids[b].device_id, ids[b].private_key,
                                          signing.REGISTRATION_DOMAIN))
    assert (joined.stage, joined.input_seconds) == (pb.PLAIN_INPUT, 0.0)  # no ticket asked for
    ticket = stub.Register(roster_message(study, ids[b].device_id, ids[b].private_key,
                                          signing.REGISTRATION_DOMAIN, ticket=True))
    assert ticket.duplicate and ticket.input_seconds > 0
    with pytest.raises(grpc.RpcError) as err:
        stub.Leave(roster_message(study, ids[b].device_id, ids[b].private_key))
    assert err.value.code() == grpc.StatusCode.ABORTED
    assert "holds an input ticket" in err.value.details()
    assert a.step().submitted == [study.study_id]
    with pytest.raises(grpc.RpcError) as err:
        stub.Leave(roster_message(study, ids[a].device_id, ids[a].private_key))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "cannot be withdrawn" in err.value.details()
    assert b.step().submitted == [study.study_id]
    assert r.wait(study.study_id, timeout=30).state == pb.DONE
    assert any(e[2] == "leave" and e[1] == ids[c].device_id for e in r.store.audit_log(1000))
    with pytest.raises(grpc.RpcError) as err:
        stub.Leave(roster_message(study, ids[c].device_id, ids[c].private_key))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "'done'" in err.value.details()


def test_a_close_waits_for_the_device_told_to_send_after_the_quorum_sent(coordinator_round,
                                                                         parts, monkeypatch):
    """Quorum 2, roster 3, window 2 s: a and b send; c joins the free place, gets its ticket in
    its spend transaction and is slow to send (3 s after its commit). The window ends meanwhile:
    the close waits for c's ticket, takes no new device, and decodes all three."""
    r = coordinator_round
    study = r.create(study_spec(min_devices=2, roster=3, collect_seconds=2.0))
    a, b, c = (r.agent(f"t{i}", parts[i]) for i in range(3))
    assert a.step().registered == [study.study_id]
    assert b.step().submitted == [study.study_id]
    assert a.step().submitted == [study.study_id]
    monkeypatch.setattr(agent_module, "fault_point", lambda: time.sleep(3.0))
    assert c.step().submitted == [study.study_id]
    assert r.wait(study.study_id, timeout=30).state == pb.DONE
    assert r.store.get_study(study.study_id).contributions == 3


def test_a_device_that_cannot_send_leaves_and_may_join_again(coordinator_round, parts, tmp_path):
    """A joins a roster of two and waits; its file becomes unreadable before the roster fills.
    When input opens, A refuses (a data refusal: it may pass), leaves the roster signed, and
    spends nothing; its place is free again. Once the file is readable, A joins again and
    sends; the study decodes from A and B, and A spent once."""
    r = coordinator_round
    study = r.create(study_spec(min_devices=2, collect_seconds=600.0))
    broken = {"now": False}

    def feed() -> LocalData:
        if broken["now"]:
            raise OSError("the data file is gone")
        return LocalData(lambda: split(parts[0]), 3)

    a = Agent(r.channel(), Ledger.create(tmp_path / "a.ledger", 1000.0), feed)
    a.ensure_enrolled(r.target, r.tokens(1)[0], "a")
    first = a.step()
    assert first.registered == [study.study_id], first
    broken["now"] = True
    b = r.agent("b", parts[1])
    assert b.step().submitted == [study.study_id]  # it filled the quorum
    out = a.step()
    assert "the data file is gone" in out.refused[study.study_id]
    assert a.ledger.spends() == [] and a.ledger.joined() == []
    assert r.store.get_study(study.study_id).registered == 1
    broken["now"] = False
    assert a.step().submitted == [study.study_id]
    assert r.wait(study.study_id, timeout=30).state == pb.DONE
    assert [s.study_id for s in a.ledger.spends()] == [study.study_id]


def test_a_close_gives_no_ticket_to_a_device_that_registers_while_it_decides(coordinator_round,
                                                                            parts, monkeypatch):
    """The close records itself before it counts the tickets, so a registration that slips in
    while it decides (forced here from inside the count) is refused and promised nothing: no
    device is told to send on a study that then fails."""
    r = coordinator_round
    study = r.create(study_spec(min_devices=2, roster=3, collect_seconds=600.0))
    a, b, c = (r.agent(f"x{i}", parts[i]) for i in range(3))
    assert a.step().registered == [study.study_id]
    assert c.step().submitted == [study.study_id]  # the quorum (a, c) filled; one of two sent
    ident = b.ledger.identity()
    stub = r.device_stub()
    count, slipped = r.store.outstanding, []

    def outstanding(study_id, now):
        with pytest.raises(grpc.RpcError) as err:  # another RPC thread, at the worst moment
            stub.Register(roster_message(study, ident.device_id, ident.private_key,
                                         signing.REGISTRATION_DOMAIN, ticket=True))
        slipped.append(err.value.code())
        return count(study_id, now)

    monkeypatch.setattr(r.store, "outstanding", outstanding)
    r.coordinator.close(study.study_id, "deadline reached")
    assert slipped == [grpc.StatusCode.FAILED_PRECONDITION]
    row = r.store.get_study(study.study_id)
    assert (row.state, row.registered) == ("failed", 2)
