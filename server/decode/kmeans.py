"""Non-private (weighted) k-means: greedy k-means++ seeding, Lloyd to convergence, best SSE of
several restarts. The coordinator's refinement rounds reduce released centroids with it
(post-processing, :mod:`.overseed`), and the centralized mechanisms of ``fedsketch.server.bench``
build their reference and their clusterings on it.

Units: records and centroids in data units, SSE in squared data units, weights dimensionless
(record i counts w_i times). Randomness comes from the generator passed in: nothing here is part
of a privacy proof.
"""

from __future__ import annotations

import math

import numpy as np

from fedsketch.common.dp.lloyd import cluster_stats, nearest

#: Non-private reference: k-means++ restarts (paper 004's "3 replicates"), Lloyd limits.
REFERENCE_RESTARTS = 3
LLOYD_MAX_ITER = 300
LLOYD_TOL = 1e-4


def kmeans_plus_plus(x: np.ndarray, k: int, rng: np.random.Generator,
                     weights: np.ndarray | None = None) -> np.ndarray:
    """Greedy k-means++ seeding: each new centre is the best (lowest potential Σ w·D²) of
    2 + ⌊ln k⌋ candidates drawn with probability ∝ w(x)·D(x)², D the distance to the chosen
    centres; w ≡ 1 without ``weights`` (n,), and the first centre is drawn ∝ w."""
    n = x.shape[0]
    w = np.ones(n) if weights is None else weights
    trials = 2 + int(math.log(k))
    x_sq = np.einsum("ij,ij->i", x, x)

    def draw(mass: np.ndarray, size: int | None) -> np.ndarray:
        """Record indices drawn with probability ∝ ``mass`` (n,) (inverse CDF on the cumulative sum)."""
        cumulative = np.cumsum(mass)
        return np.minimum(np.searchsorted(cumulative, rng.uniform(0.0, cumulative[-1], size),
                                          side="right"), n - 1)

    first = int(rng.integers(n)) if weights is None else int(draw(w, None))
    chosen = [first]
    d2 = np.maximum(x_sq - 2.0 * (x @ x[first]) + x_sq[first], 0.0)
    for _ in range(1, k):
        picks = draw(w * d2, trials)
        cand = np.maximum(x_sq[:, None] - 2.0 * (x @ x[picks].T) + x_sq[picks][None, :], 0.0)
        cand = np.minimum(cand, d2[:, None])
        best = int((cand.sum(axis=0) if weights is None else w @ cand).argmin())
        chosen.append(int(picks[best]))
        d2 = cand[:, best]
    return x[chosen].astype(np.float64)


def _lloyd_means(x: np.ndarray, labels: np.ndarray, d2: np.ndarray, k: int,
                 weights: np.ndarray | None) -> np.ndarray:
    """(Weighted) cluster means; an empty cluster is re-seeded at one of the records farthest
    from its centre."""
    counts, sums = cluster_stats(x, labels, k, weights)
    empty = np.flatnonzero(counts == 0)
    means = sums / np.where(counts > 0, counts, 1.0)[:, None]
    if empty.size:
        means[empty] = x[np.argpartition(d2, -empty.size)[-empty.size:]]
    return means


def lloyd(x: np.ndarray, init: np.ndarray,
          weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """Non-private Lloyd from ``init`` until the squared centre shift Σ_j‖Δc_j‖² is at most
    LLOYD_TOL × (mean per-feature variance) or LLOYD_MAX_ITER; returns (centroids, labels, SSE).
    With ``weights`` (n,) > 0, record i counts w_i times: weighted means, variance and
    SSE = Σ_i w_i min_j ‖x_i − c_j‖²."""
    tol = LLOYD_TOL * float(np.mean(np.average((x - np.average(x, axis=0, weights=weights)) ** 2,
                                               axis=0, weights=weights)))
    c = init
    for _ in range(LLOYD_MAX_ITER):
        labels, d2 = nearest(x, c)
        new = _lloyd_means(x, labels, d2, c.shape[0], weights)
        shift = float(((new - c) ** 2).sum())
        c = new
        if shift <= tol:
            break
    labels, d2 = nearest(x, c)
    return c, labels, float(d2.sum() if weights is None else weights @ d2)


def converged_kmeans(x: np.ndarray, k: int, rng: np.random.Generator, restarts: int = REFERENCE_RESTARTS,
                     weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Best-SSE (centroids (k, d), labels (n,)) of ``restarts`` k-means++ + Lloyd runs (weighted
    by ``weights`` (n,) > 0 when given)."""
    x = np.asarray(x, dtype=np.float64)
    best = None
    for _ in range(restarts):
        c, labels, sse = lloyd(x, kmeans_plus_plus(x, k, rng, weights), weights)
        if best is None or sse < best[2]:
            best = (c, labels, sse)
    return best[0], best[1]
