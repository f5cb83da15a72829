"""Private choice of the frequency scale σ: the calibration round (MECHANISMS §2.4, DESIGN §4).

σ (data units) shapes the public Ω of every sketch, so it must not be read off raw data outside
the privacy budget. The calibration round spends a declared slice ε_cal of the budget on a small
private ``complex`` sketch whose m0 frequencies have radii spread over the public search range:

    ω_j = ρ_j·φ_j,   ρ_j log-spaced over [RHO_SIGMA_LO/σ_hi, RHO_SIGMA_HI/σ_lo]   (1/data units),

[σ_lo, σ_hi] is public and follows the data's units: by default [h̄/60, 5h̄/3] for a box of mean
half-width h̄ (:func:`default_range`; [0.1, 10] on the ±6 box of standardized data), or a range
the user states in data units. No absolute number enters: mapping the records and the box by
x ↦ c·x + b maps the range, the radii (by 1/c), σ̂ and every fallback below by c, so the sketch
that follows is the same function of the mapped records (tests/common/sketch/test_equivariance.py).

φ_j uniform directions (purpose ``CALIBRATION_DIRECTIONS``), no dither (the fit reads moduli only).
For a mixture of clusters of spread σ_c, the empirical characteristic function obeys
|φ_X(ω)| ≤ exp(−‖ω‖²σ_c²/2), with equality in directions where the centres' phases align.
From the released sketch s (normalized by 1/√m0, noise of variance v on each real coordinate):

    y_j = m0·|s_j|² − 2·m0·v          (unbiased for |φ_X(ω_j)|², dimensionless)
    blocks of consecutive radii; in block q keep the largest y_q and its radius ρ_q
    σ̂ = argmin_σ Σ_q (y_q − exp(−ρ_q²σ²))²   over a log grid of the search range.

The main round then spends ε − ε_cal (sequential composition). The fit needs the noise rms on
√m0·|s_j| well below the envelope: about 2·c_f·m0/(n·ε_cal) ≲ 0.1 for one curator of n records,
i.e. n·ε_cal ≳ 20·c_f·m0 (≈ 3.6·10³ for m0 = 64); :attr:`ScaleCalibration.noise_rms` reports it.

The σ used is not always the fit (:attr:`ScaleCalibration.choice`). The block maxima follow the
directions in which the clusters' phases align, which is the envelope on a Gaussian mixture; on
real data (skewed, heavy-tailed, rounded columns) the largest of four directions keeps more
high-frequency power than any cluster scale explains, and the fit reads too narrow a σ (diamonds
and flights: σ̂ ≈ 0.4–0.7 in a box of ±6 standard deviations, where CL-OMPR's best σ is 1.3–2
and σ = 0.45 costs 30–40 % of relative SSE; benchmarks/RESULTS.md §6). The block medians, a
typical direction's decay σ̃, are not fooled but overshoot on a separated mixture (paper 004's:
σ̃ ≈ 3 where the best σ is 2). And noise, which the debiasing removes only on average, pushes
both down to the bottom of the range. So:

* fit reliable (noise rms ≤ RELIABLE_NOISE_RMS): σ = max(σ̂, SPREAD_SHARE·σ̃) ("fit" or
  "typical scale"), unless that lands on an end of the search range: the fit then failed (the
  data's scale lies beyond the range, or the range is the wrong one for these units), σ falls
  back to the box's floor below ("failed: range edge"), and the user is told to widen the range
  or state σ;
* fit unreliable: a data-independent choice, h/BOX_CELLS for a box of mean half-width h (σ below
  it resolves structure finer than the decoder finds in that box: on paper 004's mixture relative
  SSE 5.4 at h/σ = 15 against 1.04 at 10.7) ("noisy: box floor"), or, for a sketch without a
  stated box (:meth:`Box.widest`), the geometric middle of the search range ("noisy: range
  middle");

clipped into the search range (the explanation says so when a fallback was clipped).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import numpy as np

from ..choices import RANGE_PER_HALF_WIDTH
from .box import WIDEST, Box, Tally
from .frequencies import draw_directions
from .privacy import PrivacySpec, PrivateSketch, privatize
from .sketching import sum_records

#: Frequencies of the calibration sketch, and consecutive radii per block of the fit.
DEFAULT_M0 = 64
BLOCK = 4
#: ρσ over which the envelope exp(−ρ²σ²/2) falls from 0.98 to 0.011.
RHO_SIGMA_LO = 0.2
RHO_SIGMA_HI = 3.0
#: Direction stream of the calibration frequencies (independent of every study's Ω).
CALIBRATION_DIRECTIONS = b"calibration-directions"
#: Points per decade of the σ grid searched by the fit.
GRID_PER_DECADE = 200
#: Noise rms above which the fit is flagged unreliable (MECHANISMS §2.4).
RELIABLE_NOISE_RMS = 0.1
#: σ of an unreliable calibration: the box's mean half-width over this (module docstring).
BOX_CELLS = 7.0
#: A reliable σ is at least this share of the typical-direction fit σ̃ (module docstring).
SPREAD_SHARE = 0.8


@dataclass(frozen=True)
class CalibrationSpec:
    """Public spec of the calibration sketch: dimension d, σ range [sigma_lo, sigma_hi] (data
    units), m0 frequencies, seed."""

    d: int
    sigma_lo: float
    sigma_hi: float
    m0: int = DEFAULT_M0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.d < 1:
            raise ValueError(f"d must be >= 1, got {self.d}")
        if self.m0 < 2 * BLOCK:
            raise ValueError(f"the calibration sketch needs m0 >= {2 * BLOCK}, got {self.m0}")
        if not 0 < self.sigma_lo < self.sigma_hi < math.inf:
            raise ValueError(
                f"the scale range needs 0 < lo < hi, got {self.sigma_lo}:{self.sigma_hi}"
            )

    def radii(self) -> np.ndarray:
        """ρ_1 < … < ρ_m0, log-spaced over [RHO_SIGMA_LO/σ_hi, RHO_SIGMA_HI/σ_lo] (1/data units)."""
        lo = math.log(RHO_SIGMA_LO / self.sigma_hi)
        hi = math.log(RHO_SIGMA_HI / self.sigma_lo)
        return np.exp(np.linspace(lo, hi, self.m0))


@dataclass(frozen=True)
class CalibrationFrequencies:
    """Ω = [ρ_j φ_j] (d, m0) in 1/data units and ξ = 0, for :func:`~.sketching.feature_sum`."""

    omega: np.ndarray
    xi: np.ndarray


def calibration_frequencies(spec: CalibrationSpec) -> CalibrationFrequencies:
    """The public frequencies of the calibration sketch (directions from the SHAKE stream)."""
    phi = draw_directions(spec.seed, spec.d, spec.m0, CALIBRATION_DIRECTIONS)
    return CalibrationFrequencies(omega=phi * spec.radii(), xi=np.zeros(spec.m0))


@dataclass(frozen=True)
class ScaleCalibration:
    """The picked σ (data units), what it cost, and how noisy the fit's input was.

    ``noise_rms`` is the rms of the noise on √m0·|s_j| (dimensionless; the envelope runs from 1
    down to 0), ``reliable`` is ``noise_rms ≤ RELIABLE_NOISE_RMS``; ``fitted`` is the envelope
    fit σ̂ (block maxima), ``spread`` the typical-direction fit σ̃ (block medians), ``floor`` the
    box's floor (None without a box), and ``choice`` says how ``sigma`` came from them (module
    docstring): "fit", "typical scale", "failed: range edge", "noisy: box floor" or "noisy: range
    middle".
    """

    sigma: float
    epsilon: float
    m0: int
    sigma_lo: float
    sigma_hi: float
    noise_rms: float
    reliable: bool
    fitted: float
    spread: float
    choice: str
    floor: float | None = None

    @property
    def explanation(self) -> str:
        """One line for the user: the σ picked, and why it is not the fit when it is not. It
        names no option; :meth:`advice` says what to give, in the caller's words."""
        if self.choice == "fit":
            return f"σ = {self.sigma:.4g} (envelope fit)"
        if self.choice == "typical scale":
            return (f"σ = {self.sigma:.4g}, {SPREAD_SHARE:g} of a typical direction's scale "
                    f"{self.spread:.4g}: the envelope fit {self.fitted:.4g} is below it")
        source = self._fallback()
        if self.choice == "failed: range edge":
            ruled = max(self.fitted, SPREAD_SHARE * self.spread)
            end = "upper" if ruled >= self.sigma_hi else "lower"
            return (f"σ = {self.sigma:.4g}, {source}: the fit failed, it ran to the {end} end of "
                    f"the search range {self.sigma_lo:.4g}:{self.sigma_hi:.4g} (the data's scale "
                    "lies beyond it)")
        return (f"σ = {self.sigma:.4g}, {source}: the calibration sketch is too noisy to fit (noise "
                f"rms {self.noise_rms:.2f} on an envelope of 1, above {RELIABLE_NOISE_RMS:g})")

    def _fallback(self) -> str:
        """Where a σ that is not a fit came from, in words (the clipping included)."""
        if self.floor is None:
            return "the middle of the search range (no box was given)"
        source = f"the box's floor (mean half-width / {BOX_CELLS:g})"
        if self.floor is not None and self.floor != self.sigma:
            source += f" {self.floor:.4g} clipped into the search range"
        return source

    def advice(self, scale: str, bounds: str, scale_range: str = "the σ range") -> str:
        """What the user may give when σ is not a fit to the data, as a clause to append to
        :attr:`explanation` ("" otherwise), naming the caller's option or argument for a fixed σ
        (``scale``), for the box (``bounds``) and for the search range (``scale_range``)."""
        if self.choice == "failed: range edge":
            return f"; widen {scale_range} or give {scale}"
        if not self.choice.startswith("noisy"):
            return ""
        boxed = "" if self.choice == "noisy: box floor" else f" ({bounds} gives the box's floor instead)"
        return f"; give {scale}, or more records or budget, for a σ fitted to the data{boxed}"

    def to_dict(self) -> dict:
        """JSON-ready form, stored in the sketch file under ``calibration``."""
        out = asdict(self)
        out["epsilon"] = "inf" if math.isinf(self.epsilon) else self.epsilon
        return out


def fit_scale(sketch: np.ndarray, variance: float, spec: CalibrationSpec,
              statistic: str = "max") -> float:
    """σ̂ from a calibration sketch s (m0,) with noise variance ``variance`` per real coordinate.

    Post-processing only (module docstring): the debiased y_j = m0|s_j|² − 2m0v in blocks of
    BLOCK consecutive radii, each block summarized by its largest y at that y's radius
    (``statistic`` "max": the directions where the clusters' phases align, the envelope) or by
    its median y at the block's geometric-mean radius ("median": a typical direction, less
    swayed by one direction's high-frequency power on non-Gaussian data), then a least-squares
    fit of exp(−ρ²σ²) on a log grid of [σ_lo, σ_hi].
    """
    sketch = np.asarray(sketch)
    if sketch.shape != (spec.m0,) or not np.all(np.isfinite(sketch)):
        raise ValueError(f"a calibration sketch must be {spec.m0} finite values")
    y = spec.m0 * (np.abs(sketch) ** 2 - 2.0 * variance)
    blocks = spec.m0 // BLOCK
    y_b = y[: blocks * BLOCK].reshape(blocks, BLOCK)
    rho_b = spec.radii()[: blocks * BLOCK].reshape(blocks, BLOCK)
    if statistic == "max":
        pick = np.argmax(y_b, axis=1)
        y_q, rho_q = y_b[np.arange(blocks), pick], rho_b[np.arange(blocks), pick]
    elif statistic == "median":
        y_q, rho_q = np.median(y_b, axis=1), np.exp(np.log(rho_b).mean(axis=1))
    else:
        raise ValueError(f"unknown statistic {statistic!r}: 'max' or 'median'")
    decades = math.log10(spec.sigma_hi / spec.sigma_lo)
    grid = np.geomspace(spec.sigma_lo, spec.sigma_hi, max(2, round(decades * GRID_PER_DECADE)))
    model = np.exp(-np.outer(grid**2, rho_q**2))
    loss = ((model - y_q) ** 2).sum(axis=1)
    return float(grid[int(np.argmin(loss))])


def box_floor(box: Box) -> float | None:
    """h/BOX_CELLS (data units), h the mean half-width of ``box``: the σ of an unreliable
    calibration (module docstring); None for a box nobody stated (:meth:`Box.widest`)."""
    half = 0.5 * (box.hi - box.lo)
    if np.all(half >= WIDEST):
        return None
    return float(np.mean(half)) / BOX_CELLS


def default_range(box: Box) -> tuple[float, float]:
    """The default σ search range (data units) of a sketch in ``box``: RANGE_PER_HALF_WIDTH times
    its mean half-width h̄, [h̄/60, 5h̄/3] (module docstring). ValueError for a box nobody stated
    (:meth:`Box.widest`): without a box there is no public scale to derive a range from."""
    half = 0.5 * (box.hi - box.lo)
    if np.all(half >= WIDEST):
        raise ValueError("σ's search range follows the public box, and none was given: state the "
                         "box, or the range in data units, or a fixed σ")
    mean = float(np.mean(half))
    return RANGE_PER_HALF_WIDTH[0] * mean, RANGE_PER_HALF_WIDTH[1] * mean


def choose_scale(fitted: float, spread: float, reliable: bool, floor: float | None,
                 scale_range: tuple[float, float]) -> tuple[float, str]:
    """(σ, choice) from the envelope fit σ̂ (block maxima), the typical-direction fit σ̃ (block
    medians), their reliability and the box's fallback ``floor`` (module docstring), clipped
    into ``scale_range``. A reliable rule that lands on an end of the range is a failed fit."""
    lo, hi = scale_range
    fallback = math.sqrt(lo * hi) if floor is None else floor
    if reliable:
        least = SPREAD_SHARE * spread
        sigma, choice = (fitted, "fit") if fitted >= least else (least, "typical scale")
        if sigma <= lo or sigma >= hi:
            sigma, choice = fallback, "failed: range edge"
    elif floor is not None:
        sigma, choice = floor, "noisy: box floor"
    else:
        sigma, choice = fallback, "noisy: range middle"
    return min(max(sigma, lo), hi), choice


def calibration_release(chunks: Iterable[np.ndarray], box: Box, spec: CalibrationSpec,
                        privacy: PrivacySpec, tally: Tally | None = None) -> PrivateSketch:
    """The calibration sketch of the finite records ``chunks`` (n, d) mapped into the public
    ``box`` (clipped count to ``tally``): the integer ``complex`` feature sum at the m0 public
    frequencies of ``spec`` (r = m0), released by :func:`~.privacy.privatize` under ``privacy``
    (exact discrete noise from OS bits; pure ε-DP for δ = 0). One curator's, or one device's
    in a federated study's round 0 (:mod:`.calibration_round`)."""
    freqs = box.reduce(calibration_frequencies(spec))
    return privatize(sum_records(chunks, freqs, "complex", None, box, tally=tally), privacy)


def read_calibration(sketch: np.ndarray, variance: float, spec: CalibrationSpec, box: Box,
                     epsilon: float) -> ScaleCalibration:
    """The σ picked from a released calibration sketch s (m0,) whose real coordinates carry
    noise of variance ``variance`` (sketch units²), bought at ``epsilon``: both fits, their
    reliability and :func:`choose_scale` (module docstring). Post-processing only."""
    noise_rms = math.sqrt(2.0 * spec.m0 * variance)
    fitted = fit_scale(sketch, variance, spec)
    spread = fit_scale(sketch, variance, spec, "median")
    reliable = noise_rms <= RELIABLE_NOISE_RMS
    floor = box_floor(box)
    sigma, choice = choose_scale(fitted, spread, reliable, floor, (spec.sigma_lo, spec.sigma_hi))
    return ScaleCalibration(sigma=sigma, epsilon=epsilon, m0=spec.m0, sigma_lo=spec.sigma_lo,
                            sigma_hi=spec.sigma_hi, noise_rms=noise_rms, reliable=reliable,
                            fitted=fitted, spread=spread, choice=choice, floor=floor)


def calibrate_scale(
    chunks: Callable[[], Iterable[np.ndarray]],
    box: Box,
    epsilon: float,
    *,
    neighbouring: str = "replace_one",
    scale_range: tuple[float, float] | None = None,
    seed: int = 0,
    m0: int = DEFAULT_M0,
) -> ScaleCalibration:
    """One curator's calibration round: a private m0-entry sketch at ``epsilon``, then the fit.

    ``chunks()`` yields the finite records (n, d) in chunks (one full pass), which are mapped into
    the public ``box`` (d = its dimension) as every sketch's are (:mod:`.box`). The release is pure
    ε-DP under ``neighbouring`` (δ = 0); the caller spends the rest of its budget on the main
    sketch. ``epsilon = inf`` fits on the clean sketch (non-private baselines). The σ returned is
    the fit, the box's floor or a data-independent fallback (module docstring; ``choice``),
    searched in ``scale_range`` (data units; None: :func:`default_range` of the box).
    """
    lo, hi = default_range(box) if scale_range is None else scale_range
    spec = CalibrationSpec(d=box.d, m0=m0, sigma_lo=lo, sigma_hi=hi, seed=seed)
    release = calibration_release(chunks(), box, spec, PrivacySpec(epsilon, 0.0, neighbouring))
    return read_calibration(release.sketch, release.variance, spec, box, epsilon)
