"""CL-OMPR's compiled loops (numba; imported on a process's first decode, not at start-up).

Everything is in the decoder's unit frame (:class:`fedsketch.server.decode.clompr.Frame`), with
θ_j = Σ_k c_k ω_kj + ξ_j (one fused multiply-add per coordinate, from ξ_j up) and the residual
split as re, im (m,) (sketch units). One pass over the m frequencies computes the phases, their
cosine and sine once, and every sum the caller needs from them:

* :func:`screen`: g = Σ_j (cos θ_j re_j + sin θ_j im_j) of L candidates, float32 (a ranking
  only), vectorized over the candidates;
* :func:`correlation` / :func:`ascend`: g(c) = (1/√m) Σ_j w_j with w_j = cos θ_j re_j +
  sin θ_j im_j, ∇g = (1/√m) Σ_j ω_j v_j with v_j = cos θ_j im_j − sin θ_j re_j, and
  ∇²g = −(1/√m) Σ_j ω_j ω_jᵀ w_j (float64), and the whole Newton ascent of
  :mod:`fedsketch.server.decode.search` per start, steps and halvings included;
* :func:`objective`: F(C, p) = ‖s − gain·Σ_a p_a e^{iθ_a}‖² and its gradient
  (∂F/∂p_a = −2·gain·Σ_j (cos θ_aj res_re,j + sin θ_aj res_im,j),
  ∇_{c_a}F = −2·gain·p_a·Σ_j ω_j (cos θ_aj res_im,j − sin θ_aj res_re,j)).

Sine and cosine are computed together from one Cody–Waite reduction by π/2 (π/2 as a float64
pair, the first product exact inside an FMA) and fdlibm's degree-13/14 polynomials on
[−π/4, π/4] (float64: within 2.3·10⁻¹⁶ of ``np.cos``/``np.sin`` of the same θ for |θ| ≤ 10⁴,
tests/decode/test_kernels.py) or Cephes' float32 ones (:mod:`fedsketch.common.sketch.trig_constants`);
the loops vectorize (about 1 ns per float64 pair on the benchmark machine, against NumPy's
20 ns through libm). Sums over the m frequencies go through :func:`_dot`, the only function
compiled with reassociation allowed (so that LLVM vectorizes it); every other operation is in
IEEE order, which the range reduction relies on. Cached on disk by numba; where no cache folder
is writable, compiled in memory by each process (as :mod:`fedsketch.common.sketch.trig_compiled`).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba.extending import intrinsic

from fedsketch.common.sketch.trig_constants import CONSTANTS
from fedsketch.server.decode.linalg import jit as _jit
from fedsketch.server.decode.linalg import newton_step


@intrinsic
def fma(typingctx, a, b, c):  # noqa: ARG001 - numba's intrinsic signature
    """a·b + c rounded once (LLVM's llvm.fma), in the type of ``a``."""
    def codegen(context, builder, signature, args):  # noqa: ARG001
        return builder.fma(*args)
    return a(a, a, a), codegen


TWO_OVER_PI = 2.0 / math.pi
TWO_PI = 2.0 * math.pi
#: π/2 = PIO2_1 + PIO2_2 + O(10⁻³³): k·PIO2_1 is subtracted exactly inside one FMA.
PIO2_1, PIO2_2 = 1.5707963267948966, 6.123233995736766e-17
#: fdlibm's __kernel_sin and __kernel_cos coefficients.
S1, S2, S3 = -1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04
S4, S5, S6 = 2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10
C1, C2, C3 = 4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05
C4, C5, C6 = -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11
F_TWO_OVER_PI, F_P1, F_P2, F_P3 = (CONSTANTS[k] for k in ("TWO_OVER_PI", "P1", "P2", "P3"))
F_S1, F_S2, F_S3 = CONSTANTS["S1"], CONSTANTS["S2"], CONSTANTS["S3"]
F_C1, F_C2, F_C3 = CONSTANTS["C1"], CONSTANTS["C2"], CONSTANTS["C3"]
F_HALF, F_ONE = CONSTANTS["HALF"], CONSTANTS["ONE"]


@numba.njit(inline="always")
def _quadrant(q, s, c):  # pragma: no cover - compiled
    """(cos, sin) of r + q·π/2 from s = sin r, c = cos r."""
    cs = s if q & 1 else c
    sn = c if q & 1 else s
    cs = -cs if (q + 1) & 2 else cs
    sn = -sn if q & 2 else sn
    return cs, sn


@numba.njit(inline="always")
def sincos64(v):  # pragma: no cover - compiled
    """(cos v, sin v), float64 (module docstring)."""
    kf = np.rint(v * TWO_OVER_PI)
    r = fma(kf, -PIO2_2, fma(kf, -PIO2_1, v))
    z = r * r
    s = fma(fma(fma(fma(fma(fma(S6, z, S5), z, S4), z, S3), z, S2), z, S1) * z, r, r)
    c = fma(fma(fma(fma(fma(fma(C6, z, C5), z, C4), z, C3), z, C2), z, C1) * z, z,
            fma(-0.5, z, 1.0))
    return _quadrant(np.int64(kf) & 3, s, c)


@numba.njit(inline="always")
def sincos32(v):  # pragma: no cover - compiled
    """(cos v, sin v), float32 (trig_constants' reduction and polynomials)."""
    kf = np.rint(v * F_TWO_OVER_PI)
    r = fma(kf, -F_P3, fma(kf, -F_P2, fma(kf, -F_P1, v)))
    z = r * r
    s = fma(fma(fma(F_S3, z, F_S2), z, F_S1) * z, r, r)
    c = fma(fma(fma(F_C3, z, F_C2), z, F_C1) * z, z, fma(-F_HALF, z, F_ONE))
    return _quadrant(np.int32(kf) & 3, s, c)


@_jit(fastmath={"reassoc", "contract"})
def _dot(a, b):  # pragma: no cover - compiled
    """Σ_j a_j b_j (reassociated: vectorized)."""
    total = 0.0
    for j in range(a.size):
        total += a[j] * b[j]
    return total


@_jit(fastmath={"reassoc", "contract"})
def _sum(a):  # pragma: no cover - compiled
    """Σ_j a_j (reassociated: vectorized)."""
    total = 0.0
    for j in range(a.size):
        total += a[j]
    return total


@_jit()
def phases(c, omega, xi, out):  # pragma: no cover - compiled
    """out = θ of the point ``c`` (d,): ξ_j, then one FMA per coordinate."""
    d, m = omega.shape
    for j in range(m):
        out[j] = xi[j]
    for k in range(d):
        ck = c[k]
        for j in range(m):
            out[j] = fma(ck, omega[k, j], out[j])


@_jit()
def screen(cands, omega, xi, re, im):  # pragma: no cover - compiled
    """g (L,) float32 of the candidates ``cands`` (d, L) float32, without the 1/√m (module
    docstring): a ranking."""
    d, n = cands.shape
    m = omega.shape[1]
    g = np.zeros(n, dtype=np.float32)
    t = np.empty(n, dtype=np.float32)
    for j in range(m):
        x0, w0 = xi[j], omega[0, j]
        for i in range(n):
            t[i] = fma(cands[0, i], w0, x0)
        for k in range(1, d):
            wk = omega[k, j]
            for i in range(n):
                t[i] = fma(cands[k, i], wk, t[i])
        a, b = re[j], im[j]
        for i in range(n):
            c, s = sincos32(t[i])
            g[i] = fma(c, a, fma(s, b, g[i]))
    return g


@_jit()
def _corr(c, omega, xi, re, im, order, theta, w, v, grad, neg_hess):  # pragma: no cover
    """g(c); with ``order`` 2 also ∇g into ``grad`` (d,) and −∇²g into ``neg_hess`` (d, d).
    ``theta``, ``w`` and ``v`` (m,) are scratch."""
    d, m = omega.shape
    scale = 1.0 / math.sqrt(m)
    phases(c, omega, xi, theta)
    if order == 0:
        for j in range(m):
            cs, sn = sincos64(theta[j])
            w[j] = fma(cs, re[j], sn * im[j])
        return scale * _sum(w)
    for j in range(m):
        cs, sn = sincos64(theta[j])
        w[j] = fma(cs, re[j], sn * im[j])
        v[j] = fma(cs, im[j], -(sn * re[j]))
    for k in range(d):
        grad[k] = scale * _dot(omega[k], v)
    for a in range(d):
        for j in range(m):
            v[j] = omega[a, j] * w[j]
        for b in range(a, d):
            neg_hess[a, b] = scale * _dot(v, omega[b])
            neg_hess[b, a] = neg_hess[a, b]
    return scale * _sum(w)


@_jit()
def correlation(points, omega, xi, re, im, order):  # pragma: no cover - compiled
    """g (L,), and with ``order`` 2 ∇g (L, d) and −∇²g (L, d, d), at ``points`` (L, d)."""
    d, m = omega.shape
    n = points.shape[0]
    g = np.empty(n)
    grad = np.zeros((n, d))
    neg_hess = np.zeros((n, d, d))
    theta, w, v = np.empty(m), np.empty(m), np.empty(m)
    for i in range(n):
        g[i] = _corr(points[i], omega, xi, re, im, order, theta, w, v, grad[i], neg_hess[i])
    return g, grad, neg_hess


@_jit()
def ascend(starts, omega, xi, re, im, lo, hi, max_steps, trust, xtol, eig_floor,
           halvings):  # pragma: no cover - compiled
    """The Newton ascent of :meth:`fedsketch.server.decode.search.AtomSearch.ascend` from each
    row of ``starts`` (L, d): (local maxima (L, d), g there (L,))."""
    d, m = omega.shape
    n = starts.shape[0]
    out = np.empty((n, d))
    g_out = np.empty(n)
    theta, w, v = np.empty(m), np.empty(m), np.empty(m)
    grad, neg_hess = np.empty(d), np.empty((d, d))
    x, step, cand = np.empty(d), np.empty(d), np.empty(d)
    for i in range(n):
        for k in range(d):
            x[k] = min(max(starts[i, k], lo[k]), hi[k])
        g = 0.0
        for _ in range(max_steps):
            g = _corr(x, omega, xi, re, im, 2, theta, w, v, grad, neg_hess)
            newton_step(neg_hess, grad, eig_floor, step)
            length = math.sqrt(_dot(step, step))
            shrink = trust / length if length > trust else 1.0
            moved = False
            g_new = g
            for _ in range(halvings):
                for k in range(d):
                    cand[k] = min(max(x[k] + shrink * step[k], lo[k]), hi[k])
                g_new = _corr(cand, omega, xi, re, im, 0, theta, w, v, grad, neg_hess)
                if g_new > g:
                    moved = True
                    break
                shrink *= 0.5
            if not moved:
                break
            shift = 0.0
            for k in range(d):
                shift = max(shift, abs(cand[k] - x[k]))
                x[k] = cand[k]
            g = g_new
            if shift < xtol:
                break
        for k in range(d):
            out[i, k] = x[k]
        g_out[i] = g
    return out, g_out


@_jit()
def objective(x, omega, xi, sre, sim, gain, trig32, grad):  # pragma: no cover - compiled
    """F(C, p) (module docstring) at x = (vec(C), p), C (K, d) row-major; its gradient into
    ``grad``. With ``trig32`` the cosines and sines are float32 of the phases reduced to
    [−π, π] in float64, everything else float64."""
    d, m = omega.shape
    k = x.size // (d + 1)
    cos, sin = np.empty((k, m)), np.empty((k, m))
    theta, v = np.empty(m), np.empty(m)
    res_re, res_im = sre.copy(), sim.copy()
    for a in range(k):
        phases(x[a * d:(a + 1) * d], omega, xi, theta)
        if trig32:
            for j in range(m):
                t = theta[j]
                c, s = sincos32(np.float32(t - TWO_PI * np.rint(t * (1.0 / TWO_PI))))
                cos[a, j], sin[a, j] = c, s
        else:
            for j in range(m):
                cos[a, j], sin[a, j] = sincos64(theta[j])
        pa = -gain * x[k * d + a]
        for j in range(m):
            res_re[j] = fma(pa, cos[a, j], res_re[j])
            res_im[j] = fma(pa, sin[a, j], res_im[j])
    for a in range(k):
        ca, sa = cos[a], sin[a]
        grad[k * d + a] = -2.0 * gain * (_dot(ca, res_re) + _dot(sa, res_im))
        for j in range(m):
            v[j] = fma(ca[j], res_im[j], -(sa[j] * res_re[j]))
        scale = -2.0 * gain * x[k * d + a]
        for b in range(d):
            grad[a * d + b] = scale * _dot(omega[b], v)
    return _dot(res_re, res_re) + _dot(res_im, res_im)


@_jit()
def atoms(centroids, omega, xi, gain):  # pragma: no cover - compiled
    """Stacked real atoms (2m, K): rows 0..m−1 gain·cos θ, rows m..2m−1 gain·sin θ (float64)."""
    d, m = omega.shape
    k = centroids.shape[0]
    out = np.empty((2 * m, k))
    theta = np.empty(m)
    for a in range(k):
        phases(centroids[a], omega, xi, theta)
        for j in range(m):
            c, s = sincos64(theta[j])
            out[j, a] = gain * c
            out[m + j, a] = gain * s
    return out
