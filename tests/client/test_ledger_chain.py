"""The seal of the ledger's spends (client/ledger_chain.py): every row chained and signed with
the device's key in the transaction that records it; a deleted, edited or hand-added row, or a
signature the key did not make, is reported by ``verify_chain`` and ``device budget --verify``."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fedsketch.client.ledger import Identity, Ledger
from fedsketch.common.net import signing

FEDSKETCH = str(Path(sys.executable).with_name("fedsketch"))


def spend(ledger: Ledger, study_id: str, epsilon: float) -> None:
    ledger.record_spend(study_id=study_id, study_name=f"name of {study_id}", source="default",
                        epsilon=epsilon, delta=0.0, n=100.0, kind="int32_pairs", payload=b"\1\2",
                        spec_sha256="c" * 64)


@pytest.fixture
def sealed(tmp_path) -> Path:
    """A ledger with budget 1.0, an identity, and three spends (0.2, 0.3, 0.1)."""
    path = tmp_path / "ledger"
    led = Ledger.create(path, 1.0)
    spend(led, "before-enrollment", 0.2)  # signed when the identity is stored
    led.set_identity(Identity("dev-1", signing.new_private_key(), "localhost:1"))
    spend(led, "b", 0.3)
    spend(led, "c", 0.1)
    led.close()
    return path


def problems(path: Path) -> tuple[str, ...]:
    led = Ledger(path)
    try:
        return led.verify_chain().problems
    finally:
        led.close()


def edit(path: Path, sql: str, *args) -> None:
    with sqlite3.connect(path) as db:
        db.execute(sql, args)
    db.close()


def test_a_sealed_ledger_verifies_and_each_row_is_signed_by_the_device_key(sealed):
    led = Ledger(sealed)
    try:
        verdict = led.verify_chain()
        key = signing.public_key(led.identity().private_key)
        rows = led._conn.execute("SELECT chain, chain_signature FROM spends ORDER BY seq").fetchall()
    finally:
        led.close()
    assert verdict.ok and verdict.rows == 3
    assert all(signing.verify(key, bytes(c), bytes(s)) for c, s in rows)


@pytest.mark.parametrize("damage, words", [
    ("DELETE FROM spends", "sealed 3 spend(s) and holds 0"),
    ("DELETE FROM spends WHERE study_id = 'c'", "sealed 3 spend(s) and holds 2"),
    ("DELETE FROM spends WHERE study_id = 'b'", "study 'c' (row 3) does not follow the row before it"),
    ("UPDATE spends SET epsilon = 0.01 WHERE study_id = 'b'", "study 'b' (row 2) does not follow"),
    ("UPDATE spends SET spent_at = spent_at - 1 WHERE study_id = 'before-enrollment'",
     "study 'before-enrollment' (row 1) does not follow"),
    ("UPDATE spends SET chain_signature = zeroblob(64) WHERE study_id = 'c'",
     "a signature the device's key did not make"),
    ("INSERT INTO spends (study_id, study_name, source, epsilon, delta, n, kind, payload, "
     "payload_sha256, spec_sha256, spent_at) SELECT 'x', 'x', source, epsilon, delta, n, kind, "
     "payload, payload_sha256, spec_sha256, spent_at FROM spends WHERE study_id = 'c'",
     "study 'x' (row 4) is not sealed"),
])
def test_a_deleted_edited_or_forged_row_is_reported(sealed, damage, words):
    assert problems(sealed) == ()
    edit(sealed, damage)
    found = problems(sealed)
    assert any(words in p for p in found), found


def test_a_spend_after_rows_were_deleted_does_not_hide_the_deletion(sealed):
    edit(sealed, "DELETE FROM spends")
    led = Ledger(sealed)
    try:
        assert led.remaining("default").epsilon == pytest.approx(1.0)  # what the deletion buys
        spend(led, "again", 0.6)
        found = led.verify_chain().problems
    finally:
        led.close()
    assert any("study 'again' (row 4) does not follow" in p for p in found), found
    assert any("sealed 4 spend(s) and holds 1" in p for p in found), found


def test_device_budget_verify_says_ok_or_reports_in_words_and_exit_status(sealed):
    ok = subprocess.run([FEDSKETCH, "device", "budget", "--ledger", str(sealed), "--verify"],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "3 spends verified" in ok.stdout, ok.stdout + ok.stderr
    edit(sealed, "DELETE FROM spends WHERE study_id = 'c'")
    bad = subprocess.run([FEDSKETCH, "device", "budget", "--ledger", str(sealed), "--verify"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "sealed 3 spend(s) and holds 2" in bad.stderr, bad.stderr


def test_the_chain_fields_are_laid_out_as_the_signatures_fields():
    from fedsketch.client.ledger_chain import field

    for value in ("", "study", "ε", b"", b"\0\1", b"x" * 300):
        assert field(value) == signing.field(value)
