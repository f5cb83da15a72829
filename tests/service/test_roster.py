"""Spend only when the study can finish (issue 10, item 5): a plain study fills a roster of
``min_devices`` devices that spend nothing, takes input only from them once it is full, and
the device re-checks the study inside the transaction that records its spend. Real coordinator
(TLS on loopback, SQLite), real agents."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest
from conftest import META, study_spec

from fedsketch.client import agent as agent_module
from fedsketch.client.agent import Agent
from fedsketch.client.ledger import DEFAULT_SOURCE, Ledger
from fedsketch.client.localdata import LocalData
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.net import signing
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.server.bench.metrics import split


@pytest.fixture(scope="module")
def parts():
    x, _, _ = gmm(8_000, 3, 3, 3.0, seed=5)
    return np.array_split(x, 8)


def remaining(agent: Agent) -> float:
    return agent.ledger.remaining(DEFAULT_SOURCE).epsilon


def test_a_study_whose_roster_never_fills_costs_nobody_anything(coordinator_round, parts):
    """Must-show 6: three devices join a roster of four; at the deadline the study fails, and
    every device's remaining budget is what it was. The same for an operator's close."""
    by_deadline = coordinator_round.create(study_spec(epsilon=2.0, min_devices=4,
                                                      deadline=time.time() + 1.5))
    by_operator = coordinator_round.create(study_spec(epsilon=3.0, min_devices=4))
    agents = [coordinator_round.agent(f"q{i}", parts[i], budget=10.0) for i in range(3)]
    for agent in agents:
        out = agent.step()
        assert sorted(out.registered) == sorted([by_deadline.study_id, by_operator.study_id])
        assert out.submitted == [] and out.refused == {}
    shown = coordinator_round.operator().ShowStudy(pb.StudyRef(study_id=by_operator.study_id),
                                                   metadata=META)
    assert (shown.stage, shown.registered, shown.state) == (pb.REGISTER, 3, pb.OPEN)
    coordinator_round.operator().CloseStudy(pb.StudyRef(study_id=by_operator.study_id),
                                            metadata=META)
    failed = coordinator_round.wait(by_deadline.study_id, timeout=20)
    assert failed.state == pb.FAILED and "3 of 4 devices registered" in failed.detail
    assert "none of them spent anything" in failed.detail
    assert coordinator_round.wait(by_operator.study_id).state == pb.FAILED
    for agent in agents:
        agent.step()  # nothing is open any more
        assert agent.ledger.spends() == [] and remaining(agent) == 10.0


def test_a_device_joins_no_more_studies_than_its_budget_pays_for(coordinator_round, parts):
    """Joining spends nothing but promises ε: with 1.0 left, a device joins three studies of 0.3
    and declines the other seven, so that it can pay for all it joined once their rosters fill."""
    studies = [coordinator_round.create(study_spec(epsilon=0.3, min_devices=2)) for _ in range(10)]
    poor = coordinator_round.agent("poor", parts[0], budget=1.0)
    out = poor.step()
    assert len(out.registered) == 3 and len(out.refused) == 7
    assert all("insufficient budget" in why for why in out.refused.values())
    rich = coordinator_round.agent("rich", parts[1], budget=100.0)
    rich.step()
    for _ in range(2):
        poor.step()
    assert len(poor.ledger.spends()) == 3 and remaining(poor) == pytest.approx(0.1)
    done = [coordinator_round.wait(s.study_id).state for s in studies if s.study_id in out.registered]
    assert done == [pb.DONE] * 3


def test_the_spend_transaction_asks_the_coordinator_first(coordinator_round, parts):
    """The operator closes the study while the device sketches (its data feed does it, between
    the device's check and its spend): the re-check inside the spend transaction sees the study
    closed, and nothing is spent or sent."""
    study = coordinator_round.create(study_spec(epsilon=1.0, min_devices=1,
                                                deadline=time.time() + 3600))
    op = coordinator_round.operator()
    passes = []

    def closing_chunks():  # the first pass counts the records, the second sketches them
        passes.append(1)
        if len(passes) == 2:
            op.CloseStudy(pb.StudyRef(study_id=study.study_id), metadata=META)
        yield from split(parts[0])

    book = Ledger.create(coordinator_round.folder / "closing.ledger", 10.0)
    agent = Agent(coordinator_round.channel(), book, lambda: LocalData(closing_chunks, 3))
    agent.ensure_enrolled(coordinator_round.target, coordinator_round.tokens(1)[0], "closing")
    out = agent.step()
    assert "takes no input now" in out.refused[study.study_id]
    assert book.spends() == [] and coordinator_round.store.contributions(study.study_id) == []
    book.close()


def test_a_close_after_the_spend_waits_for_the_device_told_to_send(coordinator_round, parts,
                                                                  monkeypatch):
    """The operator closes the study between a device's spend and its Submit (the crash tests'
    fault point does it): the coordinator had given that device an input ticket, so the close
    waits for its contribution, which is stored; the study then decodes. No spend is lost."""
    study = coordinator_round.create(study_spec(epsilon=1.0, min_devices=2,
                                                deadline=time.time() + 3600))
    first, second = (coordinator_round.agent(f"t{i}", parts[i]) for i in range(2))
    assert first.step().registered == [study.study_id]
    assert second.step().submitted == [study.study_id]  # fills the roster, sends at once
    op = coordinator_round.operator()
    closed = []

    def close_now() -> None:
        closed.append(op.CloseStudy(pb.StudyRef(study_id=study.study_id), metadata=META))

    monkeypatch.setattr(agent_module, "fault_point", close_now)
    assert first.step().submitted == [study.study_id]
    assert closed[0].state == pb.COLLECTING and "closing" in closed[0].detail
    assert coordinator_round.wait(study.study_id).state == pb.DONE
    stored = {r.payload for r in coordinator_round.store.contributions(study.study_id)}
    assert stored == {a.ledger.spends()[0].payload for a in (first, second)}


def test_registrations_are_signed_and_checked(coordinator_round, parts):
    """A registration with another key, for another spec, for a secure study or a full roster is
    refused with its status, and adds nobody."""
    study = coordinator_round.create(study_spec(min_devices=1))
    agent = coordinator_round.agent("signer", parts[0])
    identity = agent.ledger.identity()

    def registration(key: bytes, spec_hash: str = study.spec_sha256) -> pb.Registration:
        digest = signing.registration_digest(study.study_id, identity.device_id, spec_hash)
        return pb.Registration(study_id=study.study_id, device_id=identity.device_id,
                               spec_sha256=spec_hash, signature=signing.sign(key, digest))

    cases = [(registration(signing.new_private_key()), grpc.StatusCode.UNAUTHENTICATED),
             (registration(identity.private_key, "0" * 64), grpc.StatusCode.FAILED_PRECONDITION)]
    for msg, code in cases:
        with pytest.raises(grpc.RpcError) as err:
            agent.stub.Register(msg, timeout=10)
        assert err.value.code() == code
    assert coordinator_round.store.get_study(study.study_id).registered == 0
    reply = agent.stub.Register(registration(identity.private_key), timeout=10)
    assert (reply.duplicate, reply.stage, reply.registered) == (False, pb.PLAIN_INPUT, 1)
    late = coordinator_round.agent("late", parts[1])
    assert "roster of study" in late.step().refused[study.study_id]
    assert late.ledger.spends() == []


def test_devices_racing_for_rosters_never_spend_without_a_stored_contribution(coordinator_round,
                                                                              parts):
    """Must-show 6 (race): eight devices, each on its own thread, channel and ledger, poll
    three studies with rosters of five at once. Every study ends DONE with five contributions;
    every spend in every ledger has its bytes stored at the coordinator; the devices left out
    spent nothing."""
    studies = [coordinator_round.create(study_spec(epsilon=0.5, min_devices=5, name=f"race{j}"))
               for j in range(3)]
    tokens = coordinator_round.tokens(8)
    seen: dict[int, tuple] = {}
    errors: list[BaseException] = []

    def poll(i: int) -> None:  # a ledger is used on the thread that opened it
        try:
            book = Ledger.create(coordinator_round.folder / f"r{i}.ledger", 10.0)
            agent = Agent(coordinator_round.channel(), book,
                          lambda: LocalData(lambda: split(parts[i]), 3))
            identity = agent.ensure_enrolled(coordinator_round.target, tokens[i], f"r{i}")
            for _ in range(60):
                agent.step()
                if all(coordinator_round.store.get_study(s.study_id).state != "open"
                       and coordinator_round.store.get_study(s.study_id).state != "collecting"
                       for s in studies):
                    break
                time.sleep(0.02)
            seen[i] = (identity.device_id, book.spends(), remaining(agent))
            book.close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=poll, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for s in studies:
        assert coordinator_round.wait(s.study_id).state == pb.DONE
    stored = {(s.study_id, r.device_id): r.payload for s in studies
              for r in coordinator_round.store.contributions(s.study_id)}
    assert len(stored) == 15
    spends = {(sp.study_id, device): sp.payload for device, book, _ in seen.values()
              for sp in book}
    assert spends == stored
    for _, book, left in seen.values():
        assert left == pytest.approx(10.0 - 0.5 * len(book))
