"""The budget of one release, how it is split, and its trace (one :class:`NoiseTerm` per draw).

A :class:`PrivacySpec` states what a release may spend: ε (∞ = no noise), δ (0 = pure DP) and the
neighbouring relation (MECHANISMS §0.3). The noise plan (:func:`fedsketch.common.dp.plan.noise_plan`)
spends it as a tuple of :class:`NoiseTerm`; each term records the ε it spends, the sensitivity it
covers and its scale, so the terms of a release are its budget trace (stored with the release,
MECHANISMS §0.6). Under add/remove the pure budget is split between the numerator and the record
count (:func:`add_remove_split`, §1.7); the ε of the terms then add up to the spec's ε.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..spec_fields import json_type, number, text
from .calibration import check_delta, check_epsilon, check_neighbouring


@dataclass(frozen=True)
class PrivacySpec:
    """The budget of one release: ε (∞ = no noise), δ (0 = pure DP), and the neighbouring relation."""

    epsilon: float
    delta: float = 0.0
    neighbouring: str = "replace_one"

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        check_delta(self.delta)
        check_neighbouring(self.neighbouring)

    @property
    def noiseless(self) -> bool:
        """True when ε = ∞: the release carries no noise and no privacy guarantee."""
        return math.isinf(self.epsilon)

    def to_dict(self) -> dict:
        """JSON-ready form (ε = ∞ is written as the string "inf")."""
        out = asdict(self)
        out["epsilon"] = "inf" if self.noiseless else self.epsilon
        return out

    @classmethod
    def from_dict(cls, data: dict) -> PrivacySpec:
        """Inverse of :meth:`to_dict`: each field of its own JSON type (:mod:`~..spec_fields`),
        ε a number or the string "inf"; ValueError naming a field of another."""
        if not isinstance(data, dict):
            raise ValueError(f"privacy must be an object, got {json_type(data)}")
        eps = data["epsilon"]
        return cls(math.inf if eps == "inf" else number(eps, "privacy.epsilon"),
                   number(data["delta"], "privacy.delta"),
                   text(data["neighbouring"], "privacy.neighbouring"))


@dataclass(frozen=True)
class NoiseTerm:
    """One noise draw: its law, the ε it spends, the sensitivity it covers and its scale.

    ``sensitivity`` and ``scale`` are in the units of ``target`` (the released quantity the noise
    is added to). law: ``laplace`` (scale b), ``discrete_laplace`` (parameter a, dimensionless),
    ``gaussian`` (σ).
    """

    target: str
    law: str
    epsilon: float
    sensitivity: float
    scale: float


def add_remove_split(epsilon: float, m: int) -> tuple[float, float]:
    """(ε1, ε2) = (ε·2m/(2m+1), ε/(2m+1)): the numerator's and the count's shares of ε (§1.7).

    ε2 is computed as ε − ε1, which is exact in floating point (Sterbenz: ε/2 ≤ ε1 ≤ ε), so the
    two shares, read as the exact rationals the samplers use, add up to ε exactly.
    """
    eps1 = epsilon * 2 * m / (2 * m + 1)
    return eps1, epsilon - eps1
