"""The validity messages on the wire: field vectors as little-endian uint32 words, and the
aggregators' :class:`~.sharing.PrepMessage` as the proto's ``PrepShare`` (proto/fedsketch.proto,
service Helper)."""

from __future__ import annotations

import numpy as np

from fedsketch.common.pb import fedsketch_pb2 as pb

from .field import P
from .sharing import LeaderShare, PrepMessage
from .xof import SEED_BYTES


def words(a: np.ndarray) -> bytes:
    """Field elements (int64 in [0, p)) as uint32 little-endian words."""
    return np.asarray(a, dtype=np.int64).astype("<u4").tobytes()


def from_words(raw: bytes, count: int | None = None) -> np.ndarray:
    """Field elements from uint32 words; ValueError for a length not a multiple of 4 (or not
    ``count`` words) or a word that is no element of F_p."""
    if len(raw) % 4 or (count is not None and len(raw) != 4 * count):
        raise ValueError(f"a field vector of {len(raw)} bytes, expected "
                         f"{'a multiple of 4' if count is None else 4 * count}")
    a = np.frombuffer(raw, dtype="<u4").astype(np.int64)
    if a.size and int(a.max()) >= P:
        raise ValueError("a word is not an element of F_p (at least p = 2^31 - 1)")
    return a


def to_pb(nonce: bytes, message: PrepMessage | None) -> pb.PrepShare:
    """One aggregator's message for a report (``present`` False when it holds no share)."""
    if message is None:
        return pb.PrepShare(nonce=nonce, present=False)
    return pb.PrepShare(nonce=nonce, present=True, verifier=words(message.verifier),
                        own_part=message.own_part, peer_part=message.peer_part)


def from_pb(share: pb.PrepShare, verifier_len: int) -> PrepMessage | None:
    """The message back (None when absent); ValueError for a verifier of the wrong length."""
    if not share.present:
        return None
    return PrepMessage(from_words(share.verifier, verifier_len), bytes(share.own_part),
                       bytes(share.peer_part))


def leader_to_bytes(nonce: bytes, share: LeaderShare) -> bytes:
    """A validated study's MASKED_INPUT body: the report's nonce, the leader's blind and the
    helper's part (16 bytes each), then the input and proof shares as uint32 words."""
    return nonce + share.blind + share.peer_part + words(share.input) + words(share.proof)


def leader_from_bytes(body: bytes, input_len: int, proof_len: int) -> tuple[bytes, LeaderShare]:
    """(nonce, leader share) of a body; ValueError unless it has exactly the circuit's length."""
    head = 3 * SEED_BYTES
    if len(body) != head + 4 * (input_len + proof_len):
        raise ValueError(f"a report of {len(body):,} bytes; this device's circuit takes "
                         f"{head + 4 * (input_len + proof_len):,}")
    a = from_words(body[head:])
    return body[:16], LeaderShare(a[:input_len], a[input_len:], body[16:32], body[32:48])
