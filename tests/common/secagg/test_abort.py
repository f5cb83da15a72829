"""The certificate of abort (rule B, docs/secure-aggregation.md): need(H, t, C), and the count of
distinct holders with a valid statement, which neither a forged nor a repeated statement grows."""

from __future__ import annotations

import pytest

from fedsketch.common.net import signing
from fedsketch.common.secagg.abort import (
    Certificate,
    counted,
    needed,
    sign_statement,
    statement_digest,
)

HOLDERS = ["u", "v", "w", "x"]
KEYS = {d: signing.new_private_key() for d in [*HOLDERS, "outsider"]}
PUBLIC = {d: signing.public_key(KEYS[d]) for d in HOLDERS}
AUD, STUDY = "coordinator.example", "study-1"


def statement(device: str, audience: str = AUD, study: str = STUDY, key: str | None = None):
    return device, audience, sign_statement(KEYS[key or device], audience, study, device)


def test_need_is_h_minus_t_plus_one_plus_colluders_up_to_h_minus_one():
    assert needed(4, 3, 0) == 2
    assert needed(4, 3, 1) == 3
    assert needed(5, 3, 10) == 3 + 4  # min(C, H − 1): u itself never colludes
    assert needed(10, 6, 2) == 7


def test_the_digest_binds_every_field():
    base = statement_digest(AUD, STUDY, "u")
    assert len({base, statement_digest("other", STUDY, "u"), statement_digest(AUD, "s2", "u"),
                statement_digest(AUD, STUDY, "v"), statement_digest(AUD + "u", STUDY, "")}) == 5


def test_a_holder_counts_once_and_a_forgery_not_at_all():
    twice = [statement("u"), statement("u"), statement("v")]
    assert counted(twice, PUBLIC, AUD, STUDY) == {"u", "v"}
    forged = [statement("w", key="outsider"),          # not w's key
              statement("x", audience="elsewhere"),     # another coordinator's name
              statement("x", study="study-2"),          # another round
              statement("outsider"),                    # holds no share
              ("w", AUD, statement("v")[2])]            # v's signature under w's name
    assert counted(forged, PUBLIC, AUD, STUDY) == set()
    assert counted([*forged, statement("w")], PUBLIC, AUD, STUDY) == {"w"}


@pytest.mark.parametrize(("signers", "colluders", "ok"), [
    (["u", "v"], 0, True), (["v", "w"], 0, False), (["u"], 0, False),
    (["u", "v"], 1, False), (["u", "v", "w"], 1, True)])
def test_a_certificate_suffices_at_need_with_the_device_among_the_signers(signers, colluders, ok):
    statements = {d: statement(d)[2] for d in signers}
    cert = Certificate(STUDY, "u", AUD, 3, colluders, PUBLIC, statements)
    assert cert.sufficient is ok
    again = Certificate.from_bytes(cert.to_bytes())
    assert again == cert and again.sufficient is ok


def test_a_tampered_certificate_does_not_suffice():
    cert = Certificate(STUDY, "u", AUD, 3, 0, PUBLIC, {"u": statement("u")[2],
                                                        "v": statement("u")[2]})
    assert not cert.sufficient  # u's signature under v's name
    with pytest.raises(ValueError, match="malformed certificate"):
        Certificate.from_bytes(b'{"format": "fedsketch.abort-certificate/1"}')


def test_deeply_nested_json_is_a_malformed_certificate():
    """A deeply nested JSON value is a malformed certificate (ValueError), not a RecursionError
    that `device budget --verify` would print as a traceback."""
    with pytest.raises(ValueError, match="malformed certificate"):
        Certificate.from_bytes(b"[" * 100_000)
