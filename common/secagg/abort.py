"""Rule B of docs/secure-aggregation.md ("When a failed round gives ε back"): statements that a
secure round aborted, and the certificate of abort that gives a device its ε back.

A holder v of a device's shares that signs the *abort statement* of round ``study_id`` (the
round's own study id: a refinement round runs under an id of its own) for the coordinator it
reaches by ``audience`` promises that it sent no UNMASK shares for that round and never will:
it records that in its ledger session, and erases the shares it holds, before it signs. The
statement is Ed25519, with v's enrolled key, over

    SHA-256("fedsketch/secagg-abort/v2" ‖ L(audience) ‖ L(study_id) ‖ L(R) ‖ L(v) ‖ L(pk_v) ‖
            L("abort"))

(L: :func:`fedsketch.common.net.signing.field`, a length-prefixed field). R = SHA-256 of the
ADVERTISE_KEYS bundle v received (:func:`bundle_digest`: the round's roster, t, C, graph seed and
enrolled keys), so a statement is of one instance of the round: a coordinator that lists a
failed round's id again, with another bundle, cannot count old statements towards it. pk_v is
the signer's enrolled public key: a statement is bound to the holder's identity (id and key),
and a holder counts once, under one id and one key (:func:`valid_statements`). Version 1 (no R,
no pk_v) is read only to check certificates that ledgers already hold (:data:`LEGACY_FORMAT`).

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

The device records the :class:`RoundTerms` of its round (R, t, C and N⁺(u) with the holders'
keys) in its spend row before y_u leaves it, sealed in the ledger's chain. A :class:`Certificate`
is what the device keeps in the void row (its SHA-256 is sealed too,
:mod:`fedsketch.client.ledger_voids`): the statements, the holders' keys it checked them against
and the round's R, t and C; the void, and ``fedsketch device budget --verify``, accept it only
if those are the terms the spend recorded (:func:`terms_mismatch`), so a certificate made up
afterwards with fewer holders or a larger t does not give ε back.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fedsketch.common.net import signing

#: Domain of the abort statement's digest.
ABORT_DOMAIN = b"fedsketch/secagg-abort/v2"
#: Domain of the first release's statements (no bundle digest, no key), kept in older ledgers.
LEGACY_DOMAIN = b"fedsketch/secagg-abort/v1"
#: Format of a certificate as a device keeps it.
CERTIFICATE_FORMAT = "fedsketch.abort-certificate/2"
#: The first release's certificates (v1 statements), read only to check older ledgers.
LEGACY_FORMAT = "fedsketch.abort-certificate/1"
#: Format of the round terms a secure spend records (:class:`RoundTerms`).
TERMS_FORMAT = "fedsketch.secagg-round-terms/1"

#: A statement as it travels: (signer's device id, audience, R, signature).
Statement = tuple[str, str, bytes, bytes]


def bundle_digest(bundle: bytes) -> bytes:
    """R = SHA-256 of the ADVERTISE_KEYS bundle (its bytes as the device received them)."""
    return hashlib.sha256(bundle).digest()


def statement_digest(audience: str, study_id: str, bundle_sha256: bytes, device_id: str,
                     public_key: bytes) -> bytes:
    """The 32-byte digest an abort statement signs (module docstring)."""
    h = hashlib.sha256(ABORT_DOMAIN)
    for part in (audience, study_id, bundle_sha256, device_id, public_key, "abort"):
        h.update(signing.field(part))
    return h.digest()


def legacy_digest(audience: str, study_id: str, device_id: str) -> bytes:
    """The digest a version-1 statement signed (in certificates older ledgers hold)."""
    h = hashlib.sha256(LEGACY_DOMAIN)
    for part in (audience, study_id, device_id, "abort"):
        h.update(signing.field(part))
    return h.digest()


def sign_statement(private_key: bytes, audience: str, study_id: str, bundle_sha256: bytes,
                   device_id: str) -> bytes:
    """The device's 64-byte abort statement for the instance R = ``bundle_sha256`` of the round
    of ``study_id``."""
    return signing.sign(private_key, statement_digest(audience, study_id, bundle_sha256, device_id,
                                                      signing.public_key(private_key)))


def needed(holders: int, threshold: int, colluders: int) -> int:
    """need(H, t, C) = H − t + 1 + min(C, H − 1) (module docstring)."""
    return holders - threshold + 1 + min(colluders, holders - 1)


def valid_statements(statements: Iterable[Statement], keys: Mapping[str, bytes], audience: str,
                     study_id: str, bundle_sha256: bytes | None) -> dict[str, bytes]:
    """Of ``statements``, the first valid one of each holder (the ids of ``keys``) for
    ``audience``, ``study_id`` and R = ``bundle_sha256``, by holder: a statement of a device
    that holds no share, for another coordinator name, round or instance, or whose signature
    does not verify under the holder's key counts for nothing; a holder twice, or a key under
    two ids, once. ``bundle_sha256`` None: version-1 statements (:func:`legacy_digest`)."""
    found: dict[str, bytes] = {}
    seen: set[bytes] = set()
    for v, aud, r, sig in statements:
        if v not in keys or v in found or keys[v] in seen or aud != audience:
            continue
        if bundle_sha256 is None:
            digest = legacy_digest(audience, study_id, v)
        elif r == bundle_sha256:
            digest = statement_digest(audience, study_id, bundle_sha256, v, keys[v])
        else:
            continue
        if signing.verify(keys[v], digest, sig):
            found[v] = sig
            seen.add(keys[v])
    return found


def counted(statements: Iterable[Statement], keys: Mapping[str, bytes], audience: str,
            study_id: str, bundle_sha256: bytes) -> frozenset[str]:
    """The distinct holders with a valid statement (:func:`valid_statements`)."""
    return frozenset(valid_statements(statements, keys, audience, study_id, bundle_sha256))


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _keys(m: Mapping) -> dict[str, bytes]:
    return {str(v): base64.b64decode(k, validate=True) for v, k in m.items()}


@dataclass(frozen=True)
class RoundTerms:
    """What a device records with its secure spend before its masked input leaves it: the round
    (``study_id``), the device, R (SHA-256 of the ADVERTISE_KEYS bundle it received), the
    threshold t, the colluders C, and the holders of its shares N⁺(u) with their enrolled keys."""

    study_id: str
    device_id: str
    bundle_sha256: bytes
    threshold: int
    colluders: int
    holders: Mapping[str, bytes]

    @classmethod
    def of_round(cls, study_id: str, device_id: str, bundle: bytes) -> RoundTerms:
        """The terms of ``device_id`` in the round whose ADVERTISE_KEYS ``bundle`` it received;
        ValueError for a bundle that does not parse (:func:`.wire.params_from_json`)."""
        from fedsketch.common.secagg import wire

        params, keys, _ = wire.params_from_json(study_id, wire.load(bundle))
        return cls(study_id, device_id, bundle_digest(bundle), params.threshold, params.colluders,
                   {v: keys.get(v, b"") for v in sorted(params.closed(device_id))})

    def to_bytes(self) -> bytes:
        """Canonical JSON (what the spend row keeps; the chain seals its SHA-256)."""
        return json.dumps({
            "format": TERMS_FORMAT, "study_id": self.study_id, "device_id": self.device_id,
            "round_sha256": self.bundle_sha256.hex(), "threshold": self.threshold,
            "colluders": self.colluders, "holders": {v: _b64(k) for v, k in self.holders.items()}},
            sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> RoundTerms:
        """Inverse of :meth:`to_bytes`; ValueError for anything else."""
        try:
            doc = json.loads(raw)
            if doc["format"] != TERMS_FORMAT:
                raise ValueError(f"not a {TERMS_FORMAT} object")
            t, c = doc["threshold"], doc["colluders"]
            if type(t) is not int or type(c) is not int or t < 1 or c < 0:
                raise ValueError("a threshold or colluders that is no count")
            return cls(str(doc["study_id"]), str(doc["device_id"]), bytes.fromhex(doc["round_sha256"]),
                       t, c, _keys(doc["holders"]))
        except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as exc:
            raise ValueError(f"malformed round terms: {exc}") from None


@dataclass(frozen=True)
class Certificate:
    """The certificate of abort for ``device_id``'s masked input in round ``study_id``: the
    ``statements`` (device id → signature, for ``audience``), the ``holders`` of its shares
    with their enrolled keys, the round's threshold t and colluders C, and R, the SHA-256 of the
    round's ADVERTISE_KEYS bundle (None: a version-1 certificate of an older ledger)."""

    study_id: str
    device_id: str
    audience: str
    threshold: int
    colluders: int
    holders: Mapping[str, bytes]
    statements: Mapping[str, bytes]
    bundle_sha256: bytes | None = None

    @property
    def need(self) -> int:
        return needed(len(self.holders), self.threshold, self.colluders)

    @property
    def signers(self) -> frozenset[str]:
        """The holders whose statement verifies (:func:`valid_statements`)."""
        return frozenset(valid_statements(
            ((v, self.audience, self.bundle_sha256 or b"", s) for v, s in self.statements.items()),
            self.holders, self.audience, self.study_id, self.bundle_sha256))

    @property
    def sufficient(self) -> bool:
        """Whether the certificate proves y_u can never be unmasked: u among the signers, and
        at least :attr:`need` of them."""
        signers = self.signers
        return self.device_id in signers and len(signers) >= self.need

    def to_bytes(self) -> bytes:
        """Canonical JSON (what the ledger keeps and seals)."""
        doc = {"format": CERTIFICATE_FORMAT, "study_id": self.study_id, "device_id": self.device_id,
               "audience": self.audience, "threshold": self.threshold, "colluders": self.colluders,
               "holders": {v: _b64(k) for v, k in self.holders.items()},
               "statements": {v: _b64(s) for v, s in self.statements.items()}}
        if self.bundle_sha256 is None:
            doc["format"] = LEGACY_FORMAT
        else:
            doc["round_sha256"] = self.bundle_sha256.hex()
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Certificate:
        """Inverse of :meth:`to_bytes`; ValueError for anything else."""
        try:
            doc = json.loads(raw)
            if doc["format"] not in (CERTIFICATE_FORMAT, LEGACY_FORMAT):
                raise ValueError(f"not a {CERTIFICATE_FORMAT} object")
            t, c = doc["threshold"], doc["colluders"]
            if type(t) is not int or type(c) is not int or t < 1 or c < 0:
                raise ValueError("a threshold or colluders that is no count")
            r = None if doc["format"] == LEGACY_FORMAT else bytes.fromhex(doc["round_sha256"])
            return cls(str(doc["study_id"]), str(doc["device_id"]), str(doc["audience"]), t, c,
                       _keys(doc["holders"]), _keys(doc["statements"]), r)
        except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as exc:
            raise ValueError(f"malformed certificate of abort: {exc}") from None


def terms_mismatch(cert: Certificate, terms: RoundTerms) -> str | None:
    """How ``cert`` differs from the ``terms`` its spend recorded before the masked input left
    (None: it does not), in words: another round, device, bundle, t, C, or set of holders or
    their keys."""
    for what, got, kept in (("round", cert.study_id, terms.study_id),
                            ("device", cert.device_id, terms.device_id),
                            ("round instance R", (cert.bundle_sha256 or b"").hex(),
                             terms.bundle_sha256.hex()),
                            ("threshold t", cert.threshold, terms.threshold),
                            ("colluders C", cert.colluders, terms.colluders),
                            ("number of holders H", len(cert.holders), len(terms.holders))):
        if got != kept:
            return f"{what} {got!r} where the spend recorded {kept!r}"
    if dict(cert.holders) != dict(terms.holders):
        return "holders or holder keys other than those the spend recorded"
    return None
