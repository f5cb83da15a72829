"""Voids (client/ledger_voids.py): a spend given back stays on the books, counts for nothing, is
never sent, is sealed in the spends' chain (a deleted, edited or moved void is reported), and a
spend whose bytes were acknowledged is not given back without a certificate, nor with one that
is not of the round terms the spend recorded (a made-up certificate with fewer holders or a
smaller t: review finding 2); ``device budget`` shows it. Real ledger files, and the real
command line."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess

import pytest
from test_ledger_chain import FEDSKETCH, edit, problems, spend

from fedsketch.client.ledger import DEFAULT_SOURCE, Identity, Ledger, LedgerError
from fedsketch.client.ledger_chain import seal_void
from fedsketch.common.net import signing
from fedsketch.common.secagg.abort import Certificate, RoundTerms, sign_statement

#: The other holders of dev-1's shares in every round here (t = 3 of 4 holders, no colluder).
OTHERS = {v: signing.new_private_key() for v in ("dev-2", "dev-3", "dev-4")}
R = bytes(range(32))  # the round instance: SHA-256 of the ADVERTISE_KEYS bundle dev-1 received


def terms(ledger: Ledger, study_id: str) -> RoundTerms:
    """The terms dev-1 records for round ``study_id``: R, t = 3, C = 0, four holders."""
    holders = {"dev-1": signing.public_key(ledger.identity().private_key),
               **{v: signing.public_key(k) for v, k in OTHERS.items()}}
    return RoundTerms(study_id, "dev-1", R, 3, 0, holders)


def secure_spend(ledger: Ledger, study_id: str, epsilon: float) -> None:
    """A secure round's spend (the only kind a void gives back), not yet sent, with the round's
    terms recorded."""
    ledger.record_spend(study_id=study_id, study_name=f"name of {study_id}", source="default",
                        epsilon=epsilon, delta=0.0, n=100.0, kind="secagg_masked", payload=b"\1\2",
                        spec_sha256="c" * 64, round_terms=terms(ledger, study_id).to_bytes())


@pytest.fixture
def book(tmp_path):
    """A ledger with budget 1.0, an identity, and spends a (0.2), b (0.3), c (0.1); b is void,
    and d (0.25) is spent after it."""
    path = tmp_path / "ledger"
    led = Ledger.create(path, 1.0)
    led.set_identity(Identity("dev-1", signing.new_private_key(), "localhost:1"))
    for study, eps in (("a", 0.2), ("b", 0.3), ("c", 0.1)):
        secure_spend(led, study, eps)
    led.void("b", "the masked input never left the device: test")
    spend(led, "d", 0.25)
    yield led
    led.close()


def test_a_void_gives_the_spend_back_and_keeps_it(book):
    assert [s.study_id for s in book.spends()] == ["a", "b", "c", "d"]  # the spend row stays
    assert book.spent(DEFAULT_SOURCE)[0] == pytest.approx(0.55)
    assert book.remaining(DEFAULT_SOURCE).epsilon == pytest.approx(0.45)
    assert [s.study_id for s in book.pending()] == ["a", "c", "d"]  # never sent
    assert list(book.voids()) == ["b"]
    assert book.void("b", "again").reason.endswith("test")  # idempotent: the first stays
    verdict = book.verify_chain()
    assert verdict.ok and (verdict.rows, verdict.voids) == (4, 1), verdict


def test_a_sent_release_is_not_given_back_without_a_certificate(book):
    book.mark_acked("a", "receipt-a")
    with pytest.raises(LedgerError, match="stands without a certificate"):
        book.void("a", "no")
    with pytest.raises(LedgerError, match="no spend"):
        book.void("zzz", "no")
    assert list(book.voids()) == ["b"]


def test_a_void_of_a_plain_or_a_sent_release_is_refused_and_reported(book):
    """The ledger refuses to void a plain spend; and a void of a spend whose bytes the
    coordinator acknowledged (an owner who cleared acked_at to void it, then put it back) is
    reported by --verify (a reviewer's forgery passed it before)."""
    spend(book, "p", 0.05)
    with pytest.raises(LedgerError, match="plain release"):
        book.void("p", "no")
    book.mark_acked("c", "receipt-c")
    path = book.path
    book.close()
    edit(path, "UPDATE spends SET acked_at = NULL WHERE study_id = 'c'")
    forged = Ledger(path)
    forged.void("c", "forged")
    forged.close()
    edit(path, "UPDATE spends SET acked_at = 1.0 WHERE study_id = 'c'")
    assert any("void of study 'c'" in p and "was sent" in p for p in problems(path)), problems(path)


@pytest.mark.parametrize("sql, words", [
    ("DELETE FROM voids", "does not follow the row before it"),
    ("UPDATE voids SET reason = 'other'", "void of study 'b'"),
    ("UPDATE voids SET study_id = 'c'", "names a spend the ledger does not hold"),
    ("UPDATE voids SET chain_signature = zeroblob(64)", "signature the device's key did not make"),
])
def test_a_deleted_edited_or_moved_void_is_reported(book, sql, words):
    path = book.path
    book.close()
    edit(path, sql)
    found = problems(path)
    assert any(words in p for p in found), found


def test_device_budget_shows_the_void(book):
    path = book.path
    book.close()
    shown = json.loads(subprocess.run([FEDSKETCH, "device", "budget", "--ledger", str(path),
                                       "--json"], capture_output=True, text=True, check=True).stdout)
    source = shown["sources"][DEFAULT_SOURCE]
    assert source["spent_epsilon"] == pytest.approx(0.55)
    assert source["given_back_epsilon"] == pytest.approx(0.3)
    (b,) = [r for r in shown["spends"] if r["study_id"] == "b"]
    assert b["state"].startswith("void: ε given back") and b["void"]["certificate"] is False
    assert shown["studies"]["b"]["epsilon"] == 0.0
    verified = subprocess.run([FEDSKETCH, "device", "budget", "--ledger", str(path), "--verify"],
                              capture_output=True, text=True)
    assert verified.returncode == 0 and "4 spends and 1 voids" in verified.stdout, verified


def certificate(book: Ledger, signers: tuple[str, ...], device: str = "dev-1",
                study: str = "a", threshold: int = 3, holders: tuple[str, ...] | None = None) -> bytes:
    """A certificate of abort for ``device``'s input in round ``study`` (by default of the terms
    the spend recorded: t = 3 of 4 holders, no colluder, 2 statements needed) signed by
    ``signers`` (dev-1 with the ledger's own key)."""
    keys = {"dev-1": book.identity().private_key, **OTHERS}
    public = {v: signing.public_key(keys[v]) for v in holders or keys}
    statements = {v: sign_statement(keys[v], "localhost", study, R, v) for v in signers}
    return Certificate(study, device, "localhost", threshold, 0, public, statements, R).to_bytes()


def forge_void(path, study_id: str, cert: bytes) -> None:
    """Write a void row with ``cert`` as whoever holds the file and its key can: the row
    inserted by hand and sealed into the chain with the device's key (what Ledger.void would
    do, without its checks)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    link = db.execute("SELECT chain FROM spends WHERE study_id = ?", (study_id,)).fetchone()[0]
    position = int(db.execute("SELECT value FROM settings WHERE key = 'chain_count'").fetchone()[0])
    cursor = db.execute("INSERT INTO voids (study_id, reason, voided_at, certificate, "
                        "certificate_sha256, spend_chain, position) VALUES (?, 'forged', 1.0, ?, "
                        "?, ?, ?)", (study_id, cert, hashlib.sha256(cert).hexdigest(), link, position))
    seal_void(db, cursor.lastrowid)
    db.execute("COMMIT")
    db.close()


@pytest.mark.parametrize("signers, device, study, words", [
    (("dev-1", "dev-2"), "dev-1", "a", None),
    (("dev-1",), "dev-1", "a", "fewer than the 2 needed"),
    (("dev-2", "dev-3"), "dev-1", "a", "fewer than the 2 needed (or none of the device's own)"),
    (("dev-1", "dev-2"), "dev-9", "a", "made out to another device"),
    (("dev-1", "dev-2"), "dev-1", "z", "of another round"),
])
def test_a_rule_b_void_is_sound_only_with_a_certificate_that_suffices(book, signers, device,
                                                                        study, words):
    """A sent release (acknowledged) given back with a certificate of abort: the void refuses it,
    and --verify reports a void written past that check, unless the certificate is of its round
    and device and holds need(4, 3, 0) = 2 valid statements of distinct holders, the device's
    own among them."""
    book.mark_acked("a", "receipt-a")
    cert = certificate(book, signers, device, study)
    path = book.path
    if words is None:
        book.void("a", "certificate of abort", certificate=cert)
    else:
        with pytest.raises(LedgerError, match="stands"):
            book.void("a", "certificate of abort", certificate=cert)
        assert not book.voided("a")
    book.close()
    if words is not None:
        forge_void(path, "a", cert)
    found = [p for p in problems(path) if "void of study 'a'" in p]
    assert (not found) if words is None else any(words in p for p in found), found


@pytest.mark.parametrize("threshold, holders, words", [
    (1, ("dev-1",), "threshold t 1 where the spend recorded 3"),   # need(1, 1, 0) = 1: itself
    (3, ("dev-1", "dev-2", "dev-3"), "number of holders H 3 where the spend recorded 4"),
    (2, None, "threshold t 2 where the spend recorded 3"),          # need(4, 2, 0) = 3 ...
])
def test_a_made_up_certificate_with_smaller_h_or_t_is_refused_and_reported(book, threshold,
                                                                           holders, words):
    """Review finding 2: a certificate made up with the device's own key, with the holders cut or
    t changed so that the statements at hand suffice by its own count, gives nothing back: the
    void refuses it (its t and holders are not those the spend recorded before the masked input
    left), and a void written by hand and sealed with the key is reported by --verify. On the
    landed code both passed (the void took any certificate; --verify counted with the
    certificate's own t, C and holders)."""
    book.mark_acked("a", "receipt-a")
    signers = ("dev-1",) if holders == ("dev-1",) else ("dev-1", "dev-2", "dev-3")
    cert = certificate(book, signers, threshold=threshold, holders=holders)
    assert Certificate.from_bytes(cert).sufficient  # by its own count it would do
    with pytest.raises(LedgerError, match=f"other round terms: {words}"):
        book.void("a", "made up", certificate=cert)
    remaining = book.remaining(DEFAULT_SOURCE).epsilon
    path = book.path
    book.close()
    forge_void(path, "a", cert)
    found = [p for p in problems(path) if "void of study 'a'" in p]
    assert any(f"other round terms: {words}" in p for p in found), found
    assert remaining == pytest.approx(0.45)  # the spend of a (0.2) still counts


def test_a_replaced_certificate_is_reported(book):
    """The void row seals the certificate's SHA-256: a certificate swapped for another, even one
    that suffices, is reported."""
    book.mark_acked("a", "receipt-a")
    book.void("a", "certificate of abort", certificate=certificate(book, ("dev-1", "dev-2")))
    other = certificate(book, ("dev-1", "dev-3"))
    path = book.path
    book.close()
    edit(path, f"UPDATE voids SET certificate = x'{other.hex()}' WHERE study_id = 'a'")
    assert any("not the one sealed in its void row" in p for p in problems(path)), problems(path)


def test_a_spend_recorded_before_schema_9_is_not_given_back_by_a_certificate(book):
    """A spend without round terms (recorded before ledger schema 9): no certificate gives it back
    (it stands); a rule-B void an earlier release wrote for such a spend, with a version-1
    certificate, is checked against that certificate itself, and --verify names it among what
    holds, not as a problem."""
    from fedsketch.common.secagg.abort import legacy_digest

    book.record_spend(study_id="old", study_name="old", source="default", epsilon=0.05, delta=0.0,
                      n=100.0, kind="secagg_masked", payload=b"\1", spec_sha256="c" * 64)
    book.mark_acked("old", "receipt-old")
    with pytest.raises(LedgerError, match="recorded no round terms"):
        book.void("old", "certificate of abort", certificate=certificate(book, ("dev-1", "dev-2"),
                                                                         study="old"))
    keys = {"dev-1": book.identity().private_key, **OTHERS}
    v1 = Certificate("old", "dev-1", "localhost", 3, 0, {v: signing.public_key(k) for v, k in keys.items()},
                     {v: signing.sign(keys[v], legacy_digest("localhost", "old", v))
                      for v in ("dev-1", "dev-2")})
    path = book.path
    book.close()
    forge_void(path, "old", v1.to_bytes())
    assert problems(path) == ()
    led = Ledger(path)
    try:
        assert led.verify_chain().legacy == ("old",)
    finally:
        led.close()
    shown = subprocess.run([FEDSKETCH, "device", "budget", "--ledger", str(path), "--verify"],
                           capture_output=True, text=True)
    assert shown.returncode == 0 and "1 voids (old) rest on certificates of abort an earlier " \
        "release wrote" in shown.stdout, shown


def test_round_terms_edited_after_the_spend_break_the_chain(book):
    """The spend's link seals its round terms: terms rewritten to fit a made-up certificate (t = 1,
    the holders cut to the device) are reported as an edited spend row."""
    forged = RoundTerms("a", "dev-1", R, 1, 0, {"dev-1": terms(book, "a").holders["dev-1"]})
    path = book.path
    book.close()
    edit(path, f"UPDATE spends SET round_terms = x'{forged.to_bytes().hex()}' WHERE study_id = 'a'")
    assert any("spend of study 'a'" in p and "does not follow" in p for p in problems(path)), \
        problems(path)
