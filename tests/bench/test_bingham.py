"""The Bingham samplers against exact references.

1-D samplers: a Kolmogorov–Smirnov test of 20 000 draws against the exact CDF at every draw,
accumulated by quadrature of the density (scipy.integrate.quad) over the gaps between sorted
draws; algebraic endpoint weights carry the θ^{−1/2} and (1−θ)^κ singularities.

Vector and matrix samplers: per-column second moments E[v_r v_rᵀ] (their sum is E[UUᵀ]) of one
long Gibbs chain against a brute-force rejection sampler (uniform or Haar proposals, accepted
w.p. exp(score − bound)). Every entry must agree within TOL_SE = 4.5 combined standard errors,
sqrt(SE_chain² + SE_exact²): batch means (40 batches) for the chain, the i.i.d. formula for the
rejection draws. Everything is seeded, so the outcome is reproducible.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from fedsketch.common.data.synthetic import random_orthonormal
from fedsketch.server.bench.bingham import (
    sample_matrix_bingham,
    sample_rotation_angle,
    sample_theta,
    sample_vector_bingham,
)

#: Seeded outcomes here depend on floating-point summation order (BLAS kernels): tests/test_blas_kernels.py
#: re-runs this module under each OpenBLAS kernel the CPU offers.
pytestmark = pytest.mark.blas


N_1D = 20_000
P_MIN = 1e-3          # KS p-value below which a 1-D sampler is declared wrong
TOL_SE = 4.5          # moment tolerance, in combined standard errors per entry
N_BATCHES = 40


def _ks_pvalue(draws: np.ndarray, pieces) -> float:
    """One-sample KS p-value of ``draws`` against the CDF built by quadrature: ``pieces(grid)``
    integrates the unnormalized density over each gap of grid = (lo, sorted draws, hi)."""
    x = np.sort(draws)
    mass = np.asarray(pieces(x))
    cdf = np.cumsum(mass)[:-1] / mass.sum()
    n = x.size
    stat = max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n))
    return float(stats.kstwo.sf(stat, n))


def _theta_pieces(a: float, p: int):
    """Integrals of θ^{−1/2}(1−θ)^κ e^{a(θ−s)} (s = 1 if a > 0 else 0, for scale) over the gaps of
    (0, draws, 1); algebraic endpoint weights carry the singularities of the end gaps."""
    kappa, shift = (p - 3) / 2, (1.0 if a > 0 else 0.0)

    def dens(t: float) -> float:
        return t**-0.5 * (1 - t) ** kappa * math.exp(a * (t - shift))

    def pieces(x: np.ndarray) -> list[float]:
        first = integrate.quad(lambda t: (1 - t) ** kappa * math.exp(a * (t - shift)), 0.0, x[0],
                               weight="alg", wvar=(-0.5, 0.0))[0]
        last = integrate.quad(lambda t: t**-0.5 * math.exp(a * (t - shift)), x[-1], 1.0,
                              weight="alg", wvar=(0.0, kappa))[0]
        middle = [integrate.quad(dens, lo, hi)[0] for lo, hi in zip(x[:-1], x[1:], strict=True)]
        return [first, *middle, last]

    return pieces


@pytest.mark.parametrize(("a", "p"), [
    (0.0, 4),       # uniform-sphere marginal, Beta(½, 3/2)
    (-0.5, 5),      # Beta proposal branch, a ≤ 0
    (-30.0, 4),     # truncated-Gamma branch
    (-2000.0, 9),   # truncated-Gamma branch, very concentrated
    (3.0, 4),       # Hoff envelope, moderate a
    (200.0, 9),     # Hoff envelope, concentrated near 1
    (0.3, 2),       # p = 2 guard: Hoff's envelope would take ln of a negative number (NaN)
    (0.7, 2),       # p = 2 guard, just below e − 2
    (1.0, 2),       # p = 2, Hoff envelope just above e − 2
    (-5.0, 2),      # p = 2, a < 0 by the θ → 1−θ symmetry
])
def test_theta_sampler_matches_quadrature(a, p):
    rng = np.random.default_rng(1000 + p)
    draws = np.array([sample_theta(a, p, rng) for _ in range(N_1D)])
    assert np.all((draws > 0) & (draws < 1))
    assert _ks_pvalue(draws, _theta_pieces(a, p)) > P_MIN


@pytest.mark.parametrize("c", [-6.0, 0.8, 15.0])
def test_rotation_angle_matches_quadrature(c):
    rng = np.random.default_rng(7)
    draws = np.array([sample_rotation_angle(c, rng) for _ in range(N_1D)])
    assert np.all((draws >= 0) & (draws < 2 * math.pi))

    def dens(t: float) -> float:
        return math.exp(c * math.cos(t) ** 2 - max(c, 0.0))

    def pieces(x: np.ndarray) -> list[float]:
        grid = np.concatenate([[0.0], x, [2 * math.pi]])
        return [integrate.quad(dens, lo, hi)[0] for lo, hi in zip(grid[:-1], grid[1:], strict=True)]

    assert _ks_pvalue(draws, pieces) > P_MIN


def test_theta_rejects_p_below_two():
    with pytest.raises(ValueError):
        sample_theta(1.0, 1, np.random.default_rng(0))


# ---- vector and matrix samplers against rejection -------------------------------------------

def _symmetric(eigenvalues, seed: int) -> np.ndarray:
    q = random_orthonormal(len(eigenvalues), len(eigenvalues), np.random.default_rng(seed))
    return q @ np.diag(eigenvalues) @ q.T


def _haar_batch(d: int, k: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """(size, d, k) Haar-distributed orthonormal frames (QR with R's diagonal made positive)."""
    q, r = np.linalg.qr(rng.standard_normal((size, d, k)))
    return q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]


def _rejection_frames(a: np.ndarray, b: np.ndarray, n_accept: int, rng) -> np.ndarray:
    """(n, d, k) exact draws ∝ exp(Σ_r b_r v_rᵀAv_r), b ≥ 0: Haar proposals accepted w.p.
    exp(score − bound), bound = Σ_r b_(r)λ_(r) (both sorted decreasing; von Neumann) ≥ score."""
    assert np.all(b >= 0)
    lam = np.linalg.eigvalsh(a)[::-1]
    bound = float(np.sort(b)[::-1] @ lam[: b.size])
    d, k = a.shape[0], b.size
    kept: list[np.ndarray] = []
    while sum(len(x) for x in kept) < n_accept:
        v = _haar_batch(d, k, 100_000, rng)
        score = np.einsum("ndr,ndr->nr", v, np.matmul(a, v)) @ b
        kept.append(v[np.log(rng.random(score.size)) <= score - bound])
    return np.concatenate(kept)[:n_accept]


def _moments(frames: np.ndarray) -> np.ndarray:
    """Per-draw column second moments v_r v_rᵀ, flattened: (n, k·d·d)."""
    return np.einsum("ndr,ner->nrde", frames, frames).reshape(frames.shape[0], -1)


def _assert_moments_agree(chain: np.ndarray, exact: np.ndarray) -> None:
    """Mean of each entry agrees within TOL_SE·sqrt(SE_chain² + SE_exact²)."""
    m_chain, m_exact = _moments(chain), _moments(exact)
    usable = (len(m_chain) // N_BATCHES) * N_BATCHES
    batches = m_chain[:usable].reshape(N_BATCHES, -1, m_chain.shape[1]).mean(axis=1)
    se_chain = batches.std(axis=0, ddof=1) / math.sqrt(N_BATCHES)
    se_exact = m_exact.std(axis=0, ddof=1) / math.sqrt(len(m_exact))
    diff = np.abs(m_chain.mean(axis=0) - m_exact.mean(axis=0))
    tol = TOL_SE * np.sqrt(se_chain**2 + se_exact**2) + 1e-12
    assert np.all(diff <= tol), f"worst |diff|/tol = {np.max(diff / tol):.2f}"


def _vector_chain(a: np.ndarray, steps: int, rng) -> np.ndarray:
    x = sample_vector_bingham(a, rng, n_iter=20)
    out = np.empty((steps, a.shape[0], 1))
    for t in range(steps):
        x = sample_vector_bingham(a, rng, n_iter=1, x0=x)
        out[t, :, 0] = x
    return out


@pytest.mark.parametrize(("eigenvalues", "seed"), [
    ((2.0, 0.7, -0.3, -1.5), 1),     # moderate: a of both signs near 0
    ((9.0, 4.0, 0.0, -6.0), 2),      # concentrated: Hoff's a > 0 and the Gamma branch
    ((0.5, 0.0), 3),                 # d = 2: every conditional is the p = 2 guard case
])
def test_vector_bingham_matches_rejection(eigenvalues, seed):
    a = _symmetric(eigenvalues, seed)
    rng = np.random.default_rng(seed)
    chain = _vector_chain(a, 10_000, rng)
    assert np.allclose(np.linalg.norm(chain[:, :, 0], axis=1), 1.0)
    exact = _rejection_frames(a, np.ones(1), 50_000, rng)
    _assert_moments_agree(chain, exact)


def _matrix_chain(a: np.ndarray, b: np.ndarray, steps: int, rng) -> np.ndarray:
    v = sample_matrix_bingham(a, b, rng, n_iter=20)
    out = np.empty((steps, a.shape[0], b.size))
    for t in range(steps):
        v = sample_matrix_bingham(a, np.diag(b) if t % 2 else b, rng, n_iter=1, V0=v)
        out[t] = v
    return out


@pytest.mark.parametrize(("eigenvalues", "b", "seed"), [
    ((3.0, 1.0, -1.0, -2.0), (1.5, 0.5), 4),    # d = 4, k = 2: complements of dimension 3
    ((1.0, 0.6, 0.0), (1.0, 0.5), 5),           # d = 3, k = 2: p = 2, guard case inside the sweep
    ((2.0, 0.0, -1.0, -0.5), (1.0,), 6),        # k = 1 through the matrix interface
    ((1.5, 0.0, -1.0), (2.0, 1.0, 0.0), 7),     # d = k = 3: pair rotations
])
def test_matrix_bingham_matches_rejection(eigenvalues, b, seed):
    a = _symmetric(eigenvalues, seed)
    b = np.asarray(b)
    rng = np.random.default_rng(seed)
    chain = _matrix_chain(a, b, 6_000, rng)
    gram = np.einsum("ndr,nds->nrs", chain, chain)
    assert np.allclose(gram, np.eye(b.size), atol=1e-10)
    exact = _rejection_frames(a, b, 50_000, rng)
    _assert_moments_agree(chain, exact)


def test_matrix_bingham_checks_its_inputs():
    rng = np.random.default_rng(0)
    a = _symmetric((1.0, 0.0, -1.0), 0)
    with pytest.raises(ValueError, match="symmetric"):
        sample_matrix_bingham(a + np.triu(np.ones((3, 3)), 1), np.ones(2), rng)
    with pytest.raises(ValueError, match="diagonal"):
        sample_matrix_bingham(a, np.ones((2, 2)), rng)
    with pytest.raises(ValueError, match="diagonal"):
        sample_matrix_bingham(a, 1.0, rng)
    with pytest.raises(ValueError, match="orthonormal"):
        sample_matrix_bingham(a, np.ones(2), rng, V0=np.ones((3, 2)))
    with pytest.raises(ValueError, match="k <= d"):
        sample_matrix_bingham(a, np.ones(4), rng)


def test_chains_leave_an_exact_eigenvector_start():
    """Started on an eigenvector, y_{−i} = 0 in the eigenbasis: the scan must not divide 0 by 0."""
    a = np.diag([3.0, 1.0, 0.0, -1.0])
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = sample_vector_bingham(a, rng, n_iter=1, x0=np.eye(4)[0])
        assert np.all(np.isfinite(x)) and np.linalg.norm(x) == pytest.approx(1.0)
        v = sample_matrix_bingham(a, np.ones(2), rng, n_iter=1, V0=np.eye(4)[:, :2])
        assert np.all(np.isfinite(v))


def test_matrix_bingham_keeps_the_start_when_not_iterated():
    rng = np.random.default_rng(0)
    v0 = random_orthonormal(5, 2, rng)
    out = sample_matrix_bingham(_symmetric((1, 2, 3, 4, 5), 0), np.ones(2), rng, n_iter=0, V0=v0)
    assert np.array_equal(out, v0)
    assert out is not v0


def test_one_dimensional_cases_draw_the_sign():
    rng = np.random.default_rng(0)
    signs = {float(sample_matrix_bingham(np.eye(1), [2.0], rng, n_iter=1)[0, 0]) for _ in range(20)}
    signs |= {float(sample_vector_bingham(np.eye(1), rng, n_iter=1)[0]) for _ in range(20)}
    assert signs == {-1.0, 1.0}
