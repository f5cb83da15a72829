"""White and colored Gaussian noise on converged k-means centroids (MECHANISMS §7): ``white`` and
``colored``, local-sensitivity (ε, δ) heuristics.

Noise of covariance Σ is added to the centroids of a converged non-private k-means of the records
clipped to the public box, calibrated so that every local difference Δ of the fixed-assignment
model satisfies ΔᵀΣ⁻¹Δ ≤ γ. The release is an integer vector (:func:`gaussian_release`): each
centroid whitened by Σ_j^{−1/2}, encoded on a public grid, plus exact discrete Gaussian noise.
**Local sensitivity is not a worst-case DP guarantee**: Σ depends on the data, and re-clustering
after a change is ignored; outcomes are labelled "local-sensitivity".

Two memos live here with what they cache: the converged clusterings (:func:`converged_clusters`,
keyed by the SHA-256 of clipped records, box and k) and the unit-level covariance covers
(:func:`unit_cover`, keyed by the bytes of the constraint rows). The noise is exact, from OS
random bits (:func:`fedsketch.common.dp.samplers.dgauss_noise`). ``Outcome.notes`` is JSON:
the public calibration (γ, the grid step, σ in steps) and, under ``"non_private"``, operator
diagnostics computed from the records without noise (σ, Δ2, the covariance's trace, the solver's
gap).

Units: records, centroids and local differences in data units; covariances in squared data
units; ε, δ and γ dimensionless.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from fedsketch.common.dp import grid
from fedsketch.common.dp.calibration import dgauss_sigma, gamma_mahalanobis
from fedsketch.common.dp.lloyd import cluster_stats
from fedsketch.common.dp.samplers import dgauss_noise
from fedsketch.common.sketch.box import Box
from fedsketch.server.bench.kmeans.budget import relation_factor
from fedsketch.server.bench.task import Outcome, Task, clip_rows_to_box, public_box, require_finite_epsilon
from fedsketch.server.decode.kmeans import converged_kmeans

#: The colored mechanism enumerates the 2^d corners of the box.
MAX_CORNER_DIM = 12
#: Fixed point of §7.6: target relative duality gap, iteration cap, full check period, pruning.
COVER_TOL = 1e-4
COVER_MAX_ITER = 20000
COVER_CHECK_EVERY = 100
COVER_PRUNE = 1e-12

_T = TypeVar("_T")


@dataclass(frozen=True)
class Clusters:
    """A converged non-private k-means of the clipped records: exact cluster means ``centroids``
    (k, d) of ``labels``, sizes ``counts`` (all ≥ 2), the box and the clipped-row count."""

    x: np.ndarray
    labels: np.ndarray
    centroids: np.ndarray
    counts: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    clipped: int


#: Memoized converged clusterings: few entries, as each holds a copy of the clipped records.
CLUSTERS_CACHE = 2
_CLUSTERS: dict[str, Clusters] = {}


def _memo(cache: dict[str, _T], limit: int, key: str, compute: Callable[[], _T]) -> _T:
    """``cache[key]``, computed by ``compute`` on a miss; the oldest entry goes beyond ``limit``."""
    if key not in cache:
        if len(cache) >= limit:
            del cache[next(iter(cache))]
        cache[key] = compute()
    return cache[key]


def _digest(*arrays: np.ndarray) -> str:
    """Hex SHA-256 of each array's contiguous bytes followed by its shape: the memo key."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
        h.update(str(a.shape).encode())
    return h.hexdigest()


def converged_clusters(task: Task) -> Clusters:
    """Clip to the public box, run :func:`converged_kmeans` and take the exact means of its final
    assignment (the query f(X) of §7.1). Refuses clusters with < 2 records.

    The local-sensitivity calibration treats f(X) as a fixed function of X, so it is one: the
    k-means++ seeds come from a generator seeded by the SHA-256 of (clipped records, box, k)
    (``Task.rng`` is not used), and the result is memoized under that digest, so repeated runs
    on one dataset (``fedsketch compare``'s trials) reuse one clustering and differ only in
    their noise. The memo holds a read-only copy of the clipped records; ``clipped`` is counted
    for each call.
    """
    lo, hi = public_box(task)
    x, clipped = clip_rows_to_box(np.asarray(task.x, dtype=np.float64), lo, hi, task.strict)
    key = _digest(x, lo, hi, np.array(task.k))

    def compute() -> Clusters:
        """The clustering on a memo-owned, read-only copy of the clipped records."""
        own = x.copy()
        own.setflags(write=False)
        _, labels = converged_kmeans(own, task.k, np.random.default_rng(int(key[:16], 16)))
        counts, sums = cluster_stats(own, labels, task.k)
        if counts.min() < 2:
            raise ValueError("every cluster needs >= 2 records for the local sensitivity "
                             "(x_i − c)/(n_j − 1), and one of the converged k-means has fewer: "
                             "lower k")  # its size is not said: it is a statistic of the records
        return Clusters(own, labels, sums / counts[:, None], counts, lo, hi, 0)

    return replace(_memo(_CLUSTERS, CLUSTERS_CACHE, key, compute), clipped=clipped)


def box_corners(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The 2^d corners (2^d, d) of the box Π[lo_l, hi_l]."""
    return np.array(list(itertools.product(*zip(lo, hi, strict=True))), dtype=np.float64)


def constraint_vectors(xj: np.ndarray, cj: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                       neighbouring: str) -> np.ndarray:
    """Local differences of cluster j's centroid (rows, data units), fixed-assignment model.

    Removal of x_i: (x_i − c_j)/(n_j − 1) (§7.1). Addition of x' in the box (a convex constraint
    is worst at a corner): (x' − c_j)/(n_j + 1) under add/remove; under replace-one the rows use
    n_j instead, because a replacement x_i → x' moves c_j by (x_i − c_j)/n_j + (c_j − x')/n_j
    (same cluster) or moves two blocks by (x_i − c)/(n − 1) and (c_j − x')/(n_j + 1): in both
    cases ‖Δ‖_Σ⁻¹ ≤ ‖removal row‖ + ‖addition row‖, covered by the level γ/4 (see
    :func:`constraint_level`).
    """
    n_j = xj.shape[0]
    add_den = n_j + 1 if neighbouring == "add_remove" else n_j
    return np.vstack([(xj - cj) / (n_j - 1), (box_corners(lo, hi) - cj) / add_den])


def constraint_level(epsilon: float, delta: float, neighbouring: str) -> float:
    """γ/f² with γ = gamma_mahalanobis(ε, δ) (§7.2, the discrete Gaussian's) and f =
    relation_factor: under replace-one each row of :func:`constraint_vectors` may take a quarter,
    so that a sum of a removal and an addition row stays within γ."""
    return gamma_mahalanobis(epsilon, delta) / relation_factor(neighbouring) ** 2


def _farthest_corner_distance(lo: np.ndarray, hi: np.ndarray, c: np.ndarray) -> float:
    """max over x' in the box of ‖x' − c‖₂ (data units)."""
    return float(np.sqrt(np.maximum((lo - c) ** 2, (hi - c) ** 2).sum()))


def white_sensitivity(clusters: Clusters, neighbouring: str) -> float:
    """Δ2 = max over all rows of :func:`constraint_vectors`, in closed form (no corner
    enumeration): the largest local move of one centroid, data units."""
    add_extra = 1 if neighbouring == "add_remove" else 0
    worst = 0.0
    for j, cj in enumerate(clusters.centroids):
        n_j = clusters.counts[j]
        xj = clusters.x[clusters.labels == j]
        removal = float(np.sqrt(((xj - cj) ** 2).sum(axis=1).max())) / (n_j - 1)
        addition = _farthest_corner_distance(clusters.lo, clusters.hi, cj) / (n_j + add_extra)
        worst = max(worst, removal, addition)
    return worst


@dataclass(frozen=True)
class CoverResult:
    """:func:`min_trace_cover`'s answer: S (d, d), the rescale η applied, the relative duality
    gap (tr S − dual)/tr S certifying near-optimality, and the iterations used."""

    cov: np.ndarray
    eta: float
    gap: float
    iterations: int

    def scaled(self, gamma: float) -> CoverResult:
        """The solution at level γ from this one at level 1: S/γ (same η, gap, iterations)."""
        return CoverResult(self.cov / gamma, self.eta, self.gap, self.iterations)


def _sqrt_and_inv_sqrt(r: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(R^{1/2}, R^{−1/2}, tr R^{1/2}) of a symmetric positive semi-definite R (d, d) by
    eigendecomposition, eigenvalues floored at 1e-300 so that R^{−1/2} exists."""
    w, u = np.linalg.eigh(r)
    w = np.maximum(w, 1e-300)
    root = np.sqrt(w)
    return (u * root) @ u.T, (u / root) @ u.T, float(root.sum())


def min_trace_cover(v: np.ndarray, gamma: float, tol: float = COVER_TOL,
                    max_iter: int = COVER_MAX_ITER) -> CoverResult:
    """min tr S over S ≻ 0 subject to v_iᵀS⁻¹v_i ≤ γ for every row v_i (§7.4, §7.6).

    Fixed point of §7.6: R = Σ λ_i v_i v_iᵀ, m_i = v_iᵀR^{−1/2}v_i, λ_i ← λ_i·m_i/γ, S = R^{1/2}.
    Rows with λ_i < COVER_PRUNE·max λ are skipped between full passes (every COVER_CHECK_EVERY
    iterations). At each full pass S is rescaled by η = max_i m_i/γ over ALL rows (so the
    constraints hold with the largest one tight) and the dual 2 tr R^{1/2} − γΣλ (a lower bound
    on the optimum) gives the gap; stop when the gap ≤ ``tol`` or after ``max_iter``.
    The rows must span R^d (the box corners always do).
    """
    lam = np.ones(v.shape[0])
    active = np.arange(v.shape[0])
    it = 0
    while True:
        va = v[active]
        root, inv_root, tr_root = _sqrt_and_inv_sqrt((va * lam[active, None]).T @ va)
        if it % COVER_CHECK_EVERY == 0 or it >= max_iter:
            m = np.einsum("ij,jk,ik->i", v, inv_root, v)
            eta = float(m.max()) / gamma
            dual = 2.0 * tr_root - gamma * float(lam[active].sum())
            gap = (eta * tr_root - dual) / (eta * tr_root)
            if gap <= tol or it >= max_iter:
                return CoverResult(eta * root, eta, gap, it)
            lam *= m / gamma
            active = np.flatnonzero(lam >= COVER_PRUNE * lam.max())
        else:
            lam[active] *= np.einsum("ij,jk,ik->i", va, inv_root, va) / gamma
        it += 1


#: Memoized unit-level covers (a few cluster sets' worth).
UNIT_COVER_CACHE = 64
_UNIT_COVERS: dict[str, CoverResult] = {}


def unit_cover(v: np.ndarray) -> CoverResult:
    """:func:`min_trace_cover` of the rows ``v`` at level γ = 1, memoized by the bytes of ``v``.

    The problem is homogeneous: v_iᵀS⁻¹v_i ≤ γ ⇔ v_iᵀ(γS)⁻¹v_i ≤ 1, so S(γ) = S(1)/γ
    (:meth:`CoverResult.scaled`), and repeated trials on the same clusters solve it once.
    """
    return _memo(_UNIT_COVERS, UNIT_COVER_CACHE, _digest(v), lambda: min_trace_cover(v, 1.0))


@dataclass(frozen=True)
class GaussianPlan:
    """What a §7 mechanism adds noise to: centroids (k, d), per-cluster covariances (k, d, d)
    (squared data units), the constraint level γ, and diagnostics (not privatized)."""

    clusters: Clusters
    covariances: np.ndarray
    gamma: float
    notes: dict


def white_plan(task: Task) -> GaussianPlan:
    """White noise (§7.3): Σ = σ²I_{kd}, σ = dgauss_sigma(f·Δ2, ε, δ) (the discrete Gaussian's σ,
    :func:`gaussian_release`), Δ2 from :func:`white_sensitivity`, f = relation_factor
    (equivalently σ² = Δ2²/(γ/f²))."""
    require_finite_epsilon(task, "white", "kmeans")
    clusters = converged_clusters(task)
    f = relation_factor(task.neighbouring)
    delta2 = white_sensitivity(clusters, task.neighbouring)
    sigma = dgauss_sigma(f * delta2, task.epsilon, task.delta)
    cov = np.broadcast_to(sigma**2 * np.eye(task.d), (task.k, task.d, task.d)).copy()
    gamma = constraint_level(task.epsilon, task.delta, task.neighbouring)
    notes = {"non_private": {"sigma": sigma, "sensitivity": delta2,
                             "trace": float(task.k * task.d * sigma**2)}}
    return GaussianPlan(clusters, cov, gamma, notes)


def colored_plan(task: Task) -> GaussianPlan:
    """Colored noise (§7.4–7.6): per cluster, S_j = :func:`min_trace_cover` of the rows of
    :func:`constraint_vectors` at level :func:`constraint_level` (exact fixed point, rescaled to
    feasibility); the blocks are independent (each row lives in one cluster's block)."""
    require_finite_epsilon(task, "colored", "kmeans")
    if task.d > MAX_CORNER_DIM:
        raise ValueError(f"colored noise enumerates the 2^d box corners; d = {task.d} > {MAX_CORNER_DIM}")
    clusters = converged_clusters(task)
    gamma = constraint_level(task.epsilon, task.delta, task.neighbouring)
    covers = [unit_cover(constraint_vectors(clusters.x[clusters.labels == j], cj, clusters.lo,
                                            clusters.hi, task.neighbouring)).scaled(gamma)
              for j, cj in enumerate(clusters.centroids)]
    cov = np.stack([c.cov for c in covers])
    notes = {"gamma": gamma, "non_private": {
        "trace": float(np.trace(cov, axis1=1, axis2=2).sum()), "max_rescale": max(c.eta for c in covers),
        "max_duality_gap": max(c.gap for c in covers), "max_iterations": max(c.iterations for c in covers)}}
    return GaussianPlan(clusters, cov, gamma, notes)


def gaussian_release(task: Task, plan: GaussianPlan) -> Outcome:
    """The integer release of every cluster's centroid under the noise Σ_j, kind
    "local-sensitivity" (not a worst-case DP guarantee); ``notes`` is JSON diagnostics.

    Whitened about the public box centre o, y_j = Σ_j^{−1/2}(c_j − o) moves by at most s = f·√γ
    between neighbours (γ the plan's constraint level, f = relation_factor). y_j is encoded on the
    grid g = s/STEPS and released as Y~_j = rint(y_j/g) + N_Z(0, σ_Z²)^d, σ_Z = dgauss_sigma(Δ, ε,
    δ) steps with Δ = :func:`~fedsketch.common.dp.grid.l2_in_steps` (s, g, d, both rounded); the
    centroid is o + Σ_j^{1/2}·g·Y~_j (post-processing). Its noise has covariance ρ²Σ_j,
    ρ = g·σ_Z = 1 + O(√d/STEPS) (``notes["noise_factor"]``). Centring on o keeps |y_j/g| within
    the grid's range for data far from the origin.
    """
    f = relation_factor(task.neighbouring)
    s = f * math.sqrt(plan.gamma)
    g = grid.step(s)
    sigma_z = dgauss_sigma(grid.l2_in_steps(s, g, task.d, both_rounded=True), task.epsilon, task.delta)
    w, u = np.linalg.eigh(plan.covariances)
    root = np.sqrt(np.maximum(w, 0.0))
    centre = Box(plan.clusters.lo, plan.clusters.hi).center
    whitened = np.einsum("kji,kj->ki", u, plan.clusters.centroids - centre) / root  # u_j's basis
    noisy = grid.encode(whitened, g, limit=None) + dgauss_noise(sigma_z, (task.k, task.d))
    released = centre + np.einsum("kij,kj->ki", u, root * (g * noisy))
    notes = {**plan.notes, "grid_step": g, "sigma_steps": sigma_z, "noise_factor": g * sigma_z}
    return Outcome(released, task.epsilon, task.delta, task.neighbouring, "local-sensitivity",
                   plan.clusters.clipped, json.dumps(notes))


def white_gaussian(task: Task) -> Outcome:
    """White Gaussian noise on converged k-means centroids (§7.3), calibrated to the LOCAL
    sensitivity Δ2 = max_i ‖Δ_i‖ of the given data (removals, and additions anywhere in the
    public box; fixed assignments). Local sensitivity is not a worst-case DP guarantee: it is
    computed on X and ignores re-clustering, so this is labelled "local-sensitivity"."""
    return gaussian_release(task, white_plan(task))


def colored_gaussian(task: Task) -> Outcome:
    """Colored Gaussian noise on converged k-means centroids (Ravi–Scaglione–Peisert, §7.6):
    the minimum-trace covariance meeting Δ_iᵀΣ⁻¹Δ_i ≤ γ for every local difference, solved
    exactly per cluster (not the paper's Lemma 5, which is wrong in general, §7.5). Local
    sensitivity is not a worst-case DP guarantee: Σ itself depends on the data and re-clustering
    is ignored; labelled "local-sensitivity"."""
    return gaussian_release(task, colored_plan(task))
