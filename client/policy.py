"""The device owner's policy: which studies the device joins and what it does with out-of-box records.

The policy lives in the ledger (:class:`fedsketch.client.ledger.Ledger`), next to the budget,
and only the owner's commands change it (``fedsketch device init`` and ``device policy``);
each change is logged there. It is checked before anything is spent:

* ``max_epsilon``: the largest ε (dimensionless) one study may take; None leaves only the
  budget as the limit;
* ``studies``: shell-style patterns (:mod:`fnmatch`, case-sensitive) a study's name must match;
* ``coordinators``: patterns the coordinator's address (``host:port``) must match, checked
  when the daemon starts;
* ``out_of_box``: ``clip`` moves records outside the study's public box onto it (counted in the
  device's log only); ``refuse`` declines a study for which any record lies outside. A refusal
  is visible to the coordinator as an absence, so ``clip`` reveals less.
"""

from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass

OUT_OF_BOX = ("clip", "refuse")


@dataclass(frozen=True)
class Policy:
    """What the device owner allows (module docstring)."""

    max_epsilon: float | None = None
    studies: tuple[str, ...] = ("*",)
    coordinators: tuple[str, ...] = ("*",)
    out_of_box: str = "clip"

    def __post_init__(self) -> None:
        if self.max_epsilon is not None and not (math.isfinite(self.max_epsilon)
                                                 and self.max_epsilon > 0):
            raise ValueError(f"the largest ε per study must be finite and > 0, got "
                             f"{self.max_epsilon!r}")
        for name in ("studies", "coordinators"):
            patterns = tuple(getattr(self, name))
            if not patterns or not all(isinstance(p, str) and p for p in patterns):
                raise ValueError(f"{name} needs at least one non-empty pattern")
            object.__setattr__(self, name, patterns)
        if self.out_of_box not in OUT_OF_BOX:
            raise ValueError(f"out_of_box must be one of {', '.join(OUT_OF_BOX)}, got "
                             f"{self.out_of_box!r}")

    def refusal(self, study_name: str, epsilon: float) -> str | None:
        """Why the policy declines a study of this name asking this ε, or None if it allows it."""
        if not any(fnmatch.fnmatchcase(study_name, p) for p in self.studies):
            return (f"the device's policy joins only studies named {' or '.join(self.studies)}; "
                    f"this one is {study_name!r}")
        if self.max_epsilon is not None and epsilon > self.max_epsilon:
            return (f"the study asks ε = {epsilon:g}; the device's policy allows at most "
                    f"{self.max_epsilon:g} per study")
        return None

    def allows_coordinator(self, target: str) -> bool:
        """Whether the policy lets the device work for the coordinator at ``target``."""
        return any(fnmatch.fnmatchcase(target, p) for p in self.coordinators)

    def to_json(self) -> str:
        """The form stored in the ledger."""
        return json.dumps({"max_epsilon": self.max_epsilon, "studies": list(self.studies),
                           "coordinators": list(self.coordinators),
                           "out_of_box": self.out_of_box}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Policy:
        """Inverse of :meth:`to_json`; ValueError for anything else."""
        try:
            data = json.loads(text)
            return cls(data["max_epsilon"], tuple(data["studies"]), tuple(data["coordinators"]),
                       data["out_of_box"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"unreadable device policy: {exc!r}") from None
