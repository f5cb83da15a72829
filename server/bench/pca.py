"""Differentially private PCA: MOD-SULQ and PPCA (Chaudhuri, Sarwate, Sinha, NIPS'12; paper 003).

Input (MECHANISMS §8.1): records x_i ∈ R^d, rows of ``Task.x``, clipped onto the public ball
‖x‖₂ ≤ R (R = ``Task.norm_bound``; the count of moved rows is reported, ``Task.strict`` refuses
them) and divided by R, so ‖x̃_i‖ ≤ 1 (dimensionless). The query is the second-moment matrix
A = (1/n) Σ_i x̃_i x̃_iᵀ (d × d, ‖A‖_F ≤ 1); the release is an orthonormal basis V (d × k) of a
k-dimensional subspace, k = ``Task.k`` ≤ d. The privacy parameter (paper 003's α) is ``Task.epsilon``.
Utility: q_F(V) = tr(VᵀAV) ∈ [0, 1], the energy of A captured by span(V) (paper 003 §4).

Methods (:data:`METHODS`):

* ``pca``: top-k eigenvectors of A (non-private reference; kind "none", ε = ∞);
* ``random``: a Haar-random basis from ``Task.rng``, data-independent (the floor; ε = 0);
* ``mod-sulq``: top-k eigenvectors of A + N, N symmetric Gaussian of paper 003's β, released as
  integers on a grid with exact discrete Gaussian noise, (ε, δ)-DP, replace-one (§8.2);
* ``ppca``: a Gibbs-chain draw from the matrix Bingham density ∝ exp((nε/2) tr(VᵀAV)), the
  exponential mechanism with utility Σ_i ‖Vᵀx̃_i‖² (§8.3); ε-DP for exact samples only.

Privacy randomness: MOD-SULQ's noise is exact, from OS random bits
(:func:`fedsketch.common.dp.samplers.dgauss_noise`); every draw of the PPCA chain, its start
included, comes from :func:`fedsketch.common.dp.samplers.noise_rng` (float sampling, so the chain's
guarantee also assumes exact samples). ``Task.rng`` is used only by the data-independent random
baseline.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fedsketch.common.data.synthetic import random_orthonormal
from fedsketch.common.dp import grid
from fedsketch.common.dp.calibration import dgauss_sigma
from fedsketch.common.dp.samplers import dgauss_noise, noise_rng
from fedsketch.server.bench.bingham import sample_matrix_bingham
from fedsketch.server.bench.task import Outcome, Task, clip_rows_to_norm, require_finite_epsilon

#: Gibbs sweeps of the PPCA chain (each updates every column once). Measured on paper 003's data
#: (n = 5000, d = 10, k = 2, ε from 0.05 to 20): from the worst start (the bottom-k eigenvectors)
#: q_F reaches its stationary level within a few sweeps; 200 is a wide margin (~0.2 s).
PPCA_SWEEPS = 200


def _check_rank(task: Task) -> None:
    """Refuse a PCA rank k above the dimension d."""
    if task.k > task.d:
        raise ValueError(f"the PCA rank k must be <= d = {task.d}, got {task.k}")


def scaled_rows(task: Task) -> tuple[np.ndarray, int]:
    """(x̃, clipped): the rows clipped to ‖x‖ ≤ R and divided by R (n × d, ‖x̃_i‖ ≤ 1,
    dimensionless), and the number of rows moved onto the ball."""
    _check_rank(task)
    x, clipped = clip_rows_to_norm(np.asarray(task.x, dtype=np.float64), task.norm_bound, task.strict)
    return x / task.norm_bound, clipped


def second_moment(task: Task) -> tuple[np.ndarray, int]:
    """(A, clipped): A = (1/n) Σ_i x̃_i x̃_iᵀ of :func:`scaled_rows` (d × d, dimensionless,
    ‖A‖_F ≤ tr A ≤ 1), and the number of rows moved onto the ball."""
    x, clipped = scaled_rows(task)
    return x.T @ x / x.shape[0], clipped


def top_eigenvectors(m: np.ndarray, k: int) -> np.ndarray:
    """Orthonormal eigenvectors (d × k) of the symmetric m for its k largest eigenvalues (by value,
    so negative eigenvalues of a noisy matrix rank below positive ones), largest first."""
    _, vecs = np.linalg.eigh(m)
    return vecs[:, ::-1][:, :k].copy()


def q_f(v: np.ndarray, a: np.ndarray) -> float:
    """q_F(V) = tr(VᵀAV): the energy of A captured by span(V), in the units of A (paper 003 §4)."""
    return float(np.trace(v.T @ a @ v))


def pca_reference(task: Task) -> Outcome:
    """Non-private top-k eigenvectors of A (kind "none", ε = ∞)."""
    a, clipped = second_moment(task)
    return Outcome(top_eigenvectors(a, task.k), math.inf, 0.0, task.neighbouring, "none", clipped,
                   "non-private reference")


def random_subspace(task: Task) -> Outcome:
    """A Haar-random (d, k) orthonormal basis from ``Task.rng``: the data-independent floor
    (E[q_F] = (k/d)·tr A). Reads no record, so spends ε = 0 and clips nothing."""
    _check_rank(task)
    return Outcome(random_orthonormal(task.d, task.k, task.rng), 0.0, 0.0, task.neighbouring,
                   "none", 0, "data-independent Haar basis")


def mod_sulq_beta(n: int, d: int, epsilon: float, delta: float) -> float:
    """MOD-SULQ's noise standard deviation (units of A), paper 003 Alg. 1 in the MATLAB form
    (MECHANISMS §8.2, §10.15):

        β = (d+1)/(n ε) · sqrt(2 ln((d² + d)/(2√(2π) δ))) + 1/(√ε · n).
    """
    arg = (d * d + d) / (2.0 * math.sqrt(2.0 * math.pi) * delta)
    if not arg > 1.0:
        raise ValueError(f"MOD-SULQ's beta needs (d²+d)/(2√(2π)δ) > 1, got {arg:g} (d = {d}, δ = {delta})")
    return (d + 1) / (n * epsilon) * math.sqrt(2.0 * math.log(arg)) + 1.0 / (math.sqrt(epsilon) * n)


#: Replace-one L2 sensitivity of the upper triangle of x̃x̃ᵀ for ‖x̃‖ ≤ 1 (dimensionless):
#: ‖x̃x̃ᵀ − x̃'x̃'ᵀ‖_F² = ‖x̃‖⁴ + ‖x̃'‖⁴ − 2(x̃ᵀx̃')² ≤ 2, and a triangle is part of the matrix.
MOD_SULQ_SENSITIVITY = math.sqrt(2.0)


def mod_sulq_sigma(n: int, d: int, epsilon: float, delta: float) -> tuple[float, float]:
    """(β, σ_Z): paper 003's noise std β (units of A, :func:`mod_sulq_beta`) and the discrete
    Gaussian's σ_Z in grid steps (g = 1/STEPS on n·A's entries) that MOD-SULQ adds.

    σ_Z = max(β·n/g, σ_min), σ_min = dgauss_sigma(Δ, ε, δ) with Δ =
    :func:`~fedsketch.common.dp.grid.l2_in_steps` (√2, g, d(d+1)/2, both rounded): the (ε, δ)
    guarantee of the integer release rests on σ_Z ≥ σ_min (Canonne–Kamath–Steinke), not on the
    paper's analysis of the float mechanism. The paper's β is the larger in every setting
    measured (14–44× σ_min·g/n at paper 003's d = 10, δ = 0.05, ε from 0.1 to 2; about 10× at
    δ = 10⁻⁶, 50× at d = 50 and δ = 10⁻⁶), so the noise is the paper's.
    """
    beta = mod_sulq_beta(n, d, epsilon, delta)
    g = grid.step(1.0)
    delta2 = grid.l2_in_steps(MOD_SULQ_SENSITIVITY, g, d * (d + 1) // 2, both_rounded=True)
    return beta, max(beta * n / g, dgauss_sigma(delta2, epsilon, delta))


def mod_sulq_matrix(task: Task) -> tuple[np.ndarray, float, float, int]:
    """(A~, β, σ_Z, clipped): the noisy second moment MOD-SULQ diagonalizes, as an integer release.

    T = Σ_i rint(x̃_i x̃_iᵀ/g) (g = 1/STEPS, each record encoded on its own); its upper triangle,
    diagonal included, gets i.i.d. N_Z(0, σ_Z²) (σ_Z from :func:`mod_sulq_sigma`) and is mirrored;
    A~ = g·T~/n, whose entries carry noise of std g·σ_Z/n = β (units of A).
    """
    require_finite_epsilon(task, "mod-sulq", "pca")
    if task.neighbouring != "replace_one":
        raise ValueError("MOD-SULQ is analysed under replace-one only (n public); "
                         "use neighbouring='replace_one'")
    x, clipped = scaled_rows(task)
    n, d = x.shape
    beta, sigma_z = mod_sulq_sigma(n, d, task.epsilon, task.delta)
    g = grid.step(1.0)
    upper = np.triu(grid.outer_sum(x, g) + dgauss_noise(sigma_z, (d, d)))
    noisy = upper + np.triu(upper, 1).T
    return g * noisy / n, beta, sigma_z, clipped


def mod_sulq(task: Task) -> Outcome:
    """MOD-SULQ (paper 003 Alg. 1): top-k eigenvectors of A + N, (ε, δ)-DP under replace-one,
    β in :func:`mod_sulq_beta`; N the exact integer noise of :func:`mod_sulq_matrix`."""
    noisy, beta, sigma_z, clipped = mod_sulq_matrix(task)
    return Outcome(top_eigenvectors(noisy, task.k), task.epsilon, task.delta, task.neighbouring,
                   "approximate", clipped,
                   f"beta = {beta:.6g} (noise std per entry of A); discrete Gaussian "
                   f"sigma = {sigma_z:.6g} steps of 2^-20 on n*A")


def ppca(task: Task, n_iter: int = PPCA_SWEEPS) -> Outcome:
    """PPCA (paper 003 Alg. 2): V ~ BMF_k((nε/2)·A), density ∝ exp(tr(Vᵀ(nε/2)AV)) on the Stiefel
    manifold, i.e. the exponential mechanism exp((ε/2)·u(V)) with u(V) = Σ_i ‖Vᵀx̃_i‖² ∈ [0, n],
    whose replace-one sensitivity is 1 (each term lies in [0, 1]); it needs no δ. Under add/remove
    u moves by a term in [0, 1] too, so the same ε bound holds.

    Sampled by ``n_iter`` Gibbs sweeps of :func:`fedsketch.server.bench.bingham.sample_matrix_bingham`
    (A_H = (nε/2)·A, B_H = I_k) from a Haar-random start, all from :func:`noise_rng`. The ε-DP
    guarantee holds for exact samples only; a finite chain is private only asymptotically (kind
    "asymptotic-mcmc", MECHANISMS §10.18).
    """
    require_finite_epsilon(task, "ppca", "pca")
    a, clipped = second_moment(task)
    n = task.x.shape[0]
    v = sample_matrix_bingham(0.5 * n * task.epsilon * a, np.ones(task.k), noise_rng(), n_iter=n_iter)
    notes = (f"{n_iter} Gibbs sweeps from a Haar start; eps-DP only for exact samples "
             "(asymptotic guarantee)")
    return Outcome(v, task.epsilon, 0.0, task.neighbouring, "asymptotic-mcmc", clipped, notes)


METHODS: dict[str, Callable[[Task], Outcome]] = {
    "pca": pca_reference,
    "mod-sulq": mod_sulq,
    "ppca": ppca,
    "random": random_subspace,
}
