"""Streaming computation of the (un-normalized, masked) feature sum of a dataset.

For records x_i ∈ R^d, public frequencies Ω ∈ R^{d×m} and dither ξ ∈ [0, 2π)^m, the accumulator
computes

    S = Σ_i q(Ωᵀx_i + ξ) ⊙ b_i   ∈ Z^m + iZ^m,

where q = round(γ·f) is the feature map encoded on its public grid of γ steps per unit
(:data:`fedsketch.common.features.GRID`; MECHANISMS §1.10) and b_i ∈ {0,1}^m is a uniform random
mask with exactly r ones (r = m: no subsampling). The normalized sketch is S / (γ·α·n·√m) with
α = r/m (MECHANISMS §1.1); noise is added by :mod:`fedsketch.common.sketch.privacy`. The real and
imaginary parts of S are exact integers (int64) for both maps, ready for discrete noise and
secure aggregation: each record's γ·cos, γ·sin are rounded in float32 (exact integers below 2^24)
and summed in float64, exact while |S| < 2^53 (n < 8·10^12 records at γ = 1024).

Cost per record is O(r·d) when r < m: only the r selected phases are computed (gather, dot,
``bincount``), never the full n×m product. Phases are computed in float32 (SIMD trigonometry);
sums are accumulated in float64 or integers. The ``complex`` map at r = m ≥ ``FUSED_MIN_M``, the
trigonometry-bound case, runs one compiled loop per record that never stores its phases
(:mod:`fedsketch.common.sketch.trig_kernel`, which states its arithmetic and accuracy); the rest
is numpy. Chunks are processed by a small thread pool (numpy and the compiled loop release the
GIL) with BLAS pinned to one thread; the integers do not depend on the thread count or chunking.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
from threadpoolctl import threadpool_limits

from ..features import GRID, check_feature, quadrant_signs
from .trig_kernel import FusedComplex

if TYPE_CHECKING:
    from .box import Box, Tally


class PhaseOperator(Protocol):
    """Public frequencies: ``omega`` Ω (d, m) in 1/data units and ``xi`` ξ (m,) in radians.

    :class:`fedsketch.common.sketch.frequencies.Frequencies` is one; the calibration round of
    :mod:`fedsketch.common.sketch.scale` builds another.
    """

    omega: np.ndarray
    xi: np.ndarray

#: Rows per inner block of the numpy paths at r = m: 256 × m float32 phases stay in cache
#: (measured 2.6× faster than 16 Ki). A block's sum of encoded entries, |Σ| ≤ BLOCK_ROWS·γ = 2^18
#: grid steps, is an integer below 2^24, which float32 adds exactly in any order: a block is summed
#: in float32 (a third of a float64 sum's time), and the float64 accumulator still holds the
#: exact integer S.
BLOCK_ROWS = 256
#: The ``complex`` map at r = m takes the fused compiled loop from this m on. Loading it costs a
#: process numba's import and its disk cache, about 0.6 CPU s (RESULTS.md §21), once; it saves
#: about half of the trigonometry's time per record, whose cost grows as m. Below this m a
#: device would need millions of records to earn the load back, so smaller sketches stay numpy.
#: The choice is a function of the public spec (m, r, the map) alone, so every engine, thread
#: count and chunking of one spec gives the same integers.
FUSED_MIN_M = 256
#: With r < m, a block holds about this many gathered frequency values (rows·r·d), 4 MiB.
MASKED_BLOCK_VALUES = 1 << 20
#: Rows per task handed to a worker thread with r = m: incoming chunks are cut into pieces of
#: this size so that one large in-memory chunk still keeps every worker busy.
PIECE_ROWS = 8192


@dataclass(frozen=True)
class FeatureSum:
    """S = Σ_i q(Ωᵀx_i + ξ) ⊙ b_i over n records, split into real and imaginary parts.

    ``re`` and ``im`` are int64 in grid steps (entries in [−γn, γn], γ = :attr:`grid`).
    """

    feature: str
    m: int
    r: int
    n: int
    re: np.ndarray
    im: np.ndarray

    @property
    def alpha(self) -> float:
        """α = r/m, the fraction of entries each record contributes to."""
        return self.r / self.m

    @property
    def grid(self) -> int:
        """γ: grid steps per unit of the feature map (:data:`fedsketch.common.features.GRID`)."""
        return GRID[self.feature]

    def clean_sketch(self) -> np.ndarray:
        """The noiseless normalized sketch S / (γ·α·n·√m) as complex128."""
        return normalized_sketch(self.re, self.im, self.grid, self.alpha, self.n)


def sketch_norm(grid: int, alpha: float, n: float, m: int) -> float:
    """γ·α·max(n, 1)·√m: grid steps of S per unit of the normalized sketch (n records released)."""
    return grid * alpha * max(n, 1) * math.sqrt(m)


def normalized_sketch(re: np.ndarray, im: np.ndarray, grid: int, alpha: float,
                      n: float) -> np.ndarray:
    """s = (re + i·im)/(γ·α·max(n, 1)·√m), complex128 (m,), from integer sums in grid steps (the
    one conversion of a release, a file and an aggregate into sketch units)."""
    norm = sketch_norm(grid, alpha, n, re.size)
    return re / norm + 1j * (im / norm)


def check_r(r: int, m: int) -> int:
    """Return r if 1 ≤ r ≤ m, else raise ValueError."""
    if not 1 <= r <= m:
        raise ValueError(f"r must be in 1..m = 1..{m}, got {r}")
    return r


def draw_masks(rng: np.random.Generator, rows: int, m: int, r: int) -> np.ndarray:
    """Indices (rows, r) of r distinct entries per row, each r-subset of 0..m−1 equally likely.

    Small r (r² ≤ 4m): Floyd's algorithm, vectorized over rows, O(rows·r²). Otherwise the r
    smallest of m uniform keys per row, O(rows·m): for such r the mask, not the trigonometry,
    bounds the speed (measured 50–200 k rows/s at m = 1000).
    """
    if r * r <= 4 * m:
        chosen = np.empty((rows, r), dtype=np.int64)
        for col, j in enumerate(range(m - r, m)):
            t = rng.integers(0, j + 1, size=rows)
            if col:
                t = np.where((chosen[:, :col] == t[:, None]).any(axis=1), j, t)
            chosen[:, col] = t
        return chosen
    keys = rng.random((rows, m), dtype=np.float32)
    return np.argpartition(keys, r - 1, axis=1)[:, :r]


class _Kernel:
    """Per-block arithmetic for one (Ω, ξ, feature, r); stateless, shared by worker threads."""

    def __init__(self, freqs: PhaseOperator, feature: str, r: int) -> None:
        self.feature = check_feature(feature)
        self.m = freqs.omega.shape[1]
        self.r = check_r(r, self.m)
        self.omega = np.ascontiguousarray(freqs.omega, dtype=np.float32)  # (d, m)
        self.omega_t = np.ascontiguousarray(self.omega.T)  # (m, d): rows gathered for r < m
        self.xi = np.asarray(freqs.xi, dtype=np.float32)
        self.grid = np.float32(GRID[self.feature])
        full_complex = self.r == self.m and self.feature == "complex" and self.m >= FUSED_MIN_M
        self.fused = FusedComplex(freqs.omega, freqs.xi, GRID["complex"]) if full_complex else None

    def chunk_sum(self, x: np.ndarray, rng: np.random.Generator | None) -> tuple[np.ndarray, ...]:
        """(re, im) sums of one chunk of float32 records; ``rng`` draws the masks (r < m)."""
        re = np.zeros(self.m, dtype=np.float64)
        im = np.zeros(self.m, dtype=np.float64)
        if self.fused is not None:
            self.fused.add_rows(x, re, im)
            return re, im
        if self.r == self.m:
            # two phase buffers per call: no 1 MiB allocation (and its page faults) per block
            t = np.empty((BLOCK_ROWS, self.m), dtype=np.float32)
            f = np.empty_like(t)
            for start in range(0, x.shape[0], BLOCK_ROWS):
                block = x[start:start + BLOCK_ROWS]
                rows = block.shape[0]
                self._full_block(block, t[:rows], f[:rows], re, im)
            return re, im
        assert rng is not None
        rows = max(BLOCK_ROWS, MASKED_BLOCK_VALUES // (self.r * x.shape[1]))
        for start in range(0, x.shape[0], rows):
            block = x[start:start + rows]
            self._masked_block(block, draw_masks(rng, block.shape[0], self.m, self.r), re, im)
        return re, im

    def _full_block(self, x: np.ndarray, t: np.ndarray, f: np.ndarray, re: np.ndarray,
                    im: np.ndarray) -> None:
        """Add the block's Σ f(Ωᵀx + ξ) to (re, im) (``quantized``, and ``complex`` below
        FUSED_MIN_M); ``t`` and ``f`` are (rows, m) buffers."""
        np.matmul(x, self.omega, out=t)
        t += self.xi
        if self.feature == "complex":  # float32 block sums are exact (BLOCK_ROWS)
            re += np.add.reduce(self._encode(np.cos(t, out=f)), axis=0)
            im += np.add.reduce(self._encode(np.sin(t, out=f)), axis=0)
            return
        s_re, s_im = quadrant_signs(t)
        re += s_re.sum(axis=0)
        im += s_im.sum(axis=0)

    def _encode(self, v: np.ndarray) -> np.ndarray:
        """round(γ·v) in place (float32, exact integers): the grid encoding of cos or sin values."""
        v *= self.grid
        return np.rint(v, out=v)

    def _masked_block(self, x: np.ndarray, idx: np.ndarray, re: np.ndarray, im: np.ndarray) -> None:
        rows, r = idx.shape
        w = np.take(self.omega_t, idx, axis=0)  # (rows, r, d)
        t = np.einsum("ijk,ik->ij", w, x) if r > 1 else np.einsum("ik,ik->i", w[:, 0], x)[:, None]
        t += np.take(self.xi, idx)
        flat = idx.ravel()
        if self.feature == "complex":
            re += np.bincount(flat, weights=self._encode(np.cos(t)).ravel(), minlength=self.m)
            im += np.bincount(flat, weights=self._encode(np.sin(t)).ravel(), minlength=self.m)
        else:
            s_re, s_im = quadrant_signs(t)
            re += np.bincount(flat, weights=s_re.ravel(), minlength=self.m)
            im += np.bincount(flat, weights=s_im.ravel(), minlength=self.m)


def feature_sum(
    chunks: Iterable[np.ndarray],
    freqs: PhaseOperator,
    feature: str,
    r: int | None = None,
    *,
    mask_seed: int | None = None,
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> FeatureSum:
    """Stream ``chunks`` of float32 records (each (rows, d)) into S = Σ_i q(Ωᵀx_i + ξ) ⊙ b_i.

    ``r`` defaults to m. Masks are drawn from a generator seeded from ``mask_seed`` or, when it is
    None, from the OS CSPRNG; masks are public and independent of the data, so a fixed seed only
    makes neighbouring-dataset tests reproducible. ``progress(rows)`` is called after each chunk.
    ``workers`` threads (default: up to 2, the cores available) process chunks concurrently.
    """
    d, m = freqs.omega.shape
    kernel = _Kernel(freqs, feature, m if r is None else r)
    seeds = np.random.SeedSequence(mask_seed)
    workers = workers or max(1, min(2, os.cpu_count() or 1))
    re = np.zeros(kernel.m, dtype=np.float64)
    im = np.zeros(kernel.m, dtype=np.float64)
    n = 0

    def job(x: np.ndarray, seed: np.random.SeedSequence) -> tuple[np.ndarray, ...]:
        return kernel.chunk_sum(x, np.random.default_rng(seed))

    # r < m: one masked block per piece (drawing masks per small piece costs more than it saves)
    piece = PIECE_ROWS if kernel.r == m else max(PIECE_ROWS, MASKED_BLOCK_VALUES // (kernel.r * d))
    with threadpool_limits(1), ThreadPoolExecutor(max_workers=workers) as pool:
        pending = []
        for chunk in chunks:
            if chunk.ndim != 2 or chunk.shape[1] != d:
                raise ValueError(f"records have dimension {chunk.shape[-1]}, the frequencies expect {d}")
            # pieces of a fixed size (not a function of ``workers``, so masks drawn from
            # ``mask_seed`` do not depend on the thread count) keep every worker busy
            for start in range(0, chunk.shape[0], piece):
                x = chunk[start:start + piece]
                pending.append((x.shape[0], pool.submit(job, x, seeds.spawn(1)[0])))
                if len(pending) > 2 * workers:
                    n += _collect(pending.pop(0), re, im, progress)
        for item in pending:
            n += _collect(item, re, im, progress)
    if not (np.all(np.isfinite(re)) and np.all(np.isfinite(im))):
        raise ValueError("the feature sum is not finite: a record has NaN, inf or a value so large "
                         "that its phases overflow; clip the data to the study's box")
    return FeatureSum(feature, kernel.m, kernel.r, n, re.astype(np.int64), im.astype(np.int64))


class SumsItself(Protocol):
    """Records that compute their own feature sum where they lie (a partitioned dataset on a
    cluster: :class:`fedsketch.common.sketch.dask_records.DaskRecords`), passed where a sketch
    takes its records' chunks."""

    def feature_sum(self, freqs: PhaseOperator, feature: str, r: int | None, box: Box,
                    tally: Tally | None = None,
                    progress: Callable[[int], None] | None = None) -> FeatureSum: ...


def sum_records(records: Iterable[np.ndarray] | SumsItself, freqs: PhaseOperator, feature: str,
                r: int | None, box: Box, *, tally: Tally | None = None,
                progress: Callable[[int], None] | None = None) -> FeatureSum:
    """S of ``records`` clipped into and centred in the public ``box`` (:meth:`Box.centred`,
    ``freqs`` reduced for it): chunks streamed through :func:`feature_sum` in this process, or
    records that sum themselves (:class:`SumsItself`). The counts go to ``tally``."""
    if hasattr(records, "feature_sum"):
        return records.feature_sum(freqs, feature, r, box, tally, progress)
    return feature_sum(box.centred(records, tally), freqs, feature, r, progress=progress)


def _collect(item, re: np.ndarray, im: np.ndarray, progress: Callable[[int], None] | None) -> int:
    rows, future = item
    part_re, part_im = future.result()
    re += part_re
    im += part_im
    if progress is not None:
        progress(rows)
    return rows
