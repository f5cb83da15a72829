"""Clustering utility: SSE per record and relative SSE against scikit-learn's k-means.

SSE/n = (1/n)·Σ_i min_j ‖x_i − c_j‖² (squared data units). Relative SSE = SSE(C)/SSE(C_km),
where C_km is scikit-learn KMeans (k-means++, n_init = 3) on the same data; ≤ 1 means as good as
the reference. Both are computed in chunks, so memory does not grow with n.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

CHUNK = 1 << 16
#: What the figure means, in one line for the simulate command and the demo.
RELATIVE_SSE_MEANING = ("relative SSE 1.0 = as good as non-private k-means (n_init = 3) on all the records "
                        "pooled in one place; 1.2 = 20 % more squared error; above about 2, clusters are "
                        "missed or merged")


@dataclass(frozen=True)
class Evaluation:
    """SSE/n of some centroids, the reference's SSE/n (None without scikit-learn), and their ratio."""

    sse_per_n: float
    kmeans_sse_per_n: float | None

    @property
    def relative_sse(self) -> float | None:
        """SSE(C)/SSE(C_km), or None without the reference."""
        return None if self.kmeans_sse_per_n is None else self.sse_per_n / self.kmeans_sse_per_n

    def to_dict(self) -> dict:
        """JSON-ready form (what ``fedsketch evaluate --json`` prints)."""
        return {"sse_per_n": self.sse_per_n, "kmeans_sse_per_n": self.kmeans_sse_per_n,
                "relative_sse": self.relative_sse}


def evaluate_centroids(chunks: Callable[[], Iterable[np.ndarray]], centroids: np.ndarray,
                       seed: int = 0) -> Evaluation:
    """SSE/n of ``centroids`` (k, d) on the records ``chunks()`` yields, and of scikit-learn's
    k-means (seeded by ``seed``) on all of them in memory; the reference is None when
    scikit-learn is not installed."""
    sse = sse_per_n(chunks(), centroids)
    if importlib.util.find_spec("sklearn") is None:
        return Evaluation(sse, None)
    x = np.concatenate(list(chunks()), axis=0)
    return Evaluation(sse, sse_per_n([x], sklearn_kmeans_centroids(x, np.shape(centroids)[0], seed)))


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
