"""What the device's protocol steps share: an admitted study, the outcome of a pass, the RPC
deadline and the crash-test fault point."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from dataclasses import dataclass, field

from fedsketch.client.localdata import LocalData
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg.wire import STAGES as SECURE_STAGES
from fedsketch.common.sketch.box import Box
from fedsketch.common.study.boxed_round import BOXED_LEDGER_ROUND
from fedsketch.common.study.calibration_round import SketchRound
from fedsketch.common.study.refine import RoundSpec
from fedsketch.common.study.study import StudySpec
from fedsketch.common.study.validated import is_validated, validity_delta

#: Fault injection for crash tests: FEDSKETCH_FAULT names the :func:`fault_point` at which the
#: process sends itself SIGKILL.
FAULT_ENV = "FEDSKETCH_FAULT"
#: Deadline (seconds) of each RPC.
RPC_TIMEOUT = 60.0
#: Time (seconds) a device allows between a round's end and the opening of the study's next one
#: (decoding, then the device's next pass) when it bounds how long it keeps that round's ε aside.
ROUND_GAP_SECONDS = 86400.0
#: Longest time (seconds) a release keeps ε aside for its study's later rounds, whatever the
#: specs state (a coordinator writes them): 30 days, more than MAX_ROUNDS rounds of the default
#: length with their gaps.
MAX_KEEP_SECONDS = 30 * 86400.0


@dataclass(frozen=True)
class Later:
    """What a study still asks of a device after one of its releases, if it takes part in every
    round after it: ``epsilon``, Σ ε of those rounds; ``delta``, the δ among them (the sketch's,
    after a calibration round 0); and ``seconds``, how long they may take at most: Σ over them
    of the round's ``round_seconds`` + :data:`ROUND_GAP_SECONDS`, each term and the sum at most
    :data:`MAX_KEEP_SECONDS`."""

    epsilon: float = 0.0
    seconds: float = 0.0
    delta: float = 0.0


def release_cost(spec: StudySpec, rnd: RoundSpec | SketchRound | None) -> tuple[float, float]:
    """(ε, δ) of a device's release for study ``spec`` in round ``rnd``: the sketch's (also in a
    sketch round, whose ``spec`` may be the study or the one the round collects), a calibration
    round 0's ε (pure), a box round's ε (pure), or a refinement round's ε (pure). A study
    validated by a helper adds the δ its bounded noise shares cost
    (:func:`~fedsketch.common.study.validated.validity_delta`), so a device without that δ in its
    budget declines before it reads its data."""
    if rnd is None and spec.box is not None:
        return spec.box.epsilon, 0.0
    if rnd is None and spec.calibration is not None:
        return spec.calibration.epsilon, 0.0
    if rnd is None or isinstance(rnd, SketchRound):
        extra = validity_delta(spec) if is_validated(spec) else 0.0
        return spec.sketch.privacy.epsilon, spec.sketch.privacy.delta + extra
    return rnd.epsilon(spec), 0.0


def later_rounds(study: StudySpec, rnd: RoundSpec | SketchRound | None) -> Later:
    """:class:`Later` for the release of ``study`` (the study itself, not a sketch round's study)
    in round ``rnd``: after the study's own release (its sketch, or its calibration round 0), the
    sketch round (if round 0 came first) and every refinement round; after the sketch round,
    every refinement round; after refinement round t, rounds t + 1 to T; after a box round,
    the boxed study's (its round 0 if declared, its sketch and every refinement round)."""
    refine = [] if study.refine is None else [(e, study.refine.round_seconds)
                                              for e in study.refine.epsilon]
    delta = 0.0
    if rnd is None and study.box is not None:
        rounds = [(study.sketch.privacy.epsilon, study.box.round_seconds), *refine]
        if study.calibration is not None:
            rounds.insert(0, (study.calibration.epsilon, study.box.round_seconds))
        delta = study.sketch.privacy.delta
    elif rnd is None and study.calibration is not None:
        rounds = [(study.sketch.privacy.epsilon, study.calibration.round_seconds), *refine]
        delta = study.sketch.privacy.delta
    elif rnd is None or isinstance(rnd, SketchRound):
        rounds = refine
    else:
        rounds = refine[rnd.round:]
    seconds = math.fsum(min(s, MAX_KEEP_SECONDS) + ROUND_GAP_SECONDS for _, s in rounds)
    return Later(math.fsum(e for e, _ in rounds), min(seconds, MAX_KEEP_SECONDS), delta)


def keep_seconds(spec: StudySpec, deadline: float | None, later: Later, now: float) -> float:
    """How long (seconds from ``now``) a release keeps its study's later rounds' ε aside: what
    may be left of its own round (until its ``deadline`` (Unix seconds); without one, the
    study's collection window, or, under secure aggregation, every stage's timeout), then
    ``later.seconds``; at most :data:`MAX_KEEP_SECONDS`."""
    if deadline is not None:
        own = max(0.0, deadline - now)
    elif spec.secure_aggregation is not None:
        own = len(SECURE_STAGES) * spec.secure_aggregation.stage_timeout
    else:
        own = spec.collect_seconds or 0.0
    return min(MAX_KEEP_SECONDS, math.fsum((min(own, MAX_KEEP_SECONDS), later.seconds)))


@dataclass(frozen=True)
class Admitted:
    """A study the device may contribute to: its spec, public box, and the data version opened
    for it; for a refinement round, ``spec`` is its study's and ``round`` the round's; for a
    sketch round, ``spec`` is the study it collects (:meth:`SketchRound.study`); what its study
    asks after this release (:func:`later_rounds`); ``root``, for the boxed study of a box
    round (``--bounds auto``) and its rounds, the study whose box round it follows, in whose
    name the ledger books the release."""

    spec: StudySpec
    box: Box
    data: LocalData
    round: RoundSpec | SketchRound | None = None
    later: Later = Later()
    root: str | None = None

    @property
    def cost(self) -> tuple[float, float]:
        """(ε, δ) of this release: :func:`release_cost`."""
        return release_cost(self.spec, self.round)

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


def spend_labels(spec: StudySpec, rnd: RoundSpec | SketchRound | None, later: Later,
                 deadline: float | None = None, root: str | None = None) -> dict:
    """What the ledger records of a release besides its cost and bytes
    (:meth:`~.ledger.Ledger.record_spend`'s study_name, parent, round, later_epsilon and
    keep_seconds): a round's name, its study and number (a sketch round: 0, the study's
    sketch), and what the study asks after it (``later``), which the device sets aside until
    the study ends or :func:`keep_seconds` (its own round ending at ``deadline``) have passed.
    A boxed study's releases (``root``: the study of its box round) are booked as rounds of
    ``root``: its own release as round :data:`BOXED_LEDGER_ROUND`, its rounds by number."""
    keep = {"later_epsilon": later.epsilon,
            "keep_seconds": keep_seconds(spec, deadline, later, time.time())}
    if isinstance(rnd, SketchRound):
        return {"study_name": f"{spec.name} · sketch (σ = {rnd.sigma:.4g})",
                "parent": root or rnd.parent_id, "round": 0, **keep}
    if rnd is not None:
        return {"study_name": f"{spec.name} · round {rnd.round}", "parent": root or rnd.parent_id,
                "round": rnd.round, **keep}
    if spec.box is not None:
        return {"study_name": f"{spec.name} · box round", "parent": None, "round": 0, **keep}
    name = spec.name if spec.calibration is None else f"{spec.name} · round 0 (σ calibration)"
    if root is not None:
        return {"study_name": f"{name} · boxed", "parent": root, "round": BOXED_LEDGER_ROUND, **keep}
    return {"study_name": name, "parent": None, "round": 0, **keep}


#: What a study's step may raise on input no check foresaw (the coordinator's bytes are not
#: trusted): the study is declined, the pass goes on. Transport errors (grpc.RpcError), a stop
#: (Stopped) and the ledger's own errors are not among them: they concern every study.
UNHANDLED = (ArithmeticError, ValueError, TypeError, KeyError, IndexError, AttributeError,
             RecursionError, UnicodeError)


def is_secure(study: pb.Study) -> bool:
    """Whether the study's spec asks for secure aggregation (an unreadable spec counts as plain:
    the plain path's checks refuse it with the reason)."""
    try:
        return json.loads(study.spec_json).get("secure_aggregation") is not None
    except (ValueError, AttributeError):
        return False


def fault_point(where: str = "kill-after-commit") -> None:
    """Where crash tests kill the device (:data:`FAULT_ENV` = ``where``): ``kill-after-commit``,
    between a release's spend commit and its first send; ``kill-after-mask``, between a secure
    round's masked input kept in its session and its spend (:mod:`.secure_steps`)."""
    if os.environ.get(FAULT_ENV) == where:
        os.kill(os.getpid(), signal.SIGKILL)
