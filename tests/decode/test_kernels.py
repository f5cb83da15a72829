"""CL-OMPR's compiled loops (server/decode/kernels.py, linalg.py): the float64 sine and cosine
against NumPy's, the float32 screening against a float64 correlation, the eigen-decomposition,
and the Newton step's Cholesky path against the floored eigen step it stands for."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsketch.server.decode import kernels as K
from fedsketch.server.decode import linalg


def _sincos(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos θ, sin θ by the kernels' sincos64, through :func:`K.atoms` with d = 1, c = 1, ξ = 0
    (θ_j = fma(1, θ_j, 0) = θ_j exactly)."""
    out = K.atoms(np.ones((1, 1)), theta[None, :].copy(), np.zeros(theta.size), 1.0)
    return out[: theta.size, 0], out[theta.size :, 0]


@pytest.mark.parametrize("bound", [1e-3, 1.0, 30.0, 1e4])
def test_float64_sine_and_cosine_agree_with_numpy_to_the_rounding_of_theta(bound):
    theta = np.random.default_rng(0).uniform(-bound, bound, size=200_000)
    cos, sin = _sincos(theta)
    # module docstring: within 2.3·10⁻¹⁶ (measured 2.2·10⁻¹⁶ at every bound here); 2·10⁻¹⁵ as the
    # table-driven sincos it replaces was held to, and dropping the last polynomial term
    # (S6·r¹³, C6·r¹⁴: about 10⁻¹⁴ at r = π/4) exceeds it.
    tol = 2e-15 * max(1.0, bound)
    assert np.abs(cos - np.cos(theta)).max() <= tol
    assert np.abs(sin - np.sin(theta)).max() <= tol


def test_exact_points():
    cos, sin = _sincos(np.array([0.0, np.pi / 2, -np.pi, 2 * np.pi]))
    np.testing.assert_allclose(cos, [1, 0, -1, 1], atol=1e-15)
    np.testing.assert_allclose(sin, [0, 1, 0, 0], atol=1e-15)


def test_float32_screening_ranks_like_the_float64_correlation():
    rng = np.random.default_rng(1)
    d, m, n = 5, 400, 300
    omega, xi = rng.normal(size=(d, m)), rng.uniform(0, 2 * math.pi, m)
    res = rng.normal(size=2 * m) / 20
    cands = rng.uniform(-3, 3, size=(n, d))
    g32 = K.screen(np.ascontiguousarray(cands.T, dtype=np.float32), omega.astype(np.float32),
                   xi.astype(np.float32), res[:m].astype(np.float32), res[m:].astype(np.float32))
    g64 = K.correlation(cands, omega, xi, res[:m].copy(), res[m:].copy(), 0)[0] * math.sqrt(m)
    # float32 phases of |θ| ≲ 30 rad (ulp 2·10⁻⁶) and float32 sums of m terms: ≤ 10⁻⁵ of Σ|res|
    assert np.abs(g32 - g64).max() < 1e-5 * np.abs(res).sum()
    assert np.abs(g64).max() > 1e3 * 1e-5 * np.abs(res).sum()  # the bound is not vacuous


def _eigen_step(neg_hess: np.ndarray, grad: np.ndarray, floor: float) -> np.ndarray:
    vals, vecs = np.linalg.eigh(neg_hess)
    mags = np.abs(vals)
    mags = np.maximum(mags, floor * mags.max() + 1e-300)
    return vecs @ ((vecs.T @ grad) / mags)


@pytest.mark.parametrize("spectrum", ["definite", "ill-conditioned", "indefinite"])
def test_newton_step_is_the_floored_eigen_step(spectrum):
    rng = np.random.default_rng({"definite": 2, "ill-conditioned": 3, "indefinite": 4}[spectrum])
    d = 6
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    vals = {"definite": np.linspace(1.0, 5.0, d), "ill-conditioned": np.geomspace(1e-6, 1.0, d),
            "indefinite": np.linspace(-2.0, 3.0, d)}[spectrum]
    neg_hess = (q * vals) @ q.T
    neg_hess = (neg_hess + neg_hess.T) / 2
    grad = rng.normal(size=d)
    step = np.empty(d)
    K.newton_step(neg_hess, grad, 1e-3, step)
    want = _eigen_step(neg_hess, grad, 1e-3)
    np.testing.assert_allclose(step, want, rtol=1e-9, atol=1e-12 * np.abs(want).max())


@pytest.mark.parametrize("d", [1, 2, 3, 6, 10, 17])
def test_eigen_decomposition_of_symmetric_matrices(d):
    rng = np.random.default_rng(d)
    for trial in range(20):
        a = rng.normal(size=(d, d))
        a = a + a.T
        if trial == 1:  # already diagonal
            a = np.diag(rng.normal(size=d))
        if trial == 2 and d > 1:  # zero diagonal, a repeated |eigenvalue|
            a[:] = 0.0
            a[0, 1] = a[1, 0] = 1.0
        z, vals, scratch = a.copy(), np.empty(d), np.empty(d)
        linalg._eigh(z, vals, scratch)
        assert np.abs(a @ z - z * vals).max() < 1e-12 * max(1.0, np.abs(a).max())
        assert np.abs(z.T @ z - np.eye(d)).max() < 1e-12
        np.testing.assert_allclose(np.sort(vals), np.linalg.eigvalsh(a), atol=1e-12 * np.abs(a).max())
