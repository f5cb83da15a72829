"""The device's privacy-budget ledger, on real files: one release per study with its exact bytes,
budgets per dataset that are never exceeded, survival of a SIGKILL, and races between processes."""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedsketch.client.ledger import (
    SCHEMA_VERSION,
    BudgetExceeded,
    Identity,
    Ledger,
    LedgerError,
    fingerprint_file,
)

FP = "a" * 64
FP2 = "b" * 64


def spend(ledger: Ledger, study_id: str, epsilon: float = 0.3, *, fingerprint: str = FP, delta: float = 0.0,
          payload: bytes = b"\x00sketch\xff"):
    return ledger.record_spend(study_id=study_id, fingerprint=fingerprint, epsilon=epsilon, delta=delta,
                               n=1234.5, kind="complex", payload=payload, spec_sha256="c" * 64)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite"


@pytest.fixture
def ledger(path: Path):
    led = Ledger(path, budget=1.0)
    yield led
    led.close()


def test_record_then_find_returns_the_exact_bytes_and_a_second_release_is_refused(ledger):
    payload = os.urandom(50_000) + b"\x00"
    s = spend(ledger, "study-1", 0.5, payload=payload)
    found = ledger.find("study-1")
    assert found == s
    assert found.payload == payload and found.payload_sha256 == hashlib.sha256(payload).hexdigest()
    assert (found.epsilon, found.delta, found.n, found.kind) == (0.5, 0.0, 1234.5, "complex")
    assert found.acked_at is None and found.receipt is None
    assert ledger.find("study-2") is None

    with pytest.raises(LedgerError, match="already released"):
        spend(ledger, "study-1", 0.1, payload=b"fresh noise")
    with pytest.raises(LedgerError, match="already released"):  # any dataset
        spend(ledger, "study-1", 0.1, fingerprint=FP2, payload=b"fresh noise")
    assert ledger.spends() == [s]
    assert ledger.spent(FP) == (0.5, 0.0) and ledger.spent(FP2) == (0.0, 0.0)


def test_budget_is_never_exceeded_and_a_refusal_writes_nothing(ledger):
    won = []
    for i in range(10):
        try:
            won.append(spend(ledger, f"s{i}", 0.3))
        except BudgetExceeded as exc:
            if i == 3:
                assert "0.1" in str(exc) and "0.3" in str(exc)  # remaining and asked ε
        assert ledger.spent(FP)[0] <= 1.0
    assert [s.study_id for s in won] == ["s0", "s1", "s2"]
    assert ledger.spends() == won and ledger.find("s3") is None
    assert ledger.remaining(FP) == pytest.approx(0.1)
    spend(ledger, "fill", ledger.remaining(FP))  # exactly filling the budget is allowed
    assert ledger.remaining(FP) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(BudgetExceeded):
        spend(ledger, "one-more", 1e-9)


def test_each_dataset_has_its_own_budget(ledger):
    spend(ledger, "s1", 1.0, fingerprint=FP)
    with pytest.raises(BudgetExceeded):
        spend(ledger, "s2", 0.1, fingerprint=FP)
    spend(ledger, "s2", 0.9, fingerprint=FP2)
    assert ledger.remaining(FP) == 0.0 and ledger.remaining(FP2) == pytest.approx(0.1)


def test_delta_adds_up_and_is_checked_separately(path):
    led = Ledger(path, budget=10.0)  # pure-ε ledger: no δ at all
    try:
        with pytest.raises(BudgetExceeded, match="δ"):
            spend(led, "s0", 0.1, delta=1e-9)
    finally:
        led.close()
    led = Ledger(path, budget=10.0, budget_delta=1e-6)
    try:
        spend(led, "s1", 0.1, delta=6e-7)
        with pytest.raises(BudgetExceeded, match="δ"):
            spend(led, "s2", 0.1, delta=6e-7)
        spend(led, "s3", 0.1, delta=4e-7)  # exactly filling δ
        spend(led, "s4", 0.1)  # pure ε still fits
        eps, delta = led.spent(FP)
        assert eps == pytest.approx(0.3) and delta == pytest.approx(1e-6)
        assert [s.study_id for s in led.spends()] == ["s1", "s3", "s4"]
    finally:
        led.close()


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_budget_or_epsilon_is_a_value_error(path, bad):
    with pytest.raises(ValueError):
        Ledger(path, budget=bad)
    led = Ledger(path, budget=1.0)
    try:
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


def test_reopen_keeps_everything_and_enforces_the_new_budget(path):
    me = Identity("dev-1", os.urandom(32), "coord:1")
    led = Ledger(path, budget=1.0)
    s1 = spend(led, "s1", 0.6, payload=os.urandom(1000))
    spend(led, "s2", 0.4)
    led.mark_acked("s2", "r2")
    led.set_identity(me)
    led.close()
    assert os.stat(path).st_mode & 0o077 == 0  # holds a private key: owner-only

    led = Ledger(path, budget=1.5)
    try:
        assert led.find("s1") == s1 and led.identity() == me
        assert [s.study_id for s in led.pending()] == ["s1"]
        assert led.remaining(FP) == pytest.approx(0.5)
        with pytest.raises(LedgerError):
            spend(led, "s1", 0.1)
    finally:
        led.close()
    with sqlite3.connect(path) as db:
        assert dict(db.execute("SELECT key, value FROM settings"))["budget"] == "1.5"
    db.close()


def test_non_sqlite_foreign_and_newer_files_are_refused(tmp_path, path):
    junk = tmp_path / "junk"
    junk.write_bytes(b"this is not a database\n" * 200)
    with pytest.raises(LedgerError):
        Ledger(junk, budget=1.0)
    assert junk.read_bytes() == b"this is not a database\n" * 200

    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE t (x)")
    db.close()
    with pytest.raises(LedgerError):
        Ledger(foreign, budget=1.0)

    Ledger(path, budget=1.0).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE settings SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    db.close()
    with pytest.raises(LedgerError, match="version"):
        Ledger(path, budget=1.0)


CHILD_COMMIT_THEN_SLEEP = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from fedsketch.client.ledger import Ledger
    led = Ledger(sys.argv[1], budget=1.0)
    led.record_spend(study_id="s1", fingerprint="f", epsilon=0.5, delta=0.0, n=10.0, kind="complex",
                     payload=Path(sys.argv[2]).read_bytes(), spec_sha256="c")
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

    led = Ledger(path, budget=1.0)
    try:
        [found] = led.spends()
        assert found.study_id == "s1" and found.payload == payload
        assert found.payload_sha256 == hashlib.sha256(payload).hexdigest()
        assert led.pending() == [found] and led.spent("f") == (0.5, 0.0)
        with pytest.raises(LedgerError):
            led.record_spend(study_id="s1", fingerprint="f", epsilon=0.5, delta=0.0, n=10.0, kind="complex",
                             payload=b"new noise", spec_sha256="c")
    finally:
        led.close()


CHILD_RACER = textwrap.dedent("""
    import sys
    from fedsketch.client.ledger import Ledger
    path, study_id = sys.argv[1], sys.argv[2]
    led = Ledger(path, budget=1.0)
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        led.record_spend(study_id=study_id, fingerprint="f", epsilon=0.6, delta=0.0, n=1.0, kind="complex",
                         payload=study_id.encode(), spec_sha256="c")
        print("won", flush=True)
    except Exception as exc:
        print(type(exc).__name__, flush=True)
""")


@pytest.mark.parametrize(("same_study", "loser"), [(True, "LedgerError"), (False, "BudgetExceeded")])
def test_racing_processes_exactly_one_wins(path, same_study, loser):
    Ledger(path, budget=1.0).close()
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
    led = Ledger(path, budget=1.0)
    try:
        [winner] = led.spends()
        assert led.spent("f") == (0.6, 0.0) and winner.payload == winner.study_id.encode()
    finally:
        led.close()


def test_fingerprint_file_is_the_sha256_of_the_bytes(tmp_path):
    f = tmp_path / "x.bin"
    data = os.urandom(3 * (1 << 20) + 17)  # crosses chunk boundaries
    f.write_bytes(data)
    assert fingerprint_file(f) == hashlib.sha256(data).hexdigest()
    f.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert fingerprint_file(f) != hashlib.sha256(data).hexdigest()
    small = tmp_path / "small.csv"
    small.write_bytes(b"1,2\n3,4\n")
    assert fingerprint_file(str(small)) == hashlib.sha256(b"1,2\n3,4\n").hexdigest()
