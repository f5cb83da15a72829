"""The coordinator's box round (``--bounds auto``, :mod:`fedsketch.common.study.box_plan`): a
study that declares one collects the devices' box releases as its own contributions. Closed
without its quorum it fails like any study, before anyone spent on anything else. Closed with
it, it turns ``decoding`` and :meth:`BoxRounds.read` sums the releases (each checked again),
reads the box (or fails the study with why), and opens the boxed study
(:mod:`fedsketch.common.study.boxed_round`), a study of its own whose spec carries the box: its
round 0, sketch round and refinement rounds are its own rounds, run as any study's. Once it
has ended, :meth:`BoxRounds.advance` publishes the study with the boxed study's result and the
box (``box``: lo, hi, ε, the explanation; ``boxed_study``: its id), or fails it with the boxed
study's reason. Every step starts by reading the store, so a step repeated after a restart
does nothing twice.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict

import numpy as np

from fedsketch.common.study.box_plan import check_box, check_box_sum, read_box
from fedsketch.common.study.boxed_round import BoxedRound, boxed_study, is_boxed_round
from fedsketch.server.store.base import DECODING_FAILED, StudyRow
from fedsketch.server.store.faults import StoreUnavailable

log = logging.getLogger("fedsketch.coordinator")

#: States in which a study has ended.
ENDED = ("done", "failed")


class BoxRounds:
    """The box rounds of the studies of ``rounds`` (a :class:`~.rounds.Rounds`: its store,
    spec parser, lifecycle and child studies)."""

    def __init__(self, rounds) -> None:
        self.rounds = rounds

    def boxed(self, study_id: str) -> tuple[BoxedRound, StudyRow] | None:
        """The study's boxed study and its row, once the box round opened it."""
        for row in self.rounds.store.rounds(study_id):
            if is_boxed_round(row.spec_json):
                return BoxedRound.from_json(row.spec_json), row
        return None

    def read(self, study_id: str, secure: tuple[np.ndarray, int] | None = None) -> None:
        """The box round of the study closed: read the box from the releases' sum (``secure``:
        a secure box round's unmasked sum (d·bins,) and its devices, whose noise is
        devices/h_min shares' worth of one draw a count) and open the boxed study; or, if it
        exists already (a restart), :meth:`advance`. A box round whose releases cannot be read
        fails the study with why."""
        if self.boxed(study_id) is not None:
            self.advance(study_id)
            return
        store, spec = self.rounds.store, self.rounds.spec(study_id)
        try:
            if secure is None:
                releases = [check_box(spec, row.kind, row.payload, row.n)
                            for row in store.contributions(study_id)]
                if not releases:
                    raise ValueError("the box round has no release to read a box from")
                total, draws = np.sum(releases, axis=0), float(len(releases))
            else:
                total = check_box_sum(spec, *secure)
                draws = secure[1] / spec.assumptions.min_honest
            box, outcome = read_box(spec, total, draws)
            deadline = time.time() + spec.box.round_seconds
            inner = boxed_study(spec, box.lo, box.hi, None if spec.secure_aggregation else deadline)
            rnd = BoxedRound(study_id, store.get_study(study_id).spec_sha256, inner.lo, inner.hi,
                             inner.omega_sha256, inner.deadline, outcome, spec.min_devices,
                             None if spec.secure_aggregation is None else asdict(spec.secure_aggregation))
            child = self.rounds._child(study_id, rnd, None,
                                       f"box round: {outcome['explanation']}; boxed study")
            log.info("study %s: the box round read %s; boxed study opened as %s", study_id,
                     outcome["explanation"], child)
        except StoreUnavailable:
            raise  # the store's fault, not the box round's: it stays decoding
        except Exception as exc:  # noqa: BLE001 (the study must not stay decoding silently)
            log.exception("study %s: the box round failed", study_id)
            self.rounds.settle(study_id, DECODING_FAILED,
                               f"the box round failed, nobody spent on anything else: {exc}")

    def advance(self, study_id: str) -> None:
        """After the boxed study ended: publish the study with its result and the box, or fail
        it with the boxed study's reason. Nothing while the boxed study runs, or once the study
        has ended."""
        store = self.rounds.store
        if store.get_study(study_id).state != "decoding" or (found := self.boxed(study_id)) is None:
            return
        rnd, row = found
        if row.state not in ENDED:
            return
        if row.state == "failed":
            self.rounds.settle(study_id, DECODING_FAILED,
                               f"its boxed study (study {row.study_id}) failed: {row.detail}")
            return
        result = json.loads(store.get_result(row.study_id))
        store.put_result(study_id, json.dumps({**result, "box": rnd.outcome,
                                               "boxed_study": row.study_id}))
        log.info("study %s published after its boxed study %s", study_id, row.study_id)

    def up(self, study_id: str) -> None:
        """If ``study_id`` is a boxed study that has ended, advance its study."""
        row = self.rounds.store.get_study(study_id)
        if row.parent is not None and row.state in ENDED and is_boxed_round(row.spec_json):
            self.advance(row.parent)
