"""The compiled loop of :mod:`fedsketch.common.sketch.trig_kernel` (numba; imported on first use).

:func:`kernel` performs steps 1–4 stated there, operation for operation as
:meth:`fedsketch.common.sketch.trig_kernel.FusedComplex.reference` (tested bit for bit), with
the slow path for records whose phase bound reaches ``FAST_LIMIT``. ``fma32`` is LLVM's
``llvm.fma.f32``: a·b + c rounded once, never contracted or reassociated otherwise (numba
compiles without fast-math, so no other operation is fused or reordered). Where numba finds no
writable cache folder (a read-only install, a systemd unit with ProtectSystem=strict), the loop
is compiled in memory by each process instead of loaded from the disk cache.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba.core import types
from numba.extending import intrinsic

from .trig_constants import CONSTANTS

TWO_OVER_PI, MAGIC = CONSTANTS["TWO_OVER_PI"], CONSTANTS["MAGIC"]
P1, P2, P3 = CONSTANTS["P1"], CONSTANTS["P2"], CONSTANTS["P3"]
S1, S2, S3 = CONSTANTS["S1"], CONSTANTS["S2"], CONSTANTS["S3"]
C1, C2, C3 = CONSTANTS["C1"], CONSTANTS["C2"], CONSTANTS["C3"]
HALF, ONE = CONSTANTS["HALF"], CONSTANTS["ONE"]
FAST_LIMIT, FLUSH_ROWS = CONSTANTS["FAST_LIMIT"], CONSTANTS["FLUSH_ROWS"]


@intrinsic
def fma32(typingctx, a, b, c):  # noqa: ARG001 - numba's intrinsic signature
    """fma(a, b, c) = a·b + c rounded once, float32."""
    def codegen(context, builder, signature, args):  # noqa: ARG001
        return builder.fma(*args)
    return types.float32(types.float32, types.float32, types.float32), codegen


def _loop(x, omega, xi, xlo, bound, grid, re, im):  # pragma: no cover - compiled
    """re += Σ_i round(γ cos t_i), im += Σ_i round(γ sin t_i) over the float32 rows of x (n, d);
    omega float32 (d, m), xi and xlo float32 (m,), bound float64 (d + 1,), grid float32 γ,
    re and im float64 (m,)."""
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
        x0 = x[i, 0]
        for j in range(m):
            t[j] = x0 * omega[0, j]
        for k in range(1, d):
            xk = x[i, k]
            for j in range(m):
                t[j] = fma32(xk, omega[k, j], t[j])
        if b < FAST_LIMIT:
            for j in range(m):
                v = (t[j] + xi[j]) + xlo[j]
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
                v64 = np.float64((t[j] + xi[j]) + xlo[j])
                acc_re[j] += np.float32(np.rint(g64 * math.cos(v64)))
                acc_im[j] += np.float32(np.rint(g64 * math.sin(v64)))
        if (i + 1) % FLUSH_ROWS == 0 or i == n - 1:
            for j in range(m):
                re[j] += np.float64(acc_re[j])
                im[j] += np.float64(acc_im[j])
                acc_re[j] = 0
                acc_im[j] = 0


try:
    kernel = numba.njit(nogil=True, cache=True, boundscheck=False)(_loop)
except RuntimeError:  # no writable cache folder (a read-only install, systemd's ProtectSystem)
    kernel = numba.njit(nogil=True, boundscheck=False)(_loop)  # compiled in memory, each process
