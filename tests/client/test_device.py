"""The device daemon end to end against a real coordinator (TLS on loopback): the budget belongs
to the device whatever the file looks like, the owner's policy is enforced before any spend, and
out-of-box or non-finite records are clipped or refused before anything is spent."""

from __future__ import annotations

import json
import logging
import threading

import grpc
import numpy as np
import pytest
from conftest import study_spec
from typer.testing import CliRunner

from fedsketch.client import daemon
from fedsketch.client.agent import Agent
from fedsketch.client.ledger import DEFAULT_SOURCE, Budget, Ledger, LedgerError
from fedsketch.client.policy import Policy
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.sketch.frequencies import FrequencySpec, draw_frequencies
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.sketching import feature_sum
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study import wire
from fedsketch.common.study.study import StudySpec, spec_sha256
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


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_records_are_refused_and_spend_nothing(coordinator_round, records, tmp_path,
                                                          caplog, bad):
    """Must-show 4 (refuse): NaN and ±inf are not records: refused with the row named, the
    ledger's spends unchanged, nothing sent."""
    x = records.astype(np.float32)
    x[11, 0] = bad
    npy, ledger = tmp_path / "x.npy", tmp_path / "ledger"
    np.save(npy, x)
    Ledger.create(ledger, 1.0).close()
    study = coordinator_round.create(study_spec(epsilon=0.5))
    caplog.set_level(logging.WARNING, logger="fedsketch.device")
    run_once(coordinator_round, npy, ledger)
    assert "record 12, column 1 holds a" in caplog.text  # counted from 1
    assert ledger_state(ledger)[1] == [] and remaining(ledger) == 1.0
    assert coordinator_round.store.contributions(study.study_id) == []


def off_centre_spec(feature: str, r: int) -> StudySpec:
    """A study over [100, 140] × [−70, −20] × [5, 6]: far from 0 and not centred on it."""
    sketch = SketchSpec(FrequencySpec(d=3, m=60, scale=1.5, seed=1), feature, r,
                        PrivacySpec(1e9, 0.0, "replace_one"))  # noise far below one grid step
    return StudySpec.create("off-centre", sketch, 3, [100.0, -70.0, 5.0], [140.0, -20.0, 6.0],
                            replicates=1)


@pytest.mark.parametrize("feature, r", [("complex", 20), ("quantized", 60), ("quantized", 20)])
def test_an_off_centre_box_releases_the_features_of_the_records_themselves(
        coordinator_round, tmp_path, feature, r):
    """Centring is exact: 300 copies of one record p in a box far from 0 release, per entry j,
    c_j·q(Ω_jᵀp + ξ_j) with q computed here in float64 without the Box class, and counts c_j ≥ 0
    adding up to n·r (each record feeds r of the m entries, whatever its random mask). A wrong
    shift or dither (ξ' ≠ ξ + Ωᵀc) gives other q's and fails."""
    spec = off_centre_spec(feature, r)
    p = np.array([103.7, -21.2, 5.9])
    freqs = draw_frequencies(spec.sketch.frequencies)
    t = p @ np.asarray(freqs.omega, np.float64) + np.asarray(freqs.xi, np.float64)
    if feature == "complex":
        q = np.stack([np.rint(1024 * np.cos(t)), np.rint(1024 * np.sin(t))])
    else:  # no phase within 1e-3 rad of a quadrant boundary, so float32 agrees with float64
        assert np.min(np.abs(t / (np.pi / 2) - np.rint(t / (np.pi / 2)))) > 1e-3 / (np.pi / 2)
        q = np.stack([np.sign(np.cos(t)), np.sign(np.sin(t))])
    npy, ledger = tmp_path / "x.npy", tmp_path / "ledger"
    np.save(npy, np.tile(p, (300, 1)))
    study = coordinator_round.create(spec)
    run_once(coordinator_round, npy, ledger, budget=2e9)
    [row] = coordinator_round.store.contributions(study.study_id)
    sent = wire.decode(row.kind, row.payload, spec.sketch.frequencies.m)
    counts = np.rint((sent * q).sum(axis=0) / (q * q).sum(axis=0))
    assert counts.min() >= 0 and counts.sum() == 300 * r
    # float32 phases may round a part of q one step the other way for some of the c_j copies
    assert np.all(np.abs(sent - counts * q) <= (counts if feature == "complex" else 0) + 1)


def test_a_replaced_data_file_is_read_with_its_own_layout(coordinator_round, records, tmp_path):
    """The daemon opens the file afresh for every study: replaced by a float64 file of other
    records (same path), the next study's release is the sketch of the new records."""
    npy, token = tmp_path / "x.npy", coordinator_round.tokens(1)[0]
    np.save(npy, records.astype(np.float32))
    book = Ledger.create(tmp_path / "ledger", 3e9)
    agent = Agent(coordinator_round.channel(), book, lambda: daemon.local_data(npy))
    agent.ensure_enrolled(coordinator_round.target, token, "replaced")
    spec = study_spec(epsilon=1e9, name="before")
    coordinator_round.create(spec)
    assert agent.step().submitted
    new = records[:123] * 0.5 + 1.0
    np.save(tmp_path / "new.npy", new)
    (tmp_path / "new.npy").replace(npy)
    study = coordinator_round.create(study_spec(epsilon=1e9, name="after"))
    assert agent.step().submitted == [study.study_id]
    [row] = coordinator_round.store.contributions(study.study_id)
    assert row.n == 123
    sent = wire.decode(row.kind, row.payload, spec.sketch.frequencies.m)
    clean = feature_sum(split(new.astype(np.float32)), draw_frequencies(spec.sketch.frequencies),
                        "complex")
    assert np.abs(sent - np.stack([clean.re, clean.im])).max() <= 1
    book.close()


def test_under_add_remove_no_decision_depends_on_n(coordinator_round, records, tmp_path):
    """Item 4 of the issue: a device with no records, and devices with fewer records than an older
    stored add/remove study asks for (created before the coordinator refused that), all
    release a sketch and a noisy count, as a device with many records does."""
    spec = study_spec(epsilon=1.0, neighbouring="add_remove", min_records=50, min_devices=3)
    text = spec.to_json()
    coordinator_round.store.create_study("st-legacy", text, spec_sha256(text), None, 3)
    names = {"empty": records[:0], "three": records[:3], "many": records}
    for name, x in names.items():  # the third fills the roster and contributes at once
        np.save(tmp_path / f"{name}.npy", x)
        run_once(coordinator_round, tmp_path / f"{name}.npy", tmp_path / f"{name}.ledger",
                 budget=1.0)
    for name in ("empty", "three"):  # the first two contribute on their next pass
        run_once(coordinator_round, tmp_path / f"{name}.npy", tmp_path / f"{name}.ledger",
                 token="")
    for name in names:
        assert ledger_state(tmp_path / f"{name}.ledger")[1] == [("test", 1.0)], name
    assert len(coordinator_round.store.contributions("st-legacy")) == 3


def test_a_data_refusal_is_retried_once_the_file_is_fixed(coordinator_round, records, tmp_path,
                                                          caplog):
    """A NaN, or a file deleted under the daemon, refuses the study for this pass only (nothing
    spent, the daemon goes on); once the owner fixes the file the device joins the same study."""
    npy = tmp_path / "x.npy"
    bad = records.copy()
    bad[3, 2] = np.nan
    np.save(npy, bad)
    book = Ledger.create(tmp_path / "ledger", 1.0)
    agent = Agent(coordinator_round.channel(), book, lambda: daemon.local_data(npy))
    agent.ensure_enrolled(coordinator_round.target, coordinator_round.tokens(1)[0], "retry")
    study = coordinator_round.create(study_spec(epsilon=0.5))
    caplog.set_level(logging.WARNING, logger="fedsketch.device")
    assert "record 4, column 3 holds a NaN" in agent.step().refused[study.study_id]
    npy.unlink()
    assert "no such file" in agent.step().refused[study.study_id]
    assert book.spends() == []
    np.save(npy, records)
    assert agent.step().submitted == [study.study_id]
    assert [s.study_id for s in book.spends()] == [study.study_id]
    book.close()


def test_min_records_binds_under_replace_one_and_cannot_be_set_under_add_remove(
        coordinator_round, records, tmp_path, caplog):
    """Under replace-one n is public, so too few records is a refusal that spends nothing. Under
    add/remove n is private: a study cannot ask for min_records > 1 (item 4 of the issue)."""
    npy, ledger = tmp_path / "x.npy", tmp_path / "ledger"
    np.save(npy, records)
    study = coordinator_round.create(study_spec(epsilon=0.5, min_records=401))
    caplog.set_level(logging.WARNING, logger="fedsketch.device")
    run_once(coordinator_round, npy, ledger, budget=1.0)
    assert "needs 401 records, the device has 400" in caplog.text
    assert ledger_state(ledger)[1] == [] and coordinator_round.store.contributions(study.study_id) == []
    with pytest.raises(grpc.RpcError, match="min_records applies under replace-one only"):
        coordinator_round.create(study_spec(epsilon=0.5, min_records=2, neighbouring="add_remove"))


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
    pol = runner.invoke(app, ["device", "policy", "--ledger", str(ledger), "--max-epsilon", "0.4"])
    assert pol.exit_code == 0 and json.loads(pol.output) == {
        "coordinators": ["*"], "max_epsilon": 0.4, "studies": ["t*"]}
    src = runner.invoke(app, ["device", "add-source", "--ledger", str(ledger), "clinic-b",
                              "--budget", "1"])
    assert src.exit_code == 0
    history = json.loads(runner.invoke(app, ["device", "budget", "--ledger", str(ledger),
                                             "--json"]).output)["history"]
    assert [h["action"] for h in history] == ["init", "policy", "raise", "policy", "add-source"]
    bad = runner.invoke(app, ["device", "policy", "--ledger", str(ledger), "--max-epsilon", "-1"])
    assert bad.exit_code == 1 and bad.output.startswith("error:")
    esc = runner.invoke(app, ["device", "policy", "--ledger", str(ledger), "--study", "\x1b[31m*"])
    assert esc.exit_code == 1 and "control characters" in esc.output
    fresh = tmp_path / "never"
    nan = runner.invoke(app, ["device", "init", "--ledger", str(fresh), "--budget", "nan"])
    assert nan.exit_code == 1 and "a budget needs" in nan.output and not fresh.exists()


def test_device_budget_shows_control_characters_escaped(tmp_path):
    """A study name is the coordinator's text: an ESC sequence in it reaches the owner's terminal
    escaped, never raw (and the coordinator refuses such names for new studies)."""
    ledger = tmp_path / "ledger"
    book = Ledger.create(ledger, 1.0)
    book.record_spend(study_id="st-1", study_name="evil\x1b[2J\x07name", source=DEFAULT_SOURCE,
                      epsilon=0.1, delta=0.0, n=5, kind="int64_pairs", payload=b"x",
                      spec_sha256="c" * 64)
    book.close()
    out = runner.invoke(app, ["device", "budget", "--ledger", str(ledger)], env={"COLUMNS": "250"})
    assert out.exit_code == 0
    assert "\x1b" not in out.output and "\x07" not in out.output
    assert "evil\\x1b[2J\\x07name" in out.output
    with pytest.raises(ValueError, match="control characters"):
        study_spec(name="evil\x1b[2J").check_new()


def test_a_budget_that_is_no_budget_is_refused_even_when_it_changes_nothing(coordinator_round,
                                                                             records, tmp_path):
    npy, ledger = tmp_path / "x.npy", tmp_path / "ledger"
    np.save(npy, records)
    run_once(coordinator_round, npy, ledger, budget=1.0)
    for bad in ({"budget": float("nan")}, {"budget": -1.0}, {"budget_delta": 1.5}):
        with pytest.raises(ValueError, match="a budget needs"):
            run_once(coordinator_round, npy, ledger, token="", **bad)


def test_a_study_the_device_cannot_handle_is_declined_and_the_pass_goes_on(coordinator_round, records,
                                                                         tmp_path, monkeypatch, caplog):
    """A study whose step raises where no check expected it (here: its frequencies' draw
    overflows) is declined for good with the error logged, and the real daemon's pass still
    contributes to the other open study and exits 0."""
    import fedsketch.client.agent as agent_module
    real = agent_module.draw_frequencies

    def overflowing(spec):
        if spec.seed == 7:
            raise OverflowError("math range error")
        return real(spec)

    monkeypatch.setattr(agent_module, "draw_frequencies", overflowing)
    base = study_spec(epsilon=0.4, name="broken")
    broken = coordinator_round.create(StudySpec.create(
        "broken", SketchSpec(FrequencySpec(d=3, m=60, scale=1.5, seed=7), "complex", 60,
                             PrivacySpec(0.4)), base.k, base.lo, base.hi, replicates=2))
    fine = coordinator_round.create(study_spec(epsilon=0.4, name="fine"))
    data, ledger = tmp_path / "x.npy", tmp_path / "ledger"
    np.save(data, records)
    caplog.set_level(logging.ERROR, logger="fedsketch.device")
    run_once(coordinator_round, data, ledger, budget=1.0)
    assert [name for name, _ in ledger_state(ledger)[1]] == ["fine"]
    assert f"study {broken.study_id}: the device cannot handle it" in caplog.text
    assert "OverflowError: math range error" in caplog.text and fine.study_id not in caplog.text
