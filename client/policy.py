"""The device owner's policy: which studies the device joins.

The policy lives in the ledger (:class:`fedsketch.client.ledger.Ledger`), next to the budget,
and only the owner's commands change it (``fedsketch device init`` and ``device policy``);
each change is logged there. It is checked before anything is spent:

* ``max_epsilon``: the largest ε (dimensionless) one study may take; None leaves only the
  budget as the limit;
* ``studies``: shell-style patterns (:mod:`fnmatch`, case-sensitive) a study's name must match;
* ``coordinators``: patterns the coordinator's address (``host:port``) must match, checked
  when the daemon starts.

Every check depends on public things only (the study's name and ε, the coordinator's address,
the ledger). There is deliberately no "refuse studies whose box some record falls outside":
that refusal is a function of the private records, seen by the coordinator as an absence, and
a coordinator could binary-search a record's value with boxes of shrinking width at ~0 ε each.
Records outside a study's box are always clipped onto it (:mod:`fedsketch.common.sketch.box`).
"""

from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    """What the device owner allows (module docstring)."""

    max_epsilon: float | None = None
    studies: tuple[str, ...] = ("*",)
    coordinators: tuple[str, ...] = ("*",)

    def __post_init__(self) -> None:
        if self.max_epsilon is not None and not (math.isfinite(self.max_epsilon)
                                                 and self.max_epsilon > 0):
            raise ValueError(f"the largest ε per study must be finite and > 0, got "
                             f"{self.max_epsilon!r}")
        for name in ("studies", "coordinators"):
            patterns = tuple(getattr(self, name))
            if not patterns or not all(isinstance(p, str) and p and p.isprintable()
                                       for p in patterns):
                raise ValueError(f"{name} needs at least one pattern, each non-empty and without "
                                 "control characters")
            object.__setattr__(self, name, patterns)

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
                           "coordinators": list(self.coordinators)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Policy:
        """Inverse of :meth:`to_json`; ValueError for anything else."""
        try:
            data = json.loads(text)
            return cls(data["max_epsilon"], tuple(data["studies"]), tuple(data["coordinators"]))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"unreadable device policy: {exc!r}") from None
