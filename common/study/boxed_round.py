"""The boxed study: what a study with a box round (``--bounds auto``,
:mod:`fedsketch.common.study.box_plan`) goes on as once its box is read.

The coordinator sums the box round's releases, reads the box, and opens the boxed study, a
study of its own (:class:`BoxedRound`, ``fedsketch.boxed-round/1``) that names its study by id
and spec hash and carries the box [lo, hi]^d (data units) and the round's public outcome. The
study it collects (:meth:`BoxedRound.study`) is the parent's spec with that box, no box round,
and, for a ``--scale auto`` study whose σ range follows the box, σ's search range
:func:`~fedsketch.common.sketch.scale.default_range` of the box (its placeholder σ and Ω hash
with it): every later release (round 0's calibration, the sketch, refinement rounds, which
are rounds of the boxed study) clips its records into the box. A device checks all of it
before it spends: the range and Ω hash recompute from the box, and the box lies in the grid's
span. Its ledger books the boxed study's releases as rounds of the parent (one study, one ε).

Units: box edges and σ in data units; seconds for deadlines.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace

from ..sketch.box import WIDEST, Box
from ..sketch.frequencies import draw_frequencies
from ..sketch.scale import default_range
from ..sketch.spec import canonical_json
from ..spec_fields import checked, integer, numbers, optional_number, text

#: Written and read: the spec of a study's boxed study after its box round.
BOXED_ROUND_FORMAT = "fedsketch.boxed-round/1"
#: The ledger's round number of the boxed study's own release (a round of the parent study
#: before its sketch round, 0, and its refinement rounds, 1..T).
BOXED_LEDGER_ROUND = -1


def is_boxed_round(spec_json: str) -> bool:
    """Whether a spec's JSON is a boxed study's (an unreadable one is not)."""
    try:
        return json.loads(spec_json).get("format") == BOXED_ROUND_FORMAT
    except (ValueError, AttributeError, RecursionError):
        return False


def boxed_study(parent, lo, hi, deadline: float | None):
    """The study ``parent`` (a StudySpec with a box round) goes on as in the box [lo, hi]:
    its box, no box round, σ's range from the box when the plan says so, and ``deadline``."""
    plan = parent.box
    if plan is None:
        raise ValueError("the boxed study's parent declares no box round")
    box = Box(lo, hi)
    if box.lo.size != parent.sketch.frequencies.d:
        raise ValueError(f"the box has d = {box.lo.size}, the study {parent.sketch.frequencies.d}")
    if float(abs(box.lo).max()) > WIDEST or float(abs(box.hi).max()) > WIDEST:
        raise ValueError("the box reaches beyond the box round's grid (±2^40)")
    sketch, cal = parent.sketch, parent.calibration
    if cal is not None and plan.derive_range:
        cal = replace(cal, sigma_lo=default_range(box)[0], sigma_hi=default_range(box)[1])
        sketch = replace(sketch, frequencies=replace(sketch.frequencies, scale=cal.placeholder))
    omega = draw_frequencies(sketch.frequencies).sha256
    return replace(parent, sketch=sketch, calibration=cal, omega_sha256=omega,
                   lo=tuple(box.lo.tolist()), hi=tuple(box.hi.tolist()), box=None,
                   deadline=deadline)


@dataclass(frozen=True)
class BoxedRound:
    """The boxed study of the study ``parent_id`` (spec hash ``parent_sha256``) after its box
    round: the box ``lo``, ``hi`` (data units), the Ω‖ξ hash of the study it collects, its
    deadline (Unix seconds), the box round's public ``outcome`` (:func:`~.box_plan.read_box`),
    its quorum (the study's) and the study's secure aggregation as its spec states it."""

    parent_id: str
    parent_sha256: str
    lo: tuple[float, ...]
    hi: tuple[float, ...]
    omega_sha256: str
    deadline: float | None
    outcome: dict
    min_devices: int
    secure_aggregation: dict | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "lo", tuple(float(v) for v in self.lo))
        object.__setattr__(self, "hi", tuple(float(v) for v in self.hi))
        Box(self.lo, self.hi)  # finite, lo < hi
        if self.deadline is not None and not math.isfinite(self.deadline):
            raise ValueError("the deadline must be a finite Unix time")
        if type(self.min_devices) is not int or self.min_devices < 1:
            raise ValueError(f"min_devices must be an integer >= 1, got {self.min_devices!r}")
        if len(self.parent_sha256) != 64 or not self.parent_id or len(self.omega_sha256) != 64:
            raise ValueError("a boxed study names its study, that study's spec hash and Ω's hash")
        if not isinstance(self.outcome, dict):
            raise ValueError("the boxed study's outcome must be an object")

    def study(self, parent):
        """The study this round collects (:func:`boxed_study`). ValueError unless ``parent``
        declares a box round, the quorum and secure aggregation are the study's, and the Ω hash
        recomputes."""
        if self.min_devices != parent.min_devices:
            raise ValueError(f"the round asks a quorum of {self.min_devices}, the study "
                             f"{parent.min_devices}")
        secure = None if parent.secure_aggregation is None else asdict(parent.secure_aggregation)
        if self.secure_aggregation != secure:
            raise ValueError("the boxed study's secure aggregation is not the study's")
        spec = boxed_study(parent, self.lo, self.hi, self.deadline)
        if spec.omega_sha256 != self.omega_sha256:
            raise ValueError("the frequencies Ω, ξ do not match the boxed study's hash")
        return spec

    def to_json(self) -> str:
        """The canonical JSON that travels and is hashed."""
        return canonical_json({"format": BOXED_ROUND_FORMAT, "parent_id": self.parent_id,
                               "parent_sha256": self.parent_sha256, "lo": list(self.lo),
                               "hi": list(self.hi), "omega_sha256": self.omega_sha256,
                               "deadline": self.deadline, "outcome": self.outcome,
                               "min_devices": self.min_devices,
                               "secure_aggregation": self.secure_aggregation})

    @classmethod
    def from_json(cls, spec_json: str) -> BoxedRound:
        """Parse and validate; ValueError with the reason on anything malformed."""
        try:
            data = json.loads(spec_json)
            if not isinstance(data, dict) or data.pop("format", None) != BOXED_ROUND_FORMAT:
                raise ValueError(f"a boxed study must be a {BOXED_ROUND_FORMAT} object")
            return cls(**checked(data, {"parent_id": text, "parent_sha256": text, "lo": numbers,
                                        "hi": numbers, "omega_sha256": text,
                                        "deadline": optional_number, "min_devices": integer}))
        except (TypeError, RecursionError) as exc:
            raise ValueError(f"malformed boxed study spec: {exc!r}") from None
