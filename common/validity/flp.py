"""A fully linear proof (FLP) that a validity circuit is zero (Boneh, Boyle, Corrigan-Gibbs,
Gilboa, Ishai, CRYPTO 2019, Thm 4.3; the IETF CFRG VDAF draft's FlpGeneric), for circuits whose
quadratic part is a sum of products left·right (:class:`.circuit.RangeCircuit`).

The gadget is ParallelSum(Mul, c): one call takes c pairs and returns Σ_j left_j·right_j; the
``num_pairs`` pairs are cut into M = ⌈num_pairs / c⌉ calls, c = ⌈√num_pairs⌉ (zero pairs pad the
last call). The prover puts each of the 2c wires on the nodes 0, 1, …, M: at node 0 a uniform
random value (the wire seed, from the prover's randomness), at node k the wire's input in call k;
f_w is the wire's polynomial of degree ≤ M through them, and p(t) = Σ_j f_{L,j}(t)·f_{R,j}(t),
degree ≤ 2M, equals call k's output at node k. The proof is the 2c wire seeds and p's values at
the nodes 0 … 2M: 2c + 2M + 1 elements, every one of them linear in the parts a verifier holds.
(p − 1 = 2·3²·7·11·31·151·331 has no large power of two, so there is no FFT domain; the nodes are
0 … 2M and interpolation is a precomputed Lagrange matrix, applied by exact BLAS products.)

A verifier holding an additive share of the encoding and of the proof, and the query point r
(shared by the verifiers, unknown to the prover, outside the nodes), computes linearly

    out  = Σ_{k=1..M} p(k) + linear part       (the circuit's value if p is honest)
    f(r) = Σ_k λ_k(r)·(wire values at node k)  (2c elements, λ the Lagrange basis on 0 … M)
    p(r) = Σ_t μ_t(r)·p(t)                      (μ the basis on 0 … 2M)

and the verifiers accept when the sum of their shares has out = 0 and Σ_j f_{L,j}(r)·f_{R,j}(r)
= p(r). Soundness: if p ≠ Σ f_L·f_R the difference is a nonzero polynomial of degree ≤ 2M, zero
at r with probability ≤ 2M/(p − 2M − 1) (r uniform off the 2M + 1 nodes); if p is honest, out
is the circuit's value. Zero knowledge (honest verifiers): for a valid input, out = 0, f(r) is
uniform (λ_0(r) ≠ 0 off the nodes, and the wire seeds are uniform) and p(r) is its function, so
the sum of the verifier shares carries nothing about the input; a verifier's own shares are
uniform. See docs/bounded-influence.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .circuit import RangeCircuit
from .field import P, dot, inv, matmul, mul, power, product, sub


@lru_cache(maxsize=16)
def _barycentric(nodes: int) -> np.ndarray:
    """w_k = 1 / Π_{j≠k} (k − j) on the nodes 0 … nodes − 1: (−1)^(N−1−k) / (k!·(N−1−k)!)."""
    fact = [1] * nodes
    for i in range(1, nodes):
        fact[i] = fact[i - 1] * i % P
    denominators = [fact[k] * fact[nodes - 1 - k] * (-1) ** (nodes - 1 - k) % P
                    for k in range(nodes)]
    return inv(np.array(denominators, dtype=np.int64))


def lagrange(points, nodes: int) -> np.ndarray:
    """(len(points), nodes): λ_k(t) = ℓ(t)·w_k / (t − k), ℓ(t) = Π_j (t − j), for points t
    off the nodes 0 … nodes − 1 (ValueError on a node)."""
    t = np.mod(np.asarray(points, dtype=np.int64), P)
    diffs = sub(t[:, None], np.arange(nodes, dtype=np.int64)[None, :])
    if (diffs == 0).any():
        raise ValueError("a Lagrange point lies on a node")
    ell = np.array([product(row) for row in diffs], dtype=np.int64)
    return mul(mul(ell[:, None], _barycentric(nodes)[None, :]), power(diffs, P - 2))


@lru_cache(maxsize=8)
def _extension(calls: int) -> np.ndarray:
    """(M, M + 1): the values at nodes M + 1 … 2M of a polynomial of degree ≤ M given at 0 … M."""
    return lagrange(np.arange(calls + 1, 2 * calls + 1), calls + 1)


@dataclass(frozen=True)
class Flp:
    """The FLP for one circuit."""

    circuit: RangeCircuit

    @property
    def chunk(self) -> int:
        """c = ⌈√num_pairs⌉ pairs per gadget call."""
        return math.isqrt(self.circuit.num_pairs - 1) + 1

    @property
    def calls(self) -> int:
        """M = ⌈num_pairs / c⌉."""
        return -(-self.circuit.num_pairs // self.chunk)

    @property
    def prove_rand_len(self) -> int:
        return 2 * self.chunk

    @property
    def proof_len(self) -> int:
        return 2 * self.chunk + 2 * self.calls + 1

    @property
    def verifier_len(self) -> int:
        return 2 * self.chunk + 2

    def soundness(self) -> float:
        """ε_q = 2M/(p − 2M − 1): the chance that a wrong gadget polynomial passes one query."""
        return 2 * self.calls / (P - 2 * self.calls - 1)

    def _wires(self, seeds: np.ndarray, values: np.ndarray) -> np.ndarray:
        """(M + 1, c): the seeds at node 0, then the calls' inputs (zero-padded)."""
        padded = np.zeros(self.calls * self.chunk, dtype=np.int64)
        padded[: values.size] = values
        return np.vstack([seeds[None, :], padded.reshape(self.calls, self.chunk)])

    def prove(self, encoded, prove_rand, joint_rand) -> np.ndarray:
        """The proof (``proof_len``,) that ``encoded`` satisfies the circuit."""
        c = self.chunk
        left, right = self.circuit.pairs(encoded, joint_rand)
        wires = [self._wires(prove_rand[:c], left), self._wires(prove_rand[c:], right)]
        ext = _extension(self.calls)
        full = [np.vstack([w, matmul(ext, w)]) for w in wires]
        gadget = np.mod(mul(full[0], full[1]).sum(axis=1), P)
        return np.concatenate([np.asarray(prove_rand, dtype=np.int64), gadget])

    def query(self, share, proof_share, query_rand, joint_rand, num_shares: int) -> np.ndarray:
        """One verifier's share (``verifier_len``,): [out, f_L(r), f_R(r), p(r)] on its shares
        of the encoding and the proof; ``query_rand`` holds r, which must lie off the nodes."""
        c, calls = self.chunk, self.calls
        r = int(query_rand[0])
        if r <= 2 * calls:
            raise ValueError("the query point must lie off the nodes 0 … 2M")
        proof_share = np.asarray(proof_share, dtype=np.int64)
        gadget = proof_share[2 * c:]
        left, right = self.circuit.pairs(share, joint_rand, num_shares)
        out = (int(gadget[1: calls + 1].sum() % P)
               + self.circuit.linear(share, joint_rand, num_shares)) % P
        at_r = lagrange([r], calls + 1)
        f_left = matmul(at_r, self._wires(proof_share[:c], left))[0]
        f_right = matmul(at_r, self._wires(proof_share[c: 2 * c], right))[0]
        p_at_r = dot(lagrange([r], 2 * calls + 1)[0], gadget)
        return np.concatenate([[out], f_left, f_right, [p_at_r]]).astype(np.int64)

    def decide(self, verifier) -> bool:
        """Accept iff out = 0 and Σ f_L(r)·f_R(r) = p(r), on the sum of the verifier shares."""
        c = self.chunk
        verifier = np.mod(np.asarray(verifier, dtype=np.int64), P)
        if verifier.shape != (self.verifier_len,):
            raise ValueError(f"a verifier message has {self.verifier_len} elements")
        return bool(verifier[0] == 0
                    and dot(verifier[1: c + 1], verifier[c + 1: 2 * c + 1]) == verifier[-1])
