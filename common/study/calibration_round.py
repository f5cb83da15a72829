"""Round 0 of a federated study with ``--scale auto``: the private choice of σ across devices.

A study may declare a calibration round
(:class:`~fedsketch.common.study.calibration_plan.CalibrationPlan`, part of its hashed spec,
format ``fedsketch.study/4``). Its devices then release, once, the calibration sketch that
:mod:`fedsketch.common.sketch.scale` computes centrally: for the records of the device mapped into the
study's public box,

    S~ = Σ_i q(Ω_0ᵀx_i) + N   ∈ Z^{2·m0}   (grid steps, γ per unit, r = m0, no dither),

Ω_0 the m0 public calibration frequencies of the study's seed (radii log-spaced over the search
range [σ_lo, σ_hi], :func:`~fedsketch.common.sketch.scale.calibration_frequencies`) and N the exact
discrete noise of :func:`~fedsketch.common.sketch.privacy.privatize` at ε_0 (the plan's ``epsilon``,
δ = 0, the study's neighbouring relation): the central calibration release
(:func:`~fedsketch.common.sketch.scale.calibration_release`), ε_0-DP for the device's records. The
coordinator sums the releases of the round (each device's own noise draw: the sum carries one
per device) and fits σ with the central rule (:func:`~fedsketch.common.sketch.scale.read_calibration`),
post-processing only. It then opens the sketch round, a study of its own
(:class:`SketchRound`, ``fedsketch.sketch-round/1``) whose hashed spec carries that σ and the
Ω‖ξ hash it gives; the study's sketch is collected and decoded there, with the study's rules,
and its refinement rounds follow as in any study. A device that takes part in every round
spends ε_0 + ε_sketch + Σ_t ε_t (sequential composition), all declared in the study's spec.

The study's own ``sketch.frequencies.scale`` is a placeholder, √(σ_lo·σ_hi) (the search
range's geometric middle), that no device releases on: only the sketch round's σ is used.

Units: σ in data units; ε dimensionless; seconds for the sketch round's window.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

import numpy as np

from ..choices import AUTO_FRACTION, ROUND_SECONDS
from ..dp.calibration import noise_radius
from ..dp.plan import noise_plan
from ..features import GRID
from ..sketch.box import Box, Tally
from ..sketch.privacy import PrivacySpec, coordinate_variance
from ..sketch.scale import (
    CalibrationSpec,
    ScaleCalibration,
    calibration_release,
    read_calibration,
)
from ..sketch.sketching import normalized_sketch
from ..sketch.spec import canonical_json
from ..spec_fields import checked, integer, number, optional_number, text
from .box_plan import check_box
from .calibration_plan import CalibrationPlan
from .payload import check_payload
from .study import StudySpec
from .wire import PayloadError, decode, encode

#: Written and read: the spec of a study's sketch round after its calibration round.
SKETCH_ROUND_FORMAT = "fedsketch.sketch-round/1"
#: The payload kind of a calibration release (``Contribution.int64_pairs``, m0 pairs).
CALIBRATION_KIND = "int64_pairs"


def split_auto(epsilon: float, scale_range: tuple[float, float], fraction: float = AUTO_FRACTION,
               round_seconds: float = ROUND_SECONDS) -> tuple[CalibrationPlan, float]:
    """(round 0's plan, the ε left for the sketch and refinement rounds) of a study whose devices
    spend ``epsilon`` in all: round 0 takes ``fraction``·ε (sequential composition) and searches
    σ in ``scale_range`` (data units; the study's box gives the default,
    :func:`~fedsketch.common.sketch.scale.default_range`). ValueError for a fraction outside (0, 1) or
    an ε that is not finite and > 0."""
    if not 0 < fraction < 1:
        raise ValueError(f"round 0's share of ε must be in (0, 1), got {fraction!r}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"--scale auto needs a finite epsilon > 0, got {epsilon!r}")
    return (CalibrationPlan(fraction * epsilon, *scale_range, round_seconds=round_seconds),
            (1 - fraction) * epsilon)


def _calibration(study: StudySpec) -> tuple[CalibrationSpec, PrivacySpec]:
    plan, freqs = study.calibration, study.sketch.frequencies
    if plan is None:
        raise ValueError("the study declares no calibration round")
    return (plan.spec(freqs.d, freqs.seed),
            PrivacySpec(plan.epsilon, 0.0, study.sketch.privacy.neighbouring))


def release_calibration(study: StudySpec, chunks: Iterable[np.ndarray], box: Box,
                        tally: Tally | None = None) -> tuple[int, str, bytes]:
    """One device's round-0 release (n as released, kind, payload bytes): the central calibration
    release of its records at the study's ε_0 (module docstring)."""
    spec, privacy = _calibration(study)
    release = calibration_release(chunks, box, spec, privacy, tally)
    kind, payload = encode(release, "complex")
    return release.n, kind, payload


def check_calibration(study: StudySpec, kind: str, payload: bytes, n: float) -> np.ndarray:
    """The (2, m0) int64 (re, im) of a round-0 payload, or PayloadError: a wrong kind or length,
    a record count outside what the study takes (under add/remove: within the noisy count's
    radius), or an entry beyond γ·n plus the noise's radius (exceeded with probability below
    2^−40, :func:`~fedsketch.common.dp.calibration.noise_radius`)."""
    spec, privacy = _calibration(study)
    if kind != CALIBRATION_KIND:
        raise PayloadError(f"a calibration release travels as {CALIBRATION_KIND}, got {kind}")
    if not (np.isfinite(n) and n == int(n)):
        raise PayloadError(f"record count must be an integer, got {n}")
    terms, cap = noise_plan("complex", spec.m0, spec.m0, privacy), study.device_cap
    if privacy.neighbouring == "replace_one":
        low, high, slack = study.min_records, cap, 0
    else:
        slack = noise_radius(terms[1].scale, 1) + 1
        low, high = -slack, cap + slack
    if not low <= n <= high:
        raise PayloadError(f"record count {n:g} is outside {low:,} .. {high:,}")
    values = decode(kind, payload, spec.m0)
    bound = GRID["complex"] * min(max(int(n), 0) + slack, cap) + noise_radius(terms[0].scale,
                                                                               2 * spec.m0) + 1
    if max(int(values.max()), -int(values.min())) > bound:
        raise PayloadError(f"a calibration entry exceeds {bound}, the largest value the "
                           "round's mechanism can produce")
    return values


def check_release(study: StudySpec, kind: str, payload: bytes, n: float) -> np.ndarray:
    """A plain study's own release checked (PayloadError, or CellsError for a box release): its
    box round's if it declares one (:func:`~fedsketch.common.study.box_plan.check_box`), its
    round 0's if it declares one (:func:`check_calibration`), else its sketch's
    (:func:`~fedsketch.common.study.payload.check_payload`)."""
    if study.box is not None:
        return check_box(study, kind, payload, n)
    if study.calibration is not None:
        return check_calibration(study, kind, payload, n)
    return check_payload(study, kind, payload, n)


def fit_round0(study: StudySpec, releases: list[tuple[float, np.ndarray]],
               draws: float | None = None) -> ScaleCalibration:
    """σ from round 0's releases [(n_k, (2, m0) int64)]: the sum S = Σ S~_k over N = Σ n_k
    records, normalized s = S/(γ·max(N, 1)·√m0), whose noise is ``draws`` draws of one device's
    term (default: one per release, each device's own), then the central rule
    (:func:`~fedsketch.common.sketch.scale.read_calibration`). ValueError without releases."""
    if not releases:
        raise ValueError("round 0 has no release to fit σ from")
    spec, privacy = _calibration(study)
    total = np.sum([values for _, values in releases], axis=0)
    records = math.fsum(n for n, _ in releases)
    term = noise_plan("complex", spec.m0, spec.m0, privacy)[0]
    grid = GRID["complex"]
    variance = (len(releases) if draws is None else draws) * coordinate_variance(
        term, grid, 1.0, records, spec.m0)
    sketch = normalized_sketch(total[0], total[1], grid, 1.0, records)
    return read_calibration(sketch, variance, spec, Box(study.lo, study.hi), privacy.epsilon)


def is_sketch_round(spec_json: str) -> bool:
    """Whether a spec's JSON is a sketch round's (an unreadable one is not)."""
    try:
        return json.loads(spec_json).get("format") == SKETCH_ROUND_FORMAT
    except (ValueError, AttributeError, RecursionError):
        return False


@dataclass(frozen=True)
class SketchRound:
    """The sketch round of the study ``parent_id`` (spec hash ``parent_sha256``) after its round 0:
    the σ fixed there (data units), the hash of the Ω‖ξ it gives, the round's deadline (Unix
    seconds; None under secure aggregation), round 0's outcome (``calibration``,
    :meth:`ScaleCalibration.to_dict`), public, its quorum (the study's) and the study's secure
    aggregation as its spec states it (a dict; None for a plain study): a secure study's sketch
    round is secure too."""

    parent_id: str
    parent_sha256: str
    sigma: float
    omega_sha256: str
    deadline: float | None
    calibration: dict
    min_devices: int
    secure_aggregation: dict | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.sigma, (int, float)) and math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"the sketch round's σ must be finite and > 0, got {self.sigma!r}")
        if self.deadline is not None and not math.isfinite(self.deadline):
            raise ValueError("the deadline must be a finite Unix time")
        if type(self.min_devices) is not int or self.min_devices < 1:
            raise ValueError(f"min_devices must be an integer >= 1, got {self.min_devices!r}")
        if len(self.parent_sha256) != 64 or not self.parent_id or len(self.omega_sha256) != 64:
            raise ValueError("a sketch round names its study, that study's spec hash and Ω's hash")
        if not isinstance(self.calibration, dict) or self.calibration.get("sigma") != self.sigma:
            raise ValueError("the sketch round's calibration must state its σ")
        object.__setattr__(self, "sigma", float(self.sigma))

    def epsilon(self, parent: StudySpec) -> float:
        """ε of the sketch round's release: the study's sketch's."""
        return parent.sketch.privacy.epsilon

    def study(self, parent: StudySpec) -> StudySpec:
        """The study this round collects: ``parent`` with σ and its Ω hash, this deadline, and no
        calibration or refinement (those are rounds of the parent). ValueError unless ``parent``
        declares round 0 and σ lies in its search range."""
        plan = parent.calibration
        if plan is None:
            raise ValueError("the round's study declares no calibration round")
        if not plan.sigma_lo <= self.sigma <= plan.sigma_hi:
            raise ValueError(f"σ = {self.sigma:g} is outside the study's search range "
                             f"{plan.sigma_lo:g}:{plan.sigma_hi:g}")
        if self.min_devices != parent.min_devices:
            raise ValueError(f"the round asks a quorum of {self.min_devices}, the study "
                             f"{parent.min_devices}")
        secure = None if parent.secure_aggregation is None else asdict(parent.secure_aggregation)
        if self.secure_aggregation != secure:
            raise ValueError("the sketch round's secure aggregation is not the study's")
        freqs = replace(parent.sketch.frequencies, scale=self.sigma)
        return replace(parent, sketch=replace(parent.sketch, frequencies=freqs),
                       omega_sha256=self.omega_sha256, deadline=self.deadline, calibration=None,
                       refine=None)

    def to_json(self) -> str:
        """The canonical JSON that travels and is hashed."""
        return canonical_json({"format": SKETCH_ROUND_FORMAT, "parent_id": self.parent_id,
                               "parent_sha256": self.parent_sha256, "sigma": self.sigma,
                               "omega_sha256": self.omega_sha256, "deadline": self.deadline,
                               "calibration": self.calibration, "min_devices": self.min_devices,
                               "secure_aggregation": self.secure_aggregation})

    @classmethod
    def from_json(cls, spec_json: str) -> SketchRound:
        """Parse and validate; ValueError with the reason on anything malformed, a field of
        another JSON type than its own included (:mod:`~.spec_fields`)."""
        try:
            data = json.loads(spec_json)
            if not isinstance(data, dict) or data.pop("format", None) != SKETCH_ROUND_FORMAT:
                raise ValueError(f"a sketch round must be a {SKETCH_ROUND_FORMAT} object")
            return cls(**checked(data, {"parent_id": text, "parent_sha256": text, "sigma": number,
                                        "omega_sha256": text, "deadline": optional_number,
                                        "min_devices": integer}))
        except (TypeError, RecursionError) as exc:
            raise ValueError(f"malformed sketch round spec: {exc!r}") from None
