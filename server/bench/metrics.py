"""Clustering utility: SSE per record and relative SSE against scikit-learn's k-means.

SSE/n = (1/n)·Σ_i min_j ‖x_i − c_j‖² (squared data units). Relative SSE = SSE(C)/SSE(C_km),
where C_km is scikit-learn KMeans (k-means++, n_init = 3) on the same data; ≤ 1 means as good as
the reference. Both are computed in chunks, so memory does not grow with n.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

CHUNK = 1 << 16


def sse_per_n(chunks: Iterable[np.ndarray], centroids: np.ndarray) -> float:
    """Mean squared distance from each record to its nearest centroid (squared data units)."""
    c = np.asarray(centroids, dtype=np.float64)
    c_sq = (c * c).sum(axis=1)
    total, n = 0.0, 0
    for x in chunks:
        x = np.asarray(x, dtype=np.float64)
        if x.shape[1] != c.shape[1]:
            raise ValueError(f"centroids have dimension {c.shape[1]}, the data {x.shape[1]}")
        d2 = (x * x).sum(axis=1)[:, None] - 2.0 * x @ c.T + c_sq[None, :]
        total += float(np.maximum(d2.min(axis=1), 0.0).sum())
        n += x.shape[0]
    if n == 0:
        raise ValueError("no records to evaluate")
    return total / n


def split(x: np.ndarray, rows: int = CHUNK) -> Iterable[np.ndarray]:
    """Row chunks of an in-memory array."""
    return (x[i:i + rows] for i in range(0, x.shape[0], rows))


def sklearn_kmeans_centroids(x: np.ndarray, k: int, seed: int = 0, n_init: int = 3) -> np.ndarray:
    """Centroids (k, d), data units, of scikit-learn KMeans (k-means++, ``n_init`` restarts) on ``x``:
    the C_km of relative SSE. Not the k-means family's own non-private ``kmeans`` method
    (:func:`fedsketch.server.bench.kmeans.kmeans_reference`, a :class:`Task` → :class:`Outcome`
    mechanism of ``fedsketch compare``).

    Raises ImportError with an install hint when scikit-learn is missing (the ``bench`` extra).
    """
    try:
        from sklearn.cluster import KMeans
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError("relative SSE needs scikit-learn: pip install 'fedsketch[bench]'") from exc
    km = KMeans(n_clusters=k, init="k-means++", n_init=n_init, random_state=seed)
    return km.fit(x).cluster_centers_
