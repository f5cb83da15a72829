"""A study with refinement rounds as real processes: ``fedsketch coordinator serve`` and
``fedsketch device run --once``, the coordinator SIGKILLed between rounds and inside one, a device
SIGKILLed between its ledger commit and its send. Every round's spend appears once in each
ledger, a re-send is byte-identical, and the study completes."""

from __future__ import annotations

import json
import signal
import time

import pytest
import test_round_processes as processes
from test_round_processes import cli_here, device, wait_done

from fedsketch.client.ledger import Ledger
from fedsketch.server.store import open_store

pytestmark = pytest.mark.slow

#: The real coordinator process and the three devices' files of the plain round's tests.
coordinator = processes.coordinator
device_files = processes.device_files


def rounds_of(c, study: str) -> list:
    store = open_store(c.db)
    try:
        return store.rounds(study)
    finally:
        store.close()


def wait_round(c, study: str, number: int) -> str:
    """The id of the study's round ``number`` once it is open."""
    stop = time.monotonic() + 120
    while time.monotonic() < stop:
        rows = rounds_of(c, study)
        if len(rows) >= number:
            return rows[number - 1].study_id
        time.sleep(0.1)
    raise TimeoutError(f"round {number} of {study}")


def stored(c, study: str) -> dict[str, bytes]:
    store = open_store(c.db)
    try:
        return {r.device_id: r.payload for r in store.contributions(study)}
    finally:
        store.close()


def test_kills_between_and_inside_rounds_lose_nothing_and_spend_once(coordinator, tmp_path,
                                                                    device_files):
    c = coordinator
    study = c.op("create-study", "--name", "r", "--d", "3", "--k", "3", "--bounds", "-12:12",
                 "--scale", "1.5", "--epsilon", "5", "--m", "60", "--r", "60",
                 "--min-devices", "3", "--replicates", "2", "--rounds", "2", here=True).stdout.strip()
    tokens = c.op("tokens", "--count", "3", here=True).stdout.split()
    ledgers = [tmp_path / f"l{i}" for i in range(3)]
    for i in range(3):  # 0 and 1 join the roster, 2 fills it and sends its sketch
        device(c, device_files[i], ledgers[i], tokens[i])
    c.kill()  # inside the sketch round: two of three sketches missing
    c.start()
    for i in (0, 1):
        device(c, device_files[i], ledgers[i])
    first = wait_round(c, study, 1)
    c.kill()  # between rounds: the sketch is decoded and round 1 open, nobody joined yet
    c.start()
    assert [r.study_id for r in rounds_of(c, study)] == [first]  # not opened twice
    for i in (1, 2):
        device(c, device_files[i], ledgers[i])  # join round 1's roster
    res = device(c, device_files[0], ledgers[0], env={"FEDSKETCH_FAULT": "kill-after-commit"},
                 check=False)
    assert res.returncode == -signal.SIGKILL  # filled the roster, committed, died before sending
    book = Ledger(ledgers[0])
    committed = book.find(first)
    assert committed is not None and committed.acked_at is None and committed.round == 1
    book.close()
    c.kill()  # inside round 1: one release committed on its device, none stored
    c.start()
    assert stored(c, first) == {}
    for i in range(3):
        device(c, device_files[i], ledgers[i])  # 0 re-sends its stored bytes, 1 and 2 send
    assert stored(c, first)[Ledger(ledgers[0]).identity().device_id] == committed.payload
    second = wait_round(c, study, 2)
    for _ in range(2):
        for i in range(3):
            device(c, device_files[i], ledgers[i])
    result = wait_done(c, study, here=True)
    assert result["refined_rounds"] == 2 and result["devices"] == 3
    status = json.loads(c.op("status", study, "--json", here=True).stdout)  # the operator's view of it
    assert (status["state"], status["epsilon"]) == ("DONE", pytest.approx(5.0))
    assert [(r["round"], r["study_id"], r["state"], r["contributions"]) for r in status["rounds"]] == [
        (1, first, "DONE", 3), (2, second, "DONE", 3)]
    one = json.loads(c.op("status", first, "--json", here=True).stdout)
    assert (one["parent_id"], one["round"], one["rounds"]) == (study, 1, [])
    assert one["epsilon"] == pytest.approx(5.0 * 0.8 / 2)  # the default round share, over 2 rounds
    names = {s["study_id"]: s["name"] for s in json.loads(c.op("list", "--json", here=True).stdout)}
    assert (names[study], names[first]) == ("r", f"round 1 of {study}")
    for path in ledgers:
        book = Ledger(path)
        spends = book.spends()
        device_id = book.identity().device_id
        book.close()
        assert sorted((s.study_id, s.round) for s in spends) == sorted(
            [(study, 0), (first, 1), (second, 2)])
        for s in spends:
            assert s.acked_at is not None and stored(c, s.study_id)[device_id] == s.payload
        budget = json.loads(cli_here("device", "budget", "--ledger", str(path), "--json").stdout)
        assert budget["studies"][study]["epsilon"] == pytest.approx(5.0)
        assert set(budget["studies"][study]["rounds"]) == {"0", "1", "2"}
    assert c.terminate() == 0


def test_create_study_splits_epsilon_over_the_rounds_and_refuses_bad_ones(coordinator):
    base = ("create-study", "--name", "s", "--d", "3", "--k", "3", "--bounds", "-12:12",
            "--scale", "1.5", "--epsilon", "1", "--m", "60")
    for extra, message in ((("--rounds", "2", "--round-share", "1"), "share of ε must be in (0, 1)"),
                           (("--rounds", "-1"), "rounds must be an integer >= 0"),
                           (("--rounds", "21"), "1 to 20 refinement rounds")):
        refused = coordinator.op(*base, *extra, check=False)
        assert refused.returncode == 1 and message in refused.stderr, (extra, refused.stderr)
    made = coordinator.op(*base, "--rounds", "4", "--round-share", "0.6")
    assert "the sketch 0.4, then 4 refinement rounds of 0.15" in made.stderr
    store = open_store(coordinator.db)
    spec = json.loads(store.get_study(made.stdout.strip()).spec_json)
    store.close()
    assert spec["sketch"]["privacy"]["epsilon"] == pytest.approx(0.4)
    assert spec["refine"]["epsilon"] == pytest.approx([0.15] * 4)
