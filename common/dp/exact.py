"""Exact integer noise samplers whose only randomness is the OS CSPRNG.

Every sample is a deterministic function of the words of :func:`random_words` (``os.urandom``),
and, if those bits are ideal, its law is the stated law exactly: no floating-point value decides
a sample, except the discrete Gaussian's prefilter, whose error is bounded with a margin (below).
Parameters are exact rationals (``Fraction``; a float enters as its exact dyadic value).

**Lazy uniforms.** A uniform U ∈ [0, 1) is an infinite bit string read on demand. A target
F (a probability, or the values F_0 ≤ F_1 ≤ … of a CDF) is known through integer enclosures
lo ≤ F·2^P ≤ hi at any precision P. With v the first P bits of U, U ∈ [v, v+1)/2^P, so hi ≤ v
proves F ≤ U and lo > v proves U < F; Bernoulli(p) is [U < p] and inversion returns
#{j : F_j ≤ U}. The first comparison reads FAST_BITS bits and is vectorized over all draws; a
draw left open (probability about 2^−FAST_BITS per target) reads 64 more bits and compares
against enclosures at precision P + 64, and so on (``_settle``, pure Python, rare). Enclosures
of e^{−t}, t rational, come from integer/Fraction arithmetic only (``_exp_neg``), cached.

**Samplers** (cost in FAST_BITS-bit chunks of random words, default 32 bits):

* ``geometric``: G = Σ_{i<K} 2^i B_i + 2^K Q, all parts independent, B_i ~ Bernoulli(b_i/(1+b_i)),
  b_i = a^{2^i}, Q geometric of ratio a^{2^K} (repeated Bernoullis), K the least with lam·2^K ≥ 16.
  Exact because (1 − a)·a^g factors over the binary digits of g. Cost ≈ K + 1 chunks.
* ``discrete_laplace``: sign·G with a fair sign bit, redrawing (−, 0): P(k) ∝ a^|k|. ≈ K + 1
  chunks / acceptance (1 + a)/2.
* ``discrete_gaussian``: Canonne–Kamath–Steinke 2020, Algorithm 3: t = ⌊σ⌋ + 1, Y ~ DLap(1/t),
  kept with probability e^{−E}, E = (|Y| − σ²/t)²/(2σ²). The comparison of U with e^{−E} uses
  53 bits of U and E, e^{−E} in float64 (``exactmath.exp``, error below 2 ulp): the computed E
  is within 2^−49·(E + 1) of E (|Y| < 2^53, relative errors of order 2^−53 on σ²/t, the
  subtraction, square and division; σ²/t < σ bounds the cancellation), so for E ≤ 700 the float
  e^{−E} is within relative 2^−38 of the true one (E > 700 is clipped to 700, which only
  overstates it, and then nothing is accepted by the float test). Draws whose 53-bit prefix is
  within relative FLOAT_MARGIN = 2^−30 of it, ≫ 2^−38, are settled exactly by ``_settle``
  against ``_exp_neg(E)``. Requires 2^−400 ≤ σ² ≤ 2^100.
* ``negative_binomial`` (ρ ≠ 1; ρ = 1 is the geometric): NB(ρ, a) is compound Poisson,
  Σ_k k·N_k with N_k ~ Poisson(ρ a^k/k). We draw M ~ Poisson(ρS) proposals k with
  P(k) ∝ a^k 2^{−j}, j = ⌊log2 k⌋, S = Σ_k a^k 2^{−j}, and keep each with probability 2^j/k:
  by Poisson marking the kept k form exactly the N_k. A proposal picks its dyadic block j with
  probability ∝ w_j = 2^{−j} b_j (1 − b_j) (inversion; S' = Σ w_j = (1 − a)·S is enclosed by
  its partial sums plus the tail bound 2^{−J} b_{J+1}), then k = 2^j + T with T's j binary digits
  the B_i above (P(T) ∝ a^T on [0, 2^j)), and is kept by a (j+1)-bit integer R: R < 2^j keeps,
  R < k drops, else R is redrawn. M is drawn by inversion of the Poisson CDF enclosed through
  μ = ρS's enclosure. Cost per draw ≈ 1 + ρS·(j̄ + 3) chunks, S ≈ log2(1/lam) + 2 for small lam.
* ``dlap_share``: NB(1/h) − NB(1/h); h shares sum to NB(1) − NB(1) = G − G = DLap.

**Timing.** The work is vectorized over a whole release, but the number of rejection rounds,
tail rounds and exact settlements depends on the values drawn, so the running time carries a
little information about the noise. A device's release time is seen by others only through when
its message arrives, which sketching the data dominates by orders of magnitude.
"""

from __future__ import annotations

import math
import os
from bisect import bisect_right
from collections.abc import Callable, Sequence
from fractions import Fraction
from functools import lru_cache, partial

import numpy as np

from ..exactmath import exp as float_exp

#: Bits of U read by the vectorized first comparison (divides 64, at most 32); tests shrink it
#: to send most draws through the exact slow path.
FAST_BITS = 32
#: Relative margin of the discrete Gaussian's float prefilter (its error is below 2^−38).
FLOAT_MARGIN = 2.0**-30

#: Enclosures (lo_j), (hi_j) of F_0 ≤ F_1 ≤ … at a precision, both non-decreasing.
Bounds = tuple[tuple[int, ...], tuple[int, ...]]
#: cdf(prec, last) → Bounds of F_0..F_J, J ≥ last (J may exceed last when prec demands it).
Cdf = Callable[[int, int], Bounds]
#: (A_lo, A_hi, S'_lo, S'_hi, scale): see ``_block_sums``.
Sums = tuple[tuple[int, ...], tuple[int, ...], int, int, int]


def random_words(count: int) -> np.ndarray:
    """``count`` uniform uint64 words from ``os.urandom``: the samplers' only source of randomness."""
    return np.frombuffer(os.urandom(8 * count), dtype=np.uint64)


def _chunks(n: int) -> np.ndarray:
    """``n`` independent uniform FAST_BITS-bit integers (int64), cut from random words."""
    per = 64 // FAST_BITS
    words = random_words(-(-n // per))
    shifts = np.arange(per, dtype=np.uint64) * np.uint64(FAST_BITS)
    return ((words[:, None] >> shifts) & np.uint64((1 << FAST_BITS) - 1)).ravel()[:n].astype(np.int64)


def _bits(n: int) -> np.ndarray:
    """``n`` independent fair bits (bool), 64 per random word."""
    return np.unpackbits(random_words(-(-n // 64)).view(np.uint8))[:n].astype(bool)


def _settle(v: int, bits: int, cdf: Cdf, last: int, bounded: bool) -> int:
    """#{j : F_j ≤ U} for one U whose first ``bits`` bits are ``v``, reading 64 more at a time.

    hi_j ≤ v proves F_j ≤ U, lo_j > v proves U < F_j. While the two counts differ, U is read
    further; if U is above every listed F_j of an unbounded law, a longer list is asked for.
    """
    while True:
        lo, hi = cdf(bits, last)
        below = bisect_right(hi, v)
        if below == bisect_right(lo, v) and (bounded or below < len(lo)):
            return below
        if below == len(lo):
            last = len(lo) + 3
        else:
            v, bits = (v << 64) | int(random_words(1)[0]), bits + 64


def _invert(n: int, cdf: Cdf, last: int, bounded: bool) -> np.ndarray:
    """``n`` independent draws of #{j : F_j ≤ U}, i.e. j with probability F_j − F_{j−1}.

    ``bounded``: the listed F_j are all there is (index len(list) means U ≥ F_J); otherwise the
    law goes on and such draws are settled against longer lists.
    """
    v = _chunks(n)
    lo, hi = cdf(FAST_BITS, last)
    out = np.searchsorted(np.array(hi), v, side="right")
    open_ = out != np.searchsorted(np.array(lo), v, side="right")
    if not bounded:
        open_ |= out == len(lo)
    for e in np.flatnonzero(open_):
        out[e] = _settle(int(v[e]), FAST_BITS, cdf, last, bounded)
    return out


def _bernoullis(cdfs: Sequence[Cdf], n: int) -> np.ndarray:
    """A (len(cdfs), n) bool array: row r holds n independent [U < p_r], p_r one-entry cdfs."""
    v = _chunks(len(cdfs) * n).reshape(len(cdfs), n)
    lo = np.array([c(FAST_BITS, 0)[0][0] for c in cdfs], dtype=np.int64).reshape(-1, 1)
    hi = np.array([c(FAST_BITS, 0)[1][0] for c in cdfs], dtype=np.int64).reshape(-1, 1)
    out = v < lo
    for r, e in zip(*np.nonzero((v >= lo) & (v < hi)), strict=True):
        out[r, e] = _settle(int(v[r, e]), FAST_BITS, cdfs[r], 0, True) == 0
    return out


@lru_cache(maxsize=4096)
def _exp_neg(t: Fraction, prec: int) -> tuple[int, int]:
    """Integers lo ≤ e^{−t}·2^prec ≤ hi for rational t ≥ 0, a few units apart.

    x = t/2^s ≤ 1/2: the Taylor terms x^n/n! decrease, so the partial sums alternate around e^{−x}
    (S_odd ≤ e^{−x} ≤ S_even); they are rounded outward at q = prec + s + 8 bits and squared
    s times, rounding lo down and hi up. Each squaring at most doubles the width and adds one
    unit, so the final width is under 2^{s+3} units at q bits, i.e. a few units at prec.
    """
    if t == 0:
        return 1 << prec, 1 << prec
    s = math.ceil(2 * t).bit_length()
    x, q = t / (1 << s), prec + s + 8
    term, total, n = Fraction(1), Fraction(1), 0
    while n % 2 == 0 or term * (1 << q) >= 1:
        n += 1
        term *= x / n
        total += -term if n % 2 else term
    lo, hi = math.floor(total * (1 << q)), math.ceil((total + term) * (1 << q))
    for _ in range(s):
        lo, hi = (lo * lo) >> q, -((-hi * hi) >> q)
    return lo >> (q - prec), min(-((-hi) >> (q - prec)), 1 << prec)


@lru_cache(maxsize=4096)
def _cdf_exp(t: Fraction, prec: int, last: int) -> Bounds:
    """The one-entry CDF of Bernoulli(e^{−t})."""
    lo, hi = _exp_neg(t, prec)
    return (lo,), (hi,)


@lru_cache(maxsize=4096)
def _cdf_digit(lam: Fraction, i: int, prec: int, last: int) -> Bounds:
    """The one-entry CDF of Bernoulli(b/(1 + b)), b = e^{−lam·2^i} (increasing in b)."""
    lo, hi = _exp_neg(lam * (1 << i), prec + 2)
    one = 1 << (prec + 2)
    return ((lo << prec) // (one + lo),), (-((-hi << prec) // (one + hi)),)


def _geometric(lam: Fraction, n: int) -> np.ndarray:
    """``n`` draws of G, P(G = g) = (1 − a)·a^g, a = e^{−lam}, by independent binary digits."""
    k = 0
    while lam * (1 << k) < 16:
        k += 1
    digits = _bernoullis([partial(_cdf_digit, lam, i) for i in range(k)], n).astype(np.int64)
    out = (digits << np.arange(k, dtype=np.int64)[:, None]).sum(axis=0, dtype=np.int64)
    tail, rounds = np.arange(n), 0
    while tail.size:
        rounds += 1
        if (rounds + 1) << k > 1 << 62:
            raise OverflowError("a geometric draw left the int64 range")
        tail = tail[_bernoullis([partial(_cdf_exp, lam * (1 << k))], tail.size)[0]]
        out[tail] += 1 << k
    return out


def _log2_inv_w0(lam: Fraction) -> int:
    """An integer ≥ log2(1/(a(1 − a))): log2(1/a) ≤ 2·lam and 1/(1 − a) ≤ (1 + lam)/lam."""
    return math.ceil(2 * lam) + math.ceil((1 + lam) / lam).bit_length()


def _block_last(lam: Fraction, prec: int) -> int:
    """The least J ≥ 0 with lam·2^{J+1} ≥ prec + 16, so that b_{J+1} < 2^{−prec−16}."""
    j = 0
    while lam * (2 << j) < prec + 16:
        j += 1
    return j


@lru_cache(maxsize=256)
def _block_sums(lam: Fraction, prec: int, last: int) -> Sums:
    """Enclosures of A_j = Σ_{i≤j} w_i (j ≤ J) and of S' = Σ_i w_i, w_i = 2^{−i} b_i (1 − b_i),
    as integers at scale 2^scale: (A_lo, A_hi, S'_lo, S'_hi, scale), relative width ≲ 2^−prec.

    b(1 − b) over b ∈ [bl, bh] lies in [bl(1 − bh), bh(1 − bl)]; the tail past J is at most
    2^{−J} b_{J+1}. The working precision covers S' ≥ w_0 = a(1 − a).
    """
    last = max(last, _block_last(lam, prec))
    q = prec + 8 + (last + 1).bit_length() + _log2_inv_w0(lam)
    alo, ahi, lo_sum, hi_sum = [], [], 0, 0
    for i in range(last + 1):
        bl, bh = _exp_neg(lam * (1 << i), q)
        lo_sum += (bl * ((1 << q) - bh)) << (last - i)
        hi_sum += (bh * ((1 << q) - bl)) << (last - i)
        alo.append(lo_sum)
        ahi.append(hi_sum)
    tail = _exp_neg(lam * (2 << last), q)[1] << q
    return tuple(alo), tuple(ahi), lo_sum, hi_sum + tail, 2 * q + last


@lru_cache(maxsize=256)
def _cdf_block(lam: Fraction, prec: int, last: int) -> Bounds:
    """F_j = A_j / S': the CDF of a proposal's block j (k ∈ [2^j, 2^{j+1}), weight w_j)."""
    alo, ahi, slo, shi, _ = _block_sums(lam, prec, last)
    return (tuple((a << prec) // shi for a in alo),
            tuple(min(-((-a << prec) // slo), 1 << prec) for a in ahi))


@lru_cache(maxsize=256)
def _mu(rho: Fraction, lam: Fraction, prec: int) -> tuple[Fraction, Fraction]:
    """An enclosure of μ = ρ·S' / (1 − a), the mean number of proposals, on the grid 2^{−prec−24}."""
    _, _, slo, shi, scale = _block_sums(lam, prec + 8, 0)
    r = prec + 16 + _log2_inv_w0(lam)
    al, ah = _exp_neg(lam, r)
    lo = rho * Fraction(slo, 1 << scale) * Fraction(1 << r, (1 << r) - al)
    hi = rho * Fraction(shi, 1 << scale) * Fraction(1 << r, (1 << r) - ah)
    grid = 1 << (prec + 24)
    return Fraction(math.floor(lo * grid), grid), Fraction(math.ceil(hi * grid), grid)


@lru_cache(maxsize=256)
def _cdf_poisson(rho: Fraction, lam: Fraction, prec: int, last: int) -> Bounds:
    """F_n = e^{−μ} Σ_{m≤n} μ^m/m! for n ≤ last; F_n decreases in μ, so μ_hi gives lo, μ_lo hi."""
    mlo, mhi = _mu(rho, lam, prec)
    r = prec + 16
    elo, ehi = _exp_neg(mhi, r)[0], _exp_neg(mlo, r)[1]
    lo, hi, tlo, thi, slo, shi = [], [], Fraction(1), Fraction(1), Fraction(0), Fraction(0)
    for n in range(last + 1):
        if n:
            tlo, thi = tlo * mhi / n, thi * mlo / n
        slo, shi = slo + tlo, shi + thi
        lo.append(math.floor(elo * slo / (1 << (r - prec))))
        hi.append(min(math.ceil(ehi * shi / (1 << (r - prec))), 1 << prec))
    return tuple(lo), tuple(hi)


def _keep_ratio(k: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Bernoulli(2^j/k) per entry, 2^j ≤ k < 2^{j+1}: R uniform on j+1 bits keeps if R < 2^j,
    drops if 2^j ≤ R < k, and is redrawn if R ≥ k."""
    keep, todo = np.zeros(k.size, dtype=bool), np.arange(k.size)
    while todo.size:
        r = (random_words(todo.size) >> (63 - j[todo]).astype(np.uint64)).astype(np.int64)
        keep[todo[r < (1 << j[todo])]] = True
        todo = todo[r >= k[todo]]
    return keep


def _log_proposals(lam: Fraction, n: int) -> np.ndarray:
    """``n`` proposals k, P(k) ∝ a^k 2^{−⌊log2 k⌋}, each replaced by 0 unless kept (prob. 2^j/k)."""
    j = _invert(n, partial(_cdf_block, lam), 0, bounded=False)
    if j.max(initial=0) > 61:
        raise OverflowError("a negative-binomial draw left the int64 range")
    order = np.argsort(-j, kind="stable")  # the draws that need digit i come first
    k = np.left_shift(1, j)
    for i in range(int(j.max(initial=0))):
        sel = order[: np.count_nonzero(j > i)]
        k[sel] += _bernoullis([partial(_cdf_digit, lam, i)], sel.size)[0].astype(np.int64) << i
    return np.where(_keep_ratio(k, j), k, 0)


def _fill(n: int, propose: Callable[[int], tuple[np.ndarray, np.ndarray]], rate: float) -> np.ndarray:
    """The first ``n`` accepted values of i.i.d. proposals, ``propose(m)`` → (values, accepted),
    asked for about n/rate at a time. The accepted values are i.i.d. with the accepted law and
    independent of which proposals were accepted, so keeping the first n is exact; ``rate``
    only sizes the batches."""
    parts, have = [], 0
    while have < n:
        values, ok = propose(int((n - have) / rate) + 16)
        parts.append(values[ok])
        have += parts[-1].size
    return np.concatenate(parts)[:n] if parts else np.empty(0, dtype=np.int64)


def _positive(name: str, value: Fraction | int | float) -> Fraction:
    """``value`` as an exact Fraction, which must be finite and > 0 (else ValueError)."""
    try:
        q = Fraction(value)
    except (TypeError, ValueError, OverflowError) as err:
        raise ValueError(f"{name} must be a finite rational, got {value!r}") from err
    if q <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return q


def _check_size(size: int) -> None:
    if not isinstance(size, int | np.integer) or size < 0:
        raise ValueError(f"size must be an integer >= 0, got {size!r}")


def geometric(lam: Fraction, size: int) -> np.ndarray:
    """``size`` int64 draws of P(k) = (1 − a)·a^k, k ≥ 0, a = e^{−lam}, lam > 0."""
    lam = _positive("lam", lam)
    _check_size(size)
    return _geometric(lam, size)


def discrete_laplace(lam: Fraction, size: int) -> np.ndarray:
    """``size`` int64 draws of P(k) = (1 − a)/(1 + a)·a^|k|, k ∈ Z, a = e^{−lam}, lam > 0.

    ±G with a fair sign, (−, 0) redrawn: P(±k) ∝ (1 − a)a^k/2 for k ≥ 1 and P(0) ∝ (1 − a)/2,
    i.e. ∝ a^|k|.
    """
    lam = _positive("lam", lam)
    _check_size(size)

    def signed(m: int) -> tuple[np.ndarray, np.ndarray]:
        g, neg = _geometric(lam, m), _bits(m)
        return np.where(neg, -g, g), ~neg | (g > 0)

    return _fill(size, signed, 0.5 + 0.5 * math.exp(-float(lam)))


def _accept_gauss(absy: np.ndarray, mu: Fraction, s2: Fraction) -> np.ndarray:
    """Per entry, Bernoulli(e^{−E}), E = (|y| − mu)²/(2·s2): float prefilter, exact settle."""
    d = absy.astype(np.float64) - float(mu)
    p = float_exp(-np.minimum(d * d / (2.0 * float(s2)), 700.0))
    v = (random_words(absy.size) >> np.uint64(11)).astype(np.float64)  # U's first 53 bits
    big = absy >= 2**53
    out = (v + 1.0 <= p * (1.0 - FLOAT_MARGIN) * 2.0**53) & ~big
    for e in np.flatnonzero(~out & ((v < p * (1.0 + FLOAT_MARGIN) * 2.0**53) | big)):
        exponent = (int(absy[e]) - mu) ** 2 / (2 * s2)
        out[e] = _settle(int(v[e]), 53, partial(_cdf_exp, exponent), 0, True) == 0
    return out


def discrete_gaussian(sigma2: Fraction, size: int) -> np.ndarray:
    """``size`` int64 draws of P(k) ∝ e^{−k²/(2σ²)}, k ∈ Z (CKS 2020, Algorithm 3), 2^−400 ≤ σ² ≤ 2^100."""
    s2 = _positive("sigma2", sigma2)
    if not Fraction(1, 2**400) <= s2 <= 2**100:
        raise ValueError(f"sigma2 must lie in [2^-400, 2^100], got {sigma2!r}")
    _check_size(size)
    t = math.isqrt(math.floor(s2)) + 1  # ⌊σ⌋ + 1

    def proposals(m: int) -> tuple[np.ndarray, np.ndarray]:
        y = discrete_laplace(Fraction(1, t), m)
        return y, _accept_gauss(np.abs(y), s2 / t, s2)

    return _fill(size, proposals, 0.7)  # CKS acceptance: 0.46 at σ = 0.1, 0.76 for σ ≥ 20


def negative_binomial(rho: Fraction, lam: Fraction, size: int) -> np.ndarray:
    """``size`` int64 draws of P(k) = Γ(k+ρ)/(k!Γ(ρ))·(1 − a)^ρ a^k, a = e^{−lam}, ρ > 0.

    Compound Poisson by thinned dyadic-block proposals (module docstring); ρ = 1 is the geometric.
    """
    rho, lam = _positive("rho", rho), _positive("lam", lam)
    _check_size(size)
    if rho == 1:
        return _geometric(lam, size)
    last = 4 * math.ceil(_mu(rho, lam, FAST_BITS)[1]) + 24
    counts = _invert(size, partial(_cdf_poisson, rho, lam), last, bounded=False)
    out = np.zeros(size, dtype=np.int64)
    np.add.at(out, np.repeat(np.arange(size), counts), _log_proposals(lam, int(counts.sum())))
    return out


def dlap_share(lam: Fraction, h: int, size: int) -> np.ndarray:
    """One of h shares, NB(1/h, a) − NB(1/h, a), a = e^{−lam}: h independent shares sum to
    exactly one discrete_laplace(lam) draw (NB's shape adds up to 1, and NB(1) is geometric)."""
    if not isinstance(h, int | np.integer) or h < 1:
        raise ValueError(f"h must be an integer >= 1, got {h!r}")
    rho = Fraction(1, int(h))
    return negative_binomial(rho, lam, size) - negative_binomial(rho, lam, size)
