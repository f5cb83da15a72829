"""A study's box round (``--bounds auto``): the private box read across devices as the study's
first stage, before anything else is spent.

A study may declare a box round (:class:`BoxPlan`, part of its hashed spec, format
``fedsketch.study/5``). Its own release is then, once per device, one per-column histogram of
the device's records on the scale-free signed logarithmic grid of
:mod:`fedsketch.common.sketch.private_box` at G = ``levels`` levels an octave (a bin spans a factor
2^{1/G}; 80·G magnitude levels of each sign and a zero bin, :func:`~.private_box.grid_bins` bins
a column), each count plus exact discrete-Laplace noise DLap(e^{−ε_b/Δ1}) (OS random bits),
ε_b the plan's ``epsilon`` and Δ1 = :func:`~.private_box.sensitivity` (2d under replace-one: one
record moved is −1 and +1 in each of the d histograms; d under add/remove): ε_b-DP for the
device's records, an integer vector of d·bins counts on a public grid. One round, not the two
stages of the central box: RESULTS.md §12 measured a single grid at G = 8 with a one-bin margin
as close to the two stages as their own run-to-run spread on flights, and one round saves a
whole round trip.

The coordinator sums the releases (each device's own draw: the sum carries one per device)
and reads the box by the farthest significant window (:func:`~.private_box.read_coarse` with
``farthest``, thresholds raised for that many draws: no run of w ≤ 32 bins wholly outside the
box holds a significant count, so a far, small cluster whose bin stands out of the noise is
kept, and the thin tail of a column spread over octaves too), widened by ``margin`` bins a
side: post-processing. The default ε_b is :data:`~fedsketch.common.choices.BOX_ROUND_FRACTION`
of the study's ε (0.2: a bin of about 490 records stands out for d = 3). It then opens the
boxed study (:mod:`fedsketch.common.study.boxed_round`), whose spec carries the box; every later
release clips its records into it. A device that takes part in every round spends ε_b plus the
rest of the study (sequential composition), all declared in the study's spec.

Units: values and box edges in data units; counts in records; ε dimensionless.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..choices import ROUND_SECONDS
from ..dp.calibration import noise_radius
from ..dp.samplers import dlap_noise, dlap_rate
from ..sketch.box import Box, Tally
from ..sketch.private_box import coarse_counts, grid_bins, read_coarse, sensitivity
from ..spec_fields import checked, integer, number
from .refine import CELLS_KIND, CellsError

#: Levels an octave and margin (bins a side) of the box round's grid (module docstring).
BOX_LEVELS, BOX_MARGIN = 8, 1
#: The payload kind of a box release: the d·bins noisy counts as little-endian int64.
BOX_KIND = CELLS_KIND


@dataclass(frozen=True)
class BoxPlan:
    """A study's box round: ``epsilon`` ε_b (finite, > 0) of each device's histogram release,
    the grid's ``levels`` an octave and ``margin`` (bins added a side), and ``round_seconds``,
    how long the boxed study that follows collects at most. ``derive_range``: σ's search range
    of a ``--scale auto`` study follows the box read (else the study states it)."""

    epsilon: float
    levels: int = BOX_LEVELS
    margin: int = BOX_MARGIN
    round_seconds: float = ROUND_SECONDS
    derive_range: bool = True

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, (int, float)) and math.isfinite(self.epsilon)
                and self.epsilon > 0):
            raise ValueError(f"the box round needs a finite ε > 0, got {self.epsilon!r}")
        if type(self.levels) is not int or not 1 <= self.levels <= 32:
            raise ValueError(f"the box round's levels an octave must be 1..32, got {self.levels!r}")
        if type(self.margin) is not int or not 0 <= self.margin <= 64:
            raise ValueError(f"the box round's margin must be 0..64 bins, got {self.margin!r}")
        if not (isinstance(self.round_seconds, (int, float)) and math.isfinite(self.round_seconds)
                and self.round_seconds > 0):
            raise ValueError(f"round_seconds must be finite and > 0, got {self.round_seconds!r}")
        if type(self.derive_range) is not bool:
            raise ValueError("derive_range must be true or false")
        for name in ("epsilon", "round_seconds"):
            object.__setattr__(self, name, float(getattr(self, name)))

    def size(self, d: int) -> int:
        """Counts in one release: d columns of :func:`~.private_box.grid_bins` bins."""
        return d * grid_bins(self.levels)

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"epsilon": self.epsilon, "levels": self.levels, "margin": self.margin,
                "round_seconds": self.round_seconds, "derive_range": self.derive_range}

    @classmethod
    def from_dict(cls, data: dict) -> BoxPlan:
        """Parse; ValueError or TypeError for anything malformed."""
        if not isinstance(data, dict) or set(data) != {"epsilon", "levels", "margin",
                                                       "round_seconds", "derive_range"}:
            raise ValueError("box must be an object with epsilon, levels, margin, round_seconds "
                             "and derive_range")
        derive = data["derive_range"]
        if type(derive) is not bool:
            raise ValueError("box.derive_range must be true or false")
        return cls(**checked({k: v for k, v in data.items() if k != "derive_range"},
                             {"epsilon": number, "levels": integer, "margin": integer,
                              "round_seconds": number}, "box"), derive_range=derive)


def _plan(study) -> BoxPlan:
    if study.box is None:
        raise ValueError("the study declares no box round")
    return study.box


def release_box(study, chunks: Iterable[np.ndarray],
                tally: Tally | None = None) -> tuple[int, str, bytes]:
    """One device's box release (n as released, kind, payload): its records' histograms plus
    DLap(e^{−ε_b/Δ1}) on every count (module docstring). n is the record count under
    replace-one (public there); under add/remove the first column's noisy total. ``tally``
    counts the records read (none is clipped: the grid spans every finite value)."""
    plan, d = _plan(study), study.sketch.frequencies.d
    counts = coarse_counts(chunks, d, plan.levels)
    if tally is not None:
        tally.records += int(counts[0].sum())
    neighbouring = study.sketch.privacy.neighbouring
    noisy = counts + dlap_noise(plan.epsilon, sensitivity(d, neighbouring), counts.shape)
    n = int(counts[0].sum()) if neighbouring == "replace_one" else int(noisy[0].sum())
    return n, BOX_KIND, noisy.astype("<i8").tobytes()


def _radius(study, size: int) -> int:
    plan, d = _plan(study), study.sketch.frequencies.d
    rate = dlap_rate(plan.epsilon, sensitivity(d, study.sketch.privacy.neighbouring))
    return noise_radius(math.exp(-rate), size)


def check_box(study, kind: str | None, payload: bytes, n: float) -> np.ndarray:
    """The (d, bins) int64 counts of a box release, or CellsError: a wrong kind or length, a
    record count outside what the study takes, or a count outside −(r + 1) .. N + r + 1, r the
    noise's radius over the release (exceeded with probability below 2^−40) and N the most
    records a device declares."""
    plan, d = _plan(study), study.sketch.frequencies.d
    if kind != BOX_KIND:
        raise CellsError(f"a box release travels as {BOX_KIND}, got {kind}")
    size = plan.size(d)
    if len(payload) != 8 * size:
        raise CellsError(f"a box release holds {size} int64 counts, got {len(payload)} bytes")
    if not (math.isfinite(n) and n == int(n)):
        raise CellsError(f"record count must be an integer, got {n}")
    radius, cap = _radius(study, size), study.device_cap
    low, high = ((study.min_records, cap) if study.sketch.privacy.neighbouring == "replace_one"
                 else (-radius * grid_bins(plan.levels), cap + radius * grid_bins(plan.levels)))
    if not low <= n <= high:
        raise CellsError(f"record count {n:g} is outside {low:,} .. {high:,}")
    counts = np.frombuffer(payload, dtype="<i8").astype(np.int64).reshape(d, -1)
    if counts.min() < -(radius + 1) or counts.max() > cap + radius + 1:
        raise CellsError(f"a box count lies outside −{radius + 1} .. {cap + radius + 1}, what the "
                         "round's mechanism can produce")
    return counts


def read_box(study, total: np.ndarray, draws: float) -> tuple[Box, dict]:
    """(the box, its public outcome) from the sum ``total`` (d, bins) of the devices' box
    releases, each count carrying ``draws`` DLap draws of the round's scale (one per device
    plainly): :func:`~.private_box.read_coarse` on the plan's grid (the farthest reading),
    widened by its margin.
    Post-processing. ValueError for a column no bin of which stands out of the noise."""
    plan = _plan(study)
    neighbouring = study.sketch.privacy.neighbouring
    lo, hi, tau = read_coarse(np.asarray(total, dtype=np.int64), plan.epsilon, neighbouring,
                              draws, plan.levels, plan.margin, farthest=True)
    box = Box(lo, hi)
    outcome = {"lo": box.lo.tolist(), "hi": box.hi.tolist(), "epsilon": plan.epsilon,
               "tau": tau, "draws": draws,
               "explanation": (f"a private box from one noisy histogram of every column at ε = "
                               f"{plan.epsilon:.4g} ({plan.levels} levels an octave; bins of "
                               f"fewer than about {tau:,} records at the edges are left out and "
                               "their records clipped into the box)")}
    return box, outcome


def check_box_sum(study, total: np.ndarray, devices: int) -> np.ndarray:
    """The (d, bins) counts of a secure box round's unmasked sum of ``devices`` devices, or
    CellsError: a wrong length, or a count outside what ``devices`` honest inputs of at most N
    records each can sum to plus the shares' noise radius (shape devices/h_min)."""
    plan, d = _plan(study), study.sketch.frequencies.d
    total = np.asarray(total, dtype=np.int64)
    if total.size != plan.size(d):
        raise CellsError(f"the box round's sum holds {total.size} counts, not {plan.size(d)}")
    rate = dlap_rate(plan.epsilon, sensitivity(d, "replace_one"))
    radius = noise_radius(math.exp(-rate), total.size, devices / study.assumptions.min_honest)
    high = min(devices * study.device_cap, study.secure_aggregation.max_records) + radius + 1
    if total.min() < -(radius + 1) or total.max() > high:
        raise CellsError(f"a count of the box round's sum lies outside −{radius + 1} .. {high}: "
                         "an input was out of range")
    return total.reshape(d, -1)
