"""Device identity and contribution signatures (Ed25519, from ``cryptography``).

A device signs the digest

    SHA-256("fedsketch/contribution/v1" ‖ L(study_id) ‖ L(device_id) ‖ f64le(n) ‖ L(spec_sha256)
            ‖ SHA-256(payload))

where L(s) is the UTF-8 bytes of s prefixed by their length as a little-endian uint32 and
f64le(n) the record count as a little-endian IEEE-754 double, so no two field tuples share an
encoding. A registration for a plain study is signed over

    SHA-256("fedsketch/registration/v1" ‖ L(study_id) ‖ L(device_id) ‖ L(spec_sha256))

(its own domain, so a registration never verifies as a contribution or the reverse), and a
device's leave of a roster it joined (before it contributed) over the same fields in the domain
"fedsketch/leave/v1", so nobody but the device can take its place away. A device's refusal of
a study is signed over

    SHA-256("fedsketch/refusal/v1" ‖ L(study_id) ‖ L(device_id) ‖ L(spec_sha256) ‖ u32le(reason))

(reason: the ``RefusalReason`` code of ``proto/fedsketch.proto``), so nobody can report a
refusal in a device's name. A device's read of studies or of a result (``DeviceRead`` in
``proto/fedsketch.proto``) is signed over (format :data:`READ_FORMAT`)

    SHA-256("fedsketch/read/v2" ‖ L(audience) ‖ L(method) ‖ L(device_id) ‖ L(study_id)
            ‖ f64le(signed_at))

(audience: the coordinator's name the device verified over TLS,
:func:`fedsketch.common.net.device_reads.audience`; method: the RPC's name, "ListStudies",
"GetStudy" or "GetResult"; study_id "" for a list; signed_at: Unix seconds), so a read signed
for one coordinator, method, study or moment is no other. (Format 1, "fedsketch/read/v1", named
no audience; it is no longer taken.)

Every digest a device signs starts with its kind's domain, and the read's is no prefix of
another kind's nor another's of it (``tests/common/net/test_device_reads.py``), so a read signature
never verifies as a registration, leave, refusal, contribution or secure-aggregation message,
nor the reverse. The coordinator verifies them against the public key registered at enrollment.
"""

from __future__ import annotations

import hashlib
import struct

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

DOMAIN = b"fedsketch/contribution/v1"
REGISTRATION_DOMAIN = b"fedsketch/registration/v1"
LEAVE_DOMAIN = b"fedsketch/leave/v1"
REFUSAL_DOMAIN = b"fedsketch/refusal/v1"
READ_DOMAIN = b"fedsketch/read/v2"
#: The format of the read digest (``DeviceRead.format``): 2, the one with an audience.
READ_FORMAT = 2
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64


def field(data: str | bytes) -> bytes:
    """A length-prefixed field of a digest: uint32 little-endian byte length, then the bytes
    (UTF-8 for text), so that concatenated fields cannot be re-split differently."""
    raw = data.encode() if isinstance(data, str) else data
    return struct.pack("<I", len(raw)) + raw


def contribution_digest(study_id: str, device_id: str, n: float, spec_sha256: str,
                        payload: bytes) -> bytes:
    """The 32-byte digest a contribution's signature covers (module docstring)."""
    return contribution_digest_of(study_id, device_id, n, spec_sha256, hashlib.sha256(payload).digest())


def contribution_digest_of(study_id: str, device_id: str, n: float, spec_sha256: str,
                           payload_sha256: bytes) -> bytes:
    """:func:`contribution_digest` from the payload's SHA-256 (32 bytes), for a caller that
    needs that hash too (the coordinator's receipt): the payload is hashed once."""
    h = hashlib.sha256(DOMAIN)
    for part in (field(study_id), field(device_id), struct.pack("<d", n), field(spec_sha256),
                 payload_sha256):
        h.update(part)
    return h.digest()


def registration_digest(study_id: str, device_id: str, spec_sha256: str,
                        domain: bytes = REGISTRATION_DOMAIN) -> bytes:
    """The 32-byte digest a registration's signature covers, or with ``domain`` =
    :data:`LEAVE_DOMAIN` a leave's (module docstring)."""
    h = hashlib.sha256(domain)
    for part in (field(study_id), field(device_id), field(spec_sha256)):
        h.update(part)
    return h.digest()


def refusal_digest(study_id: str, device_id: str, spec_sha256: str, reason: int) -> bytes:
    """The 32-byte digest a refusal report's signature covers (module docstring); ``reason`` a
    ``RefusalReason`` number (0 ≤ reason < 2^32)."""
    h = hashlib.sha256(REFUSAL_DOMAIN)
    for part in (field(study_id), field(device_id), field(spec_sha256), struct.pack("<I", reason)):
        h.update(part)
    return h.digest()


def read_digest(audience: str, method: str, device_id: str, study_id: str, signed_at: float) -> bytes:
    """The 32-byte digest a device's signed read covers (module docstring): ``audience`` the
    coordinator's name, ``method`` the RPC's name, ``study_id`` "" for a list, ``signed_at``
    Unix seconds."""
    h = hashlib.sha256(READ_DOMAIN)
    for part in (field(audience), field(method), field(device_id), field(study_id),
                 struct.pack("<d", signed_at)):
        h.update(part)
    return h.digest()


def new_private_key() -> bytes:
    """A fresh Ed25519 private key as its 32 raw bytes (from the OS CSPRNG)."""
    return Ed25519PrivateKey.generate().private_bytes_raw()


def public_key(private_key: bytes) -> bytes:
    """The raw 32-byte public key of a raw private key."""
    key = Ed25519PrivateKey.from_private_bytes(private_key).public_key()
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def sign(private_key: bytes, digest: bytes) -> bytes:
    """The 64-byte Ed25519 signature of ``digest``."""
    return Ed25519PrivateKey.from_private_bytes(private_key).sign(digest)


def verify(public_key_bytes: bytes, digest: bytes, signature: bytes) -> bool:
    """True iff ``signature`` is a valid Ed25519 signature of ``digest`` under the key."""
    if len(public_key_bytes) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key_bytes).verify(signature, digest)
    except (InvalidSignature, ValueError):
        return False
    return True
