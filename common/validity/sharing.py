"""Two-aggregator sharing of a proven input, and its verification (Prio3's shard, prepare and
decide, for :class:`.circuit.RangeCircuit` and ``proofs`` repetitions of :class:`.flp.Flp`).

**Device** (:meth:`ProvenInput.shard`): encodes x, draws the helper's 16-byte seed and two
16-byte blinds from the OS; the helper's shares of the encoding and of the proofs are the seed's
XOF streams, the leader's are the encoding and the proofs minus them (so each share alone is
uniform). Joint randomness binds the shares, as Prio3's joint-randomness parts do: part_L =
H(blind_L, nonce, leader's input share), part_H = H(blind_H, nonce, helper's seed), joint seed =
H(part_L, part_H), and proof i uses the joint seed's i-th stream; each aggregator receives the
other's part as a hint. The prover's randomness (the wire seeds) comes from a fresh OS seed.
**Aggregators** (:meth:`ProvenInput.prepare`): each recomputes its own part from its share and
blind, builds the joint seed from it and the hint, and queries every proof at r_i, the i-th
stream of H(verify_key, nonce): a key the two aggregators share and devices never see, so r is
unknown to the prover; r is drawn again until it lies off the FLP's nodes. **Decision**
(:func:`decide`, run by both on the exchanged messages): every proof accepts on the sum of the
two verifier shares, and each aggregator's recomputed part equals the hint the other was given
(both used the joint seed of the shares they actually hold, so the device could not pick its
input after seeing the joint randomness).

Soundness (:meth:`ProvenInput.soundness_log2`): for an invalid input, proof i passes only if its
joint randomness zeroes the circuit (probability 1/p, over a random oracle) or its query misses
a wrong gadget polynomial (ε_q = 2M/(p − 2M − 1)). The query points are independent across
proofs and hidden from the device; the joint randomness can be ground by a device that hashes Q
candidate reports (changing its blind). So a report is wrongly accepted with probability at
most Σ_j min(1, Q·C(R, j)·p^−j)·ε_q^(R−j) over the number j of proofs won by the joint
randomness, R = ``proofs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import xof
from .circuit import RangeCircuit
from .field import P, add, sub
from .flp import Flp


@dataclass(frozen=True)
class LeaderShare:
    """What the leader (the coordinator) receives: its shares in full, its blind, the helper's part."""

    input: np.ndarray
    proof: np.ndarray
    blind: bytes
    peer_part: bytes


@dataclass(frozen=True)
class HelperShare:
    """What the helper receives: 16 bytes of seed for both its shares, its blind, the leader's part."""

    seed: bytes
    blind: bytes
    peer_part: bytes


@dataclass(frozen=True)
class PrepMessage:
    """One aggregator's message to the other: its verifier shares (R·``verifier_len``), the
    part it recomputed and the peer's part it was handed."""

    verifier: np.ndarray
    own_part: bytes
    peer_part: bytes


def _part(blind: bytes, nonce: bytes, share: bytes) -> bytes:
    return xof.derive(b"fedsketch validity joint part", blind, nonce, share)


@dataclass(frozen=True)
class ProvenInput:
    """Range-proven two-aggregator sharing for one :class:`RangeCircuit`, ``proofs`` FLPs."""

    circuit: RangeCircuit
    proofs: int = 3

    @property
    def flp(self) -> Flp:
        return Flp(self.circuit)

    def _helper_streams(self, seed: bytes) -> tuple[np.ndarray, np.ndarray]:
        return (xof.expand(seed, b"fedsketch validity input share", self.circuit.length),
                xof.expand(seed, b"fedsketch validity proof share", self.proofs * self.flp.proof_len))

    def _joint_rands(self, part_leader: bytes, part_helper: bytes) -> list[np.ndarray]:
        joint = xof.derive(b"fedsketch validity joint seed", part_leader, part_helper)
        return [xof.expand(joint, b"joint %d" % i, self.circuit.joint_rand_len)
                for i in range(self.proofs)]

    def shard(self, x, nonce: bytes) -> tuple[LeaderShare, HelperShare]:
        """The device's two shares of integers ``x`` (ValueError when out of range)."""
        return self.shard_encoded(self.circuit.encode(x), nonce)

    def shard_encoded(self, encoded: np.ndarray, nonce: bytes) -> tuple[LeaderShare, HelperShare]:
        """The two shares of an encoding with proofs: the device's half of :meth:`shard`, which
        proves whatever it is given (an invalid encoding's proofs are rejected by
        :meth:`decide`); ``nonce`` is the report's public identifier."""
        helper_seed, blind_leader, blind_helper = xof.seed(), xof.seed(), xof.seed()
        helper_input, helper_proof = self._helper_streams(helper_seed)
        leader_input = sub(encoded, helper_input)
        part_leader = _part(blind_leader, nonce, leader_input.tobytes())
        part_helper = _part(blind_helper, nonce, helper_seed)
        flp = self.flp
        prove_rand = xof.expand(xof.seed(), b"fedsketch validity prove",
                                self.proofs * flp.prove_rand_len).reshape(self.proofs, -1)
        proof = np.concatenate([flp.prove(encoded, rand, joint) for rand, joint in
                                zip(prove_rand, self._joint_rands(part_leader, part_helper),
                                    strict=True)])
        return (LeaderShare(leader_input, sub(proof, helper_proof), blind_leader, part_helper),
                HelperShare(helper_seed, blind_helper, part_leader))

    def _query_rands(self, verify_key: bytes, nonce: bytes) -> list[np.ndarray]:
        stream = xof.expand(xof.derive(b"fedsketch validity query", verify_key, nonce),
                            b"query", 8 * self.proofs)
        usable = stream[stream > 2 * self.flp.calls]  # off the nodes 0 … 2M
        if usable.size < self.proofs:  # probability below (2^-22)^(5·proofs)
            raise RuntimeError("the query stream fell on the FLP's nodes; use another nonce")
        return [usable[i: i + 1] for i in range(self.proofs)]

    def prepare(self, share: LeaderShare | HelperShare, verify_key: bytes,
                nonce: bytes) -> PrepMessage:
        """One aggregator's verifier shares for one device's report."""
        if isinstance(share, LeaderShare):
            inputs, proof = share.input, share.proof
            own = _part(share.blind, nonce, np.asarray(inputs, dtype=np.int64).tobytes())
            joints = self._joint_rands(own, share.peer_part)
        else:
            inputs, proof = self._helper_streams(share.seed)
            own = _part(share.blind, nonce, share.seed)
            joints = self._joint_rands(share.peer_part, own)
        flp = self.flp
        if np.shape(inputs) != (self.circuit.length,) or np.shape(proof) != (
                self.proofs * flp.proof_len,):
            raise ValueError("a share of the wrong length")
        proofs = np.asarray(proof, dtype=np.int64).reshape(self.proofs, flp.proof_len)
        verifier = np.concatenate([
            flp.query(inputs, pf, query, joint, num_shares=2) for pf, query, joint in
            zip(proofs, self._query_rands(verify_key, nonce), joints, strict=True)])
        return PrepMessage(verifier, own, share.peer_part)

    def decide(self, mine: PrepMessage, theirs: PrepMessage) -> bool:
        """Accept the report iff both used the joint randomness of the shares they hold and every
        proof accepts on the summed verifier shares. Symmetric: both aggregators agree."""
        if mine.own_part != theirs.peer_part or theirs.own_part != mine.peer_part:
            return False
        total = add(mine.verifier, theirs.verifier).reshape(self.proofs, -1)
        return all(self.flp.decide(v) for v in total)

    def input_share(self, share: LeaderShare | HelperShare) -> np.ndarray:
        """The aggregator's additive share of the encoding (to be summed over accepted reports
        and read back with :meth:`RangeCircuit.decode`)."""
        return share.input if isinstance(share, LeaderShare) else self._helper_streams(share.seed)[0]

    def soundness_log2(self, hash_queries: int = 1) -> float:
        """log2 of the bound on wrongly accepting an invalid report (module docstring) for a
        device that tries ``hash_queries`` candidate reports."""
        eps = self.flp.soundness()
        total = sum(min(1.0, hash_queries * math.comb(self.proofs, j) * float(P) ** -j)
                    * eps ** (self.proofs - j) for j in range(self.proofs + 1))
        return math.log2(total)

    def report_bytes(self) -> dict[str, int]:
        """Bytes a device sends, field elements as 4-byte words: the leader's input and proof
        shares with its blind and hint, the helper's seed, blind and hint."""
        words = 4 * (self.circuit.length + self.proofs * self.flp.proof_len)
        return {"leader": words + 2 * xof.SEED_BYTES, "helper": 3 * xof.SEED_BYTES}


@lru_cache(maxsize=64)
def proven(entries: int, bound: int, l1_bound: int) -> ProvenInput:
    """The sharing of the circuit (``entries``, ``bound``, ``l1_bound`` or 0 for none), built
    once per circuit (its FLP's interpolation matrices are the costly part)."""
    return ProvenInput(RangeCircuit(entries, bound, l1_bound or None))


def verify_key(leader_seed: bytes, helper_seed: bytes) -> bytes:
    """The aggregators' shared verify key, hashed from both aggregators' 16-byte seeds."""
    return xof.derive(b"fedsketch validity verify key", leader_seed, helper_seed)
