"""The prime field F_p, p = 2^31 − 1 (a Mersenne prime), vectorised over int64 numpy arrays.

Elements are int64 in [0, p). A product of two elements is below 2^62, so it fits int64 before
its reduction; sums of two elements are below 2^32. Signed integers x with |x| < p/2 map to
x mod p and back (:func:`to_field`, :func:`from_field`). Inverses are a^(p−2) by square and
multiply (Fermat), vectorised. The sum of a study's inputs must stay below p/2 in magnitude to
be read back (docs/bounded-influence.md: about 10⁶ records at γ = 1,024).
"""

from __future__ import annotations

import numpy as np

#: The field's modulus.
P = 2**31 - 1


def to_field(x) -> np.ndarray:
    """Signed integers (|x| < p/2) as field elements (int64 in [0, p)); ValueError beyond."""
    x = np.asarray(x, dtype=np.int64)
    if x.size and (int(x.max()) >= P // 2 or int(x.min()) <= -(P // 2)):
        raise ValueError(f"integers must lie within ±{P // 2} to be read back from F_p")
    return np.mod(x, P)


def from_field(a) -> np.ndarray:
    """Field elements as the signed integers in (−p/2, p/2) they stand for."""
    a = np.asarray(a, dtype=np.int64)
    return np.where(a > P // 2, a - P, a)


def add(a, b) -> np.ndarray:
    return np.mod(np.asarray(a, dtype=np.int64) + np.asarray(b, dtype=np.int64), P)


def sub(a, b) -> np.ndarray:
    return np.mod(np.asarray(a, dtype=np.int64) - np.asarray(b, dtype=np.int64), P)


def mul(a, b) -> np.ndarray:
    """a·b mod p, exact: both below 2^31, their product below 2^62."""
    return np.mod(np.asarray(a, dtype=np.int64) * np.asarray(b, dtype=np.int64), P)


def dot(a, b) -> int:
    """Σ a_i·b_i mod p: each product reduced below 2^31, so up to 2^32 terms sum in int64."""
    return int(mul(a, b).sum() % P) if np.size(a) else 0


def power(a, e: int) -> np.ndarray:
    """a^e mod p by square and multiply (e ≥ 0)."""
    result = np.ones_like(np.asarray(a, dtype=np.int64))
    base = np.mod(np.asarray(a, dtype=np.int64), P)
    while e:
        if e & 1:
            result = mul(result, base)
        base, e = mul(base, base), e >> 1
    return result


def inv(a) -> np.ndarray:
    """a^(−1) mod p; ZeroDivisionError for a zero element."""
    a = np.mod(np.asarray(a, dtype=np.int64), P)
    if (a == 0).any():
        raise ZeroDivisionError("zero has no inverse in F_p")
    return power(a, P - 2)


def random_elements(size: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """``size`` uniform field elements (from OS random bits unless ``rng`` is given)."""
    rng = rng or np.random.default_rng()
    return rng.integers(0, P, size, dtype=np.int64)


def share(x, rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Two additive shares of the field vector ``x``: uniform, and x minus it."""
    first = random_elements(np.size(x), rng).reshape(np.shape(x))
    return first, sub(x, first)


#: Rows of b summed in one float64 product: 2^11 · 2^31 · 2^11 < 2^53, so every partial sum is exact.
_BLOCK = 2**11


def matmul(a, b) -> np.ndarray:
    """a @ b mod p, exact, on float64 BLAS: b is cut in three 11-bit limbs (b = Σ_l 2^(11l)·b_l),
    so each product a·b_l sums at most 2^11 terms below 2^31 · 2^11, under 2^53 (float64's exact
    integers); the limbs' products are reduced and recombined in int64."""
    a = np.mod(np.asarray(a, dtype=np.int64), P)
    b = np.mod(np.asarray(b, dtype=np.int64), P)
    out = np.zeros((a.shape[0], b.shape[1]), dtype=np.int64)
    for start in range(0, a.shape[1], _BLOCK):
        block_a = a[:, start: start + _BLOCK].astype(np.float64)
        block_b = b[start: start + _BLOCK]
        for shift in (0, 11, 22):
            limb = ((block_b >> shift) & (2**11 - 1)).astype(np.float64)
            part = np.mod((block_a @ limb).astype(np.int64), P)
            out = np.mod(out + mul(part, 1 << shift), P)
    return out


def product(a) -> int:
    """Π a_i mod p, by pairwise halving (log2 n vector steps)."""
    a = np.mod(np.asarray(a, dtype=np.int64).ravel(), P)
    if a.size == 0:
        return 1
    while a.size > 1:
        if a.size % 2:
            a = np.append(a, 1)
        a = mul(a[0::2], a[1::2])
    return int(a[0])
