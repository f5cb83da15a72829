"""The certificate of abort (rule B, docs/secure-aggregation.md): need(H, t, C), and the count of
distinct holders with a valid statement (version 2: bound to the round's instance R and the
signer's key), which neither a forged, a repeated, another instance's nor a second name's
statement grows; the round terms a spend records, and a certificate compared with them."""

from __future__ import annotations

import pytest

from fedsketch.common.net import signing
from fedsketch.common.secagg.abort import (
    Certificate,
    RoundTerms,
    counted,
    legacy_digest,
    needed,
    sign_statement,
    statement_digest,
    terms_mismatch,
)

HOLDERS = ["u", "v", "w", "x"]
KEYS = {d: signing.new_private_key() for d in [*HOLDERS, "outsider"]}
PUBLIC = {d: signing.public_key(KEYS[d]) for d in HOLDERS}
AUD, STUDY = "coordinator.example", "study-1"
R, R2 = bytes(range(32)), bytes(32)  # two instances of the round (bundle digests)


def statement(device: str, audience: str = AUD, study: str = STUDY, key: str | None = None,
              r: bytes = R):
    return device, audience, r, sign_statement(KEYS[key or device], audience, study, r, device)


def test_need_is_h_minus_t_plus_one_plus_colluders_up_to_h_minus_one():
    assert needed(4, 3, 0) == 2
    assert needed(4, 3, 1) == 3
    assert needed(5, 3, 10) == 3 + 4  # min(C, H − 1): u itself never colludes
    assert needed(10, 6, 2) == 7


def test_the_digest_binds_every_field():
    pk = PUBLIC["u"]
    base = statement_digest(AUD, STUDY, R, "u", pk)
    assert len({base, statement_digest("other", STUDY, R, "u", pk),
                statement_digest(AUD, "s2", R, "u", pk), statement_digest(AUD, STUDY, R2, "u", pk),
                statement_digest(AUD, STUDY, R, "v", pk), statement_digest(AUD, STUDY, R, "u", PUBLIC["v"]),
                statement_digest(AUD + "u", STUDY, R, "", pk), legacy_digest(AUD, STUDY, "u")}) == 8


def test_a_holder_counts_once_and_a_forgery_not_at_all():
    twice = [statement("u"), statement("u"), statement("v")]
    assert counted(twice, PUBLIC, AUD, STUDY, R) == {"u", "v"}
    forged = [statement("w", key="outsider"),          # not w's key
              statement("x", audience="elsewhere"),     # another coordinator's name
              statement("x", study="study-2"),          # another round
              statement("x", r=R2),                     # another instance of the round
              ("x", AUD, R, statement("x", r=R2)[3]),   # another instance's signature, R relabelled
              statement("outsider"),                    # holds no share
              ("w", AUD, R, statement("v")[3])]         # v's signature under w's name
    assert counted(forged, PUBLIC, AUD, STUDY, R) == set()
    assert counted([*forged, statement("w")], PUBLIC, AUD, STUDY, R) == {"w"}


def test_one_key_under_two_names_counts_once():
    """A holder is its id and its key: a roster that gives one key to two ids (the keys are the
    coordinator's word) gets one count for that key, however both statements verify."""
    keys = {**PUBLIC, "x": PUBLIC["w"]}
    both = [statement("w"), ("x", AUD, R, sign_statement(KEYS["w"], AUD, STUDY, R, "x"))]
    assert len(counted(both, keys, AUD, STUDY, R)) == 1


@pytest.mark.parametrize(("signers", "colluders", "ok"), [
    (["u", "v"], 0, True), (["v", "w"], 0, False), (["u"], 0, False),
    (["u", "v"], 1, False), (["u", "v", "w"], 1, True)])
def test_a_certificate_suffices_at_need_with_the_device_among_the_signers(signers, colluders, ok):
    statements = {d: statement(d)[3] for d in signers}
    cert = Certificate(STUDY, "u", AUD, 3, colluders, PUBLIC, statements, R)
    assert cert.sufficient is ok
    again = Certificate.from_bytes(cert.to_bytes())
    assert again == cert and again.sufficient is ok


def test_a_tampered_certificate_does_not_suffice():
    cert = Certificate(STUDY, "u", AUD, 3, 0, PUBLIC, {"u": statement("u")[3],
                                                        "v": statement("u")[3]}, R)
    assert not cert.sufficient  # u's signature under v's name
    other = Certificate(STUDY, "u", AUD, 3, 0, PUBLIC, {"u": statement("u")[3],
                                                         "v": statement("v")[3]}, R2)
    assert not other.sufficient  # statements of instance R presented as of R2
    with pytest.raises(ValueError, match="malformed certificate"):
        Certificate.from_bytes(b'{"format": "fedsketch.abort-certificate/2"}')


def test_a_version_1_certificate_is_still_read():
    """Ledgers written before hold version-1 certificates (no R, no key in the digest): they are
    read and checked with the version-1 digest, and say so (``bundle_sha256`` None)."""
    v1 = {d: signing.sign(KEYS[d], legacy_digest(AUD, STUDY, d)) for d in ("u", "v")}
    cert = Certificate.from_bytes(Certificate(STUDY, "u", AUD, 3, 0, PUBLIC, v1).to_bytes())
    assert cert.bundle_sha256 is None and cert.sufficient
    assert b"abort-certificate/1" in cert.to_bytes()


def test_round_terms_round_trip_and_a_certificate_is_compared_with_them():
    terms = RoundTerms(STUDY, "u", R, 3, 0, PUBLIC)
    assert RoundTerms.from_bytes(terms.to_bytes()) == terms
    statements = {d: statement(d)[3] for d in ("u", "v")}
    assert terms_mismatch(Certificate(STUDY, "u", AUD, 3, 0, PUBLIC, statements, R), terms) is None
    cut = {"u": PUBLIC["u"], "v": PUBLIC["v"]}
    for cert, words in ((Certificate(STUDY, "u", AUD, 2, 0, PUBLIC, statements, R), "threshold t 2"),
                        (Certificate(STUDY, "u", AUD, 3, 0, cut, statements, R), "holders H 2"),
                        (Certificate(STUDY, "u", AUD, 3, 1, PUBLIC, statements, R), "colluders C 1"),
                        (Certificate(STUDY, "u", AUD, 3, 0, PUBLIC, statements, R2), "instance R"),
                        (Certificate(STUDY, "u", AUD, 3, 0, {**PUBLIC, "x": PUBLIC["w"]},
                                     statements, R), "holder keys")):
        assert words in (terms_mismatch(cert, terms) or ""), (words, terms_mismatch(cert, terms))
    with pytest.raises(ValueError, match="malformed round terms"):
        RoundTerms.from_bytes(b"{}")


def test_deeply_nested_json_is_a_malformed_certificate():
    """A deeply nested JSON value is a malformed certificate (ValueError), not a RecursionError
    that `device budget --verify` would print as a traceback."""
    with pytest.raises(ValueError, match="malformed certificate"):
        Certificate.from_bytes(b"[" * 100_000)
