"""Synthetic data: the Gaussian-mixture protocol of paper 004 (Schellekens et al., SPARS'19).

k clusters of equal weight with identity covariance in R^d; centres μ_1..μ_k drawn i.i.d. from
N(0, (s·k^{1/d})² I_d) where s is the separation (2.5 in the paper). Records are generated in
chunks from one seeded generator, so n = 10^7 never needs more than one chunk in memory.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

CHUNK = 1 << 18


def check_gmm_args(n: int, k: int, d: int, separation: float) -> None:
    """Raise ValueError unless n ≥ k ≥ 1, d ≥ 1 and separation > 0 (finite)."""
    if k < 1 or d < 1:
        raise ValueError(f"k and d must be ≥ 1, got k = {k}, d = {d}")
    if n < k:
        raise ValueError(f"n must be ≥ k, got n = {n}, k = {k}")
    if not 0 < separation < float("inf"):
        raise ValueError(f"separation must be positive and finite, got {separation}")


def gmm_centres(k: int, d: int, separation: float, rng: np.random.Generator) -> np.ndarray:
    """(k, d) centres ~ N(0, (separation·k^{1/d})² I) (data units)."""
    return rng.normal(0.0, separation * k ** (1.0 / d), size=(k, d))


def gmm_chunks(
    n: int, k: int, d: int, separation: float, seed: int, rows: int = CHUNK
) -> tuple[np.ndarray, Iterator[tuple[np.ndarray, np.ndarray]]]:
    """The centres and an iterator of (records float32 (b, d), labels int32 (b,)) chunks.

    Labels are i.i.d. uniform on 0..k−1; records are μ_label + N(0, I). The same seed gives the
    same centres and records.
    """
    check_gmm_args(n, k, d, separation)
    rng = np.random.default_rng(seed)
    centres = gmm_centres(k, d, separation, rng)

    def chunks() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for start in range(0, n, rows):
            b = min(rows, n - start)
            labels = rng.integers(0, k, size=b).astype(np.int32)
            x = centres[labels] + rng.standard_normal((b, d))
            yield x.astype(np.float32), labels

    return centres, chunks()


def gmm(n: int, k: int, d: int, separation: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All at once: (records float32 (n, d), labels (n,), centres (k, d))."""
    centres, chunks = gmm_chunks(n, k, d, separation, seed)
    parts = list(chunks)
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), centres)


#: Covariance eigenvalues of paper 003's Fig. 2 synthetic data (d = 10).
SPECTRUM_003: tuple[float, ...] = (0.5, 0.30, 0.04, 0.03, 0.02, 0.01, 0.004, 0.003, 0.001, 0.001)


def random_orthonormal(d: int, q: int, rng: np.random.Generator) -> np.ndarray:
    """A (d, q) matrix with orthonormal columns, uniform (Haar) on the Stiefel manifold."""
    g = rng.standard_normal((d, q))
    u, _, vt = np.linalg.svd(g, full_matrices=False)
    return u @ vt


def spectrum(n: int, eigenvalues: tuple[float, ...] = SPECTRUM_003,
             seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Paper 003's protocol: n zero-mean Gaussian records (float64 (n, d), d = len(eigenvalues))
    with covariance V·diag(eigenvalues)·Vᵀ for a random orthonormal V; returns (x, V)."""
    lam = np.asarray(eigenvalues, dtype=np.float64)
    if lam.ndim != 1 or lam.size < 1 or np.any(lam < 0):
        raise ValueError("eigenvalues must be a non-empty list of numbers >= 0")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = np.random.default_rng(seed)
    v = random_orthonormal(lam.size, lam.size, rng)
    x = (rng.standard_normal((n, lam.size)) * np.sqrt(lam)) @ v.T
    return x, v


def subspaces(n: int, d: int, k: int, q: int, noise: float,
              seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Paper 001's protocol: k random q-dimensional subspaces of R^d (orthonormal bases U_l,
    (k, d, q)); each record x = U_l y + w with l uniform, y uniform on the unit sphere S^{q−1}
    and w ~ N(0, noise²·I_d). Returns (x float64 (n, d), labels (n,), bases)."""
    if not 1 <= q < d:
        raise ValueError(f"need 1 <= q < d, got q = {q}, d = {d}")
    if k < 1 or n < k:
        raise ValueError(f"need n >= k >= 1, got n = {n}, k = {k}")
    if not noise >= 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    rng = np.random.default_rng(seed)
    bases = np.stack([random_orthonormal(d, q, rng) for _ in range(k)])
    labels = rng.integers(0, k, size=n)
    y = rng.standard_normal((n, q))
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    x = np.einsum("ndq,nq->nd", bases[labels], y) + noise * rng.standard_normal((n, d))
    return x, labels, bases
