"""Voids (client/ledger_voids.py): a spend given back stays on the books, counts for nothing, is
never sent, is sealed in the spends' chain (a deleted, edited or moved void is reported), and a
spend whose bytes were acknowledged is not given back without a certificate; ``device budget``
shows it. Real ledger files, and the real command line."""

from __future__ import annotations

import json
import subprocess

import pytest
from test_ledger_chain import FEDSKETCH, edit, problems, spend

from fedsketch.client.ledger import DEFAULT_SOURCE, Identity, Ledger, LedgerError
from fedsketch.common.net import signing
from fedsketch.common.secagg.abort import Certificate, sign_statement


def secure_spend(ledger: Ledger, study_id: str, epsilon: float) -> None:
    """A secure round's spend (the only kind a void gives back), not yet sent."""
    ledger.record_spend(study_id=study_id, study_name=f"name of {study_id}", source="default",
                        epsilon=epsilon, delta=0.0, n=100.0, kind="secagg_masked", payload=b"\1\2",
                        spec_sha256="c" * 64)


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
                study: str = "a") -> bytes:
    """A certificate of abort for ``device``'s input in round ``study`` (t = 3 of 4 holders, no
    colluder: 2 statements needed) signed by ``signers`` (dev-1 with the ledger's own key)."""
    keys = {"dev-1": book.identity().private_key,
            **{v: signing.new_private_key() for v in ("dev-2", "dev-3", "dev-4")}}
    holders = {v: signing.public_key(k) for v, k in keys.items()}
    statements = {v: sign_statement(keys[v], "localhost", study, v) for v in signers}
    return Certificate(study, device, "localhost", 3, 0, holders, statements).to_bytes()


@pytest.mark.parametrize("signers, device, study, words", [
    (("dev-1", "dev-2"), "dev-1", "a", None),
    (("dev-1",), "dev-1", "a", "fewer than the 2 needed"),
    (("dev-2", "dev-3"), "dev-1", "a", "fewer than the 2 needed (or none of the device's own)"),
    (("dev-1", "dev-2"), "dev-9", "a", "made out to another device"),
    (("dev-1", "dev-2"), "dev-1", "z", "of another round"),
])
def test_a_rule_b_void_is_sound_only_with_a_certificate_that_suffices(book, signers, device,
                                                                        study, words):
    """A sent release (acknowledged) given back with a certificate of abort: --verify accepts it
    only if the certificate is of its round and device and holds need(4, 3, 0) = 2 valid
    statements of distinct holders, the device's own among them."""
    book.mark_acked("a", "receipt-a")
    book.void("a", "certificate of abort", certificate=certificate(book, signers, device, study))
    path = book.path
    book.close()
    found = [p for p in problems(path) if "void of study 'a'" in p]
    assert (not found) if words is None else any(words in p for p in found), found


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
