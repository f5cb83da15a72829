"""Seeds, and their expansion into field elements (an XOF built from standard primitives).

A seed is 16 bytes of OS randomness (:func:`seed`). :func:`expand` reads AES-128 in counter
mode keyed by the seed (``cryptography``), its initial counter block the first 16 bytes of
SHA-256 of a label, so one seed gives independent streams for different labels; the stream is
cut into 31-bit words (the top bit of each little-endian uint32 dropped) and a word equal to p
(= 2^31 − 1, the only value ≥ p) is rejected, so every element is uniform on F_p as long as
AES-128 is a pseudorandom permutation. :func:`derive` hashes labelled byte strings into a new
16-byte seed (SHA-256, each part prefixed by its length so that no two lists of parts collide):
the joint randomness's binding to the input shares (Prio3's joint-randomness parts) and the
query randomness from the aggregators' shared verification key use it.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from .field import P

SEED_BYTES = 16


def seed() -> bytes:
    """16 bytes from the operating system's random source."""
    return os.urandom(SEED_BYTES)


def derive(label: bytes, *parts: bytes) -> bytes:
    """A 16-byte seed bound to ``label`` and every part (SHA-256, length-prefixed parts)."""
    digest = hashlib.sha256()
    for item in (label, *parts):
        digest.update(len(item).to_bytes(8, "little"))
        digest.update(item)
    return digest.digest()[:SEED_BYTES]


def expand(key: bytes, label: bytes, count: int) -> np.ndarray:
    """``count`` field elements (int64 in [0, p)) from the stream of ``key`` under ``label``."""
    if len(key) != SEED_BYTES:
        raise ValueError(f"a seed has {SEED_BYTES} bytes, got {len(key)}")
    nonce = hashlib.sha256(label).digest()[:16]
    encryptor = Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor()
    out = np.empty(0, dtype=np.int64)
    while out.size < count:
        # a word is rejected with probability 2^-31: ask for a few extra
        want = count - out.size + 8
        words = np.frombuffer(encryptor.update(bytes(4 * want)), dtype="<u4")
        words = (words & np.uint32(P)).astype(np.int64)
        out = np.concatenate([out, words[words != P]])
    return out[:count]
