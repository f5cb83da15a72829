"""The exponential mechanism for subspace clustering sampled by Gibbs (MECHANISMS §9.4, paper 001
§4): ε-DP for exact samples only. Every draw of the chain comes from the family's ``noise_rng``
(float sampling), looked up on :mod:`fedsketch.server.bench.subspace` at each run so that a test
can seed it; the start is k Haar-random subspaces from ``Task.rng`` (data-independent).
"""

from __future__ import annotations

import numpy as np

from fedsketch.common.data.synthetic import random_orthonormal
from fedsketch.server.bench import subspace as family
from fedsketch.server.bench.bingham import sample_matrix_bingham
from fedsketch.server.bench.subspace.geometry import cluster_scatter, prepare, residuals
from fedsketch.server.bench.task import Outcome, Task, require_finite_epsilon


def gibbs_assign(x: np.ndarray, bases: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """z_i ~ categorical with P(z_i = ℓ) ∝ exp(−(ε/2) d²(x_i, S_ℓ)) (paper eq. 11), by inverse CDF."""
    logits = -0.5 * epsilon * residuals(x, bases)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    cdf = np.cumsum(p, axis=1)
    u = rng.random(x.shape[0])[:, None] * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(axis=1), bases.shape[0] - 1)


def gibbs_sweep(x: np.ndarray, bases: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """One Gibbs iteration: all z given the subspaces, then each U_ℓ given z from the matrix Bingham
    ∝ exp((ε/2) tr(U_ℓᵀA_ℓU_ℓ)), A_ℓ = Σ_{z_i=ℓ} x_ix_iᵀ (eq. 12; B = (ε/2)I_q, not App. D.2's εI_q)."""
    z = gibbs_assign(x, bases, epsilon, rng)
    b = np.full(bases.shape[2], 0.5 * epsilon)
    return np.stack([
        sample_matrix_bingham(cluster_scatter(x, z, ell), b, rng, n_iter=1, V0=bases[ell])
        for ell in range(bases.shape[0])
    ])


def gibbs_chain(x: np.ndarray, bases: np.ndarray, epsilon: float, n_iter: int,
                rng: np.random.Generator) -> np.ndarray:
    """The subspaces after ``n_iter`` :func:`gibbs_sweep` iterations from ``bases``."""
    for _ in range(n_iter):
        bases = gibbs_sweep(x, bases, epsilon, rng)
    return bases


def gibbs_subspace(task: Task, n_iter: int = 300) -> Outcome:
    """Exponential mechanism p(S, z) ∝ exp(−(ε/2) Σ_i d²(x_i, S_{z_i})) by Gibbs (kind "asymptotic-mcmc").

    Score sensitivity 1 (d² ∈ [0, 1]), so an EXACT sample is ε-DP under replace-one (Prop. 4.1);
    only the subspaces of the last sample are released (its marginal is also ε-DP under add/remove:
    adding x_i multiplies p(S) by Σ_ℓ exp(−(ε/2)d²(x_i, S_ℓ))/E[·] ∈ [e^{−ε/2}, e^{ε/2}]). The
    chain starts from k Haar-random subspaces drawn from ``Task.rng`` (data-independent, MECHANISMS
    §9.4; the paper starts from the non-private SSC/LRR solution, which a finite chain can carry
    into the output) and runs a finite number of iterations of float draws, so the output is
    private only asymptotically: no formal guarantee holds for this finite run.
    """
    require_finite_epsilon(task, "gibbs", "kplane")
    x, clipped = prepare(task)
    start = np.stack([random_orthonormal(task.d, task.q, task.rng) for _ in range(task.k)])
    bases = gibbs_chain(x, start, task.epsilon, n_iter, family.noise_rng())
    notes = (f"{n_iter} Gibbs iterations from Haar-random subspaces; eps-DP only for exact samples "
             "(asymptotic guarantee); last sample's subspaces released")
    return Outcome(bases, task.epsilon, 0.0, task.neighbouring, "asymptotic-mcmc", clipped, notes)
