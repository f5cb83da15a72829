"""Reservations (ledger schema 4): the budget a device sets aside for the plain studies whose
roster it joined lives in the ledger, so a restarted daemon still counts it; it stops counting
once the device spent on the study, left it, or the reservation expired (the study's deadline,
else a day after joining), and it is forgotten once the study closes. On real files, and end to
end against a real coordinator (TLS on loopback)."""

from __future__ import annotations

import json
import math
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import META, study_spec
from typer.testing import CliRunner

from fedsketch.client.agent import Agent
from fedsketch.client.ledger import DEFAULT_SOURCE, Ledger, LedgerError, Reservation
from fedsketch.client.ledger_reservations import RESERVATION_SECONDS
from fedsketch.client.localdata import LocalData
from fedsketch.client.policy import Policy
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.study.refine import RefineSpec
from fedsketch.server.bench.metrics import split
from fedsketch.server.cli.main import app

OTHER = "clinic-b"
HOUR = 3600.0


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite"


def reserve(ledger: Ledger, study_id: str, epsilon: float, *, delta: float = 0.0,
            expires_in: float = HOUR, source: str = DEFAULT_SOURCE) -> Reservation:
    return ledger.reserve(study_id, f"name of {study_id}", source, epsilon, delta,
                          time.time() + expires_in)


def spend(ledger: Ledger, study_id: str, epsilon: float):
    return ledger.record_spend(study_id=study_id, study_name=study_id, source=DEFAULT_SOURCE,
                               epsilon=epsilon, delta=0.0, n=10.0, kind="complex", payload=b"x",
                               spec_sha256="c" * 64)


def test_reservations_survive_reopening_and_count_against_the_budget(path):
    """With a budget of 1 and 0.6 reserved for a joined study (the ledger closed and reopened in
    between, as a daemon restarts), another study asking 0.6 is refused and one asking 0.4 is
    not; the study that holds the reservation is not charged its own; an in-memory extra counts
    too; the spend itself is decided without reservations."""
    led = Ledger.create(path, 1.0)
    made = reserve(led, "A", 0.6)
    led.close()
    led = Ledger(path)
    try:
        [held] = led.reservations()
        assert held == made and (held.study_id, held.study_name, held.source) == (
            "A", "name of A", DEFAULT_SOURCE)
        assert (held.epsilon, held.delta, held.left_at) == (0.6, 0.0, None)
        assert held.expires_at == pytest.approx(held.joined_at + HOUR, abs=5)
        assert led.reserved(DEFAULT_SOURCE) == (0.6, 0.0)
        assert led.reserved(DEFAULT_SOURCE, other_than="A") == (0.0, 0.0)
        why = led.refusal(DEFAULT_SOURCE, 0.6, 0.0, study_id="B")
        assert why is not None and "insufficient budget" in why
        assert "0.4 of 1 remains" in why and "0.6 set aside" in why
        assert led.refusal(DEFAULT_SOURCE, 0.4, 0.0, study_id="B") is None
        assert led.refusal(DEFAULT_SOURCE, 0.4, 0.0) is None
        assert led.refusal(DEFAULT_SOURCE, 1.0, 0.0, study_id="A") is None  # its own
        assert led.refusal(DEFAULT_SOURCE, 0.4, 0.0, (0.1, 0.0), study_id="B") is not None
        spend(led, "B", 0.6)  # record_spend sets no reservation aside (the docstring's word)
        assert led.refusal(DEFAULT_SOURCE, 0.4, 0.0, study_id="C") is not None
        assert led.refusal(DEFAULT_SOURCE, 0.4, 0.0, study_id="A") is None
    finally:
        led.close()


def test_only_live_reservations_of_the_source_count(path):
    """An expired reservation, a left one and one whose study has a spend do not count, nor one
    of another source; a δ reservation counts against δ."""
    led = Ledger.create(path, 1.0, 1e-6)
    try:
        led.declare(OTHER, 1.0)
        reserve(led, "expired", 0.5, expires_in=-1.0)
        reserve(led, "left", 0.5)
        reserve(led, "spent", 0.5)
        reserve(led, "elsewhere", 0.9, source=OTHER)
        assert led.reserved(DEFAULT_SOURCE) == (1.0, 0.0)
        left = led.leave("left")
        assert left.left_at is not None and led.reservation("left") == left
        assert led.leave("left") == left  # the first time is kept
        spend(led, "spent", 0.3)
        assert led.reservations() == [led.reservation("elsewhere")]
        assert led.reserved(DEFAULT_SOURCE) == (0.0, 0.0)
        assert led.refusal(DEFAULT_SOURCE, 0.7, 0.0, study_id="new") is None
        assert led.refusal(DEFAULT_SOURCE, 0.71, 0.0, study_id="new") is not None
        assert led.reserved(OTHER) == (0.9, 0.0)
        assert led.refusal(OTHER, 0.2, 0.0, study_id="new") is not None
        assert [r.study_id for r in led.joined()] == ["expired", "left", "spent", "elsewhere"]

        later = time.time() + 2 * HOUR
        reserve(led, "delta", 0.1, delta=6e-7)
        assert led.reserved(DEFAULT_SOURCE) == (0.1, 6e-7)
        assert "δ = 5e-07" in led.refusal(DEFAULT_SOURCE, 0.1, 5e-7, study_id="new")
        assert led.reserved(DEFAULT_SOURCE, now=later) == (0.0, 0.0)
        assert led.reservations(now=later) == []
        assert led.refusal(DEFAULT_SOURCE, 0.1, 5e-7, study_id="delta") is None

        led.end_reservation("delta")
        led.end_reservation("never-joined")  # nothing to forget
        assert led.reservation("delta") is None and led.reserved(DEFAULT_SOURCE) == (0.0, 0.0)
        with pytest.raises(LedgerError, match="no reservation"):
            led.leave("never-joined")
    finally:
        led.close()


def test_reserve_is_idempotent_and_checks_its_input(path):
    led = Ledger.create(path, 1.0)
    try:
        first = reserve(led, "A", 0.3)
        again = reserve(led, "A", 0.9, delta=0.1, expires_in=10 * HOUR)
        assert again == first and led.joined() == [first]
        assert led.reserved(DEFAULT_SOURCE) == (0.3, 0.0)
        with pytest.raises(LedgerError, match="no budget for source"):
            reserve(led, "B", 0.3, source="undeclared")
        for bad in ({"epsilon": math.nan}, {"epsilon": -0.1}, {"delta": math.inf}):
            kwargs = {"epsilon": 0.1, "delta": 0.0} | bad
            with pytest.raises(ValueError):
                led.reserve("C", "c", DEFAULT_SOURCE, expires_at=time.time() + HOUR, **kwargs)
        with pytest.raises(ValueError, match="finite Unix time"):
            led.reserve("C", "c", DEFAULT_SOURCE, 0.1, 0.0, math.inf)
        assert led.joined() == [first]
    finally:
        led.close()


def test_device_budget_shows_what_is_reserved(path):
    led = Ledger.create(path, 1.0)
    reserve(led, "st-joined", 0.6)
    reserve(led, "st-expired", 0.2, expires_in=-1.0)
    led.close()
    runner = CliRunner()
    shown = json.loads(runner.invoke(app, ["device", "budget", "--ledger", str(path), "--json"]).output)
    [held] = shown["reserved"]
    assert (held["study_id"], held["study"], held["epsilon"], held["delta"]) == (
        "st-joined", "name of st-joined", 0.6, 0.0)
    assert held["expires_at"] > time.time() and held["joined_at"] <= time.time()
    source = shown["sources"][DEFAULT_SOURCE]
    assert (source["reserved_epsilon"], source["reserved_delta"]) == (0.6, 0.0)
    assert source["remaining_epsilon"] == 1.0  # budget − spent, as before
    table = runner.invoke(app, ["device", "budget", "--ledger", str(path)], env={"COLUMNS": "250"})
    assert table.exit_code == 0, table.output
    assert "1 (0.6 of it reserved)" in table.output
    assert "reserved (rosters joined" in table.output and "name of st-joined (st-joined)" in table.output
    assert "st-expired" not in table.output


# -- end to end: a real coordinator ---------------------------------------------------------


@pytest.fixture
def records() -> np.ndarray:
    return np.random.default_rng(4).uniform(-5.0, 5.0, size=(300, 3))


def device(rnd, ledger: Ledger, records: np.ndarray, token: str | None = None) -> Agent:
    """A device on ``ledger`` (enrolled with ``token`` on its first start)."""
    data = LocalData(lambda: split(records), records.shape[1])
    agent = Agent(rnd.channel(), ledger, lambda: data)
    agent.ensure_enrolled(rnd.target, token, "device")
    return agent


def test_a_restarted_device_keeps_its_reservation_until_it_expires(coordinator_round, records,
                                                                   tmp_path):
    """The device joins a study whose roster cannot fill (two devices wanted, one there) and
    reserves its whole ε (sketch and rounds: 0.6 of 1). A new Agent on the same ledger (a
    restart) keeps waiting in that roster, does not count it as joined anew, and refuses a
    second study of 0.6. Once the reservation expired it joins the second study; when both
    rosters then fill it contributes to the one its budget still covers, and only once, and
    leaves the other's roster."""
    first = coordinator_round.create(study_spec(epsilon=0.2, min_devices=2, name="first",
                                                refine=RefineSpec((0.2, 0.2))))
    file = tmp_path / "device.ledger"
    book = Ledger.create(file, 1.0)
    agent = device(coordinator_round, book, records, coordinator_round.tokens(1)[0])
    out = agent.step()
    assert out.registered == [first.study_id] and out.refused == {} and agent.waiting
    [held] = book.reservations()
    assert (held.study_id, held.study_name, held.left_at) == (first.study_id, "first", None)
    assert held.epsilon == pytest.approx(0.6) and held.delta == 0.0
    assert held.expires_at == pytest.approx(held.joined_at + RESERVATION_SECONDS)
    book.close()
    del agent

    book = Ledger(file)
    agent = device(coordinator_round, book, records)  # enrolled already
    assert agent.waiting
    second = coordinator_round.create(study_spec(epsilon=0.6, min_devices=2, name="second"))
    out = agent.step()
    assert out.registered == [] and out.submitted == []
    assert "insufficient budget" in out.refused[second.study_id]
    assert coordinator_round.store.get_study(first.study_id).registered == 1
    assert coordinator_round.store.get_study(second.study_id).registered == 0

    with sqlite3.connect(file) as db:  # a day later
        db.execute("UPDATE reservations SET expires_at = ?", (time.time() - 1.0,))
    db.close()
    assert not agent.waiting and book.reserved(DEFAULT_SOURCE) == (0.0, 0.0)
    out = agent.step()
    assert out.registered == [second.study_id] and out.refused == {} and agent.waiting
    assert [r.study_id for r in book.reservations()] == [second.study_id]
    assert coordinator_round.store.get_study(first.study_id).registered == 1  # still on it

    other = coordinator_round.agent("other", records)
    assert sorted(other.step().submitted) == sorted([first.study_id, second.study_id])
    out = agent.step()
    assert out.submitted == [second.study_id]
    assert "insufficient budget" in out.refused[first.study_id]  # checked again: 0.6 is the second's
    assert [(s.study_id, s.epsilon) for s in book.spends()] == [(second.study_id, 0.6)]
    assert book.reservation(second.study_id) is None and not agent.waiting
    assert book.joined() == []  # it left the first study's roster (unspent): its place is free
    assert coordinator_round.store.get_study(first.study_id).registered == 1
    book.close()


def test_a_deadline_bounds_the_reservation_and_a_closed_study_is_forgotten(coordinator_round,
                                                                           records, tmp_path):
    deadline = time.time() + HOUR
    study = coordinator_round.create(study_spec(epsilon=0.5, min_devices=2, deadline=deadline))
    book = Ledger.create(tmp_path / "device.ledger", 1.0)
    agent = device(coordinator_round, book, records, coordinator_round.tokens(1)[0])
    assert agent.step().registered == [study.study_id]
    [held] = book.reservations()
    assert held.expires_at == deadline
    coordinator_round.operator().CloseStudy(pb.StudyRef(study_id=study.study_id), metadata=META)
    assert coordinator_round.wait(study.study_id).state == pb.FAILED
    out = agent.step()
    assert out.refused == {} and book.joined() == [] and not agent.waiting
    assert book.spends() == []
    book.close()


def test_a_study_the_device_left_is_not_handled_again(coordinator_round, records, tmp_path):
    """A left reservation stays as a record: when the roster fills, this device, restarted or
    not, neither contributes nor joins the study again."""
    study = coordinator_round.create(study_spec(epsilon=0.5, min_devices=2))
    file = tmp_path / "device.ledger"
    book = Ledger.create(file, 1.0)
    agent = device(coordinator_round, book, records, coordinator_round.tokens(1)[0])
    assert agent.step().registered == [study.study_id]
    book.leave(study.study_id)
    assert not agent.waiting and book.reserved(DEFAULT_SOURCE) == (0.0, 0.0)
    other = coordinator_round.agent("other", records)
    assert other.step().submitted == [study.study_id]
    for fresh in (False, True):
        if fresh:
            book.close()
            book = Ledger(file)
            agent = device(coordinator_round, book, records)
        out = agent.step()
        assert (out.registered, out.submitted, out.refused) == ([], [], {})
        assert book.spends() == [] and book.reservation(study.study_id).left_at is not None
    book.close()


def test_a_study_refused_for_good_frees_its_reservation(coordinator_round, records, tmp_path):
    """The owner's policy changes while the device waits: once the roster fills, the device
    refuses the study for good, leaves its roster (signed: the place goes to another device), and
    its reservation, kept as left, no longer holds the budget."""
    study = coordinator_round.create(study_spec(epsilon=0.5, min_devices=2))
    book = Ledger.create(tmp_path / "device.ledger", 1.0)
    agent = device(coordinator_round, book, records, coordinator_round.tokens(1)[0])
    assert agent.step().registered == [study.study_id]
    book.set_policy(Policy(max_epsilon=0.1))
    assert book.reserved(DEFAULT_SOURCE) == (0.5, 0.0)  # the roster is not full yet
    assert agent.step().refused == {}
    assert coordinator_round.agent("other", records).step().submitted == [study.study_id]
    out = agent.step()
    assert "at most 0.1 per study" in out.refused[study.study_id]
    assert book.reservation(study.study_id).left_at is not None and book.spends() == []
    assert book.reserved(DEFAULT_SOURCE) == (0.0, 0.0)
    assert coordinator_round.store.get_study(study.study_id).registered == 1  # it left, signed
    assert agent.step().refused == {}  # not handled again
    book.close()
