"""The geometry every subspace-clustering method shares (MECHANISMS §9.1, §9.6): distances,
costs, the rows' public bound and scatter matrices.

d(x, S)² = ‖x‖² − ‖Uᵀx‖² (projection residual). Between two q-dimensional subspaces,
d(S, S') = ‖sin Θ(S, S')‖_F = √(q − ‖UᵀU'‖_F²), the Frobenius norm of the sines of the principal
angles. Paper 001 prints it as ‖UUᵀ − U'U'ᵀ‖_F, which is √2 times larger; that projection
Frobenius form is NOT used (§10 item 16). d_W² = min over permutations π of Σ_j d²(Ŝ_j, S*_π(j))
(Hungarian algorithm on the k×k matrix of d²). cost(C; X) = (1/n) Σ_i min_j d²(x_i, S_j), the mean
over records of the squared residual to the nearest subspace (paper eq. 3).

Units: records divided by the public norm bound (‖x‖ ≤ 1, dimensionless); subspaces as
orthonormal bases (d, q), a set of them as (k, d, q).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import linear_sum_assignment

from fedsketch.server.bench.task import Task, clip_rows_to_norm


def residuals(x: np.ndarray, bases: np.ndarray) -> np.ndarray:
    """(n, k) squared distances d²(x_i, S_j) = ‖x_i‖² − ‖U_jᵀx_i‖², clipped at 0 (rounding)."""
    proj = np.einsum("nd,kdq->nkq", x, bases)
    sq = np.einsum("nd,nd->n", x, x)[:, None] - np.einsum("nkq,nkq->nk", proj, proj)
    return np.maximum(sq, 0.0)


def subspace_cost(bases: np.ndarray, x: np.ndarray) -> float:
    """k-means subspace cost (paper 001 eq. 3): (1/n) Σ_i min_j d²(x_i, S_j)."""
    return float(residuals(np.asarray(x, dtype=np.float64), bases).min(axis=1).mean())


def subspace_distance(u: np.ndarray, v: np.ndarray) -> float:
    """d(S, S') = ‖sin Θ‖_F = √(q − ‖UᵀV‖_F²) for orthonormal (d, q) bases U, V.

    Equal to ‖UUᵀ − VVᵀ‖_F / √2: the projection Frobenius form divided by √2 (§10 item 16).
    """
    return math.sqrt(max(u.shape[1] - float(np.sum((u.T @ v) ** 2)), 0.0))


def wasserstein_distance(a: np.ndarray, b: np.ndarray) -> float:
    """d_W(A, B) = √(min_π Σ_j d²(A_j, B_π(j))) for sets of bases (k, d, q), Hungarian matching."""
    if a.shape != b.shape:
        raise ValueError(f"sets of subspaces differ in shape: {a.shape} vs {b.shape}")
    cost = np.array([[subspace_distance(u, v) ** 2 for v in b] for u in a])
    rows, cols = linear_sum_assignment(cost)
    return math.sqrt(float(cost[rows, cols].sum()))


def prepare(task: Task) -> tuple[np.ndarray, int]:
    """Rows clipped to ‖x‖ ≤ norm_bound (count returned; refused under strict), divided by the bound.

    Raises ValueError unless 1 ≤ q < d.
    """
    if not 1 <= task.q < task.d:
        raise ValueError(f"subspace dimension q must satisfy 1 <= q < d = {task.d}, got q = {task.q}")
    x, clipped = clip_rows_to_norm(np.asarray(task.x, dtype=np.float64), task.norm_bound, task.strict)
    return x / task.norm_bound, clipped


def cluster_scatter(x: np.ndarray, labels: np.ndarray, ell: int) -> np.ndarray:
    """A_ℓ A_ℓᵀ = Σ_{labels_i = ℓ} x_i x_iᵀ (d × d)."""
    rows = x[labels == ell]
    return rows.T @ rows


def span_basis(points: np.ndarray, d: int, q: int, rng: np.random.Generator) -> np.ndarray:
    """(d, q) orthonormal basis (QR) of the span of ``points`` completed by Gaussian directions."""
    extra = rng.standard_normal((q - points.shape[0], d))
    return np.linalg.qr(np.vstack([points, extra]).T)[0]
