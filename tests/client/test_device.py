"""The device daemon end to end against a real coordinator (TLS on loopback): the budget belongs
to the device whatever the file looks like, the owner's policy is enforced before any spend, and
out-of-box or non-finite records are clipped or refused before anything is spent."""

from __future__ import annotations

import json
import logging
import threading

import numpy as np
import pytest
from conftest import study_spec
from typer.testing import CliRunner

from fedsketch.client import daemon
from fedsketch.client.ledger import DEFAULT_SOURCE, Budget, Ledger, LedgerError
from fedsketch.client.policy import Policy
from fedsketch.common import wire
from fedsketch.common.frequencies import draw_frequencies
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.sketching import feature_sum
from fedsketch.server.bench.metrics import split
from fedsketch.server.cli.main import app

runner = CliRunner()


@pytest.fixture
def records() -> np.ndarray:
    return np.random.default_rng(3).uniform(-5.0, 5.0, size=(400, 3))


def run_once(rnd, data, ledger, token=None, **options) -> None:
    """One pass of the real daemon (``fedsketch device run --once``) in this process."""
    cfg = daemon.DaemonConfig(rnd.target, data, ledger, ca=rnd.certs.ca_cert, once=True,
                              token=token if token is not None else rnd.tokens(1)[0], **options)
    assert daemon.run(cfg, threading.Event()) == 0


def ledger_state(path) -> tuple[dict, list]:
    book = Ledger(path)
    try:
        return book.sources(), [(s.study_name, s.epsilon) for s in book.spends()]
    finally:
        book.close()


def remaining(path) -> float:
    book = Ledger(path)
    try:
        return book.remaining(DEFAULT_SOURCE).epsilon
    finally:
        book.close()


def test_appending_converting_or_renaming_the_file_keeps_the_budget(coordinator_round, records,
                                                                    tmp_path, caplog):
    """Must-show 5: the budget is the device's. 0.8 of 1.0 spent on a CSV stays spent after a row
    is appended, the file is converted to .npy or renamed; --budget 5 does not raise it."""
    csv, ledger = tmp_path / "x.csv", tmp_path / "ledger"
    np.savetxt(csv, records, delimiter=",")
    for name in ("first", "second"):
        coordinator_round.create(study_spec(epsilon=0.4, name=name))
        run_once(coordinator_round, csv, ledger, budget=1.0)
    assert remaining(ledger) == pytest.approx(0.2)
    token = None
    coordinator_round.create(study_spec(epsilon=0.4, name="third"))
    with open(csv, "a") as fh:
        fh.write("1.5,2.5,3.5\n")
    npy, renamed = tmp_path / "converted.npy", tmp_path / "renamed.csv"
    np.save(npy, np.loadtxt(csv, delimiter=","))
    csv.rename(renamed)
    caplog.set_level(logging.WARNING, logger="fedsketch.device")
    for data, budget in ((renamed, None), (npy, None), (renamed, 5.0)):
        run_once(coordinator_round, data, ledger, token, budget=budget)
        assert remaining(ledger) == pytest.approx(0.2)
    sources, spends = ledger_state(ledger)
    assert sources == {DEFAULT_SOURCE: Budget(1.0, 0.0)}
    assert spends == [("first", 0.4), ("second", 0.4)]
    assert "insufficient budget" in caplog.text and "cannot raise it" in caplog.text


def test_a_smaller_budget_lowers_it_and_a_new_source_name_is_refused(coordinator_round, records,
                                                                     tmp_path):
    npy, ledger = tmp_path / "x.npy", tmp_path / "ledger"
    np.save(npy, records)
    run_once(coordinator_round, npy, ledger, budget=1.0)
    run_once(coordinator_round, npy, ledger, budget=0.3)
    assert ledger_state(ledger)[0] == {DEFAULT_SOURCE: Budget(0.3, 0.0)}
    with pytest.raises(LedgerError, match="add-source"):
        run_once(coordinator_round, npy, ledger, budget=1.0, source="fresh-name")
    book = Ledger(ledger)
    assert [h.action for h in book.history()] == ["init", "lower"]
    book.close()


def test_a_first_run_without_a_budget_is_refused(coordinator_round, records, tmp_path):
    npy = tmp_path / "x.npy"
    np.save(npy, records)
    with pytest.raises(LedgerError, match="--budget"):
        run_once(coordinator_round, npy, tmp_path / "ledger")


@pytest.mark.parametrize("value", [1e38, -3.4e38, 1e300])
def test_a_huge_finite_record_is_clipped_before_sketching(coordinator_round, records, tmp_path,
                                                          value):
    """Must-show 4 (clip): the released sketch is the one of the records clipped into the box,
    every entry finite; the count of clipped records is logged on the device only."""
    x = records.copy()
    x[7, 1] = value
    npy, ledger = tmp_path / "x.npy", tmp_path / "ledger"
    np.save(npy, x.astype(np.float32) if abs(value) < 3.5e38 else x)
    spec = study_spec(epsilon=1e9)  # noise far below one grid step: the sum is visible
    study = coordinator_round.create(spec)
    run_once(coordinator_round, npy, ledger, budget=1e10)
    [row] = coordinator_round.store.contributions(study.study_id)
    sent = wire.decode(row.kind, row.payload, spec.sketch.frequencies.m)
    clipped = np.clip(x, spec.lo, spec.hi).astype(np.float32)  # the box is centred at 0
    clean = feature_sum(split(clipped), draw_frequencies(spec.sketch.frequencies),
                        spec.sketch.feature, spec.sketch.r)
    assert np.abs(sent - np.stack([clean.re, clean.im])).max() <= 1
    assert ledger_state(ledger)[1] == [("test", 1e9)]


@pytest.mark.parametrize("bad, why", [(np.nan, "NaN or an infinity"), (np.inf, "NaN or an infinity"),
                                      (-np.inf, "NaN or an infinity"),
                                      (1e38, "outside the study's box")])
def test_refused_records_spend_nothing(coordinator_round, records, tmp_path, caplog, bad, why):
    """Must-show 4 (refuse): NaN and ±inf always, a finite out-of-box record under the owner's
    out-of-box = refuse policy: refused with the reason, the ledger's spends unchanged."""
    x = records.astype(np.float32)
    x[11, 0] = bad
    npy, ledger = tmp_path / "x.npy", tmp_path / "ledger"
    np.save(npy, x)
    Ledger.create(ledger, 1.0, policy=Policy(out_of_box="refuse")).close()
    study = coordinator_round.create(study_spec(epsilon=0.5))
    caplog.set_level(logging.WARNING, logger="fedsketch.device")
    run_once(coordinator_round, npy, ledger)
    assert why in caplog.text
    assert ledger_state(ledger)[1] == [] and remaining(ledger) == 1.0
    assert coordinator_round.store.contributions(study.study_id) == []


def test_the_policy_decides_which_studies_the_device_joins(coordinator_round, records, tmp_path,
                                                           caplog):
    npy, ledger = tmp_path / "x.npy", tmp_path / "ledger"
    np.save(npy, records)
    Ledger.create(ledger, 10.0, policy=Policy(max_epsilon=0.5, studies=("diabetes-*",))).close()
    for name, eps in (("diabetes-2026", 0.5), ("marketing", 0.1), ("diabetes-greedy", 0.6)):
        coordinator_round.create(study_spec(epsilon=eps, name=name))
    caplog.set_level(logging.WARNING, logger="fedsketch.device")
    run_once(coordinator_round, npy, ledger)
    assert ledger_state(ledger)[1] == [("diabetes-2026", 0.5)]
    assert "only studies named diabetes-*" in caplog.text and "at most 0.5 per study" in caplog.text
    book = Ledger(ledger)
    book.set_policy(Policy(coordinators=("coordinator.example.org:*",)))
    book.close()
    with pytest.raises(LedgerError, match="works only for coordinators"):
        run_once(coordinator_round, npy, ledger)


def test_device_cli_init_policy_raise_and_budget(coordinator_round, records, tmp_path):
    """The owner's commands, and `device budget` showing each spend's time, study and outcome."""
    npy, ledger = tmp_path / "x.npy", tmp_path / "ledger"
    np.save(npy, records)
    ok = runner.invoke(app, ["device", "init", "--ledger", str(ledger), "--budget", "1",
                             "--max-epsilon", "0.6", "--study", "t*"])
    assert ok.exit_code == 0, ok.output
    again = runner.invoke(app, ["device", "init", "--ledger", str(ledger), "--budget", "9"])
    assert again.exit_code == 1 and "already holds a budget" in again.output
    study = coordinator_round.create(study_spec(epsilon=0.5))
    run_once(coordinator_round, npy, ledger)
    coordinator_round.wait(study.study_id)
    run_once(coordinator_round, npy, ledger, token="")  # learns the study's end
    out = runner.invoke(app, ["device", "budget", "--ledger", str(ledger), "--json"])
    shown = json.loads(out.output)
    assert shown["sources"]["default"]["remaining_epsilon"] == pytest.approx(0.5)
    assert shown["policy"]["max_epsilon"] == 0.6 and shown["policy"]["studies"] == ["t*"]
    [spend] = shown["spends"]
    assert (spend["study"], spend["state"]) == ("test", pb.StudyState.Name(pb.DONE))
    assert spend["spent_at"] > 0
    table = runner.invoke(app, ["device", "budget", "--ledger", str(ledger)])
    assert table.exit_code == 0 and "DONE" in table.output and "test" in table.output

    no = runner.invoke(app, ["device", "raise-budget", "--ledger", str(ledger), "--budget", "0.5",
                             "--reason", "x"])
    assert no.exit_code == 1 and "does not raise" in no.output
    up = runner.invoke(app, ["device", "raise-budget", "--ledger", str(ledger), "--budget", "2",
                             "--reason", "consent renewed"])
    assert up.exit_code == 0 and "1 → 2" in up.output
    pol = runner.invoke(app, ["device", "policy", "--ledger", str(ledger), "--out-of-box", "refuse"])
    assert pol.exit_code == 0 and json.loads(pol.output)["studies"] == ["t*"]
    src = runner.invoke(app, ["device", "add-source", "--ledger", str(ledger), "clinic-b",
                              "--budget", "1"])
    assert src.exit_code == 0
    history = json.loads(runner.invoke(app, ["device", "budget", "--ledger", str(ledger),
                                             "--json"]).output)["history"]
    assert [h["action"] for h in history] == ["init", "policy", "raise", "policy", "add-source"]
    bad = runner.invoke(app, ["device", "policy", "--ledger", str(ledger), "--max-epsilon", "-1"])
    assert bad.exit_code == 1 and bad.output.startswith("error:")
