"""One whole dataset sketched by its curator: the optional private choice of σ, then the release.

This is the ``sketch`` command's work, shared with the Python API (``fedsketch.sketch`` and
``fedsketch.CompressiveKMeans``). A :class:`SketchPlan` holds every public choice and checks
them when it is made, before any data is read. :meth:`SketchPlan.run` then

1. without a box ("auto"), spends ε_box = ``box_fraction``·ε on a private box read from the
   records (:mod:`fedsketch.common.sketch.private_box`; at ε = ∞ the records' own range),
2. with ``scale=None`` ("auto"), spends ε_cal = ``auto_fraction``·ε on a private calibration
   sketch and fits σ from it (:func:`fedsketch.common.sketch.scale.calibrate_scale`), and
3. releases the main sketch (:func:`fedsketch.common.sketch.spec.release_sketch`) at the rest,
   ε − ε_box − ε_cal (sequential composition: the whole run is ε-DP, or (ε, δ) with δ > 0).

At ε = ∞ every step is noiseless. Each release draws its noise from OS bits, so a run is never
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
from .private_box import BOX_FRACTION, PrivateBox, data_box, private_box
from .scale import ScaleCalibration, calibrate_scale
from .sketchfile import SketchFile
from .sketching import check_r
from .spec import SketchSpec, release_sketch

#: The most of ε a run may spend before its main sketch (the box's and σ's shares together).
MAX_READ = 0.5


def below_total(total: float, main: float, calibration: float, box: float) -> float:
    """``main`` (the sketch's ε), lowered by a rounding step at a time until the file's
    ``epsilon_spent`` (main + (calibration + box), summed as
    :meth:`~.sketchfile.SketchFile.from_release` sums them) is at most ``total``: ε·(1 − b) − ε·a
    can round a step above ε − ε·b − ε·a."""
    while main + sum((calibration, box)) > total:
        main = math.nextafter(main, 0.0)
    return main


@dataclass(frozen=True)
class DatasetSketch:
    """What :meth:`SketchPlan.run` made: the main release's ``spec`` and ``release``, the
    calibration round that chose σ (None when σ was given), and the ``box`` the records were
    clipped into with how it was read (None when the caller gave it)."""

    spec: SketchSpec
    release: PrivateSketch
    calibration: ScaleCalibration | None
    box: PrivateBox | Box | None = None

    def box_dict(self) -> dict | None:
        """The box read from the records as the file and ``--json`` report it: a private box's
        :meth:`~.private_box.PrivateBox.to_dict`, or at ε = ∞ the data's own range (``epsilon``
        "inf": no privacy); None when the caller gave the box."""
        if isinstance(self.box, PrivateBox):
            return self.box.to_dict()
        if isinstance(self.box, Box):
            return {"lo": self.box.lo.tolist(), "hi": self.box.hi.tolist(), "epsilon": "inf"}
        return None

    def to_file(self) -> SketchFile:
        """The sketch as its file holds it (write it with :meth:`SketchFile.save`)."""
        calibration = None if self.calibration is None else self.calibration.to_dict()
        return SketchFile.from_release(self.spec, self.release,
                                       draw_frequencies(self.spec.frequencies).sha256, calibration,
                                       self.box_dict())


@dataclass(frozen=True)
class SketchPlan:
    """The public choices of one dataset's sketch (the ``sketch`` command's options).

    ``m`` frequencies drawn by ``law`` at scale σ = ``scale`` (data units; None: "auto", chosen
    privately with ``auto_fraction`` of ε, searched in ``scale_range``, data units; None: the range
    the public box gives, :func:`~fedsketch.common.sketch.scale.default_range`) from the public ``seed``,
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
    scale_range: tuple[float, float] | None = None
    box_fraction: float = BOX_FRACTION

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
        if not 0 < self.box_fraction < 1:
            raise ValueError(f"the box's share of ε must be in (0, 1), got {self.box_fraction}")
        if self.scale_range is not None:
            lo, hi = self.scale_range
            if not 0 < lo < hi < math.inf:
                raise ValueError(f"the σ search range needs 0 < LO < HI, got {lo}:{hi}")

    def run(self, chunks: Callable[[], Iterable[np.ndarray]], box: Box | None, *,
            d: int | None = None, tally: Tally | None = None,
            progress: Callable[[int], None] | None = None) -> DatasetSketch:
        """Sketch the records that ``chunks()`` yields (finite, (rows, d) each, data units;
        called once, or more with scale or box "auto") clipped into the public ``box`` (module
        docstring), or with ``box`` None ("auto", ``d`` given) into a box read from them: a
        private one at ``box_fraction`` of ε (:func:`~.private_box.private_box`), the data's own
        range at ε = ∞. ``tally`` counts the main pass's clipped records; ``progress(rows)``
        after each of its chunks."""
        eps_total = self.privacy.epsilon
        sigma, calibration, eps_main, read = self.scale, None, eps_total, None
        if box is None:
            if d is None:
                raise ValueError("a box read from the records needs their dimension d")
            if self.box_fraction + (0 if self.scale is not None else self.auto_fraction) > MAX_READ:
                raise ValueError(f"the box's and σ's shares of ε ({self.box_fraction:g} + "
                                 f"{0 if self.scale is not None else self.auto_fraction:g}) must "
                                 f"leave the sketch at least {1 - MAX_READ:g} of it")
            if hasattr(chunks(), "feature_sum"):
                raise ValueError("a box read from the records reads them in this process: with a "
                                 "dataset summed on a cluster (--engine dask), give the box "
                                 "(--bounds LO:HI or a bounds.json)")
            if math.isfinite(eps_total):
                read = private_box(chunks, d, eps_total * self.box_fraction,
                                   neighbouring=self.privacy.neighbouring)
                box, eps_main = read.box, eps_total * (1 - self.box_fraction)
            else:
                box = read = data_box(chunks, d)
        if sigma is None:
            eps_cal = eps_total * self.auto_fraction
            eps_main = eps_main - eps_cal if math.isfinite(eps_total) else eps_total
            calibration = calibrate_scale(chunks, box, eps_cal, neighbouring=self.privacy.neighbouring,
                                          scale_range=self.scale_range, seed=self.seed)
            sigma = calibration.sigma
        if math.isfinite(eps_total):
            eps_main = below_total(eps_total, eps_main, eps_cal if calibration else 0.0,
                                   read.epsilon if read is not None else 0.0)
        spec = SketchSpec(
            FrequencySpec(d=box.d, m=self.m, scale=sigma, law=self.law, seed=self.seed, dither=self.dither),
            self.feature,
            self.m if self.r is None else self.r,
            PrivacySpec(eps_main, self.privacy.delta, self.privacy.neighbouring),
        )
        release = release_sketch(spec, chunks(), box, tally=tally, progress=progress)
        return DatasetSketch(spec, release, calibration, read)
