"""Rule B of docs/secure-aggregation.md ("When a failed round gives ε back"): statements that a
secure round aborted, and the certificate of abort that gives a device its ε back.

A holder v of a device's shares that signs the *abort statement* of round ``study_id`` (the
round's own study id: a refinement round runs under an id of its own) for the coordinator it
reaches by ``audience`` promises that it sent no UNMASK shares for that round and never will:
it records that in its ledger session, and erases the shares it holds, before it signs. The
statement is Ed25519, with v's enrolled key, over

    SHA-256("fedsketch/secagg-abort/v1" ‖ L(audience) ‖ L(study_id) ‖ L(device_id) ‖ L("abort"))

(L: :func:`fedsketch.common.net.signing.field`, a length-prefixed field).

A device u's masked input y_u = x_u + e_u + PRG(b_u) + Σ ±PRG(s_uv) reveals x_u + e_u only to
whoever learns b_u, which needs t of the H = |N⁺(u)| Shamir shares of b_u (its holders: u and
its neighbours, :meth:`~.params.SecAggParams.closed`). If at least H − t + 1 holders never
reveal theirs, at most t − 1 shares can ever come out, and y_u stays a uniformly masked word
vector, independent of x_u. Up to C = ``colluders`` signers may sign and hand their share to
the coordinator anyway, and u cannot tell which, so u needs

    need(H, t, C) = H − t + 1 + min(C, H − 1)

distinct holders with a valid statement (u itself, which never colludes, is among the holders
and signs too). A holder counts once, however often its statement appears, and only with a
signature that verifies under the key the round's parameters gave it (the enrolled keys are
the coordinator's word, as everywhere in secure aggregation). The same count answers a round
that aborted during UNMASK: a holder that sent its UNMASK shares never signs, so a device with
t shares of b_u revealed has at most H − t honest signers left, below the bound.

A :class:`Certificate` is what the device keeps in the void row of its ledger (its SHA-256 is
sealed in the chain, :mod:`fedsketch.client.ledger_voids`): the statements, the holders' keys it
checked them against and the round's t and C, so ``fedsketch device budget --verify`` checks
the count again from the ledger alone.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fedsketch.common.net import signing

#: Domain of the abort statement's digest.
ABORT_DOMAIN = b"fedsketch/secagg-abort/v1"
#: Format of a certificate as a device keeps it.
CERTIFICATE_FORMAT = "fedsketch.abort-certificate/1"


def statement_digest(audience: str, study_id: str, device_id: str) -> bytes:
    """The 32-byte digest an abort statement signs (module docstring)."""
    h = hashlib.sha256(ABORT_DOMAIN)
    for part in (audience, study_id, device_id, "abort"):
        h.update(signing.field(part))
    return h.digest()


def sign_statement(private_key: bytes, audience: str, study_id: str, device_id: str) -> bytes:
    """The device's 64-byte abort statement for the round of ``study_id``."""
    return signing.sign(private_key, statement_digest(audience, study_id, device_id))


def needed(holders: int, threshold: int, colluders: int) -> int:
    """need(H, t, C) = H − t + 1 + min(C, H − 1) (module docstring)."""
    return holders - threshold + 1 + min(colluders, holders - 1)


def valid_statements(statements: Iterable[tuple[str, str, bytes]], keys: Mapping[str, bytes],
                     audience: str, study_id: str) -> dict[str, bytes]:
    """Of ``statements`` ((device id, audience, signature) each), the first valid one of each
    holder (the ids of ``keys``) for ``audience`` and ``study_id``, by holder: a statement of a
    device that holds no share, for another coordinator name or round, or whose signature does
    not verify under the holder's key counts for nothing; a holder twice, once."""
    found: dict[str, bytes] = {}
    for v, aud, sig in statements:
        if (v in keys and v not in found and aud == audience
                and signing.verify(keys[v], statement_digest(audience, study_id, v), sig)):
            found[v] = sig
    return found


def counted(statements: Iterable[tuple[str, str, bytes]], keys: Mapping[str, bytes],
            audience: str, study_id: str) -> frozenset[str]:
    """The distinct holders with a valid statement (:func:`valid_statements`)."""
    return frozenset(valid_statements(statements, keys, audience, study_id))


@dataclass(frozen=True)
class Certificate:
    """The certificate of abort for ``device_id``'s masked input in round ``study_id``: the
    ``statements`` (device id → signature, for ``audience``), the ``holders`` of its shares
    with their enrolled keys, and the round's threshold t and colluders C."""

    study_id: str
    device_id: str
    audience: str
    threshold: int
    colluders: int
    holders: Mapping[str, bytes]
    statements: Mapping[str, bytes]

    @property
    def need(self) -> int:
        return needed(len(self.holders), self.threshold, self.colluders)

    @property
    def signers(self) -> frozenset[str]:
        """The holders whose statement verifies (:func:`counted`)."""
        return counted(((v, self.audience, s) for v, s in self.statements.items()),
                       self.holders, self.audience, self.study_id)

    @property
    def sufficient(self) -> bool:
        """Whether the certificate proves y_u can never be unmasked: u among the signers, and
        at least :attr:`need` of them."""
        signers = self.signers
        return self.device_id in signers and len(signers) >= self.need

    def to_bytes(self) -> bytes:
        """Canonical JSON (what the ledger keeps and seals)."""
        def b64(raw: bytes) -> str:
            return base64.b64encode(raw).decode()

        return json.dumps({
            "format": CERTIFICATE_FORMAT, "study_id": self.study_id, "device_id": self.device_id,
            "audience": self.audience, "threshold": self.threshold, "colluders": self.colluders,
            "holders": {v: b64(k) for v, k in self.holders.items()},
            "statements": {v: b64(s) for v, s in self.statements.items()}},
            sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Certificate:
        """Inverse of :meth:`to_bytes`; ValueError for anything else."""
        try:
            doc = json.loads(raw)
            if doc["format"] != CERTIFICATE_FORMAT:
                raise ValueError(f"not a {CERTIFICATE_FORMAT} object")
            t, c = doc["threshold"], doc["colluders"]
            if type(t) is not int or type(c) is not int or t < 1 or c < 0:
                raise ValueError("a threshold or colluders that is no count")
            def keys(m: dict) -> dict[str, bytes]:
                return {str(v): base64.b64decode(k, validate=True) for v, k in m.items()}
            return cls(str(doc["study_id"]), str(doc["device_id"]), str(doc["audience"]), t, c,
                       keys(doc["holders"]), keys(doc["statements"]))
        except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as exc:
            raise ValueError(f"malformed certificate of abort: {exc}") from None
