"""The range proof's validity circuit: every entry of an integer vector lies in [−B, B].

Encoding (as Prio3's SumVec, with a two-sided bound): entry x_i is sent as the bits of
y_i = x_i + B and of z_i = B − x_i, each in w = (2B).bit_length() bits, so the encoded vector
has 2·n·w field elements. The aggregate x is read back linearly (:func:`decode`), so the two
aggregators can each read their share of it. The circuit, for random field elements r (one per
bit) and s (one per entry), is

    C = Σ_k r_k·β_k·(β_k − 1) + Σ_i s_i·(Σ_j 2^j·b_ij + Σ_j 2^j·c_ij − 2B),

zero for every valid encoding (each bit 0 or 1, and y_i + z_i = 2B, so y_i, z_i ≥ 0 give
−B ≤ x_i ≤ B); for an invalid one it is a nonzero polynomial of degree 2 in (r, s), so it
vanishes with probability at most 2/p (Schwartz–Zippel) over the verifier's random choice. A
fully linear proof of C on secret shares (Boneh et al., CRYPTO 2019) is the next step; here C is
evaluated on the plain encoding, for tests.
"""

from __future__ import annotations

import numpy as np

from .field import P, add, dot, mul, sub, to_field


def width(bound: int) -> int:
    """w: bits of y, z ∈ [0, 2B]."""
    if bound < 1 or 2 * bound >= P // 2:
        raise ValueError(f"the bound must lie in 1 .. {P // 4}, got {bound}")
    return (2 * bound).bit_length()


def _bits(values: np.ndarray, w: int) -> np.ndarray:
    return (values[:, None] >> np.arange(w, dtype=np.int64)) & 1


def encode(x, bound: int) -> np.ndarray:
    """The field encoding (2·n·w,) of integers ``x`` (n,), each in [−B, B]; ValueError
    otherwise (an honest device never encodes an input out of range)."""
    x = np.asarray(x, dtype=np.int64)
    w = width(bound)
    if x.size and (int(x.max()) > bound or int(x.min()) < -bound):
        raise ValueError(f"an entry lies outside ±{bound}")
    return np.concatenate([_bits(x + bound, w).ravel(), _bits(bound - x, w).ravel()])


def _split(encoded: np.ndarray, n: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    encoded = np.asarray(encoded, dtype=np.int64)
    if encoded.shape != (2 * n * w,):
        raise ValueError(f"an encoding of {n} entries of {w} bits has {2 * n * w} elements, "
                         f"got {encoded.shape}")
    return encoded[: n * w].reshape(n, w), encoded[n * w:].reshape(n, w)


def _weights(w: int) -> np.ndarray:
    return np.left_shift(1, np.arange(w, dtype=np.int64))


def decode(encoded, n: int, bound: int, leader: bool = True) -> np.ndarray:
    """x (n,) as field elements from an encoding, or from one aggregator's additive share of
    it: Σ_j 2^j·b_ij − B (the constant −B on the ``leader``'s share only), linear in the
    encoding, so the shares' decodings add up to x mod p."""
    w = width(bound)
    b, _ = _split(encoded, n, w)
    y = np.mod(mul(b, _weights(w)[None, :]).sum(axis=1), P)
    return sub(y, to_field(np.full(n, bound))) if leader else y


def validity(encoded, n: int, bound: int, r: np.ndarray, s: np.ndarray) -> int:
    """C (module docstring) for the verifier's random r (2·n·w,) and s (n,): 0 for a valid
    encoding."""
    w = width(bound)
    b, c = _split(encoded, n, w)
    flat = np.mod(np.asarray(encoded, dtype=np.int64), P)
    quadratic = dot(r, mul(flat, sub(flat, 1)))
    weights = _weights(w)[None, :]
    sums = add(np.mod(mul(b, weights).sum(axis=1), P), np.mod(mul(c, weights).sum(axis=1), P))
    linear = dot(s, sub(sums, 2 * bound))
    return (quadratic + linear) % P
