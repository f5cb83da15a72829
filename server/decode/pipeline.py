"""Federated aggregation of device releases and decoding of the average (MECHANISMS §1.8).

Device l releases the noisy encoded sum S~_l ∈ Z^{2m} (grid steps, γ per unit) and its record
count n_l (exact under replace-one, noisy under add/remove). With N = Σ_l n_l the average is
s = Σ_l S~_l / (γ·α·N·√m), the integer sum being exact (int64) for both maps (§1.10). It is
ε-DP per record by parallel composition over the devices' disjoint records. Decoding is CL-OMPR
inside the study's public box (never reads data).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from fedsketch.common.features import FIRST_HARMONIC, GRID
from fedsketch.common.sketch.frequencies import draw_frequencies
from fedsketch.common.sketch.sketching import normalized_sketch
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.aggregate import check_sketch_sum
from fedsketch.common.study.planner import noise_variance
from fedsketch.common.study.study import StudySpec
from fedsketch.common.study.verdict import Verdict
from fedsketch.server.decode.clompr import DecodeResult, clompr
from fedsketch.server.decode.identify import Identifiability, assess
from fedsketch.server.decode.judge import judge_sketch


@dataclass(frozen=True)
class StudyResult:
    """Decoded centroids (k, d) in data units, weights (k,), sketch residual, devices, records,
    whether the centroids stand above the sketch's noise (:mod:`.identify`), and the verdict on
    them (:mod:`fedsketch.common.study.verdict`)."""

    centroids: np.ndarray
    weights: np.ndarray
    residual: float
    devices: int
    records: float
    identifiability: Identifiability
    verdict: Verdict

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {
            "centroids": self.centroids.tolist(),
            "weights": self.weights.tolist(),
            "residual": self.residual,
            "devices": self.devices,
            "records": self.records,
            "identifiability": self.identifiability.to_dict(),
            "verdict": self.verdict.to_dict(),
        }


def average_sketch(spec: StudySpec, parts: Iterable[tuple[float, np.ndarray]]) -> tuple[
        np.ndarray, int, float]:
    """(s complex (m,), devices, N) from (n_l, payload (2, m) int64) pairs (module docstring)."""
    total, devices, records = sum_parts(spec, parts)
    return integer_sketch(spec, total, records), devices, records


def sum_parts(spec: StudySpec, parts: Iterable[tuple[float, np.ndarray]]) -> tuple[
        np.ndarray, int, float]:
    """(Σ S~_l (2, m) int64, devices, N) from (n_l, payload (2, m) int64) pairs; ValueError on
    int64 overflow or without contributions."""
    total = np.zeros((2, spec.sketch.frequencies.m), dtype=np.int64)
    devices, records = 0, 0.0
    for n, values in parts:
        if _magnitude(total) + _magnitude(values) >= 2**63:
            raise ValueError("the devices' integer sums overflow int64: too many records")
        total += values
        devices += 1
        records += n
    if devices == 0 or records <= 0:
        raise ValueError("no contributions (or no records) to aggregate")
    return total, devices, records


def _magnitude(values: np.ndarray) -> int:
    """max |v| as a Python int (np.abs would wrap −2^63)."""
    return max(int(values.max()), -int(values.min()))


def integer_sketch(spec: StudySpec, total: np.ndarray, records: float) -> np.ndarray:
    """s = ΣS~ / (γ·α·N·√m) (complex (m,)) from the summed integer payloads (2, m)."""
    return normalized_sketch(total[0], total[1], GRID[spec.sketch.feature],
                             spec.sketch.r / spec.sketch.frequencies.m, records)


def decode_study(spec: StudySpec, parts: Iterable[tuple[float, np.ndarray]]) -> StudyResult:
    """Sum the contributions, check the sum against what honest devices can release
    (:func:`~fedsketch.common.study.aggregate.check_sketch_sum`: AggregateError, nothing
    decoded), and decode k centroids with the study's replicates and seed; every device added a
    full noise draw."""
    total, devices, records = sum_parts(spec, parts)
    check_sketch_sum(spec, total, records, devices, secure=False)
    return decode_sketch(spec, integer_sketch(spec, total, records), devices, records,
                         draws=devices)


def decode_centroids(sketch: np.ndarray, spec: SketchSpec, k: int, lo: np.ndarray, hi: np.ndarray, *,
                     replicates: int, rng: np.random.Generator,
                     progress: Callable[[int, int], None] | None = None) -> DecodeResult:
    """The decoding half of compressive k-means, as the ``decode`` command, ``compare``'s ckm
    and the coordinator all run it: CL-OMPR on ``sketch`` (complex (m,)) with the Ω, ξ of
    ``spec.frequencies`` and the first harmonic of ``spec.feature``, k centroids inside the
    public box [lo, hi] (data units), the best of ``replicates`` runs by sketch residual."""
    freqs = draw_frequencies(spec.frequencies)
    return clompr(sketch, freqs.omega, freqs.xi, k, np.asarray(lo, dtype=np.float64),
                  np.asarray(hi, dtype=np.float64), harmonic=FIRST_HARMONIC[spec.feature],
                  replicates=replicates, rng=rng, progress=progress)


@dataclass(frozen=True)
class Decoding:
    """Decoded centroids (k, d) in data units, their weights (k,) summing to 1, the sketch
    residual, whether the centroids stand above the sketch's noise (:mod:`.identify`), and the
    verdict on them (:mod:`fedsketch.common.study.verdict`)."""

    centroids: np.ndarray
    weights: np.ndarray
    residual: float
    identifiability: Identifiability
    verdict: Verdict

    def to_dict(self) -> dict:
        """JSON-ready form (what ``fedsketch decode --json`` prints)."""
        return {"centroids": self.centroids.tolist(), "weights": self.weights.tolist(),
                "residual": self.residual, "identifiability": self.identifiability.to_dict(),
                "verdict": self.verdict.to_dict()}


def decode_judged(sketch: np.ndarray, spec: SketchSpec, k: int, lo: np.ndarray, hi: np.ndarray, *,
                  records: float, draws: float = 1.0, replicates: int, rng: np.random.Generator,
                  progress: Callable[[int, int], None] | None = None) -> Decoding:
    """:func:`decode_centroids`, then the verdict on its centroids against the noise of ``draws``
    full noise draws on ``records`` released records
    (:func:`fedsketch.common.study.planner.noise_variance`: 1 draw for one release, the number of
    devices with local noise, devices/h_min under secure aggregation). ValueError unless 1 ≤ k ≤ m."""
    if not 1 <= k <= spec.frequencies.m:
        raise ValueError(f"k must be in 1..m = 1..{spec.frequencies.m}, got {k}")
    out = decode_centroids(sketch, spec, k, lo, hi, replicates=replicates, rng=rng, progress=progress)
    variance = noise_variance(spec, records, draws)
    ident = assess(sketch, spec, out.centroids, lo, hi, variance)
    verdict = judge_sketch(sketch, spec, out.centroids, lo, hi, variance, ident.to_dict())
    return Decoding(out.centroids, out.weights, out.residual, ident, verdict)


def decode_sketch(spec: StudySpec, sketch: np.ndarray, devices: int, records: float,
                  draws: float) -> StudyResult:
    """Decode k centroids from an aggregate sketch with the study's replicates and seed, and
    judge them against the noise of ``draws`` full noise draws in the sum (the number of
    devices with local noise; devices/h_min under secure aggregation)."""
    out = decode_judged(sketch, spec.sketch, spec.k, np.array(spec.lo), np.array(spec.hi),
                        records=records, draws=draws, replicates=spec.replicates,
                        rng=np.random.default_rng(spec.decode_seed))
    return StudyResult(out.centroids, out.weights, out.residual, devices, records, out.identifiability,
                       out.verdict)
