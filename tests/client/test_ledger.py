"""The device's privacy-budget ledger, on real files: one release per study with its exact bytes,
budgets per device (and per declared source) that are never exceeded and only the owner raises,
the log of every change, migration of schema-1 files, survival of a SIGKILL, and races between
processes."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedsketch.client.ledger import (
    DEFAULT_SOURCE,
    SCHEMA_VERSION,
    Budget,
    BudgetExceeded,
    Identity,
    Ledger,
    LedgerError,
)
from fedsketch.client.policy import Policy

OTHER = "clinic-b"


def spend(ledger: Ledger, study_id: str, epsilon: float = 0.3, *, source: str = DEFAULT_SOURCE,
          delta: float = 0.0, payload: bytes = b"\x00sketch\xff"):
    return ledger.record_spend(study_id=study_id, study_name=f"name of {study_id}", source=source,
                               epsilon=epsilon, delta=delta, n=1234.5, kind="complex",
                               payload=payload, spec_sha256="c" * 64)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite"


@pytest.fixture
def ledger(path: Path):
    led = Ledger.create(path, 1.0)
    yield led
    led.close()


def test_record_then_find_returns_the_exact_bytes_and_a_second_release_is_refused(ledger):
    payload = os.urandom(50_000) + b"\x00"
    s = spend(ledger, "study-1", 0.5, payload=payload)
    found = ledger.find("study-1")
    assert found == s
    assert found.payload == payload and found.payload_sha256 == hashlib.sha256(payload).hexdigest()
    assert (found.epsilon, found.delta, found.n, found.kind) == (0.5, 0.0, 1234.5, "complex")
    assert (found.study_name, found.source) == ("name of study-1", DEFAULT_SOURCE)
    assert found.acked_at is None and found.receipt is None and found.final_state is None
    assert ledger.find("study-2") is None

    with pytest.raises(LedgerError, match="already released"):
        spend(ledger, "study-1", 0.1, payload=b"fresh noise")
    ledger.declare(OTHER, 1.0)
    with pytest.raises(LedgerError, match="already released"):  # any source
        spend(ledger, "study-1", 0.1, source=OTHER, payload=b"fresh noise")
    assert ledger.spends() == [s]
    assert ledger.spent(DEFAULT_SOURCE) == (0.5, 0.0) and ledger.spent(OTHER) == (0.0, 0.0)


def test_budget_is_never_exceeded_and_a_refusal_writes_nothing(ledger):
    won = []
    for i in range(10):
        try:
            won.append(spend(ledger, f"s{i}", 0.3))
        except BudgetExceeded as exc:
            if i == 3:
                assert "0.1" in str(exc) and "0.3" in str(exc)  # remaining and asked ε
        assert ledger.spent(DEFAULT_SOURCE)[0] <= 1.0
    assert [s.study_id for s in won] == ["s0", "s1", "s2"]
    assert ledger.spends() == won and ledger.find("s3") is None
    assert ledger.remaining(DEFAULT_SOURCE).epsilon == pytest.approx(0.1)
    spend(ledger, "fill", ledger.remaining(DEFAULT_SOURCE).epsilon)  # exactly filling is allowed
    assert ledger.remaining(DEFAULT_SOURCE).epsilon == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(BudgetExceeded):
        spend(ledger, "one-more", 1e-9)


def test_a_declared_source_has_its_own_budget_and_an_undeclared_one_none(ledger):
    """Parallel composition only between sources the owner declared; no other key exists."""
    spend(ledger, "s1", 1.0)
    with pytest.raises(BudgetExceeded):
        spend(ledger, "s2", 0.1)
    with pytest.raises(LedgerError, match="no budget for source 'clinic-b'"):
        spend(ledger, "s2", 0.1, source=OTHER)
    ledger.declare(OTHER, 1.0)
    spend(ledger, "s2", 0.9, source=OTHER)
    assert ledger.remaining(DEFAULT_SOURCE).epsilon == 0.0
    assert ledger.remaining(OTHER).epsilon == pytest.approx(0.1)
    with pytest.raises(LedgerError, match="already has a budget"):
        ledger.declare(OTHER, 5.0)  # declaring again is no way to a fresh budget
    assert ledger.budget(OTHER) == Budget(1.0, 0.0)


def test_budget_only_goes_down_except_by_the_owners_logged_raise(ledger):
    with pytest.raises(ValueError, match="raise"):
        ledger.lower(DEFAULT_SOURCE, 5.0)
    assert ledger.lower(DEFAULT_SOURCE, 0.5) == Budget(0.5, 0.0)
    ledger.lower(DEFAULT_SOURCE, 0.5)  # no change: no log line
    with pytest.raises(ValueError, match="reason"):
        ledger.raise_budget(DEFAULT_SOURCE, 2.0, None, "  ")
    with pytest.raises(ValueError, match="does not raise"):
        ledger.raise_budget(DEFAULT_SOURCE, 0.4, None, "typo")
    assert ledger.budget(DEFAULT_SOURCE) == Budget(0.5, 0.0)
    assert ledger.raise_budget(DEFAULT_SOURCE, 2.0, None, "ethics board approval 12") == Budget(2.0, 0.0)
    log = ledger.history()
    assert [h.action for h in log] == ["init", "lower", "raise"]
    assert (log[1].epsilon, log[2].epsilon) == (0.5, 2.0)
    assert "ethics board approval 12" in log[2].detail and "0.5 → 2" in log[2].detail
    assert all(log[i].at <= log[i + 1].at for i in range(2))


def test_policy_is_stored_logged_and_enforced_in_the_spend_transaction(ledger):
    assert ledger.policy() == Policy()
    strict = Policy(max_epsilon=0.25, studies=("diabetes-*",))
    ledger.set_policy(strict)
    ledger.set_policy(strict)  # unchanged: no second log line
    assert ledger.policy() == strict
    assert [h.action for h in ledger.history()] == ["init", "policy"]
    with pytest.raises(BudgetExceeded, match="at most 0.25 per study"):
        spend(ledger, "s1", 0.3)
    assert ledger.spends() == []
    spend(ledger, "s1", 0.25)


def test_delta_adds_up_and_is_checked_separately(tmp_path):
    led = Ledger.create(tmp_path / "pure", 10.0)  # pure-ε ledger: no δ at all
    try:
        for tiny in (1e-9, 4e-16, 5e-324):  # no absolute slack: a pure-ε budget admits no δ
            with pytest.raises(BudgetExceeded, match="a pure-ε budget"):
                spend(led, "s0", 0.1, delta=tiny)
            assert "δ" in led.refusal(DEFAULT_SOURCE, 0.1, tiny)
        assert led.refusal(DEFAULT_SOURCE, 0.1, 0.0) is None
    finally:
        led.close()
    led = Ledger.create(tmp_path / "approx", 10.0, 1e-6)
    try:
        spend(led, "s1", 0.1, delta=6e-7)
        with pytest.raises(BudgetExceeded, match="δ"):
            spend(led, "s2", 0.1, delta=6e-7)
        spend(led, "s3", 0.1, delta=4e-7)  # exactly filling δ
        spend(led, "s4", 0.1)  # pure ε still fits
        eps, delta = led.spent(DEFAULT_SOURCE)
        assert eps == pytest.approx(0.3) and delta == pytest.approx(1e-6)
        assert [s.study_id for s in led.spends()] == ["s1", "s3", "s4"]
    finally:
        led.close()


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_budget_or_epsilon_is_a_value_error(path, bad):
    with pytest.raises(ValueError):
        Ledger.create(path, bad)
    led = Ledger.create(path, 1.0)
    try:
        with pytest.raises(ValueError):
            led.declare(OTHER, bad)
        with pytest.raises(ValueError):
            led.lower(DEFAULT_SOURCE, bad)
        with pytest.raises(ValueError):
            spend(led, "s", bad)
        assert led.spends() == []
    finally:
        led.close()


def test_pending_until_acked_and_ack_is_idempotent(ledger):
    a, b, c = (spend(ledger, s, 0.2) for s in ("a", "b", "c"))
    assert [s.study_id for s in ledger.pending()] == ["a", "b", "c"]
    ledger.mark_acked("b", "receipt-b")
    first = ledger.find("b")
    assert first.receipt == "receipt-b" and first.acked_at is not None
    ledger.mark_acked("b", "receipt-b")
    assert ledger.find("b") == first
    with pytest.raises(LedgerError):
        ledger.mark_acked("b", "another receipt")
    with pytest.raises(LedgerError):
        ledger.mark_acked("never-spent", "r")
    assert ledger.pending() == [a, c]
    assert [s.study_id for s in ledger.spends()] == ["a", "b", "c"]


def test_identity_round_trip_and_refusal_to_overwrite(ledger):
    assert ledger.identity() is None
    me = Identity(device_id="dev-1", private_key=bytes(range(32)), coordinator="coord.example:7443")
    ledger.set_identity(me)
    ledger.set_identity(me)  # same identity: no-op
    assert ledger.identity() == me
    with pytest.raises(LedgerError):
        ledger.set_identity(Identity("dev-1", bytes(32), "coord.example:7443"))
    assert ledger.identity() == me


def test_final_state_is_recorded_for_acknowledged_spends(ledger):
    spend(ledger, "a", 0.2)
    spend(ledger, "b", 0.2)
    assert ledger.unsettled() == []  # nothing sent yet
    ledger.mark_acked("a", "r")
    assert [s.study_id for s in ledger.unsettled()] == ["a"]
    ledger.set_final_state("a", "FAILED")
    assert ledger.find("a").final_state == "FAILED" and ledger.unsettled() == []
    with pytest.raises(LedgerError):
        ledger.set_final_state("never-spent", "DONE")


def test_reopen_keeps_everything_including_the_budget(path):
    me = Identity("dev-1", os.urandom(32), "coord:1")
    led = Ledger.create(path, 1.0)
    s1 = spend(led, "s1", 0.6, payload=os.urandom(1000))
    spend(led, "s2", 0.4)
    led.mark_acked("s2", "r2")
    led.set_identity(me)
    led.close()
    assert os.stat(path).st_mode & 0o077 == 0  # holds a private key: owner-only

    led = Ledger(path)
    try:
        assert led.find("s1") == s1 and led.identity() == me
        assert [s.study_id for s in led.pending()] == ["s1"]
        assert led.budget(DEFAULT_SOURCE) == Budget(1.0, 0.0)
        assert led.remaining(DEFAULT_SOURCE).epsilon == 0.0
        with pytest.raises(LedgerError):
            spend(led, "s1", 0.1)
    finally:
        led.close()
    with pytest.raises(LedgerError, match="already holds a budget"):
        Ledger.create(path, 5.0)


def test_non_sqlite_foreign_and_newer_files_are_refused(tmp_path, path):
    junk = tmp_path / "junk"
    junk.write_bytes(b"this is not a database\n" * 200)
    with pytest.raises(LedgerError):
        Ledger(junk)
    assert junk.read_bytes() == b"this is not a database\n" * 200

    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE t (x)")
    db.close()
    with pytest.raises(LedgerError):
        Ledger(foreign)

    Ledger.create(path, 1.0).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE settings SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    db.close()
    with pytest.raises(LedgerError, match="version"):
        Ledger(path)


CHILD_COMMIT_THEN_SLEEP = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from fedsketch.client.ledger import Ledger
    led = Ledger.create(sys.argv[1], 1.0)
    led.record_spend(study_id="s1", study_name="s1", source="default", epsilon=0.5, delta=0.0,
                     n=10.0, kind="complex", payload=Path(sys.argv[2]).read_bytes(), spec_sha256="c")
    print("committed", flush=True)
    time.sleep(60)
""")


def test_a_spend_survives_sigkill_right_after_commit(tmp_path, path):
    payload = os.urandom(200_000)
    (tmp_path / "payload").write_bytes(payload)
    argv = [sys.executable, "-c", CHILD_COMMIT_THEN_SLEEP, str(path), str(tmp_path / "payload")]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line == "committed\n", child.stderr.read() if child.poll() is not None else line
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
        child.stderr.close()

    led = Ledger(path)
    try:
        [found] = led.spends()
        assert found.study_id == "s1" and found.payload == payload
        assert found.payload_sha256 == hashlib.sha256(payload).hexdigest()
        assert led.pending() == [found] and led.spent(DEFAULT_SOURCE) == (0.5, 0.0)
        with pytest.raises(LedgerError):
            spend(led, "s1", 0.5, payload=b"new noise")
    finally:
        led.close()


CHILD_RACER = textwrap.dedent("""
    import sys
    from fedsketch.client.ledger import Ledger
    path, study_id = sys.argv[1], sys.argv[2]
    led = Ledger(path)
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        led.record_spend(study_id=study_id, study_name=study_id, source="default", epsilon=0.6,
                         delta=0.0, n=1.0, kind="complex", payload=study_id.encode(), spec_sha256="c")
        print("won", flush=True)
    except Exception as exc:
        print(type(exc).__name__, flush=True)
""")


@pytest.mark.parametrize(("same_study", "loser"), [(True, "LedgerError"), (False, "BudgetExceeded")])
def test_racing_processes_exactly_one_wins(path, same_study, loser):
    Ledger.create(path, 1.0).close()
    ids = ["study" if same_study else f"study-{i}" for i in range(4)]
    racers = [subprocess.Popen([sys.executable, "-c", CHILD_RACER, str(path), sid], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True) for sid in ids]
    try:
        assert [r.stdout.readline() for r in racers] == ["ready\n"] * len(racers)
        for r in racers:  # release them together
            r.stdin.write("go\n")
            r.stdin.flush()
        outcomes = sorted(r.communicate(timeout=60)[0].strip() for r in racers)
    finally:
        for r in racers:
            r.kill()
            r.wait()
    assert outcomes == sorted(["won"] + [loser] * (len(racers) - 1))
    led = Ledger(path)
    try:
        [winner] = led.spends()
        assert led.spent(DEFAULT_SOURCE) == (0.6, 0.0) and winner.payload == winner.study_id.encode()
    finally:
        led.close()


#: The schema-1 layout as fedsketch wrote it until schema 2 (budgets keyed by a file's SHA-256).
V1_SCHEMA = """
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE spends (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, study_id TEXT NOT NULL UNIQUE,
    fingerprint TEXT NOT NULL, epsilon REAL NOT NULL CHECK (epsilon > 0),
    delta REAL NOT NULL CHECK (delta >= 0), n REAL NOT NULL, kind TEXT NOT NULL,
    payload BLOB NOT NULL, payload_sha256 TEXT NOT NULL, spec_sha256 TEXT NOT NULL,
    spent_at REAL NOT NULL, acked_at REAL, receipt TEXT);
CREATE INDEX spends_by_fingerprint ON spends (fingerprint);
CREATE TABLE identity (id INTEGER PRIMARY KEY CHECK (id = 1), device_id TEXT NOT NULL,
                       private_key BLOB NOT NULL, coordinator TEXT NOT NULL);
"""


def _v1_ledger(path: Path, budget: str | None = "1.0") -> None:
    """A schema-1 ledger: 0.6 spent on one file's hash, 0.7 on another's, an identity."""
    with sqlite3.connect(path) as db:
        db.executescript(V1_SCHEMA)
        settings = {"format": "fedsketch.ledger", "schema_version": "1", "budget_delta": "0.0"}
        if budget is not None:
            settings["budget"] = budget
        db.executemany("INSERT INTO settings VALUES (?, ?)", settings.items())
        for seq, (sid, fp, eps, acked) in enumerate([("s1", "a" * 64, 0.6, 5.0),
                                                      ("s2", "b" * 64, 0.7, None)]):
            db.execute("INSERT INTO spends (study_id, fingerprint, epsilon, delta, n, kind, payload, "
                       "payload_sha256, spec_sha256, spent_at, acked_at, receipt) VALUES "
                       "(?, ?, ?, 0, 100, 'int64_pairs', ?, 'h', 'c', ?, ?, ?)",
                       (sid, fp, eps, sid.encode(), float(seq), acked,
                        None if acked is None else "r"))
        db.execute("INSERT INTO identity VALUES (1, 'dev-9', ?, 'coord:1')", (b"k" * 32,))
    db.close()


@pytest.mark.parametrize("old_budget", ["5.0", None])
def test_a_schema_1_ledger_is_migrated_with_nothing_left(path, old_budget):
    """Spends once keyed by two files' hashes all count against the device's one budget, and that
    budget is what they spent (1.3): schema 1 rewrote its stored budget (here 5, or none) from
    every run's --budget, so taking it would hand out a fresh budget. The owner raises it."""
    _v1_ledger(path, old_budget)
    led = Ledger(path)
    try:
        [(source, budget)] = led.sources().items()
        assert source == DEFAULT_SOURCE and budget.epsilon == pytest.approx(1.3, abs=1e-12)
        assert budget.delta == 0.0
        assert [(s.study_id, s.source, s.epsilon) for s in led.spends()] == [
            ("s1", DEFAULT_SOURCE, 0.6), ("s2", DEFAULT_SOURCE, 0.7)]
        assert led.remaining(DEFAULT_SOURCE).epsilon == 0.0
        assert [s.study_id for s in led.pending()] == ["s2"]  # still re-sent with its stored bytes
        assert led.find("s2").payload == b"s2"
        assert led.identity() == Identity("dev-9", b"k" * 32, "coord:1")
        [entry] = led.history()
        assert entry.action == "migrate" and "2 spends on 2 data files" in entry.detail
        assert "raise-budget" in entry.detail
        with pytest.raises(BudgetExceeded):
            spend(led, "s3", 0.01)
        led.raise_budget(DEFAULT_SOURCE, 2.0, None, "the owner's real total")
        spend(led, "s3", 0.7)
    finally:
        led.close()
    with sqlite3.connect(path) as db:
        assert dict(db.execute("SELECT key, value FROM settings"))["schema_version"] == str(SCHEMA_VERSION)
    db.close()
    Ledger(path).close()  # a second open finds schema 2: no second migration
    led = Ledger(path)
    assert [h.action for h in led.history()] == ["migrate", "raise"]
    led.close()


def test_a_stored_out_of_box_policy_is_dropped_once_and_logged(path, caplog):
    """The first schema-2 release stored out_of_box in the policy; `refuse` is no longer offered
    (a refusal that depends on the records reveals them)."""
    Ledger.create(path, 1.0, policy=Policy(max_epsilon=0.5)).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE settings SET value = ? WHERE key = 'policy'",
                   (json.dumps({"max_epsilon": 0.5, "studies": ["*"], "coordinators": ["*"],
                                "out_of_box": "refuse"}),))
    db.close()
    caplog.set_level(logging.WARNING, logger="fedsketch.device")
    for _ in range(2):
        led = Ledger(path)
        assert led.policy() == Policy(max_epsilon=0.5)
        led.close()
    assert caplog.text.count("no longer offered") == 1
    led = Ledger(path)
    assert [h.action for h in led.history()] == ["init", "policy", "policy"]
    assert "out-of-box = refuse dropped" in led.history()[-1].detail
    led.close()


def round_spend(ledger: Ledger, study_id: str, parent: str, round: int, epsilon: float = 0.2):
    return ledger.record_spend(study_id=study_id, study_name=f"{parent} · round {round}",
                               source=DEFAULT_SOURCE, epsilon=epsilon, delta=0.0, n=10.0,
                               kind="int64_cells", payload=b"cells", spec_sha256="d" * 64,
                               parent=parent, round=round)


def test_refinement_rounds_are_spent_once_each_and_capped_per_study(path):
    """A study's rounds count toward it: the owner's largest ε per study caps the sketch and its
    rounds together, a round is released once whatever study id announces it, and until the
    study ends the rounds still to come stay set aside from other studies."""
    led = Ledger.create(path, 1.5)
    try:
        led.record_spend(study_id="P", study_name="p", source=DEFAULT_SOURCE, epsilon=0.3,
                         delta=0.0, n=10.0, kind="complex", payload=b"s", spec_sha256="c" * 64,
                         later_epsilon=0.4, keep_seconds=3600.0)
        assert "0.8 of 1.5 remains" in led.refusal(DEFAULT_SOURCE, 0.9, 0.0)  # 0.4 kept for P
        assert led.refusal(DEFAULT_SOURCE, 0.8, 0.0) is None
        assert led.refusal(DEFAULT_SOURCE, 1.2, 0.0, parent="P") is None  # P's round pays from it
        led.set_policy(Policy(max_epsilon=0.7))
        round_spend(led, "R1", "P", 1)
        with pytest.raises(LedgerError, match="already released round 1"):
            round_spend(led, "R1-again", "P", 1)
        assert led.round_refusal("P", 1) is not None and led.round_refusal("P", 2) is None
        with pytest.raises(BudgetExceeded, match="at most 0.7 per study"):
            round_spend(led, "R2", "P", 2, epsilon=0.25)  # 0.3 + 0.2 + 0.25 > 0.7
        round_spend(led, "R2", "P", 2, epsilon=0.2)
        assert led.refusal(DEFAULT_SOURCE, 0.7, 0.0) is None  # 0.8 left, none kept
        assert [(s.round, s.parent) for s in led.spends()] == [(0, None), (1, "P"), (2, "P")]
    finally:
        led.close()


#: Schema 2's spends table (before refinement rounds).
V2_SPENDS = """CREATE TABLE spends (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, study_id TEXT NOT NULL UNIQUE, study_name TEXT NOT NULL,
    source TEXT NOT NULL REFERENCES sources (name), epsilon REAL NOT NULL CHECK (epsilon > 0),
    delta REAL NOT NULL CHECK (delta >= 0), n REAL NOT NULL, kind TEXT NOT NULL,
    payload BLOB NOT NULL, payload_sha256 TEXT NOT NULL, spec_sha256 TEXT NOT NULL,
    spent_at REAL NOT NULL, acked_at REAL, receipt TEXT, final_state TEXT)"""


def test_a_schema_2_ledger_is_migrated_keeping_every_spend(path):
    """Schema 2 had no rounds: its spends become sketches (round 0, no study above them), the
    budget and the log stay, and round spends are then recorded."""
    led = Ledger.create(path, 1.0)
    spend(led, "old", 0.4)
    led.close()
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT study_id, study_name, source, epsilon, delta, n, kind, payload, "
                          "payload_sha256, spec_sha256, spent_at FROM spends").fetchall()
        db.execute("DROP TABLE voids")  # schema 8's
        db.execute("DROP TABLE spends")
        db.execute("DROP TABLE reservations")  # schema 4's
        db.execute("DROP TABLE secure_sessions")  # schema 6's
        db.execute(V2_SPENDS)
        db.executemany("INSERT INTO spends (study_id, study_name, source, epsilon, delta, n, kind, "
                       "payload, payload_sha256, spec_sha256, spent_at) VALUES "
                       "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        db.execute("UPDATE settings SET value = '2' WHERE key = 'schema_version'")
    db.close()
    led = Ledger(path)
    try:
        (old,) = led.spends()
        assert (old.study_id, old.epsilon, old.round, old.parent) == ("old", 0.4, 0, None)
        assert led.remaining(DEFAULT_SOURCE).epsilon == pytest.approx(0.6)
        assert "schema 2 → 3" in led.history()[-7].detail  # then 3 → 4, … 7 → 8, 8 → 9
        assert "schema 3 → 4" in led.history()[-6].detail
        assert "schema 4 → 5" in led.history()[-5].detail
        assert "schema 5 → 6" in led.history()[-4].detail
        assert "schema 6 → 7: the 1 spends recorded so far were sealed" in led.history()[-3].detail
        assert "schema 7 → 8" in led.history()[-2].detail
        assert "schema 8 → 9" in led.history()[-1].detail
        round_spend(led, "r", "old", 1)
        assert led.spent(DEFAULT_SOURCE)[0] == pytest.approx(0.6)
    finally:
        led.close()


def _older_ledger(path: Path, version: int) -> None:
    """A ledger as schema ``version`` (1 to 8) wrote it: schema 1 by :func:`_v1_ledger`;
    schemas 2 to 8 with one spend of 0.4 (``old``), without ``spends.round_terms``; before 8
    without the voids table; before 7 without
    the seal (``spends.chain``,
    ``spends.chain_signature``, the ``chain_*`` settings); before 6 without
    ``spends.kept_until`` and the secure_sessions table, but for 5
    without ``spends.premask``, and before 4 without the reservations table."""
    if version == 1:
        _v1_ledger(path)
        return
    led = Ledger.create(path, 1.0)
    spend(led, "old", 0.4)
    led.close()
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE spends DROP COLUMN round_terms")
        if version == 8:
            db.execute("UPDATE settings SET value = '8' WHERE key = 'schema_version'")
    db.close()
    if version == 8:
        return
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE voids")
        if version == 7:
            db.execute("UPDATE settings SET value = '7' WHERE key = 'schema_version'")
    db.close()
    if version == 7:
        return
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE spends DROP COLUMN chain")
        db.execute("ALTER TABLE spends DROP COLUMN chain_signature")
        db.execute("DELETE FROM settings WHERE key IN ('chain_count', 'chain_head')")
        if version == 6:
            db.execute("UPDATE settings SET value = '6' WHERE key = 'schema_version'")
    db.close()
    if version == 6:
        return
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE spends DROP COLUMN kept_until")
        db.execute("DROP TABLE secure_sessions")
        if version < 5:
            db.execute("ALTER TABLE spends DROP COLUMN premask")
        if version < 4:
            db.execute("DROP TABLE reservations")
        if version == 2:
            rows = db.execute("SELECT study_id, study_name, source, epsilon, delta, n, kind, "
                              "payload, payload_sha256, spec_sha256, spent_at FROM spends").fetchall()
            db.execute("DROP TABLE spends")
            db.execute(V2_SPENDS)
            db.executemany("INSERT INTO spends (study_id, study_name, source, epsilon, delta, n, "
                           "kind, payload, payload_sha256, spec_sha256, spent_at) VALUES "
                           "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        db.execute("UPDATE settings SET value = ? WHERE key = 'schema_version'", (str(version),))
    db.close()


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6, 7, 8])
def test_older_ledgers_are_migrated_to_schema_9_with_no_reservation(path, version):
    """Schemas 1 to 3 kept what the device joined in the daemon's memory: the migration keeps
    every spend and adds the reservations table, empty; reservations then work, and a second
    open migrates nothing. Schema 5 adds the pre-mask input of a masked release (none before),
    schema 6 when a promise lapses (none here: no spend kept ε for later rounds), schema 7 the
    seal of the spends: every migrated spend is sealed, and the chain verifies; schema 8 the
    voids table, empty; schema 9 the round terms of a secure spend (none before: the links of
    the spends sealed before stay as they were, and verify)."""
    assert SCHEMA_VERSION == 9
    _older_ledger(path, version)
    led = Ledger(path)
    try:
        spent = {1: [("s1", 0.6), ("s2", 0.7)]}.get(version, [("old", 0.4)])
        assert [(s.study_id, s.epsilon, s.premask, s.kept_until) for s in led.spends()] == [
            (sid, eps, None, None) for sid, eps in spent]
        assert led.joined() == [] and led.reservations() == [] and led.sessions(DEFAULT_SOURCE) == {}
        history = [h.detail for h in led.history()]
        assert any("schema 3 → 4" in h for h in history) == (version in (2, 3))  # 1: straight to 5
        assert any("schema 4 → 5" in h for h in history) == (version not in (1, 5, 6, 7, 8))
        assert any("schema 5 → 6" in h for h in history) == (version not in (1, 6, 7, 8))
        assert any("schema 6 → 7" in h for h in history) == (version not in (1, 7, 8))
        assert any("schema 7 → 8" in h for h in history) == (version not in (1, 8))
        assert any("schema 8 → 9" in h for h in history) == (version != 1)
        assert all(s.round_terms is None for s in led.spends())
        assert led.voids() == {}
        verdict = led.verify_chain()
        assert verdict.ok and verdict.rows == len(spent), verdict
        led.raise_budget(DEFAULT_SOURCE, 3.0, None, "test")
        led.reserve("new", "new", DEFAULT_SOURCE, 0.5, 0.0, 2e9)
        assert led.reserved(DEFAULT_SOURCE) == (0.5, 0.0)
    finally:
        led.close()
    with sqlite3.connect(path) as db:
        assert dict(db.execute("SELECT key, value FROM settings"))["schema_version"] == "9"
        columns = [r[1] for r in db.execute("PRAGMA table_info(reservations)")]
    db.close()
    assert columns == ["study_id", "study_name", "source", "epsilon", "delta", "joined_at",
                       "expires_at", "left_at"]
    led = Ledger(path)
    try:
        assert [h.detail for h in led.history()][:len(history)] == history
        assert len(led.history()) == len(history) + 1  # the raise; no second migration
        assert [r.study_id for r in led.joined()] == ["new"]
    finally:
        led.close()
