"""The range proof's validity circuit: every entry of an integer vector lies in [−B, B], and
optionally its L1 norm is at most B₁.

Encoding (as Prio3's SumVec, with a two-sided bound). Every element of the encoding is a bit.
Entry x_i is sent as the w bits of y_i = x_i + B and the w bits of z_i = B − x_i,
w = (2B).bit_length(). With an L1 bound, also the w_a = B.bit_length() bits of a_i = |x_i|, and
a few bits that prove S = Σ a_i ≤ B₁ without a sum that wraps mod p (S can exceed p): S is split
at bit h into S_lo = Σ a_i mod-free low parts (a_i's bits below h) and S_hi (the bits from h up),
and the prover sends s0 = S_lo mod 2^h, c = ⌊S_lo / 2^h⌋, the borrow b and t0, t1 with
B₁ − S = t1·2^h + t0 (below).

The circuit, for the joint randomness (one random element per constraint), is

    C = Σ_k r_k·β_k·(β_k − 1)                       every element a bit
      + Σ_i s_i·(Y_i + Z_i − 2B)                     y_i + z_i = 2B
      + Σ_i u_i·(A_i − X_i)·(A_i + X_i)              a_i = ±x_i, X_i = Y_i − B   (L1 only)
      + v1·(Σ_i A_i^lo − c·2^h − s0)                 S_lo = c·2^h + s0           (L1 only)
      + v2·(t0 + s0 − b·2^h − B₁^lo)                 low limbs, borrow b         (L1 only)
      + v3·(t1 + S_hi + c + b − B₁^hi)               high limbs                  (L1 only)

where capitals are the integers the bits stand for and B₁ = B₁^hi·2^h + B₁^lo. It is zero for
every valid encoding. Each constraint holds as an integer equation, not only mod p, because both
sides stay below p in magnitude (checked by :class:`RangeCircuit`): then y_i, z_i ≥ 0 give
−B ≤ x_i ≤ B; a_i ≥ 0 and a_i = ±x_i give a_i = |x_i|; and S = (S_hi + c)·2^h + s0
= B₁ − t1·2^h − t0 ≤ B₁. For an invalid encoding some constraint is nonzero, and C, linear in
the random coefficients, vanishes with probability 1/p over them (Schwartz–Zippel).

The quadratic terms are pairs (left, right) with product left·right, fed to the fully linear
proof's gadget (:mod:`.flp`): (r_k·β_k, β_k − 1) and (u_i·(A_i − X_i), A_i + X_i). On an additive
share of the encoding the pairs and the linear part are affine: constants enter as c/num_shares
on every share, so the shares' values add up to the plain ones (Prio3's convention).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .field import P, add, dot, inv, mul, sub, to_field


def width(bound: int) -> int:
    """w: bits of y, z ∈ [0, 2B]; ValueError unless 1 ≤ B ≤ p/4 (then y + z < 2B + p)."""
    if bound < 1 or 2 * bound >= P // 2:
        raise ValueError(f"the bound must lie in 1 .. {P // 4}, got {bound}")
    return (2 * bound).bit_length()


def _bits(values, w: int) -> np.ndarray:
    return (np.asarray(values, dtype=np.int64)[..., None] >> np.arange(w, dtype=np.int64)) & 1


def _weights(w: int, start: int = 0) -> np.ndarray:
    return np.left_shift(1, np.arange(start, start + w, dtype=np.int64))


def _value(bits: np.ndarray, start: int = 0) -> np.ndarray:
    """Σ_j 2^(j−start)·bits[..., j] mod p over the last axis, from ``start`` on."""
    part = bits[..., start:]
    return np.mod(mul(part, _weights(part.shape[-1])).sum(axis=-1), P)


@dataclass(frozen=True)
class RangeCircuit:
    """Validity of n integers in [−B, B] (and Σ|x_i| ≤ B₁ when ``l1_bound`` is given)."""

    n: int
    bound: int
    l1_bound: int | None = None
    #: name → (offset, count, bits per value) of each part of the encoding
    layout: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"the circuit needs at least one entry, got {self.n}")
        w = width(self.bound)
        parts = [("y", self.n, w), ("z", self.n, w)]
        if self.l1_bound is not None:
            parts += self._l1_parts()
        layout, offset = {}, 0
        for name, count, bits in parts:
            layout[name] = (offset, count, bits)
            offset += count * bits
        object.__setattr__(self, "layout", layout)

    def _l1_parts(self) -> list[tuple[str, int, int]]:
        n, bound, l1 = self.n, self.bound, self.l1_bound
        if l1 < 0:
            raise ValueError(f"the L1 bound must be ≥ 0, got {l1}")
        wa = bound.bit_length()
        h = min(wa, ((P - 1) // (3 * n + 1)).bit_length() - 1)
        high = l1 >> h
        wt1 = max(1, high.bit_length())
        # S_hi + c + b + t1 and B₁^hi must stay below p (the S_lo side is below p by h's choice)
        if h < 1 or n * (1 << (wa - h)) + 2 * n + (1 << wt1) + 2 >= P:
            raise ValueError(f"an L1 bound of {l1} over {n} entries within ±{bound} does not fit "
                             f"the field (p = 2^31 − 1)")
        return [("a", n, wa), ("s0", 1, h), ("c", 1, max(1, n.bit_length())), ("t0", 1, h),
                ("b", 1, 1), ("t1", 1, wt1)]

    @property
    def length(self) -> int:
        """Elements of the encoding (all bits)."""
        offset, count, bits = list(self.layout.values())[-1]
        return offset + count * bits

    @property
    def num_pairs(self) -> int:
        """Quadratic terms: one per bit, and one per entry with an L1 bound."""
        return self.length + (self.n if self.l1_bound is not None else 0)

    @property
    def joint_rand_len(self) -> int:
        """Random coefficients: r (one per bit), s (n), and u (n), v (3) with an L1 bound."""
        return self.length + self.n + (self.n + 3 if self.l1_bound is not None else 0)

    def _part(self, encoded: np.ndarray, name: str) -> np.ndarray:
        offset, count, bits = self.layout[name]
        return encoded[offset: offset + count * bits].reshape(count, bits)

    def encode(self, x) -> np.ndarray:
        """The field encoding (``length``,) of integers ``x`` (n,); ValueError for an input out
        of range (an honest device never encodes one)."""
        x = np.asarray(x, dtype=np.int64)
        if x.shape != (self.n,):
            raise ValueError(f"the input has {self.n} entries, got shape {x.shape}")
        if int(x.max()) > self.bound or int(x.min()) < -self.bound:
            raise ValueError(f"an entry lies outside ±{self.bound}")
        w = self.layout["y"][2]
        pieces = [_bits(x + self.bound, w).ravel(), _bits(self.bound - x, w).ravel()]
        if self.l1_bound is not None:
            pieces += self._l1_encoding(np.abs(x))
        return np.concatenate(pieces)

    def _l1_encoding(self, a: np.ndarray) -> list[np.ndarray]:
        total = int(a.sum())
        if total > self.l1_bound:
            raise ValueError(f"the L1 norm {total} exceeds {self.l1_bound}")
        h = self.layout["s0"][2]
        low = int((a & ((1 << h) - 1)).sum())
        s0, c = low & ((1 << h) - 1), low >> h
        b = int(s0 > (self.l1_bound & ((1 << h) - 1)))
        t0 = (self.l1_bound & ((1 << h) - 1)) + (b << h) - s0
        t1 = (self.l1_bound >> h) - int((a >> h).sum()) - c - b
        return [_bits(a, self.layout["a"][2]).ravel()] + [
            _bits([value], self.layout[name][2]).ravel()
            for name, value in (("s0", s0), ("c", c), ("t0", t0), ("b", b), ("t1", t1))]

    def decode(self, share, num_shares: int = 1, count: int = 1) -> np.ndarray:
        """x (n,) as field elements from an encoding, or from one of ``num_shares`` additive
        shares of the sum of ``count`` encodings: Σ_j 2^j·b_ij − count·B/num_shares, linear, so
        the shares' decodings add up to Σ x mod p."""
        y = _value(self._part(np.asarray(share, dtype=np.int64), "y"))
        return sub(y, mul(to_field(count * self.bound), inv(num_shares)))

    def pairs(self, share, joint_rand, num_shares: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(left, right), each (``num_pairs``,): the gadget's inputs on a share."""
        share = np.asarray(share, dtype=np.int64)
        one = int(inv(num_shares))
        left, right = [mul(joint_rand[: self.length], share)], [sub(share, one)]
        if self.l1_bound is not None:
            u = joint_rand[self.length + self.n: self.length + 2 * self.n]
            x = sub(_value(self._part(share, "y")), mul(self.bound, one))
            a = _value(self._part(share, "a"))
            left.append(mul(u, sub(a, x)))
            right.append(add(a, x))
        return np.concatenate(left), np.concatenate(right)

    def linear(self, share, joint_rand, num_shares: int = 1) -> int:
        """The circuit's linear part on a share (constants divided by ``num_shares``)."""
        share = np.asarray(share, dtype=np.int64)
        one = int(inv(num_shares))
        s = joint_rand[self.length: self.length + self.n]
        sums = add(_value(self._part(share, "y")), _value(self._part(share, "z")))
        total = dot(s, sub(sums, mul(2 * self.bound, one)))
        if self.l1_bound is None:
            return total
        h = self.layout["s0"][2]
        v1, v2, v3 = (int(v) for v in joint_rand[-3:])
        a = self._part(share, "a")
        s0, c, t0, b, t1 = (int(_value(self._part(share, name))[0])
                            for name in ("s0", "c", "t0", "b", "t1"))
        low = int(_value(a[:, :h]).sum() % P)
        high = int(_value(a, h).sum() % P)
        l1_low, l1_high = self.l1_bound & ((1 << h) - 1), self.l1_bound >> h
        checks = ((v1, low - c * (1 << h) - s0),
                  (v2, t0 + s0 - b * (1 << h) - int(mul(l1_low, one))),
                  (v3, t1 + high + c + b - int(mul(l1_high, one))))
        return (total + sum(int(mul(v, e % P)) for v, e in checks)) % P

    def evaluate(self, encoded, joint_rand) -> int:
        """C (module docstring) on a plain encoding: 0 for a valid one."""
        left, right = self.pairs(encoded, joint_rand)
        return (dot(left, right) + self.linear(encoded, joint_rand)) % P
