"""Lloyd's algorithm, the pieces shared by every k-means path: nearest-centroid assignment,
per-cluster statistics, and one noisy Lloyd step (DPLloyd's count-and-sum release, MECHANISMS §5).

Units: records, centroids, the box half-widths h and the Laplace scales of the sums are in data
units; counts and their Laplace scale in records; ε is dimensionless.

The noisy step reads records shifted by the centre of a public box, so coordinate l lies in
[−h_l, h_l]. Given the current (public) centroids it releases, for every cluster j (empty ones
included), the count N_j + Lap(1/ε_count) and the coordinate sums S_{j,l} + Lap(h_l/ε_dim,l).
Under add/remove one record changes one cluster's count by 1 and its sum coordinate l by at most
h_l, and the clusters partition the records (parallel composition over clusters), so the whole
release is (ε_count + Σ_l ε_dim,l)-DP; the new centroids clip(S~_j/max(N~_j, 1), −h, h) are
post-processing. Replace-one and the composition over iterations are the caller's accounting
(the budget traces of ``fedsketch.server.bench.kmeans``).

The noise generator is an argument, never created here: callers pass a fresh
:func:`fedsketch.common.dp.samplers.noise_rng` (OS CSPRNG seed) for each release. This module imports
nothing from ``server`` or ``client``, so a federated refinement round can use the same step.
"""

from __future__ import annotations

import numpy as np

from .dp.calibration import laplace_scale

#: Rows per block of :func:`nearest` (bounds its (rows, k) scratch matrix).
CHUNK = 1 << 15


def nearest(x: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(labels (n,), squared distance to the nearest centroid (n,), squared data units) of the
    records ``x`` (n, d) and centroids ``c`` (k, d), in chunks of CHUNK rows:
    argmax_j (x·c_j − ‖c_j‖²/2), then ‖x‖² − 2(x·c_j − ‖c_j‖²/2) (floored at 0)."""
    n = x.shape[0]
    labels = np.empty(n, dtype=np.intp)
    d2 = np.empty(n)
    ct = np.ascontiguousarray(c.T)
    half = 0.5 * (c * c).sum(axis=1)
    for s in range(0, n, CHUNK):
        xb = x[s:s + CHUNK]
        g = xb @ ct
        g -= half
        lab = g.argmax(axis=1)
        labels[s:s + CHUNK] = lab
        d2[s:s + CHUNK] = np.einsum("ij,ij->i", xb, xb) - 2.0 * np.take_along_axis(g, lab[:, None], 1)[:, 0]
    return labels, np.maximum(d2, 0.0, out=d2)


def cluster_stats(x: np.ndarray, labels: np.ndarray, k: int,
                  weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact per-cluster counts N_j (k,) (records) and coordinate sums S_j = Σ_{labels_i = j} x_i
    (k, d) (data units) of ``x`` (n, d) under ``labels`` (n,); with ``weights`` (n,), the weighted
    counts Σ w_i and sums Σ w_i x_i instead."""
    counts = np.bincount(labels, weights=weights, minlength=k).astype(np.float64)
    wx = x if weights is None else x * weights[:, None]
    sums = np.stack([np.bincount(labels, weights=wx[:, j], minlength=k) for j in range(x.shape[1])],
                    axis=1)
    return counts, sums


def noisy_cluster_stats(x: np.ndarray, centroids: np.ndarray, h: np.ndarray, eps_count: float,
                        eps_dims: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One private iteration's release on shifted records ``x`` (n, d), coordinate l in [−h_l, h_l].

    Assigns every record to its nearest of ``centroids`` (k, d), then releases, for EVERY cluster
    (empty ones included), N~_j = N_j + Lap(1/ε_count) (records) and
    S~_{j,l} = S_{j,l} + Lap(h_l/ε_dim,l) (data units), noise from ``rng`` (pass a fresh
    :func:`fedsketch.common.dp.samplers.noise_rng`). ε_count + Σ_l ε_dim,l (``eps_dims`` (d,)) is the
    add/remove ε of the whole release (parallel composition over clusters; sensitivities 1 and h_l).
    Returns (N~ (k,), S~ (k, d)).
    """
    k, d = centroids.shape
    labels, _ = nearest(x, centroids)
    counts, sums = cluster_stats(x, labels, k)
    b_dims = np.array([laplace_scale(float(hl), float(e)) for hl, e in zip(h, eps_dims, strict=True)])
    noisy_counts = counts + rng.laplace(0.0, laplace_scale(1.0, eps_count), k)
    noisy_sums = sums + rng.laplace(0.0, 1.0, (k, d)) * b_dims[None, :]
    return noisy_counts, noisy_sums


def centroids_from_stats(counts: np.ndarray, sums: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Lloyd's update from released statistics (post-processing): c_j = clip(S~_j/max(N~_j, 1)) to
    the shifted box [−h, h]; ``counts`` (k,) in records, ``sums`` (k, d) and the result in data
    units. Clamping N~_j at 1 keeps an empty or negative noisy count from blowing up the mean."""
    return np.clip(sums / np.maximum(counts, 1.0)[:, None], -h, h)


def noisy_lloyd_step(x: np.ndarray, centroids: np.ndarray, h: np.ndarray, eps_count: float,
                     eps_dims: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One DPLloyd iteration: :func:`noisy_cluster_stats` from ``centroids`` (k, d), then
    :func:`centroids_from_stats`. Returns the next shifted centroids (k, d) and the released noisy
    counts N~ (k,) (records; released, so free to reuse). Spends what the release spends:
    ε_count + Σ_l ε_dim,l under add/remove."""
    counts, sums = noisy_cluster_stats(x, centroids, h, eps_count, eps_dims, rng)
    return centroids_from_stats(counts, sums, h), counts
