"""Sample-and-aggregate around TSC (MECHANISMS §9.2–9.3, paper 001 Alg. 1–2): (ε, δ)-DP under
replace-one where Theorem 3.1's conditions hold and its float Gaussian noise is taken as exact;
otherwise a run without a privacy guarantee, labelled so. Its subsets, TSC's draws and the noise
come from the family's ``noise_rng``, looked up on :mod:`fedsketch.server.bench.subspace` at each
run so that a test can seed it.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial.distance import cdist

from fedsketch.common.data.synthetic import random_orthonormal
from fedsketch.server.bench import subspace as family
from fedsketch.server.bench.pca import top_eigenvectors
from fedsketch.server.bench.subspace.geometry import prepare, span_basis
from fedsketch.server.bench.task import Outcome, Task, require_finite_epsilon


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
    bases = [span_basis(x[rng.choice(mem, size=min(q, mem.size), replace=False)], d, q, rng)
             for mem in members]
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

    ρ(t) is the mean of the top ⌊s/β⌋ values of r_i(t), at least 1 (all m of them when ⌊s/β⌋ > m:
    such a run is outside the theorem, and :func:`theorem_gap` says so); t is rounded up (ρ is
    non-decreasing in t, so this is conservative); for t > m, r_i(t) is undefined and ρ(t) is the
    output diameter Λ, which bounds every later term, so the maximum stops there.
    """
    m = radii.shape[0]
    s = math.sqrt(m)
    top = max(1, math.floor(s / beta))  # beyond m, the slice takes all m: theorem_gap says why
    best, j = 0.0, 0
    while (t := math.ceil(t0 + (j + 1) * s)) <= m:
        rho = float(np.sort(radii[:, t - 1])[-top:].mean())
        best = max(best, rho * math.exp(-beta * j))
        j += 1
    return 2.0 * max(best, diameter * math.exp(-beta * j))


def smoothing_beta(epsilon: float, delta: float, dim: int) -> float:
    """β = ε/(4(D + ln(2/δ))) (dimensionless), the smoothing rate of Alg. 1 step 6 for outputs in
    R^D (D = ``dim``)."""
    return epsilon / (4.0 * (dim + math.log(2.0 / delta)))


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
    alpha = epsilon / (5.0 * math.sqrt(2.0 * math.log(2.0 / delta)))
    beta = smoothing_beta(epsilon, delta, dim)
    t0 = math.ceil((m + math.sqrt(m)) / 2.0 + 1.0)
    radii = neighbour_radii(points)
    centre = points[int(np.argmin(radii[:, t0 - 1]))]
    scale = smooth_bound(radii, t0, beta, diameter) / alpha
    return centre + scale * rng.standard_normal(dim), scale


def theorem_gap(epsilon: float, delta: float, m: int, dim: int) -> str | None:
    """Why Theorem 3.1 (Nissim–Raskhodnikova–Smith Thm 4.2) does not cover sample-and-aggregate
    with m subsets and outputs in R^D (D = ``dim``), or None when it does.

    It needs ε > 2D/√m, and ρ(t), the mean of the top ⌊s/β⌋ of the m distances r_i(t)
    (s = √m, β = :func:`smoothing_beta`), needs ⌊s/β⌋ ≤ m, as :func:`smooth_bound` computes it.
    Both hold once m ≥ 1/β², since 1/β = 4(D + ln(2/δ))/ε > 2D/ε; the second fails whenever the
    first does. The note names the failing conditions and that m. Both depend only on public
    quantities. (The theorem's m = ω(log² n) is asymptotic and is not checked.)
    """
    beta = smoothing_beta(epsilon, delta, dim)
    reasons = []
    if epsilon <= 2.0 * dim / math.sqrt(m):
        reasons.append(f"eps = {epsilon:g} <= 2D/sqrt(m) = {2.0 * dim / math.sqrt(m):.4g}")
    top = math.floor(math.sqrt(m) / beta)
    if top > m:
        reasons.append(f"rho(t) averages the top floor(s/beta) = {top} of only m distances")
    if not reasons:
        return None
    return f"{'; '.join(reasons)} (D = {dim}, m = {m}; both hold from m >= {math.ceil(1 / beta**2)} subsets)"


def sample_aggregate(task: Task, m: int | None = None, n_neighbours: int | None = None) -> Outcome:
    """Sample-and-aggregate around TSC, (ε, δ)-DP under replace-one where Theorem 3.1 applies.

    m subsets (default round(√n), at least 4, so that t0 ≤ m) of n // m records; TSC with
    ``n_neighbours`` (default max(q, ⌊n/(6km)⌋), the upper end n_ℓ/6 of Lemma 3.5); each output is
    :func:`canonical_vector` (D = k d², diameter Λ = √(2kq)); the noisy aggregate is projected back
    to rank-q projectors.

    Its noise is float Gaussian (the smooth-sensitivity analysis needs the continuous law), so
    where the theorem applies the kind is "exact-sampling". Where it does not
    (:func:`theorem_gap`: ε ≤ 2D/√m, which holds at every moderate n, e.g. D = 300 for k = 3,
    d = 10; or ⌊s/β⌋ > m), the run still happens, for comparison, with kind "none" (no privacy
    guarantee) and the reason in ``notes``. The noise std S(B)/α is computed from the data: the
    notes label it non-private.
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
    rng = family.noise_rng()
    subsets = draw_subsets(n, m, rng)
    points = np.stack([canonical_vector(tsc(x[s], k, q, n_neighbours, rng)) for s in subsets])
    noisy, scale = sample_aggregate_combine(points, task.epsilon, task.delta, math.sqrt(2.0 * k * q), rng)
    gap = theorem_gap(task.epsilon, task.delta, m, points.shape[1])
    notes = f"m={m} subsets of {n // m}, D={points.shape[1]}"
    notes += "" if gap is None else f"; no guarantee: {gap}"
    notes += f"; non-private: noise std {scale:.4g} (smooth sensitivity of the data)"
    return Outcome(projectors_to_bases(noisy, k, d, q), task.epsilon, task.delta, task.neighbouring,
                   "exact-sampling" if gap is None else "none", clipped, notes)
