"""Differentially private subspace clustering (MECHANISMS §9; Wang, Wang, Singh, paper 001).

A clustering is k subspaces of dimension q of R^d, each given by an orthonormal basis; a set is an
array of bases (k, d, q). Every mechanism clips the rows to ``Task.norm_bound`` (refusing under
``Task.strict``) and works on x / norm_bound, so ‖x_i‖ ≤ 1 as the paper assumes; subspaces are
invariant to that scaling. SuLQ's noise is exact integer noise on grid-encoded scatter matrices
(:mod:`fedsketch.common.dp.grid`, OS random bits); the other privacy randomness (the Gibbs
sampler's draws, the subsets and noise of sample-and-aggregate) comes from
:func:`fedsketch.common.dp.samplers.noise_rng` (float sampling); ``Task.rng`` only seeds
non-private work (the reference's restarts, SuLQ's data-independent start).

Distances (§9.1, §10 item 16). d(x, S)² = ‖x‖² − ‖Uᵀx‖² (projection residual). Between two
q-dimensional subspaces this module uses d(S, S') = ‖sin Θ(S, S')‖_F = √(q − ‖UᵀU'‖_F²), the
Frobenius norm of the sines of the principal angles. Paper 001 prints it as ‖UUᵀ − U'U'ᵀ‖_F, which
is √2 times larger; that projection Frobenius form is NOT used. d_W² = min over permutations π of
Σ_j d²(Ŝ_j, S*_π(j)) (Hungarian algorithm on the k×k matrix of d²). cost(C; X) = (1/n) Σ_i min_j
d²(x_i, S_j), the mean over records of the squared residual to the nearest subspace (paper eq. 3).

Mechanisms (:data:`METHODS`): ``kplane`` non-private Lloyd-style k-plane; ``sulq-kplane`` k-plane
with Gaussian-noised scatter matrices (§9.5, (ε, δ)-DP over all T·k queries by advanced
composition); ``gibbs`` the exponential mechanism sampled by Gibbs (§9.4, ε-DP only for exact
samples); ``sample-aggregate`` sample-and-aggregate around TSC (§9.2–9.3, (ε, δ)-DP).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial.distance import cdist

from fedsketch.common.dp import grid
from fedsketch.common.dp.calibration import advanced_composition, advanced_composition_inverse, dgauss_sigma
from fedsketch.common.dp.samplers import dgauss_noise, noise_rng
from fedsketch.common.synthetic import random_orthonormal
from fedsketch.server.bench.bingham import sample_matrix_bingham
from fedsketch.server.bench.pca import top_eigenvectors
from fedsketch.server.bench.task import Outcome, Task, clip_rows_to_norm, require_finite_epsilon

# ---------------------------------------------------------------------------------------------
# Distances and costs (§9.1, §9.6)


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


# ---------------------------------------------------------------------------------------------
# Shared steps


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


# ---------------------------------------------------------------------------------------------
# Non-private k-plane (paper 001 App. E; Bradley–Mangasarian)


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
    return np.stack([_span(x[p], x.shape[1], q, rng) for p in picks])


def _span(points: np.ndarray, d: int, q: int, rng: np.random.Generator) -> np.ndarray:
    """(d, q) orthonormal basis (QR) of the span of ``points`` completed by Gaussian directions."""
    extra = rng.standard_normal((q - points.shape[0], d))
    return np.linalg.qr(np.vstack([points, extra]).T)[0]


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


# ---------------------------------------------------------------------------------------------
# SuLQ k-plane (§9.5, paper 001 App. E Alg. 5)


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


# ---------------------------------------------------------------------------------------------
# Exponential mechanism by Gibbs sampling (§9.4, paper 001 §4)


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
    chain starts from the non-private k-plane solution (as the paper starts from SSC/LRR) and runs
    a finite number of iterations, so the output is private only asymptotically: no formal
    guarantee holds for this finite run.
    """
    require_finite_epsilon(task, "gibbs", "kplane")
    x, clipped = prepare(task)
    start = kplane_solve(x, task.k, task.q, task.rng)
    bases = gibbs_chain(x, start, task.epsilon, n_iter, noise_rng())
    notes = (f"{n_iter} Gibbs iterations from the non-private k-plane; eps-DP only for exact samples "
             "(asymptotic guarantee); last sample's subspaces released")
    return Outcome(bases, task.epsilon, 0.0, task.neighbouring, "asymptotic-mcmc", clipped, notes)


# ---------------------------------------------------------------------------------------------
# Sample-and-aggregate with TSC (§9.2–9.3, paper 001 Alg. 1–2)


def tsc(x: np.ndarray, k: int, q: int, n_neighbours: int, rng: np.random.Generator) -> np.ndarray:
    """Simplified thresholding-based subspace clustering (Alg. 2): link each x_i to the
    ``n_neighbours`` records of largest |⟨x_i, x_j⟩|, take connected components of the undirected
    graph, keep the k largest, span (QR) q records drawn from each without replacement; pad with
    Haar subspaces when there are fewer than k components."""
    n, d = x.shape
    sim = np.abs(x @ x.T)
    np.fill_diagonal(sim, -np.inf)
    nbrs = np.argpartition(-sim, n_neighbours - 1, axis=1)[:, :n_neighbours]
    graph = coo_matrix((np.ones(nbrs.size), (np.repeat(np.arange(n), n_neighbours), nbrs.ravel())), (n, n))
    _, comp = connected_components(graph, directed=False)
    largest = np.argsort(-np.bincount(comp), kind="stable")[:k]
    members = [np.flatnonzero(comp == c) for c in largest]
    bases = [_span(x[rng.choice(mem, size=min(q, mem.size), replace=False)], d, q, rng) for mem in members]
    bases += [random_orthonormal(d, q, rng) for _ in range(k - len(bases))]
    return np.stack(bases)


def canonical_vector(bases: np.ndarray) -> np.ndarray:
    """The k projectors U_jU_jᵀ, sorted lexicographically by their diagonals, stacked in R^{k d²}.

    A permutation-free representation in which Euclidean distance is the aggregation metric.
    """
    proj = np.einsum("kdq,keq->kde", bases, bases)
    diag = np.einsum("kdd->kd", proj)
    order = np.lexsort(diag.T[::-1])
    return proj[order].ravel()


def projectors_to_bases(vector: np.ndarray, k: int, d: int, q: int) -> np.ndarray:
    """Nearest rank-q projectors: top-q eigenvectors of each symmetrized d×d block of ``vector``."""
    blocks = vector.reshape(k, d, d)
    return np.stack([top_eigenvectors(0.5 * (b + b.T), q) for b in blocks])


def draw_subsets(n: int, m: int, rng: np.random.Generator, max_tries: int = 1000) -> np.ndarray:
    """(m, n // m) indices: m subsets, each uniform without replacement and independent, redrawn
    until no record lies in more than √m of them (Alg. 1 step 3)."""
    size = n // m
    for _ in range(max_tries):
        subsets = np.stack([rng.choice(n, size=size, replace=False) for _ in range(m)])
        if np.bincount(subsets.ravel(), minlength=n).max() <= math.sqrt(m):
            return subsets
    raise ValueError(f"no draw of {m} subsets of {size} records kept every record in <= sqrt(m) subsets")


def neighbour_radii(points: np.ndarray) -> np.ndarray:
    """(m, m) r with r[i, t−1] = r_i(t), the distance from s_i to its t-th nearest point of B
    (s_i itself is the first, r_i(1) = 0)."""
    return np.sort(cdist(points, points), axis=1)


def smooth_bound(radii: np.ndarray, t0: int, beta: float, diameter: float) -> float:
    """S(B) = 2 max_{j≥0} ρ(t0 + (j+1)s) e^{−βj}, s = √m (Alg. 1 step 6).

    ρ(t) is the mean of the top ⌊s/β⌋ (between 1 and m) values of r_i(t); t is rounded up (ρ is
    non-decreasing in t, so this is conservative); for t > m, r_i(t) is undefined and ρ(t) is the
    output diameter Λ, which bounds every later term, so the maximum stops there.
    """
    m = radii.shape[0]
    s = math.sqrt(m)
    top = min(m, max(1, math.floor(s / beta)))
    best, j = 0.0, 0
    while (t := math.ceil(t0 + (j + 1) * s)) <= m:
        rho = float(np.sort(radii[:, t - 1])[-top:].mean())
        best = max(best, rho * math.exp(-beta * j))
        j += 1
    return 2.0 * max(best, diameter * math.exp(-beta * j))


def sample_aggregate_combine(points: np.ndarray, epsilon: float, delta: float, diameter: float,
                             rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """Sample-and-aggregate's combining step (Alg. 1 steps 5–7; unrelated to the coordinator's
    aggregation of device sketches): the m subset outputs ``points`` (m, D) become their center of
    attention plus smooth-sensitivity Gaussian noise; returns the noisy point (D,) and the noise
    standard deviation S(B)/α, both in the units of ``points`` (as ``diameter`` Λ).

    α = ε/(5√(2 ln(2/δ))), β = ε/(4(D + ln(2/δ))), t0 = ⌈(m + s)/2 + 1⌉, g(B) = s_{i*} with
    i* = argmin_i r_i(t0), output g(B) + (S(B)/α)·u, u ~ N(0, I_D).
    """
    m, dim = points.shape
    log_term = math.log(2.0 / delta)
    alpha = epsilon / (5.0 * math.sqrt(2.0 * log_term))
    beta = epsilon / (4.0 * (dim + log_term))
    t0 = math.ceil((m + math.sqrt(m)) / 2.0 + 1.0)
    radii = neighbour_radii(points)
    centre = points[int(np.argmin(radii[:, t0 - 1]))]
    scale = smooth_bound(radii, t0, beta, diameter) / alpha
    return centre + scale * rng.standard_normal(dim), scale


def sample_aggregate(task: Task, m: int | None = None, n_neighbours: int | None = None) -> Outcome:
    """Sample-and-aggregate around TSC (kind "approximate", (ε, δ)-DP under replace-one).

    m subsets (default round(√n), at least 4, so that t0 ≤ m) of n // m records; TSC with
    ``n_neighbours`` (default max(q, ⌊n/(6km)⌋), the upper end n_ℓ/6 of Lemma 3.5); each output is
    :func:`canonical_vector` (D = k d², diameter Λ = √(2kq)); the noisy aggregate is projected back
    to rank-q projectors. Theorem 3.1 (Nissim–Raskhodnikova–Smith) is stated for ε > 2D/√m; when
    that fails (always at moderate n: D = 300 for k = 3, d = 10) the notes say so.
    """
    require_finite_epsilon(task, "sample-aggregate", "kplane")
    if task.neighbouring != "replace_one":
        raise ValueError("sample-and-aggregate is stated for replace-one neighbours (fixed n) only")
    x, clipped = prepare(task)
    n, d, k, q = task.x.shape[0], task.d, task.k, task.q
    m = max(4, round(math.sqrt(n))) if m is None else m
    n_neighbours = max(q, n // (6 * k * m)) if n_neighbours is None else n_neighbours
    if m < 4:
        raise ValueError(f"need m >= 4 subsets (so that t0 <= m), got {m}")
    if n // m <= n_neighbours:
        raise ValueError(f"subsets of n // m = {n // m} records need more than n_neighbours = {n_neighbours}")
    rng = noise_rng()
    subsets = draw_subsets(n, m, rng)
    points = np.stack([canonical_vector(tsc(x[s], k, q, n_neighbours, rng)) for s in subsets])
    noisy, scale = sample_aggregate_combine(points, task.epsilon, task.delta, math.sqrt(2.0 * k * q), rng)
    dim = points.shape[1]
    notes = f"m={m} subsets of {n // m}, D={dim}, noise std {scale:.4g}"
    if task.epsilon <= 2.0 * dim / math.sqrt(m):
        notes += f"; eps <= 2D/sqrt(m) = {2.0 * dim / math.sqrt(m):.4g}: Thm 3.1's condition fails"
    return Outcome(projectors_to_bases(noisy, k, d, q), task.epsilon, task.delta, task.neighbouring,
                   "approximate", clipped, notes)


METHODS: dict[str, Callable[[Task], Outcome]] = {
    "kplane": kplane_reference,
    "sulq-kplane": sulq_kplane,
    "gibbs": gibbs_subspace,
    "sample-aggregate": sample_aggregate,
}
