"""Small dense linear algebra for step 1's Newton ascent, compiled by numba (imported with
:mod:`fedsketch.server.decode.kernels` on a process's first decode): a Cholesky factorization, a
symmetric eigen-decomposition and the floored Newton step built from them, on d × d matrices
(d the data's dimension), in plain loops (numba compiles them in seconds, where its
``np.linalg.eigh`` took tens of seconds and cost 20 µs a call at d = 10); and :func:`jit`, the
decorator of both compiled modules.
"""

from __future__ import annotations

import math

import numba
import numpy as np


def jit(**options):
    """numba.njit with the disk cache, or compiled in memory where no cache folder is writable
    (a read-only install, a systemd unit with ProtectSystem=strict: numba then finds no locator)."""
    def wrap(fn):
        try:
            return numba.njit(cache=True, boundscheck=False, **options)(fn)
        except RuntimeError:  # no writable cache folder (a read-only install, systemd's ProtectSystem)
            return numba.njit(boundscheck=False, **options)(fn)
    return wrap


@jit()
def _cholesky(a, low):  # pragma: no cover - compiled
    """a = low·lowᵀ (lower triangular ``low``); False if ``a`` is not positive definite."""
    n = a.shape[0]
    for i in range(n):
        for j in range(i + 1):
            s = a[i, j]
            for k in range(j):
                s -= low[i, k] * low[j, k]
            if i == j:
                if not s > 0.0:
                    return False
                low[i, i] = math.sqrt(s)
            else:
                low[i, j] = s / low[j, j]
    return True


@jit()
def _eigh(z, vals, off):  # pragma: no cover - compiled
    """Eigen-decomposition of the symmetric ``z`` (d, d) in place: Householder reduction to
    tridiagonal form, then the implicit QL iteration with Wilkinson shifts (Numerical Recipes'
    tred2 and tqli; EISPACK's tred2/tql2). ``vals`` (d,) receives the eigenvalues, ``z`` the
    eigenvectors as columns; ``off`` (d,) is scratch. At most 30 QL iterations per eigenvalue."""
    n = vals.size
    for i in range(n - 1, 0, -1):
        h = scale = 0.0
        if i > 1:
            for k in range(i):
                scale += abs(z[i, k])
        if i > 1 and scale != 0.0:
            for k in range(i):
                z[i, k] /= scale
                h += z[i, k] * z[i, k]
            f = z[i, i - 1]
            g = -math.sqrt(h) if f >= 0.0 else math.sqrt(h)
            off[i] = scale * g
            h -= f * g
            z[i, i - 1] = f - g
            f = 0.0
            for j in range(i):
                z[j, i] = z[i, j] / h
                g = 0.0
                for k in range(j + 1):
                    g += z[j, k] * z[i, k]
                for k in range(j + 1, i):
                    g += z[k, j] * z[i, k]
                off[j] = g / h
                f += off[j] * z[i, j]
            hh = f / (h + h)
            for j in range(i):
                f = z[i, j]
                g = off[j] - hh * f
                off[j] = g
                for k in range(j + 1):
                    z[j, k] -= f * off[k] + g * z[i, k]
        else:
            off[i] = z[i, i - 1]
        vals[i] = h
    vals[0] = 0.0
    off[0] = 0.0
    for i in range(n):
        if vals[i] != 0.0:
            for j in range(i):
                g = 0.0
                for k in range(i):
                    g += z[i, k] * z[k, j]
                for k in range(i):
                    z[k, j] -= g * z[k, i]
        vals[i] = z[i, i]
        z[i, i] = 1.0
        for j in range(i):
            z[j, i] = z[i, j] = 0.0
    for i in range(1, n):
        off[i - 1] = off[i]
    off[n - 1] = 0.0
    for low in range(n):
        for _ in range(30):
            top = low
            while top < n - 1:
                dd = abs(vals[top]) + abs(vals[top + 1])
                if abs(off[top]) <= 2.220446049250313e-16 * dd:
                    break
                top += 1
            if top == low:
                break
            g = (vals[low + 1] - vals[low]) / (2.0 * off[low])
            r = math.hypot(g, 1.0)
            g = vals[top] - vals[low] + off[low] / (g + (r if g >= 0.0 else -r))
            s = c = 1.0
            p = 0.0
            underflow = False
            for i in range(top - 1, low - 1, -1):
                f = s * off[i]
                b = c * off[i]
                r = math.hypot(f, g)
                off[i + 1] = r
                if r == 0.0:
                    vals[i + 1] -= p
                    off[top] = 0.0
                    underflow = True
                    break
                s = f / r
                c = g / r
                g = vals[i + 1] - p
                r = (vals[i] - g) * s + 2.0 * c * b
                p = s * r
                vals[i + 1] = g + p
                g = c * r - b
                for k in range(n):
                    f = z[k, i + 1]
                    z[k, i + 1] = s * z[k, i] + c * f
                    z[k, i] = c * z[k, i] - s * f
            if underflow:
                continue
            vals[low] -= p
            off[low] = g
            off[top] = 0.0


@jit()
def newton_step(neg_hess, grad, eig_floor, step):  # pragma: no cover - compiled
    """step = Σ_i v_i v_iᵀ grad / max(|λ_i|, eig_floor·max|λ| + 10⁻³⁰⁰) over the eigenpairs
    (λ_i, v_i) of −∇²g. Where every λ_i exceeds eig_floor·‖−∇²g‖_∞ (≥ eig_floor·max|λ|: two
    Cholesky factorizations tell) this is (−∇²g)⁻¹·grad, solved by Cholesky; else by :func:`_eigh`."""
    d = grad.size
    bound = 0.0
    for i in range(d):
        row = 0.0
        for k in range(d):
            row += abs(neg_hess[i, k])
        bound = max(bound, row)
    work, low = neg_hess.copy(), np.zeros((d, d))
    for i in range(d):
        work[i, i] -= eig_floor * bound
    if _cholesky(work, low) and _cholesky(neg_hess, low):
        for i in range(d):  # low·y = grad, then lowᵀ·step = y
            s = grad[i]
            for k in range(i):
                s -= low[i, k] * step[k]
            step[i] = s / low[i, i]
        for i in range(d - 1, -1, -1):
            s = step[i]
            for k in range(i + 1, d):
                s -= low[k, i] * step[k]
            step[i] = s / low[i, i]
        return
    work[:, :] = neg_hess
    vals, scratch = np.empty(d), np.empty(d)
    _eigh(work, vals, scratch)
    top = 0.0
    for i in range(d):
        top = max(top, abs(vals[i]))
    floor = eig_floor * top + 1e-300
    for k in range(d):
        step[k] = 0.0
    for i in range(d):
        proj = 0.0
        for k in range(d):
            proj += work[k, i] * grad[k]
        proj /= max(abs(vals[i]), floor)
        for k in range(d):
            step[k] += work[k, i] * proj


