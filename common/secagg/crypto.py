"""The protocol's cryptography, all from ``cryptography``: advert signatures (Ed25519 digests),
X25519 key agreement, HKDF-SHA256, AES-256-GCM sealing of the shares and the AES-256-CTR PRG of
the masks (package docstring, stages 1–4)."""

from __future__ import annotations

import hashlib
import secrets
import struct
from collections.abc import Collection
from functools import lru_cache

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ..net import signing
from .protocol import DOMAIN_PREFIX, Advert, SecAggAbort

KEY_BYTES = 32
NONCE_BYTES = 12


def advert_digest(study_id: str, device_id: str, c_pk: bytes, s_pk: bytes) -> bytes:
    """SHA-256(domain ‖ L(study) ‖ L(device) ‖ L(c_pk) ‖ L(s_pk)): what an advert's signature covers."""
    h = hashlib.sha256(DOMAIN_PREFIX + b"advert")
    for part in (study_id, device_id, c_pk, s_pk):
        h.update(signing.field(part))
    return h.digest()


def verify_advert(advert: Advert, study_id: str, public_key: bytes) -> bool:
    """True iff the advert's signature verifies under the device's enrolled Ed25519 key."""
    digest = advert_digest(study_id, advert.device_id, advert.c_pk, advert.s_pk)
    return signing.verify(public_key, digest, advert.signature)


def survivors_digest(study_id: str, signer: str, survivors: Collection[str]) -> bytes:
    """SHA-256(domain ‖ L(study) ‖ L(signer) ‖ H(Y)): what the signature of device ``signer``
    on the survivor list Y covers (stage 4), with H(Y) = SHA-256(u32le(|Y|) ‖ L(v) for v in
    sorted Y), computed once per list however many signatures are checked."""
    h = hashlib.sha256(DOMAIN_PREFIX + b"survivors")
    h.update(signing.field(study_id))
    h.update(signing.field(signer))
    h.update(_list_hash(tuple(survivors)))
    return h.digest()


@lru_cache(maxsize=8)
def _list_hash(survivors: tuple[str, ...]) -> bytes:
    """H(Y) of :func:`survivors_digest` (order and repeats do not count)."""
    ids = sorted(set(survivors))
    h = hashlib.sha256(struct.pack("<I", len(ids)))
    for v in ids:
        h.update(signing.field(v))
    return h.digest()


def public_bytes(key: X25519PrivateKey) -> bytes:
    """The raw 32-byte X25519 public key of ``key``."""
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def agree(key: X25519PrivateKey, peer_public: bytes) -> bytes:
    """X25519(key, peer); SecAggAbort on a malformed or low-order peer key."""
    try:
        return key.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as exc:
        raise SecAggAbort(f"key agreement failed: {exc}") from exc


def hkdf(secret: bytes, label: bytes, *fields: str) -> bytes:
    """A 32-byte key: HKDF-SHA256(secret, info = domain ‖ label ‖ L(field)…), no salt."""
    info = DOMAIN_PREFIX + label + b"".join(signing.field(f) for f in fields)
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(secret)


def _share_context(study_id: str, sender: str, receiver: str) -> bytes:
    """The AEAD associated data of the shares sent by ``sender`` to ``receiver``."""
    return (DOMAIN_PREFIX + b"shares" + signing.field(study_id) + signing.field(sender)
            + signing.field(receiver))


def seal(shared: bytes, study_id: str, sender: str, receiver: str, plaintext: bytes) -> bytes:
    """nonce ‖ AES-256-GCM(key = HKDF(shared, study, sender→receiver), ad = (study, sender, receiver))."""
    key = hkdf(shared, b"share-key", study_id, sender, receiver)
    nonce = secrets.token_bytes(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, _share_context(study_id, sender, receiver))


def open_sealed(shared: bytes, study_id: str, sender: str, receiver: str, ciphertext: bytes) -> bytes:
    """Inverse of :func:`seal`; SecAggAbort if the ciphertext does not authenticate."""
    key = hkdf(shared, b"share-key", study_id, sender, receiver)
    try:
        return AESGCM(key).decrypt(ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:],
                                   _share_context(study_id, sender, receiver))
    except (InvalidTag, ValueError) as exc:
        raise SecAggAbort(f"the shares from {sender} do not decrypt") from exc


def mask_seed(shared: bytes, study_id: str, u: str, v: str) -> bytes:
    """s_uv = HKDF(X25519 secret, study, min(u,v), max(u,v)): the same on both sides."""
    return hkdf(shared, b"mask", study_id, *sorted((u, v)))


def prg(seed: bytes, dim: int, bits: int) -> np.ndarray:
    """``dim`` words uniform mod 2^bits: the AES-256-CTR keystream of ``seed`` (zero IV), as uint64 LE.

    Each seed keys exactly one stream, so the fixed IV never repeats under one key.
    """
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    words = np.frombuffer(encryptor.update(bytes(8 * dim)), dtype="<u8").astype(np.uint64)
    return words & np.uint64(2**bits - 1)


def add_pair_mask(acc: np.ndarray, mask: np.ndarray, u: str, v: str) -> None:
    """acc += σ(u, v) · mask (mod 2^64), σ(u, v) = +1 if u < v else −1."""
    if u < v:
        acc += mask
    else:
        acc -= mask


def as_words(values: np.ndarray, dim: int, name: str) -> np.ndarray:
    """An integer (dim,) vector as uint64 words (two's complement, i.e. its value mod 2^64)."""
    arr = np.asarray(values)
    if arr.shape != (dim,) or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be an integer vector of shape ({dim},), got {arr.dtype} {arr.shape}")
    return arr.astype(np.int64).view(np.uint64)
