"""The coordinator's refinement rounds (:mod:`fedsketch.common.study.refine`): after a study's sketch is
decoded, one round study per declared round, each a plain study of its own, then the study's
refined result.

Lifecycle. The study stays ``decoding`` while its rounds run (its detail names the open round).
Its sketch decodes into the start C_0, which opens round 1 (a study whose ``parent`` is the
study; its spec carries C_0 and, for the result, the sketch's public outcome). A round collects
like any plain study, with the study's quorum and roster size and a deadline ``round_seconds``
away, and closes as soon as its whole roster has sent; a secure study's round runs secure
aggregation instead (by stage timeouts, over the round's cells:
:mod:`fedsketch.common.study.secure_rounds`), which a restarted coordinator resumes from its store
(:mod:`.secure_round`). A round that ends ``done`` holds the next centres and opens the next round; after
the last one, or once a round fails (its roster never filled, a device missed its deadline, or
its decoding failed), the study is published with the centres of the last round that ended with
new ones (the start if none did): a failed round costs the study its refinement, not its result.

Round 0. A study with a calibration round (``--scale auto``,
:mod:`fedsketch.common.study.calibration_round`) collects the devices' calibration releases as its
own contributions: closed without its quorum it fails like any study, before anyone spent on
its sketch. Closed with it, it turns ``decoding`` and :meth:`Rounds.calibrate` fits σ from the
releases' sum (or fails the study with why), records the choice and its explanation in the
study's detail, and opens the sketch round, a study of its own whose spec carries σ (secure
aggregation's sum carries one noise draw in all, and the sketch round is secure too). Once that
round is decoded the study goes on as above (its refinement rounds, or its result); if it
fails, so does the study. The published result adds ``calibration`` (σ, how it was chosen,
``explanation``) and ``sketch_round`` (its study id).

Every step runs on the coordinator's one decoder thread and starts by reading the store, so a
step repeated after a restart (the study is still ``decoding``) does nothing twice: a round is
opened only if it does not exist yet, and the result is published once.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, replace

import numpy as np

from fedsketch.common.sketch.frequencies import draw_frequencies
from fedsketch.common.sketch.scale import ScaleCalibration
from fedsketch.common.study.aggregate import VIOLATION, check_calibration_sum, check_cells_sum
from fedsketch.common.study.boxed_round import BoxedRound, is_boxed_round
from fedsketch.common.study.calibration_round import (
    SketchRound,
    check_calibration,
    fit_round0,
    is_sketch_round,
)
from fedsketch.common.study.refine import RoundSpec, check_cells, is_round
from fedsketch.common.study.secure_box import SecureBox
from fedsketch.common.study.secure_calibration import SecureCalibration, SecureProtocol
from fedsketch.common.study.secure_rounds import SecureRound
from fedsketch.common.study.study import StudySpec, spec_sha256
from fedsketch.server.decode.pipeline import StudyResult
from fedsketch.server.decode.refine import RoundResult, first_centroids, next_centroids, refined_result
from fedsketch.server.service.box_rounds import BoxRounds
from fedsketch.server.store.base import DECODING_FAILED, Store, StudyRow
from fedsketch.server.store.faults import StoreUnavailable

log = logging.getLogger("fedsketch.coordinator")

#: States in which a round has ended.
ENDED = ("done", "failed")


def failure_detail(spec: StudySpec | RoundSpec | SecureProtocol, detail: str) -> str:
    """The detail of a study that failed to collect, plainly (its quorum missed) or securely
    (its secure-aggregation round aborted), from its spec or its round's protocol: ``detail``,
    said to be its round 0's (before anyone spent on its sketch) if it declares one. The one
    wording of such a failure, plain or secure; a box round's says so."""
    if isinstance(spec, SecureBox) or getattr(spec, "box", None) is not None:
        return f"the box round failed, nobody spent on anything else: {detail}"
    if not isinstance(spec, SecureCalibration) and getattr(spec, "calibration", None) is None:
        return detail
    return f"round 0 (σ calibration) failed, nobody spent on the sketch: {detail}"


def tick_each(rounds, now: float) -> None:
    """The watcher's stage timeouts: ``tick`` every secure round in ``rounds``; a round whose
    tick raises (a store fault included) is logged and the others still tick, so one round
    cannot stop every study's deadlines."""
    for r in rounds:
        try:
            r.tick(now)
        except Exception:  # noqa: BLE001 — logged with its traceback; the next pass tries again
            log.exception("watcher: the round of study %s failed its tick", r.study_id)


class Rounds:
    """A study's rounds over a store: round 0 and the sketch round after it, and refinement
    rounds. ``spec`` parses a study's spec (cached by the caller),
    ``settle`` makes a lifecycle transition from the coordinator's own threads, and
    ``secure_opened(round_id, round)`` starts the secure-aggregation round of a secure study's
    round once it is stored (``round`` None: its sketch round after round 0)."""

    def __init__(self, store: Store, spec, settle, secure_opened) -> None:
        self.store = store
        self.spec = spec
        self.settle = settle
        self.secure_opened = secure_opened
        self.boxes = BoxRounds(self)

    def parse(self, text: str) -> StudySpec | RoundSpec:
        """A stored spec: a refinement round's, a study's, or for a sketch round the study it
        collects (:meth:`SketchRound.study` of its study's spec)."""
        if is_round(text):
            return RoundSpec.from_json(text)
        if is_sketch_round(text):
            rnd = SketchRound.from_json(text)
            return rnd.study(self.spec(rnd.parent_id))
        if is_boxed_round(text):  # a study's boxed study (--bounds auto)
            boxed = BoxedRound.from_json(text)
            return boxed.study(self.spec(boxed.parent_id))
        return StudySpec.from_json(text)

    def failure(self, study_id: str, detail: str) -> str:
        """:func:`failure_detail` of the study ``study_id``."""
        return failure_detail(self.spec(study_id), detail)

    def calibrate(self, study_id: str, secure: tuple[np.ndarray, int, float] | None = None) -> None:
        """Round 0 of the study closed: fit σ from its releases (``secure``: a secure round 0's
        unmasked sum (2·m0,), its devices and the records they declared, whose noise is
        devices/h_min shares' worth of one draw) and open its sketch round; or, if that round
        exists already (a restart), :meth:`advance`. A round 0 whose releases cannot be fitted
        fails the study with why."""
        if self._sketch_round(study_id) is not None:
            self.advance(study_id)
            return
        spec = self.spec(study_id)
        try:
            if secure is None:
                releases = [(row.n, check_calibration(spec, row.kind, row.payload, row.n))
                            for row in self.store.contributions(study_id)]
                draws = None
            else:
                total, devices, records = secure
                check_calibration_sum(spec, total, records, devices)
                releases = [(records, np.asarray(total, dtype=np.int64).reshape(2, spec.calibration.m0))]
                draws = devices / spec.assumptions.min_honest
            self._open_sketch(study_id, fit_round0(spec, releases, draws))
        except StoreUnavailable:
            raise  # the store's fault, not round 0's: it stays decoding
        except Exception as exc:  # noqa: BLE001 (the study must not stay decoding silently)
            log.exception("study %s: round 0 failed", study_id)
            self.settle(study_id, DECODING_FAILED, f"round 0 (σ calibration) failed: {exc}")
            self.boxes.up(study_id)

    def _open_sketch(self, study_id: str, cal: ScaleCalibration) -> None:
        """Open the study's sketch round with the σ of ``cal``, fixed and public from now on."""
        spec: StudySpec = self.spec(study_id)
        freqs, secure = replace(spec.sketch.frequencies, scale=cal.sigma), spec.secure_aggregation
        rnd = SketchRound(study_id, self.store.get_study(study_id).spec_sha256, cal.sigma,
                          draw_frequencies(freqs).sha256,
                          None if secure else time.time() + spec.calibration.round_seconds,
                          {**cal.to_dict(), "explanation": cal.explanation}, spec.min_devices,
                          None if secure is None else asdict(secure))
        advice = cal.advice("a fixed σ to create-study (--scale σ)", "--bounds",
                            "create-study's --scale-range")
        round_id = self._child(study_id, rnd, None, f"round 0: {cal.explanation}{advice}; sketch round")
        log.info("study %s: round 0 chose %s; sketch round opened as %s", study_id,
                 cal.explanation, round_id)

    def _sketch_round(self, study_id: str) -> tuple[SketchRound, StudyRow] | None:
        """The study's sketch round and its row, once round 0 opened it."""
        for row in self.store.rounds(study_id):
            if is_sketch_round(row.spec_json):
                return SketchRound.from_json(row.spec_json), row
        return None

    def started(self, study_id: str) -> bool:
        """Whether the study's rounds have begun (its sketch was decoded and round 1 opened)."""
        return bool(self.store.rounds(study_id))

    def begin(self, study_id: str, start: StudyResult) -> None:
        """Open round 1 from the decoded sketch ``start``."""
        self._open(study_id, 1, first_centroids(self.spec(study_id), start.centroids,
                                                start.records, start.devices),
                   start.to_dict())

    def decode(self, round_id: str, rnd: RoundSpec) -> None:
        """Sum a closed round's releases into the next centres and publish them (or fail the
        round with why), then :meth:`advance` its study."""
        def compute(parent: StudySpec) -> RoundResult:
            releases = [(row.n, *check_cells(parent, rnd, row.kind, row.payload, row.n))
                        for row in self.store.contributions(round_id)]
            if releases:  # next_centroids says why none
                check_cells_sum(parent, rnd, sum(r[1] for r in releases),
                                sum(r[2] for r in releases), sum(r[0] for r in releases),
                                len(releases), secure=False)
            return next_centroids(parent, rnd, releases)

        self._publish(round_id, rnd, compute)

    def decode_secure(self, round_id: str, rnd: RoundSpec, total: np.ndarray, devices: int,
                      records: float) -> None:
        """A secure round's unmasked sum of ``devices`` devices' cells (``records`` declared in
        all) into the next centres, as :meth:`decode`."""
        def compute(parent: StudySpec) -> RoundResult:
            counts, sums = SecureRound(parent, rnd).cells(total)
            check_cells_sum(parent, rnd, counts, sums, records, devices, secure=True)
            return next_centroids(parent, rnd, [(records, counts, sums)], secure_devices=devices)

        self._publish(round_id, rnd, compute)

    def _publish(self, round_id: str, rnd: RoundSpec,
                 compute: Callable[[StudySpec], RoundResult]) -> None:
        """Store ``compute(study spec)`` as the round's result, or fail the round with why (a
        ValueError: a release the round cannot have produced, no release), then advance."""
        try:
            out = compute(self.spec(rnd.parent_id))
            self.store.put_result(round_id, json.dumps(out.to_dict()))
            log.info("study %s: round %d decoded from %d devices, %d of %d centres kept",
                     rnd.parent_id, rnd.round, out.devices, int(out.kept.sum()), out.kept.size)
        except ValueError as exc:  # CellsError included
            log.warning("study %s: round %d failed: %s", rnd.parent_id, rnd.round, exc)
            self.settle(round_id, DECODING_FAILED, f"decoding failed: {exc}")
        self.advance(rnd.parent_id)

    def advance(self, study_id: str) -> None:
        """After a round ended: open the next one, or publish the study (module docstring). Does
        nothing while the last round still runs or once the study is published; a step that
        raises fails the study with why (it runs on the decoder thread, where nobody else would
        see the error)."""
        try:
            self._advance(study_id)
        except StoreUnavailable:
            raise  # the store's fault, not the refinement's: it stays decoding
        except Exception as exc:  # noqa: BLE001 (the study must not stay decoding silently)
            log.exception("study %s: refinement failed", study_id)
            self.settle(study_id, DECODING_FAILED, f"refinement failed: {exc}")
        self.boxes.up(study_id)  # a boxed study that ended: its study goes on

    def _rounds(self, study_id: str) -> list[tuple[RoundSpec, StudyRow]]:
        """The study's refinement rounds in round order (not creation order: clocks can step
        back)."""
        return sorted(((self.spec(row.study_id), row) for row in self.store.rounds(study_id)
                       if is_round(row.spec_json)), key=lambda pair: pair[0].round)

    def _advance(self, study_id: str) -> None:
        if self.store.get_study(study_id).state != "decoding":
            return
        spec: StudySpec = self.spec(study_id)
        if spec.box is not None:  # after the box round, the boxed study
            self.boxes.advance(study_id)
            return
        extra = {}
        if spec.calibration is not None:  # after round 0, the sketch round
            found = self._sketch_round(study_id)
            if found is None or found[1].state not in ENDED:
                return
            sketch, row = found
            if row.state == "failed":
                self.settle(study_id, DECODING_FAILED,
                            f"its sketch round (study {row.study_id}) failed: {row.detail}")
                return
            extra = {"calibration": sketch.calibration, "sketch_round": row.study_id}
            start = json.loads(self.store.get_result(row.study_id))
            if spec.refine is None:
                self.store.put_result(study_id, json.dumps({**start, **extra}))
                log.info("study %s published after its sketch round", study_id)
                return
            if not self._rounds(study_id):
                self._open(study_id, 1, first_centroids(spec, np.array(start["centroids"]),
                                                        start["records"], start["devices"]), start)
                return
        rounds = self._rounds(study_id)
        if not rounds or rounds[-1][1].state not in ENDED:
            return
        last, row = rounds[-1]
        if row.state == "done" and last.round < spec.refine.rounds:
            result = json.loads(self.store.get_result(row.study_id))
            self._open(study_id, last.round + 1, np.array(result["centroids"]), None)
            return
        for rnd, row in rounds:  # a hostile input was summed: nothing of the study is published
            if row.state == "failed" and VIOLATION in (row.detail or ""):
                self.settle(study_id, DECODING_FAILED,
                            f"refinement round {rnd.round} (study {row.study_id}): {row.detail}")
                return
        summary = []
        for rnd, row in rounds:
            text = self.store.get_result(row.study_id)
            summary.append({"round": rnd.round, "study_id": row.study_id, "state": row.state,
                            "detail": row.detail,
                            "result": None if text is None else json.loads(text)})
        start = rounds[0][0].start
        self.store.put_result(study_id, json.dumps({**refined_result(start, summary, np.array(spec.lo),
                                                                          np.array(spec.hi)), **extra}))
        log.info("study %s published after %d refinement rounds", study_id, len(rounds))

    def _open(self, study_id: str, number: int, centroids: np.ndarray, start: dict | None) -> None:
        """Create round ``number`` of the study with ``centroids`` (K, d) in data units, unless
        it exists already (one round ``number`` per study, whatever happens to the clock)."""
        if any(rnd.round == number for rnd, _ in self._rounds(study_id)):
            raise ValueError(f"round {number} of study {study_id} exists already")
        spec: StudySpec = self.spec(study_id)
        row = self.store.get_study(study_id)
        secure = spec.secure_aggregation
        rnd = RoundSpec(study_id, row.spec_sha256, number, tuple(map(tuple, centroids.tolist())),
                        spec.min_devices,
                        None if secure else time.time() + spec.refine.round_seconds, start,
                        None if secure is None else asdict(secure), spec.refine.radius)
        round_id = self._child(study_id, rnd, rnd, f"refinement round {number} of {spec.refine.rounds}:")
        log.info("study %s: refinement round %d opened as %s", study_id, number, round_id)

    def _child(self, study_id: str, rnd: SketchRound | RoundSpec, refinement: RoundSpec | None,
               what: str) -> str:
        """Create the study's round ``rnd`` as a child study (its own id, the study's quorum and
        roster), start its secure round if the study has secure aggregation (``refinement``:
        the refinement round's spec, None for a sketch round), and say in the study's detail
        ("``what`` collecting in study ID") where it collects; the round's id."""
        spec: StudySpec = self.spec(study_id)
        text = rnd.to_json()
        round_id = "st-" + secrets.token_hex(8)
        self.store.create_study(round_id, text, spec_sha256(text), rnd.deadline, spec.min_devices,
                                parent=study_id, roster=spec.roster)
        if spec.secure_aggregation is not None:
            self.secure_opened(round_id, refinement)
        self.store.set_state(study_id, "decoding", f"{what} collecting in study {round_id}",
                             expect=("decoding",))
        return round_id
