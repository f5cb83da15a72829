"""Lloyd's algorithm, the pieces shared by every k-means path: nearest-centroid assignment,
per-cluster statistics, and one noisy Lloyd step (DPLloyd's count-and-sum release, MECHANISMS §5).

Units: records, centroids and the box half-widths h are in data units; counts in records; the
released sums in grid steps (g_l = h_l/STEPS data units, :mod:`fedsketch.common.dp.grid`); ε is
dimensionless.

The noisy step reads records shifted by the centre of a public box, so coordinate l lies in
[−h_l, h_l]. Given the current (public) centroids it releases integers: for every cluster j
(empty ones included), the count N_j + DLap(ε_count) and the sums T_{j,l} + DLap(ε_dim,l/STEPS) of
the records' encoded coordinates q_il = rint(x_il/g_l) ∈ [−STEPS, STEPS]. Under add/remove one
record changes one cluster's count by 1 and its encoded sum l by at most STEPS, and the clusters
partition the records (parallel composition over clusters), so the whole release is
(ε_count + Σ_l ε_dim,l)-DP; in data units the sums' noise has the Laplace scale h_l/ε_dim,l of
the float mechanism, and the new centroids clip(g·T~_j/max(N~_j, 1), −h, h) are post-processing.
Replace-one and the composition over iterations are the caller's accounting (the budget traces
of ``fedsketch.server.bench.kmeans``).

The noise is exact discrete Laplace from OS random bits (:mod:`fedsketch.common.dp.samplers`):
no generator or seed is an argument. This module imports nothing from ``server`` or ``client``,
so a federated refinement round can use the same step.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from . import grid
from .samplers import dlap_noise

#: Rows per block of :func:`nearest` (bounds its (rows, k) scratch matrix).
CHUNK = 1 << 15
#: Su et al.'s coordinate normalisation factor ρ (MECHANISMS §6.2).
RHO = 0.225
#: A noisy cell count at or below this many Laplace scales of its noise cannot be told from an
#: empty cell's (P(DLap > 3b) ≈ e^{−3}/2 ≈ 2.5 %).
OVERSEED_KEEP_SCALES = 3.0


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


def relation_factor(neighbouring: str) -> int:
    """2 under replace-one (a record change touches two clusters: twice the add/remove L1
    sensitivity of the joint release), 1 under add/remove (MECHANISMS §0.3, §5.1). The Gaussian
    mechanisms of ``fedsketch.server.bench.kmeans.gaussian`` use the same factor f (σ for f·Δ2,
    level γ/f²)."""
    if neighbouring not in ("add_remove", "replace_one"):
        raise ValueError(f"unknown neighbouring relation {neighbouring!r}")
    return 2 if neighbouring == "replace_one" else 1


def su_ratio(d: int) -> float:
    """c_ρ = cbrt(4dρ²): Su et al.'s ratio ε_count/ε_dim (MECHANISMS §6.2)."""
    return float(np.cbrt(4.0 * d * RHO**2))


def su_split(eps_t: float, d: int) -> tuple[float, float]:
    """Su et al.'s split of one iteration's add/remove ε_t (MECHANISMS §6.2): each sum coordinate
    ε_dim = ε_t/(d + c_ρ), the count ε_count = c_ρ·ε_t/(d + c_ρ) (so ε_count/ε_dim = c_ρ and
    ε_count + d·ε_dim = ε_t). diffprivlib inverts the two (§6.3); this is the direction of the
    MSE derivation."""
    c = su_ratio(d)
    return c * eps_t / (d + c), eps_t / (d + c)


def exact_cell_stats(chunks: Iterable[np.ndarray], centroids: np.ndarray, h: np.ndarray,
                     relative: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
    """The exact integer statistics of one Lloyd step over shifted records streamed in ``chunks``
    (rows, d), coordinate l in [−h_l, h_l]: every record goes to its nearest of ``centroids``
    (k, d) and is encoded on the grid g_l = h_l/STEPS, clipped to ±STEPS; with ``relative``, its
    offset x − c_j from that centroid instead, so ``h`` is then the public radius the offsets are
    clipped to. Either way an encoded coordinate lies in [−STEPS, STEPS]. Returns (N (k,)
    records, T (k, d) steps, both int64, and the records read). ValueError past
    ``grid.MAX_ROWS`` records."""
    k, d = centroids.shape
    counts = np.zeros(k, dtype=np.int64)
    sums = np.zeros((k, d), dtype=np.int64)
    rows = 0
    g = grid.step(h)
    for chunk in chunks:
        rows += chunk.shape[0]
        grid.check_rows(rows)
        x = np.asarray(chunk, dtype=np.float64)
        labels, _ = nearest(x, centroids)
        values = x - centroids[labels] if relative else chunk
        n_j, t_j = cluster_stats(grid.encode(values, g), labels, k)  # exact: < 2^53 per chunk
        counts += n_j.astype(np.int64)
        sums += t_j.astype(np.int64)
    return counts, sums, rows


def add_cell_noise(counts: np.ndarray, sums: np.ndarray, eps_count: float,
                   eps_dims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N + DLap(ε_count), T_{·,l} + DLap(ε_dim,l/STEPS)) for every cell, exact noise from OS
    random bits: an ε_count + Σ_l ε_dim,l add/remove release of the exact ``counts`` (k,)
    (records, sensitivity 1) and ``sums`` (k, d) (steps, sensitivity STEPS), int64."""
    k = counts.shape[0]
    noisy_counts = counts.astype(np.int64) + dlap_noise(eps_count, 1.0, k)
    noisy_sums = sums.astype(np.int64)
    for col, eps in enumerate(eps_dims):
        noisy_sums[:, col] += dlap_noise(float(eps), float(grid.STEPS), k)
    return noisy_counts, noisy_sums


def noisy_cluster_stats(x: np.ndarray, centroids: np.ndarray, h: np.ndarray, eps_count: float,
                        eps_dims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One private iteration's integer release on shifted records ``x`` (n, d), coordinate l in
    [−h_l, h_l]: :func:`exact_cell_stats` then :func:`add_cell_noise`, so for EVERY cluster
    (empty ones included) N~_j = N_j + DLap(ε_count) (records, sensitivity 1) and
    T~_{j,l} = Σ_{i ∈ j} rint(x_il/g_l) + DLap(ε_dim,l/STEPS) (steps, sensitivity STEPS).
    ε_count + Σ_l ε_dim,l (``eps_dims`` (d,)) is the add/remove ε of the whole release (parallel
    composition over clusters). Returns (N~ (k,), T~ (k, d)), both int64.
    """
    counts, sums, _ = exact_cell_stats((x,), centroids, h)
    return add_cell_noise(counts, sums, eps_count, eps_dims)


def centroids_from_stats(counts: np.ndarray, sums: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Lloyd's update from released statistics (post-processing): c_j = clip(g·T~_j/max(N~_j, 1))
    to the shifted box [−h, h], g_l = h_l/STEPS; ``counts`` (k,) in records, ``sums`` (k, d) in
    steps, the result in data units. Clamping N~_j at 1 keeps an empty or negative noisy count
    from blowing up the mean."""
    return np.clip(sums * grid.step(h) / np.maximum(counts, 1)[:, None], -h, h)


def noisy_lloyd_step(x: np.ndarray, centroids: np.ndarray, h: np.ndarray, eps_count: float,
                     eps_dims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One DPLloyd iteration: :func:`noisy_cluster_stats` from ``centroids`` (k, d), then
    :func:`centroids_from_stats`. Returns the next shifted centroids (k, d) and the released noisy
    counts N~ (k,) (records, int64; released, so free to reuse). Spends what the release spends:
    ε_count + Σ_l ε_dim,l under add/remove."""
    counts, sums = noisy_cluster_stats(x, centroids, h, eps_count, eps_dims)
    return centroids_from_stats(counts, sums, h), counts


def excess_counts(counts: np.ndarray, count_scale: float) -> np.ndarray:
    """w_j = N~_j − OVERSEED_KEEP_SCALES·b (records), b the Laplace scale of the noisy counts N~
    (for a sum of D independent draws, pass b·√D: the same multiple of its standard deviation).
    Centroid j is reliable when w_j > 0; at or below, its cell cannot be told from an empty one."""
    return counts - OVERSEED_KEEP_SCALES * count_scale
