"""What the device's protocol steps share: an admitted study, the outcome of a pass, the RPC
deadline and the crash-test fault point."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field

from fedsketch.common.box import Box
from fedsketch.common.calibration_round import SketchRound
from fedsketch.common.refine import RoundSpec
from fedsketch.common.study import StudySpec

from .localdata import LocalData

#: Fault injection for crash tests: with FEDSKETCH_FAULT=kill-after-commit the process sends
#: itself SIGKILL right after the ledger commit and before the first send.
FAULT_ENV = "FEDSKETCH_FAULT"
#: Deadline (seconds) of each RPC.
RPC_TIMEOUT = 60.0


@dataclass(frozen=True)
class Admitted:
    """A study the device may contribute to: its spec, public box, and the data version opened
    for it; for a refinement round, ``spec`` is its study's and ``round`` the round's; for a
    sketch round, ``spec`` is the study it collects (:meth:`SketchRound.study`)."""

    spec: StudySpec
    box: Box
    data: LocalData
    round: RoundSpec | SketchRound | None = None

    @property
    def cost(self) -> tuple[float, float]:
        """(ε, δ) of this release: the sketch's, a calibration round 0's ε (pure), or the
        round's ε (pure)."""
        if self.round is None and self.spec.calibration is not None:
            return self.spec.calibration.epsilon, 0.0
        if self.round is None or isinstance(self.round, SketchRound):
            return self.spec.sketch.privacy.epsilon, self.spec.sketch.privacy.delta
        return self.round.epsilon(self.spec), 0.0

    @property
    def deadline(self) -> float | None:
        """The study's, or the round's, deadline (Unix seconds), or None."""
        return self.spec.deadline if self.round is None else self.round.deadline


@dataclass
class Outcome:
    """What one pass over the open studies did."""

    registered: list[str] = field(default_factory=list)
    submitted: list[str] = field(default_factory=list)
    resent: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


def spend_labels(spec: StudySpec, rnd: RoundSpec | SketchRound | None) -> dict:
    """What the ledger records of a release besides its cost and bytes
    (:meth:`~.ledger.Ledger.record_spend`'s study_name, parent, round and study_epsilon): a
    round's name, its study and number (a sketch round: 0, the study's sketch); for the study's
    own release (its sketch, or its calibration round 0) when more rounds follow, the whole
    study's ε (the device sets the later rounds' share aside until the study ends)."""
    if isinstance(rnd, SketchRound):
        return {"study_name": f"{spec.name} · sketch (σ = {rnd.sigma:.4g})",
                "parent": rnd.parent_id, "round": 0, "study_epsilon": None}
    if rnd is not None:
        return {"study_name": f"{spec.name} · round {rnd.round}", "parent": rnd.parent_id,
                "round": rnd.round, "study_epsilon": None}
    later = spec.refine is not None or spec.calibration is not None
    name = spec.name if spec.calibration is None else f"{spec.name} · round 0 (σ calibration)"
    return {"study_name": name, "parent": None, "round": 0,
            "study_epsilon": spec.total_epsilon if later else None}


def fault_point() -> None:
    """Between the ledger commit and the first send: where crash tests kill the device."""
    if os.environ.get(FAULT_ENV) == "kill-after-commit":
        os.kill(os.getpid(), signal.SIGKILL)
