"""k-plane clustering: the non-private reference (paper 001 App. E; Bradley–Mangasarian) and SuLQ
k-plane (§9.5, App. E Alg. 5), whose k noisy scatter matrices per iteration are integer releases
with exact discrete Gaussian noise (:mod:`fedsketch.common.dp.grid`, OS random bits), (ε, δ)-DP
over all T·k queries by advanced composition. ``Task.rng`` seeds the reference's restarts and
SuLQ's data-independent start.
"""

from __future__ import annotations

import math

import numpy as np

from fedsketch.common.data.synthetic import random_orthonormal
from fedsketch.common.dp import grid
from fedsketch.common.dp.calibration import advanced_composition, advanced_composition_inverse, dgauss_sigma
from fedsketch.common.dp.samplers import dgauss_noise
from fedsketch.server.bench.pca import top_eigenvectors
from fedsketch.server.bench.subspace.geometry import (
    cluster_scatter,
    prepare,
    residuals,
    span_basis,
    subspace_cost,
)
from fedsketch.server.bench.task import Outcome, Task, require_finite_epsilon


def kplane_fit(x: np.ndarray, bases: np.ndarray, max_iter: int = 100) -> np.ndarray:
    """Lloyd-style k-plane from ``bases``: assign each x_i to its nearest subspace, refit each
    subspace as the top-q eigenvectors of its scatter Σ x_i x_iᵀ; stop when assignments repeat.

    An empty cluster is refitted to the q records worst fitted by the current subspaces.
    """
    k, _, q = bases.shape
    labels = None
    for _ in range(max_iter):
        res = residuals(x, bases)
        new = res.argmin(axis=1)
        if labels is not None and np.array_equal(new, labels):
            break
        labels = new
        counts = np.bincount(labels, minlength=k)
        worst = x[np.argsort(res.min(axis=1))[-q:]] if counts.min() == 0 else None  # sort only if needed
        scatters = [cluster_scatter(x, labels, ell) if counts[ell] else worst.T @ worst
                    for ell in range(k)]
        bases = np.stack([top_eigenvectors(a, q) for a in scatters])
    return bases


def kplane_start(x: np.ndarray, k: int, q: int, rng: np.random.Generator) -> np.ndarray:
    """k subspaces, each spanned (QR) by q distinct records drawn at random."""
    picks = [rng.choice(x.shape[0], size=min(q, x.shape[0]), replace=False) for _ in range(k)]
    return np.stack([span_basis(x[p], x.shape[1], q, rng) for p in picks])


def kplane_solve(x: np.ndarray, k: int, q: int, rng: np.random.Generator, restarts: int = 10) -> np.ndarray:
    """Best (lowest cost) of ``restarts`` k-plane runs from :func:`kplane_start`."""
    fits = [kplane_fit(x, kplane_start(x, k, q, rng)) for _ in range(restarts)]
    return min(fits, key=lambda b: subspace_cost(b, x))


def kplane_reference(task: Task, restarts: int = 10) -> Outcome:
    """Non-private k-plane (kind "none"): the best of ``restarts`` runs seeded from Task.rng."""
    x, clipped = prepare(task)
    bases = kplane_solve(x, task.k, task.q, task.rng, restarts)
    return Outcome(bases, math.inf, 0.0, task.neighbouring, "none", clipped,
                   f"non-private k-plane, best of {restarts} restarts")


def sulq_sensitivity(neighbouring: str) -> float:
    """L2 sensitivity of A_ℓA_ℓᵀ for ‖x‖ ≤ 1 and public subspaces.

    replace-one: ‖xxᵀ − x'x'ᵀ‖_F² = ‖x‖⁴ + ‖x'‖⁴ − 2(xᵀx')² ≤ 2, so √2 (the paper's bound is 2);
    add/remove: ‖xxᵀ‖_F = ‖x‖² ≤ 1.
    """
    return math.sqrt(2.0) if neighbouring == "replace_one" else 1.0


def sulq_plan(epsilon: float, delta: float, queries: int, neighbouring: str,
              d: int) -> tuple[float, float, float]:
    """(ε, δ, σ_Z) of each of ``queries`` noisy d × d scatter matrices so that all of them are
    (ε', δ') = (epsilon, delta) by advanced composition: δ = δ'/(queries + 1), ε by bisection;
    σ_Z (grid steps, g = 1/STEPS) = dgauss_sigma(Δ, ε, δ), Δ =
    :func:`~fedsketch.common.dp.grid.l2_in_steps` (Δ2, g, d², rounded on both sides under
    replace-one), Δ2 from :func:`sulq_sensitivity`: each query is then (ε, δ)-DP (CKS).
    """
    eps_q, delta_q = advanced_composition_inverse(epsilon, delta, queries)
    g = grid.step(1.0)
    steps = grid.l2_in_steps(sulq_sensitivity(neighbouring), g, d * d,
                             both_rounded=neighbouring == "replace_one")
    return eps_q, delta_q, dgauss_sigma(steps, eps_q, delta_q)


def noisy_scatter(rows: np.ndarray, sigma_z: float) -> np.ndarray:
    """B~ = g·(Σ_i rint(x_i x_iᵀ/g) + W), g = 1/STEPS, W (d × d) i.i.d. N_Z(0, σ_Z²) integers,
    not symmetrized (Alg. 5): an integer release, exact noise from OS random bits."""
    d = rows.shape[1]
    g = grid.step(1.0)
    return g * (grid.outer_sum(rows, g) + dgauss_noise(sigma_z, (d, d)))


def sulq_step(x: np.ndarray, bases: np.ndarray, sigma_z: float) -> np.ndarray:
    """One SuLQ k-plane iteration: k queries, each the top-q left singular vectors of the noisy
    scatter of the records nearest (in the current public subspaces) to subspace ℓ."""
    labels = residuals(x, bases).argmin(axis=1)
    q = bases.shape[2]
    return np.stack([
        np.linalg.svd(noisy_scatter(x[labels == ell], sigma_z))[0][:, :q] for ell in range(bases.shape[0])
    ])


def sulq_kplane(task: Task, iterations: int = 10) -> Outcome:
    """SuLQ k-plane (kind "approximate"): ``iterations`` × k noisy queries, total (ε, δ) = Task's.

    The start is data-independent (Haar subspaces from Task.rng); assignments are not released.
    """
    require_finite_epsilon(task, "sulq-kplane", "kplane")
    x, clipped = prepare(task)
    queries = iterations * task.k
    eps_q, delta_q, sigma_z = sulq_plan(task.epsilon, task.delta, queries, task.neighbouring, task.d)
    bases = np.stack([random_orthonormal(task.d, task.q, task.rng) for _ in range(task.k)])
    for _ in range(iterations):
        bases = sulq_step(x, bases, sigma_z)
    eps_spent, delta_spent = advanced_composition(eps_q, delta_q, queries)
    notes = (f"{queries} discrete Gaussian queries at eps={eps_q:.6g}, delta={delta_q:.3g}, "
             f"Delta2={sulq_sensitivity(task.neighbouring):.6g}, "
             f"sigma={grid.step(1.0) * sigma_z:.6g} (scatter units)")
    return Outcome(bases, eps_spent, delta_spent, task.neighbouring, "approximate", clipped, notes)
