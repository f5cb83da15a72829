"""A study's round 0 as its hashed spec declares it (:class:`CalibrationPlan`): ε_0, m0 and σ's
search range; :mod:`fedsketch.common.study.calibration_round` runs the round.

Units: σ in data units; ε dimensionless; seconds for the sketch round's window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..choices import ROUND_SECONDS
from ..sketch.scale import DEFAULT_M0, CalibrationSpec
from ..spec_fields import checked, integer, number

#: Most calibration frequencies a study may ask (a release of 16·m0 bytes, 64 KiB).
MAX_M0 = 4096


@dataclass(frozen=True)
class CalibrationPlan:
    """A study's round 0: ``epsilon`` ε_0 (finite, > 0) of each device's calibration release,
    the σ search range [``sigma_lo``, ``sigma_hi``] (data units; by default derived from the
    study's box, :func:`~fedsketch.common.sketch.scale.default_range`), ``m0`` calibration
    frequencies, and ``round_seconds``, how long the sketch round that follows collects at most."""

    epsilon: float
    sigma_lo: float
    sigma_hi: float
    m0: int = DEFAULT_M0
    round_seconds: float = ROUND_SECONDS

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, (int, float)) and math.isfinite(self.epsilon)
                and self.epsilon > 0):
            raise ValueError(f"the calibration round needs a finite ε > 0, got {self.epsilon!r}")
        if type(self.m0) is not int or self.m0 > MAX_M0:
            raise ValueError(f"m0 must be an integer of at most {MAX_M0}, got {self.m0!r}")
        if not (isinstance(self.round_seconds, (int, float)) and math.isfinite(self.round_seconds)
                and self.round_seconds > 0):
            raise ValueError(f"round_seconds must be finite and > 0, got {self.round_seconds!r}")
        for name in ("epsilon", "sigma_lo", "sigma_hi", "round_seconds"):
            object.__setattr__(self, name, float(getattr(self, name)))
        self.spec(1, 0)  # the range and m0, checked once

    @property
    def placeholder(self) -> float:
        """√(σ_lo·σ_hi): the study's own (unused) sketch scale (module docstring)."""
        return math.sqrt(self.sigma_lo * self.sigma_hi)

    def spec(self, d: int, seed: int) -> CalibrationSpec:
        """The calibration sketch's public spec for records of dimension d and the study's seed."""
        return CalibrationSpec(d=d, m0=self.m0, sigma_lo=self.sigma_lo, sigma_hi=self.sigma_hi,
                               seed=seed)

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"epsilon": self.epsilon, "m0": self.m0, "sigma_lo": self.sigma_lo,
                "sigma_hi": self.sigma_hi, "round_seconds": self.round_seconds}

    @classmethod
    def from_dict(cls, data: dict) -> CalibrationPlan:
        """Parse; ValueError or TypeError for anything malformed, a field of another JSON type
        than its own included (:mod:`~.spec_fields`)."""
        if not isinstance(data, dict) or set(data) != {"epsilon", "m0", "sigma_lo", "sigma_hi",
                                                       "round_seconds"}:
            raise ValueError("calibration must be an object with epsilon, m0, sigma_lo, "
                             "sigma_hi and round_seconds")
        return cls(**checked(data, {"epsilon": number, "m0": integer, "sigma_lo": number,
                                    "sigma_hi": number, "round_seconds": number}, "calibration"))
