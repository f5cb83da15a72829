"""The ε a device keeps for the rounds still to come of a study it took part in (ledger schema 6,
:func:`fedsketch.client.ledger_schema.promises`): from any release of the study that has rounds
after it, set aside from every other study at admission and at commit, never counted twice,
and only until the device learns the study ended or the time its rounds' lengths bound."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import study_spec
from typer.testing import CliRunner

from fedsketch.cli import app
from fedsketch.client.ledger import DEFAULT_SOURCE, BudgetExceeded, Ledger
from fedsketch.client.ledger_schema import MIGRATED_KEEP_SECONDS
from fedsketch.client.study_pass import MAX_KEEP_SECONDS, ROUND_GAP_SECONDS, Later, keep_seconds, later_rounds
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions
from fedsketch.common.study.calibration_round import SketchRound, split_auto
from fedsketch.common.study.refine import RefineSpec, RoundSpec
from fedsketch.common.study.study import StudySpec


def release(led: Ledger, study_id: str, epsilon: float, *, parent: str | None = None, round: int = 0,
            later: float = 0.0, keep: float = 0.0):
    return led.record_spend(study_id=study_id, study_name=study_id, source=DEFAULT_SOURCE,
                            epsilon=epsilon, delta=0.0, n=10.0, kind="int64_cells", payload=b"x",
                            spec_sha256="c" * 64, parent=parent, round=round, later_epsilon=later,
                            keep_seconds=keep)


@pytest.fixture
def led(tmp_path: Path):
    book = Ledger.create(tmp_path / "l.ledger", 2.0)
    yield book
    book.close()


def kept(led: Ledger) -> list[tuple[str, float]]:
    return [(study, round(eps, 12)) for study, _, _, eps, _ in led.promises()]


def test_a_sketch_round_release_after_a_missed_round_0_keeps_the_rounds_until_its_time(led):
    """Budget 2. The device missed round 0 of P and sends its sketch round (ε 0.3, rounds 0.8
    after it, kept for an hour): 0.8 is set aside from every other study, at admission and at
    commit, and P's own round pays from it; past ``kept_until`` nothing is kept any more."""
    spend = release(led, "S", 0.3, parent="P", later=0.8, keep=3600.0)
    assert spend.study_epsilon == pytest.approx(1.1) and spend.kept_until == spend.spent_at + 3600.0
    assert kept(led) == [("P", 0.8)]
    assert led.refusal(DEFAULT_SOURCE, 0.95, 0.0) is not None  # 1.7 left, 0.8 of it kept
    assert led.refusal(DEFAULT_SOURCE, 0.9, 0.0) is None
    assert led.refusal(DEFAULT_SOURCE, 1.7, 0.0, parent="P") is None  # P's round pays from it
    with pytest.raises(BudgetExceeded):  # the commit sets it aside too
        release(led, "other", 0.95)
    release(led, "R1", 0.5, parent="P", round=1)
    assert kept(led) == [("P", 0.3)]
    led._conn.execute("UPDATE spends SET kept_until = ?", (time.time() - 1.0,))
    assert kept(led) == [] and led.refusal(DEFAULT_SOURCE, 1.2, 0.0) is None


def test_a_release_that_cannot_pay_the_rounds_after_it_is_refused_at_commit(led):
    """The commit checks the release's ε and the rounds' after it (2.1 > 2): nothing is written."""
    with pytest.raises(BudgetExceeded, match="asks ε = 2.1"):
        release(led, "S", 0.3, parent="P", later=1.8, keep=60.0)
    assert led.spends() == []


def test_round_0_then_the_sketch_round_keep_the_rest_once(led):
    """Round 0 (ε 0.1, sketch 0.3 and rounds 0.8 after it) then the sketch round (rounds 0.8
    after it): both rows promise the same whole ε 1.2 for P, so 0.8 is kept, not 1.6 or 0.7;
    once the device records P's end, nothing."""
    release(led, "P", 0.1, later=1.1, keep=60.0)
    assert kept(led) == [("P", 1.1)]
    release(led, "S", 0.3, parent="P", later=0.8, keep=60.0)
    assert kept(led) == [("P", 0.8)]
    led.set_final_state("P", "DONE")
    assert kept(led) == [("P", 0.8)]  # the sketch round's release still promises it
    led.set_final_state("S", "DONE")
    assert kept(led) == []


def test_what_a_study_asks_after_each_release_and_for_how_long():
    """Round 0 (auto), then the sketch round (900 s), then rounds 1 and 2 (600 s each), each
    followed by a gap of a day for decoding and the next pass."""
    plan, rest = split_auto(10.0, (0.1, 10.0), round_seconds=900.0)
    base = study_spec(epsilon=rest * 0.5, refine=RefineSpec((1.5, 3.0), 600.0))
    freqs = replace(base.sketch.frequencies, scale=plan.placeholder)
    spec = StudySpec.create(base.name, replace(base.sketch, frequencies=freqs), base.k, base.lo,
                            base.hi, replicates=2, calibration=plan, refine=base.refine)
    sketch = spec.sketch.privacy.epsilon
    gap = ROUND_GAP_SECONDS
    after0 = later_rounds(spec, None)
    assert (after0.epsilon, after0.seconds) == (sketch + 4.5, 900.0 + 2 * 600.0 + 3 * gap)
    assert after0.epsilon == pytest.approx(spec.total_epsilon - plan.epsilon, rel=1e-12)
    rnd = SketchRound("P", "0" * 64, 1.0, "1" * 64, None, {"sigma": 1.0}, spec.min_devices)
    assert later_rounds(spec, rnd) == later_rounds(replace(spec, calibration=None), None)
    assert (later_rounds(spec, rnd).epsilon, later_rounds(spec, rnd).seconds) == (4.5, 1200.0 + 2 * gap)
    first = RoundSpec("P", "0" * 64, 1, ((0.0, 0.0, 0.0),) * 3, 2, None)
    assert (later_rounds(spec, first).epsilon, later_rounds(spec, first).seconds) == (3.0, 600.0 + gap)
    last = replace(first, round=2)
    assert (later_rounds(spec, last).epsilon, later_rounds(spec, last).seconds) == (0.0, 0.0)


def test_a_schema_5_promise_lapses_a_week_after_its_spend(tmp_path):
    """Schema 5 kept a promise until the device learnt the study's end: the migration gives it
    ``kept_until`` = its spend + a week; a promise older than that is kept no more."""
    path = tmp_path / "old.ledger"
    led = Ledger.create(path, 2.0)
    release(led, "fresh", 0.1, later=0.5, keep=60.0)
    release(led, "stale", 0.1, later=0.7, keep=60.0)
    led.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE spends SET spent_at = spent_at - ? WHERE study_id = 'stale'", (8 * 86400.0,))
        db.execute("ALTER TABLE spends DROP COLUMN kept_until")
        db.execute("ALTER TABLE spends DROP COLUMN chain")  # schema 7's seal
        db.execute("ALTER TABLE spends DROP COLUMN chain_signature")
        db.execute("DROP TABLE secure_sessions")
        db.execute("DROP TABLE voids")  # schema 8's
        db.execute("ALTER TABLE spends DROP COLUMN round_terms")  # schema 9's
        db.execute("UPDATE settings SET value = '5' WHERE key = 'schema_version'")
    db.close()
    led = Ledger(path)
    try:
        rows = {s.study_id: s for s in led.spends()}
        assert all(s.kept_until == s.spent_at + MIGRATED_KEEP_SECONDS for s in rows.values())
        assert kept(led) == [("fresh", 0.5)]
        assert "schema 5 → 6" in led.history()[-4].detail  # then 6 → 7, 7 → 8 and 8 → 9
    finally:
        led.close()


def test_device_budget_shows_what_is_kept_and_until_when(tmp_path):
    """``device budget``: the source's ε left says how much of it is kept, and each promise is
    listed with its study, the release that made it and its time (also in ``--json``)."""
    path = tmp_path / "l.ledger"
    led = Ledger.create(path, 2.0)
    spend = release(led, "S", 0.3, parent="P", later=0.8, keep=3600.0)
    led.close()
    shown = CliRunner().invoke(app, ["device", "budget", "--ledger", str(path), "--json"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)
    assert doc["sources"][DEFAULT_SOURCE]["kept_epsilon"] == pytest.approx(0.8)
    assert doc["kept"] == [{"study_id": "P", "release": "S", "source": DEFAULT_SOURCE,
                            "epsilon": pytest.approx(0.8), "until": spend.kept_until}]
    text = CliRunner().invoke(app, ["device", "budget", "--ledger", str(path)], env={"COLUMNS": "200"})
    assert text.exit_code == 0 and "1.7 (0.8 of it kept)" in text.stdout, text.stdout


def test_how_long_a_release_keeps_the_rounds_after_it():
    """Its own round's rest first (to its deadline; else the study's collection window; else, under
    secure aggregation, every stage's timeout), then the later rounds; never past 30 days, and a
    spec's huge round_seconds neither overflows nor keeps the budget longer."""
    later, now = Later(1.0, 1000.0), 1e9
    plain = study_spec(min_devices=2, roster=3, collect_seconds=3 * 86400.0)
    assert keep_seconds(plain, now + 50.0, later, now) == 1050.0
    assert keep_seconds(plain, now - 50.0, later, now) == 1000.0
    assert keep_seconds(plain, None, later, now) == 3 * 86400.0 + 1000.0
    secure = study_spec(min_devices=4, secure_aggregation=SecAggSpec.assuming(
        Assumptions(4, 0, 0), 1000, None, 20.0))
    assert keep_seconds(secure, None, later, now) == 6 * 20.0 + 1000.0
    huge = study_spec(refine=RefineSpec((1.0, 1.0), 1e308))
    assert later_rounds(huge, None) == Later(2.0, MAX_KEEP_SECONDS)
    assert keep_seconds(huge, now + 1e300, later_rounds(huge, None), now) == MAX_KEEP_SECONDS


def test_round_0_asks_for_the_sketchs_delta_too():
    """After a calibration round 0 comes the sketch, whose δ the device must still be able to pay:
    round 0 asks for it (a pure-ε budget could never follow round 0 with the sketch)."""
    plan, rest = split_auto(10.0, (0.1, 10.0))
    base = study_spec(epsilon=rest)
    sketch = replace(base.sketch, privacy=replace(base.sketch.privacy, delta=1e-6),
                     frequencies=replace(base.sketch.frequencies, scale=plan.placeholder))
    spec = StudySpec.create(base.name, sketch, base.k, base.lo, base.hi, replicates=2, calibration=plan)
    assert later_rounds(spec, None).delta == 1e-6
    rnd = SketchRound("P", "0" * 64, 1.0, "1" * 64, None, {"sigma": 1.0}, spec.min_devices)
    assert later_rounds(spec, rnd).delta == 0.0  # the sketch round's δ is its own release's


def test_a_promise_of_one_source_keeps_nothing_for_another(led):
    """Two sources on one ledger: a round of P sets nothing aside for the source that keeps P's
    rounds, and its full cost for the other."""
    led.declare("clinic", 2.0)
    release(led, "P", 0.3, later=0.8, keep=60.0)
    assert led.keeps("P", DEFAULT_SOURCE) and not led.keeps("P", "clinic")
