"""The r = m ``complex`` kernel fused into one compiled loop: phases, sin and cos, grid, sums.

For a chunk of float32 records x_i ∈ R^d, Ω ∈ R^{d×m} (1/data units) and ξ ∈ R^m (radians),
it adds, for every entry j,

    re_j += Σ_i round(γ·cos t_ij),   im_j += Σ_i round(γ·sin t_ij),   t_ij ≈ Ωᵀx_i + ξ (float32),

with γ = :data:`fedsketch.common.features.GRID` ["complex"] = 1024 steps per unit. One pass per
record and entry, in registers, instead of nine numpy passes over a block of n × m phases
(matmul, + ξ, cos, sin, two products by γ, two ``rint``, two sums): in numpy the passes other
than cos and sin took 0.44 of the time (RESULTS.md §21).

**The arithmetic, exactly.** Every step is one IEEE-754 float32 operation, a fused
multiply-add fma(a, b, c) = a·b + c rounded once, so the compiled vector loop, its scalar
remainder and :meth:`FusedComplex.reference` give the same bits on any machine (LLVM's
``llvm.fma`` is the instruction where the CPU has one, a correctly rounded call where not), for
any chunking and thread count:

1. t = ((fma(x_{d−1}, Ω_{d−1,j}, … fma(x_1, Ω_1j, x_0·Ω_0j)…) + ξ_j) + ξ'_j, in this order, with
   Ω rounded to float32 and ξ = ξ_j + ξ'_j split into two float32 (ξ' the float64 remainder).
2. k = fma(t, 2/π, M) − M, M = 1.5·2^23 (t·2/π rounded half to even), and
   r = fma(−k, P₃, fma(−k, P₂, fma(−k, P₁, t))), P₁ + P₂ + P₃ = π/2 (Cody–Waite with Cephes'
   constants; the products k·P₁, k·P₂ are exact while |t| < 8192): r ∈ [−π/4, π/4].
3. sin r and cos r by Cephes' minimax polynomials (``sinf``, ``cosf``) on [−π/4, π/4] in Horner
   form with fma; the quadrant k mod 4 swaps and negates them.
4. round(γ·v) = fma(v, γ, M) − M (half to even), summed over records in float32: exact, since a
   run of at most :data:`FLUSH_ROWS` records has |Σ| ≤ 2^13·γ = 2^23 < 2^24; each run is then
   added to the float64 sums (exact integers below 2^53).

Step 2 holds for |t| < 8192 rad. A record whose bound Σ_k |x_k|·max_j |Ω_kj| + max_j |ξ_j|
reaches :data:`FAST_LIMIT` (or is not finite) takes the slow path: the same float32 t, then cos
and sin in float64 (libm) and round(γ·v) in float64. The choice depends on the record alone,
never on its chunk. A NaN or ±inf record gives NaN sums, which the caller refuses.

**Accuracy** (``benchmarks/bench_sketch.py``, RESULTS.md §21: 5,000 records N(0, 9) in d = 10,
m = 1000, the benchmark's Ω; 10^7 values of cos and sin): against γ·e^{it} in float64 from
float64 phases, |Δ| in grid steps has median 8.7·10⁻⁵, 99th percentile 9.28·10⁻⁴, maximum
6.66·10⁻³, and 1.48·10⁻⁴ of the rounded integers differ; numpy's float32 path it replaces:
8.8·10⁻⁵, 9.30·10⁻⁴, 6.66·10⁻³, 1.50·10⁻⁴. The float32 phase dominates (≈ |t|·6·10⁻⁸ rad); sin
and cos alone err by at most 1.4·2⁻²⁴ (tests/common/sketch/test_trig_kernel.py).

Compiled by numba (:mod:`fedsketch.common.sketch.trig_compiled`) on first use in a process and
cached on disk (numba's cache: next to that module, or in the user's cache folder where that is
not writable); numba is imported only then, so commands that never sketch at r = m do not load
it. The GIL is released, so the threads of :func:`fedsketch.common.sketch.sketching.feature_sum`
run it in parallel. No n × m block is stored: per record the loop touches Ω (4·d·m bytes), ξ, t
and two float32 sums (20·m bytes), 60 KB at d = 10, m = 1000, which stay in L2.
"""

from __future__ import annotations

import numpy as np

from .trig_constants import CONSTANTS, FAST_LIMIT, FLUSH_ROWS

#: The run length and the slow path's threshold (trig_constants), re-exported with the class.
__all__ = ["FAST_LIMIT", "FLUSH_ROWS", "FusedComplex"]

_F = np.float32


def _kernel():
    """The compiled kernel (:mod:`fedsketch.common.sketch.trig_compiled`), imported on first use
    so that numba is loaded only by processes that sketch at r = m."""
    from .trig_compiled import kernel

    return kernel


class FusedComplex:
    """Ω and ξ prepared for the kernel: Ω float32 (d, m), ξ as two float32 (ξ_hi + ξ_lo), and
    the per-coordinate phase bounds (max_j |Ω_kj|, then max_j |ξ_j|) in float64."""

    def __init__(self, omega: np.ndarray, xi: np.ndarray, grid: int) -> None:
        xi64 = np.asarray(xi, dtype=np.float64)
        self.omega = np.ascontiguousarray(omega, dtype=np.float32)
        self.xi = xi64.astype(np.float32)
        self.xlo = (xi64 - self.xi).astype(np.float32)
        self.bound = np.concatenate([np.abs(self.omega).max(axis=1).astype(np.float64),
                                     [float(np.abs(xi64).max(initial=0.0))]])
        self.grid = np.float32(grid)

    def add_rows(self, x: np.ndarray, re: np.ndarray, im: np.ndarray) -> None:
        """Add Σ_i round(γ·cos t_i) to ``re`` and Σ_i round(γ·sin t_i) to ``im`` (float64 (m,))
        over the float32 records ``x`` (n, d)."""
        if x.shape[0]:
            _kernel()(np.ascontiguousarray(x, dtype=np.float32), self.omega, self.xi, self.xlo,
                      self.bound, self.grid, re, im)

    def reference(self, x: np.ndarray, rounded: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Steps 1–4 in numpy, entry by entry: float32 (n, m) arrays of round(γ·cos t) and
        round(γ·sin t), the specification the compiled loop is tested against bit for bit (fast
        path only); γ·cos t and γ·sin t before rounding if not ``rounded`` (for accuracy
        measurements). The fused multiply-add is emulated in 80-bit long double (a·b is exact
        there; the sum rounds twice, which differs from one rounding about once in 2^40)."""
        c = {k: v for k, v in CONSTANTS.items() if isinstance(v, np.float32)}
        x = np.asarray(x, dtype=np.float32)
        t = x[:, :1] * self.omega[0]
        for k in range(1, x.shape[1]):
            t = _fma(x[:, k:k + 1], self.omega[k], t)
        t = (t + self.xi) + self.xlo
        kf = _fma(t, c["TWO_OVER_PI"], c["MAGIC"]) - c["MAGIC"]
        r = _fma(kf, -c["P3"], _fma(kf, -c["P2"], _fma(kf, -c["P1"], t)))
        z = r * r
        s = _fma(_fma(_fma(c["S3"], z, c["S2"]), z, c["S1"]) * z, r, r)
        co = _fma(_fma(_fma(c["C3"], z, c["C2"]), z, c["C1"]) * z, z, _fma(-c["HALF"], z, c["ONE"]))
        q = kf.astype(np.int32) & 3
        cs, sn = np.where(q & 1, s, co), np.where(q & 1, co, s)
        cs, sn = np.where((q + 1) & 2, -cs, cs), np.where(q & 2, -sn, sn)
        if not rounded:
            return cs * self.grid, sn * self.grid
        return (_fma(cs, self.grid, c["MAGIC"]) - c["MAGIC"],
                _fma(sn, self.grid, c["MAGIC"]) - c["MAGIC"])


def _fma(a, b, c) -> np.ndarray:
    """fma(a, b, c) of float32 operands in numpy: a·b + c in 80-bit long double (a·b exact),
    rounded to float32 (two roundings: one rounding's result except about once in 2^40)."""
    ld = np.longdouble
    return (np.asarray(a, dtype=ld) * np.asarray(b, dtype=ld) + np.asarray(c, dtype=ld)).astype(_F)
