"""Shamir t-of-n secret sharing over the prime field GF(p), p = 2^521 − 1 (a Mersenne prime).

A secret of at most 65 bytes is read as a big-endian integer s < 2^520 < p. ``split`` draws a
polynomial f(X) = s + a_1 X + … + a_{t−1} X^{t−1} with a_i uniform in GF(p) (from ``secrets``)
and hands the share (x, f(x)) to the holder with public coordinate x ∈ {1, …, p−1}. Any t shares
determine f, hence s = f(0), by Lagrange interpolation at 0:

    s = Σ_i y_i · Π_{j≠i} x_j / (x_j − x_i)   (mod p).

Any t−1 shares are jointly uniform over GF(p)^{t−1} whatever s is (for every candidate s there
is exactly one polynomial of degree < t through them and (0, s)): they carry no information.

A share travels as ``SHARE_BYTES`` bytes: x then y, each as a 66-byte big-endian integer.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from functools import lru_cache

PRIME = 2**521 - 1
MAX_SECRET_BYTES = 65  # 8 · 65 = 520 bits < 521: every such secret is a field element
FIELD_BYTES = 66  # ⌈521 / 8⌉
SHARE_BYTES = 2 * FIELD_BYTES


def _check_x(x: int) -> None:
    if not isinstance(x, int) or not 1 <= x < PRIME:
        raise ValueError(f"share coordinates must be integers in 1..p−1, got {x!r}")


def _eval(coeffs: Sequence[int], x: int) -> int:
    """f(x) mod p by Horner's rule, coefficients by increasing degree."""
    acc = 0
    for c in reversed(coeffs):
        acc = (acc * x + c) % PRIME
    return acc


@lru_cache(maxsize=256)
def _lagrange_at_zero(xs: tuple[int, ...]) -> tuple[int, ...]:
    """λ_i = Π_{j≠i} x_j / (x_j − x_i) mod p, so that f(0) = Σ_i λ_i f(x_i) (cached: a coordinator
    interpolates many secrets from the same holders)."""
    weights = []
    for xi in xs:
        num, den = 1, 1
        for xj in xs:
            if xj != xi:
                num = num * xj % PRIME
                den = den * (xj - xi) % PRIME
        weights.append(num * pow(den, -1, PRIME) % PRIME)
    return tuple(weights)


def split(secret: bytes, t: int, xs: Sequence[int]) -> dict[int, int]:
    """Shares {x: f(x)} of ``secret`` for each holder coordinate in ``xs``; any t of them recover it.

    Refuses (ValueError) a secret over 65 bytes, t < 1, t > len(xs), and coordinates that are
    repeated or outside 1..p−1.
    """
    if len(secret) > MAX_SECRET_BYTES:
        raise ValueError(f"a secret holds at most {MAX_SECRET_BYTES} bytes, got {len(secret)}")
    for x in xs:
        _check_x(x)
    if len(set(xs)) != len(xs):
        raise ValueError("share coordinates must be distinct")
    if not 1 <= t <= len(xs):
        raise ValueError(f"need 1 <= t <= number of holders ({len(xs)}), got t = {t}")
    coeffs = [int.from_bytes(secret, "big")] + [secrets.randbelow(PRIME) for _ in range(t - 1)]
    return {x: _eval(coeffs, x) for x in xs}


def combine(shares: Mapping[int, int], length: int, *, t: int | None = None) -> bytes:
    """The ``length``-byte secret interpolated at 0 from ``shares`` ({x: y}).

    All given shares are used (more than t consistent shares give the same f). Raises ValueError
    on no shares, fewer than ``t`` when t is given, a coordinate outside 1..p−1 (so no two
    coordinates coincide mod p), a value outside 0..p−1, or an interpolated value that does not
    fit in ``length`` bytes — what too few shares, or a share replaced by a random value, give
    almost surely when ``length`` is well below 65 (the wrong value is then uniform over GF(p)).
    """
    if not shares or (t is not None and len(shares) < t):
        raise ValueError(f"too few shares to reconstruct: {len(shares)} (threshold {t})")
    for x, y in shares.items():
        _check_x(x)
        if not 0 <= y < PRIME:
            raise ValueError("share values must lie in 0..p−1")
    xs = tuple(sorted(shares))
    secret = sum(w * shares[x] for w, x in zip(_lagrange_at_zero(xs), xs, strict=True)) % PRIME
    if secret >= 256**length:
        raise ValueError(f"the shares do not interpolate to a {length}-byte secret (too few or inconsistent)")
    return secret.to_bytes(length, "big")


def encode_share(x: int, y: int) -> bytes:
    """The ``SHARE_BYTES`` wire form of the share (x, y)."""
    _check_x(x)
    if not 0 <= y < PRIME:
        raise ValueError("share values must lie in 0..p−1")
    return x.to_bytes(FIELD_BYTES, "big") + y.to_bytes(FIELD_BYTES, "big")


def decode_share(data: bytes) -> tuple[int, int]:
    """Inverse of :func:`encode_share`; ValueError on a wrong length or out-of-range field."""
    if len(data) != SHARE_BYTES:
        raise ValueError(f"a share is {SHARE_BYTES} bytes, got {len(data)}")
    x = int.from_bytes(data[:FIELD_BYTES], "big")
    y = int.from_bytes(data[FIELD_BYTES:], "big")
    _check_x(x)
    if not y < PRIME:
        raise ValueError("share values must lie in 0..p−1")
    return x, y
