"""The secure-aggregation calls of the coordinator: each study's (or refinement round's)
:class:`~.secure_round.SecAggRound`, started at creation or resumed from the store after a
restart, the stage messages routed to it, and the decoding of its unmasked sum, at once or, after
a restart while decoding, from the sum the store kept."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from fedsketch.common import signing
from fedsketch.common.refine import RoundSpec
from fedsketch.common.secagg import wire as secagg_wire
from fedsketch.common.secure_calibration import SecureCalibration, SecureProtocol, secure_protocol
from fedsketch.common.secure_rounds import SecureRound
from fedsketch.server.decode.pipeline import StudyResult, decode_sketch, integer_sketch
from fedsketch.server.errors import Code, Refusal
from fedsketch.server.service.messages import StageMessage
from fedsketch.server.service.rounds import Rounds, failure_detail
from fedsketch.server.service.secure_round import SecAggRound
from fedsketch.server.store.base import ACCEPTING, SecureRoundRow, Store

log = logging.getLogger("fedsketch.coordinator")


class SecureStudies:
    """A mixin of :class:`~fedsketch.server.service.coordinator.Coordinator`, which provides
    ``store``, ``spec``, ``rounds``, ``refinement``, ``_lock``, ``_decoder``, ``_enrolled_key``,
    ``_decode`` and ``_publish``."""

    store: Store
    rounds: dict[str, SecAggRound]
    refinement: Rounds
    _lock: threading.Lock
    _decoder: ThreadPoolExecutor

    def _resume_rounds(self) -> None:
        """Rebuild every secure-aggregation round the store holds as running (a study or a
        refinement round still accepting), at the stage it was in (:meth:`SecAggRound.resume`),
        and, for who may read what (:mod:`.reads`), the roster of every round that had ended
        (:meth:`SecAggRound.ended`). A round that cannot be rebuilt (its kept messages no
        longer pass this coordinator's checks) fails its study with the reason; the others
        resume, except under ``--shared``, where a running round is left untouched in the store
        (each process would rebuild its own copy and the devices would be split between them)."""
        for row in self.store.list_studies():
            try:
                spec = self.spec(row.study_id)
            except ValueError:  # an earlier release's round: failed at start-up, or finished
                continue
            if spec.secure_aggregation is None:
                continue
            protocol = (SecureRound(self.spec(row.parent), spec) if isinstance(spec, RoundSpec)
                        else secure_protocol(spec))  # a study's (round 0 or sketch), a sketch round's
            if row.state not in ACCEPTING:
                kept = self.store.secure_round(row.study_id)
                if kept is not None and kept.members is not None:
                    with self._lock:
                        self.rounds[row.study_id] = SecAggRound.ended(
                            row.study_id, protocol, self.store, kept.members)
                continue
            if self.store.shared:  # its stages would be split between processes; leave it whole
                log.warning("study %s: a secure-aggregation round is left as it is: coordinators "
                            "sharing a database (--shared) run none; serve the database alone to "
                            "finish it", row.study_id)
                continue
            finish, fail = self._round_ends(row.study_id, protocol)
            try:
                round_ = SecAggRound.resume(row.study_id, protocol, self.store, finish, fail)
            except Exception as exc:  # noqa: BLE001 (one study's round, not the coordinator)
                log.exception("study %s: its secure round cannot be resumed", row.study_id)
                reason = failure_detail(protocol, "the secure-aggregation round could not be "
                                        f"resumed after a restart: {exc}")
                self.store.end_secure_round(row.study_id, reason)
                fail(reason)
                continue
            with self._lock:
                self.rounds[row.study_id] = round_

    def _decode_unmasked(self, study_id: str, kept: SecureRoundRow) -> None:
        """Decode a secure study, a secure refinement round or a secure round 0 (σ, then the
        sketch round) from its stored unmasked sum (a restart while it decoded), unless a sketch
        study's rounds have begun already."""
        total = np.frombuffer(kept.total, dtype="<i8").astype(np.int64)
        spec = self.spec(study_id)
        if isinstance(spec, RoundSpec):
            self.refinement.decode_secure(study_id, spec, total, kept.devices, kept.records)
        elif spec.calibration is not None:  # opens the sketch round, or goes on if it exists
            self.refinement.calibrate(study_id, (total, kept.devices, kept.records))
        elif spec.refine is not None and self.refinement.started(study_id):
            self.refinement.advance(study_id)
        else:
            self._decode_secure(study_id, total, kept.devices, kept.records)

    def _decode_secure(self, study_id: str, total, devices: int, records: float) -> None:
        def decode() -> StudyResult:
            spec = self.spec(study_id)
            m = spec.sketch.frequencies.m
            return decode_sketch(spec, integer_sketch(spec, total.reshape(2, m), records), devices,
                                 records, draws=devices / spec.assumptions.min_honest)

        self._publish(study_id, decode)

    def _new_round(self, study_id: str, spec: SecureProtocol) -> SecAggRound:
        """The secure-aggregation round of a study (or sketch round), of a round 0 (σ from its
        sum) or of a refinement round (its cells)."""
        return SecAggRound(study_id, spec, self.store, *self._round_ends(study_id, spec))

    def _round_ends(self, study_id: str, spec: SecureProtocol) -> tuple[Callable, Callable]:
        """(finish, fail) of a round (:class:`SecAggRound`), called once the round's end is
        stored: decode the unmasked sum (a refinement round's becomes its cells, a round 0's
        gives σ and the sketch round), or log the abort; a round's end, or abort, lets its study
        go on (under the study's claim)."""
        def finish(total, devices: int, records: float) -> None:
            if isinstance(spec, SecureRound):
                self._decoder.submit(self.refinement.decode_secure, study_id, spec.round, total,
                                     devices, records)
            elif isinstance(spec, SecureCalibration):
                self._decoder.submit(self.refinement.calibrate, study_id, (total, devices, records))
            else:
                self._decoder.submit(self._decode_secure, study_id, total, devices, records)

        def fail(reason: str) -> None:
            log.warning("study %s: %s", study_id, reason)
            if (parent := self.store.get_study(study_id).parent) is not None:  # a round's
                self._decoder.submit(self._decode, parent)

        return finish, fail

    def _secure_round_opened(self, round_id: str, rnd: RoundSpec | None) -> None:
        """Start the secure round of a refinement round (``rnd`` None: a sketch round) just opened."""
        protocol = self.spec(round_id) if rnd is None else SecureRound(self.spec(rnd.parent_id), rnd)
        round_ = self._new_round(round_id, protocol)
        with self._lock:
            self.rounds[round_id] = round_

    def _round(self, study_id: str) -> SecAggRound:
        """The running round of a study (not_found / failed_precondition). A round exists only
        for a created study, so the store is read only when none is found."""
        with self._lock:
            found = self.rounds.get(study_id)
        if found is None:
            self.store.get_study(study_id)  # not_found for an unknown study
            raise Refusal(Code.FAILED_PRECONDITION,
                          f"study {study_id} has no secure-aggregation round running")
        return found

    def _authenticate(self, msg: StageMessage) -> None:
        """Check a stage message's signature against the device's enrolled key."""
        key = self._enrolled_key(msg.device_id)
        digest = secagg_wire.message_digest(msg.study_id, msg.device_id, msg.stage, msg.body)
        if not signing.verify(key, digest, msg.signature):
            raise Refusal(Code.UNAUTHENTICATED, "invalid signature on a stage message")

    def send_stage(self, msg: StageMessage) -> bool:
        """Hand one authenticated stage message to its round; True for an identical re-send."""
        self._authenticate(msg)
        return self._round(msg.study_id).receive(msg.device_id, msg.stage, msg.body)

    def fetch_stage(self, msg: StageMessage) -> bytes:
        """What the round routes to the (authenticated) device for the open stage."""
        self._authenticate(msg)
        return self._round(msg.study_id).fetch(msg.device_id, msg.stage)
