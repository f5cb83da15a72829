"""One whole dataset sketched by its curator: the optional private choice of σ, then the release.

This is the ``sketch`` command's work, shared with the Python API (``fedsketch.sketch`` and
``fedsketch.CompressiveKMeans``). A :class:`SketchPlan` holds every public choice and checks
them when it is made, before any data is read. :meth:`SketchPlan.run` then

1. with ``scale=None`` ("auto"), spends ε_cal = ``auto_fraction``·ε on a private calibration
   sketch and fits σ from it (:func:`fedsketch.common.sketch.scale.calibrate_scale`), and
2. releases the main sketch (:func:`fedsketch.common.sketch.spec.release_sketch`) at the rest,
   ε − ε_cal (sequential composition: the whole run is ε-DP, or (ε, δ) with δ > 0).

At ε = ∞ both steps are noiseless. Each release draws its noise from OS bits, so a run is never
reproducible at finite ε, whatever the seed (the seed fixes the public Ω and ξ only).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from ..features import check_feature
from .box import Box, Tally
from .frequencies import LAWS, FrequencySpec, draw_frequencies
from .privacy import PrivacySpec, PrivateSketch
from .scale import DEFAULT_RANGE, ScaleCalibration, calibrate_scale
from .sketchfile import SketchFile
from .sketching import check_r
from .spec import SketchSpec, release_sketch


@dataclass(frozen=True)
class DatasetSketch:
    """What :meth:`SketchPlan.run` made: the main release's ``spec`` and ``release``, and the
    calibration round that chose σ (None when σ was given)."""

    spec: SketchSpec
    release: PrivateSketch
    calibration: ScaleCalibration | None

    def to_file(self) -> SketchFile:
        """The sketch as its file holds it (write it with :meth:`SketchFile.save`)."""
        calibration = None if self.calibration is None else self.calibration.to_dict()
        return SketchFile.from_release(self.spec, self.release,
                                       draw_frequencies(self.spec.frequencies).sha256, calibration)


@dataclass(frozen=True)
class SketchPlan:
    """The public choices of one dataset's sketch (the ``sketch`` command's options).

    ``m`` frequencies drawn by ``law`` at scale σ = ``scale`` (data units; None: "auto", chosen
    privately with ``auto_fraction`` of ε, searched in ``scale_range``) from the public ``seed``,
    with a random dither ξ if ``dither``; ``feature`` map; ``r`` of m entries per record (None:
    m); ``privacy`` the whole run's budget, calibration included. ValueError names the first bad
    choice.
    """

    privacy: PrivacySpec
    m: int = 1000
    feature: str = "complex"
    law: str = "adapted_radius"
    scale: float | None = None
    seed: int = 0
    r: int | None = None
    dither: bool = True
    auto_fraction: float = 0.1
    scale_range: tuple[float, float] = DEFAULT_RANGE

    def __post_init__(self) -> None:
        if self.law not in LAWS:
            raise ValueError(f"unknown law {self.law!r}; choose one of {', '.join(LAWS)}")
        check_feature(self.feature)
        if self.m < 1:
            raise ValueError(f"m must be ≥ 1, got {self.m}")
        check_r(self.m if self.r is None else self.r, self.m)
        if self.scale is not None and not 0 < self.scale < math.inf:
            raise ValueError(f"the scale σ must be a positive number or 'auto', got {self.scale!r}")
        if self.scale is None and not 0 < self.auto_fraction < 1:
            raise ValueError(f"the auto fraction of ε must be in (0, 1), got {self.auto_fraction}")
        lo, hi = self.scale_range
        if not 0 < lo < hi < math.inf:
            raise ValueError(f"the σ search range needs 0 < LO < HI, got {lo}:{hi}")

    def run(self, chunks: Callable[[], Iterable[np.ndarray]], box: Box, *, tally: Tally | None = None,
            progress: Callable[[int], None] | None = None) -> DatasetSketch:
        """Sketch the records that ``chunks()`` yields (finite, (rows, box.d) each, data units;
        called once, or twice with scale "auto") clipped into the public ``box`` (module
        docstring). ``tally`` counts the main pass's clipped records; ``progress(rows)`` after each
        of its chunks."""
        eps_total = self.privacy.epsilon
        sigma, calibration, eps_main = self.scale, None, eps_total
        if sigma is None:
            eps_cal = eps_total * self.auto_fraction
            eps_main = eps_total - eps_cal if math.isfinite(eps_total) else eps_total
            calibration = calibrate_scale(chunks, box, eps_cal, neighbouring=self.privacy.neighbouring,
                                          scale_range=self.scale_range, seed=self.seed)
            sigma = calibration.sigma
        spec = SketchSpec(
            FrequencySpec(d=box.d, m=self.m, scale=sigma, law=self.law, seed=self.seed, dither=self.dither),
            self.feature,
            self.m if self.r is None else self.r,
            PrivacySpec(eps_main, self.privacy.delta, self.privacy.neighbouring),
        )
        release = release_sketch(spec, chunks(), box, tally=tally, progress=progress)
        return DatasetSketch(spec, release, calibration)
