"""The r = m ``complex`` kernel fused into one compiled loop: phases, sin and cos, grid, sums.

For a chunk of float32 records x_i ∈ R^d, Ω ∈ R^{d×m} (1/data units) and ξ ∈ R^m (radians),
it adds, for every entry j,

    re_j += Σ_i round(γ·cos t_ij),   im_j += Σ_i round(γ·sin t_ij),   t_ij ≈ Ωᵀx_i + ξ (float32),

with γ = :data:`fedsketch.common.features.GRID` ["complex"] = 1024 steps per unit. One pass per
record and entry, in registers, instead of nine numpy passes over a block of n × m phases
(matmul, + ξ, cos, sin, two products by γ, two ``rint``, two sums): in numpy the passes other
than cos and sin took 0.44 of the time (RESULTS.md §19).

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

**Accuracy** (``benchmarks/bench_sketch.py``, RESULTS.md §19: 5,000 records N(0, 9) in d = 10,
m = 1000, the benchmark's Ω; 10^7 values of cos and sin): against γ·e^{it} in float64 from
float64 phases, |Δ| in grid steps has median 8.7·10⁻⁵, 99th percentile 9.28·10⁻⁴, maximum
6.66·10⁻³, and 1.48·10⁻⁴ of the rounded integers differ; numpy's float32 path it replaces:
8.8·10⁻⁵, 9.30·10⁻⁴, 6.66·10⁻³, 1.50·10⁻⁴. The float32 phase dominates (≈ |t|·6·10⁻⁸ rad); sin
and cos alone err by at most 1.4·2⁻²⁴ (tests/common/sketch/test_trig_kernel.py).

Compiled by numba on first use (≈ 3 s, then cached on disk next to this module when that is
writable), with the GIL released so that the threads of
:func:`fedsketch.common.sketch.sketching.feature_sum` run it in parallel. The phase of step 1
is generated as one unrolled expression for d ≤ :data:`UNROLL_D` (the loop over entries then
keeps t in registers), and as a loop over k with the same operations in the same order beyond.
"""

from __future__ import annotations

import math

import numpy as np

#: Rows summed in float32 before the sums move to float64: |Σ| ≤ 2^13·1024 = 2^23 < 2^24.
FLUSH_ROWS = 1 << 13
#: A record whose phase bound reaches this (radians) takes the float64 slow path (step 2 above).
FAST_LIMIT = 8192.0
#: Largest d whose phase is one unrolled expression.
UNROLL_D = 32

_F = np.float32
_CONST = {
    "TWO_OVER_PI": _F(2.0 / math.pi),
    "MAGIC": _F(12582912.0),  # 1.5·2^23: v + M − M rounds v half to even for |v| < 2^22
    "P1": _F(1.5703125), "P2": _F(4.837512969970703125e-4), "P3": _F(7.54978995489188216e-8),
    "S1": _F(-1.6666654611e-1), "S2": _F(8.3321608736e-3), "S3": _F(-1.9515295891e-4),
    "C1": _F(4.166664568298827e-2), "C2": _F(-1.388731625493765e-3),
    "C3": _F(2.443315711809948e-5), "HALF": _F(0.5), "ONE": _F(1.0), "FAST_LIMIT": FAST_LIMIT,
    "FLUSH_ROWS": FLUSH_ROWS,
}

# The kernel's source: {phase} is step 1 for entry j of row i (``{prep}`` sets it up per row).
_SOURCE = '''
def kernel(x, omega, xi, xlo, bound, grid, re, im):
    n, d = x.shape
    m = omega.shape[1]
    t = np.empty(m, dtype=np.float32)
    acc_re = np.zeros(m, dtype=np.float32)
    acc_im = np.zeros(m, dtype=np.float32)
    g64 = np.float64(grid)
    for i in range(n):
        b = bound[d]
        for k in range(d):
            b += abs(np.float64(x[i, k])) * bound[k]
{prep}
        if b < FAST_LIMIT:
            for j in range(m):
                v = {phase}
                kf = fma32(v, TWO_OVER_PI, MAGIC) - MAGIC
                r = fma32(kf, -P3, fma32(kf, -P2, fma32(kf, -P1, v)))
                z = r * r
                s = fma32(fma32(fma32(S3, z, S2), z, S1) * z, r, r)
                c = fma32(fma32(fma32(C3, z, C2), z, C1) * z, z, fma32(-HALF, z, ONE))
                q = np.int32(kf) & 3
                cs = s if q & 1 else c
                sn = c if q & 1 else s
                cs = -cs if (q + 1) & 2 else cs
                sn = -sn if q & 2 else sn
                acc_re[j] += fma32(cs, grid, MAGIC) - MAGIC
                acc_im[j] += fma32(sn, grid, MAGIC) - MAGIC
        else:
            for j in range(m):
                v = np.float64({phase})
                acc_re[j] += np.float32(np.rint(g64 * math.cos(v)))
                acc_im[j] += np.float32(np.rint(g64 * math.sin(v)))
        if (i + 1) % FLUSH_ROWS == 0 or i == n - 1:
            for j in range(m):
                re[j] += np.float64(acc_re[j])
                im[j] += np.float64(acc_im[j])
                acc_re[j] = 0
                acc_im[j] = 0
'''

_LOOP_PREP = '''        for j in range(m):
            t[j] = x[i, 0] * omega[0, j]
        for k in range(1, d):
            xk = x[i, k]
            for j in range(m):
                t[j] = fma32(xk, omega[k, j], t[j])'''

_compiled: dict[bool, object] = {}


def _source(d: int) -> str:
    """The kernel's source for dimension d (unrolled phase when d ≤ UNROLL_D)."""
    if d <= UNROLL_D:
        prep = "\n".join(f"        x{k} = x[i, {k}]" for k in range(d))
        phase = "x0 * omega[0, j]"
        for k in range(1, d):
            phase = f"fma32(x{k}, omega[{k}, j], {phase})"
    else:
        prep, phase = _LOOP_PREP, "t[j]"
    return _SOURCE.format(prep=prep, phase=f"(({phase}) + xi[j]) + xlo[j]")


def _kernel(d: int):
    """The compiled kernel for dimension d (numba ``njit``, GIL released), built once per d."""
    if d not in _compiled:
        import numba
        from numba.core import types
        from numba.extending import intrinsic

        @intrinsic
        def fma32(typingctx, a, b, c):  # noqa: ARG001 - numba's intrinsic signature
            """fma(a, b, c) = a·b + c rounded once (LLVM's llvm.fma.f32)."""
            def codegen(context, builder, signature, args):  # noqa: ARG001
                return builder.fma(*args)
            return types.float32(types.float32, types.float32, types.float32), codegen

        scope = {"np": np, "math": math, "fma32": fma32, **_CONST}
        exec(compile(_source(d), f"<trig_kernel d={d}>", "exec"), scope)  # noqa: S102
        _compiled[d] = numba.njit(nogil=True, boundscheck=False)(scope["kernel"])
    return _compiled[d]


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
            _kernel(x.shape[1])(np.ascontiguousarray(x, dtype=np.float32), self.omega, self.xi,
                                self.xlo, self.bound, self.grid, re, im)

    def reference(self, x: np.ndarray, rounded: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Steps 1–4 in numpy, entry by entry: float32 (n, m) arrays of round(γ·cos t) and
        round(γ·sin t), the specification the compiled loop is tested against bit for bit (fast
        path only); γ·cos t and γ·sin t before rounding if not ``rounded`` (for accuracy
        measurements). The fused multiply-add is emulated in 80-bit long double (a·b is exact
        there; the sum rounds twice, which differs from one rounding about once in 2^40)."""
        c = {k: v for k, v in _CONST.items() if isinstance(v, np.float32)}
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
