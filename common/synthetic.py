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
