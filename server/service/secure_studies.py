"""The secure-aggregation calls of the coordinator: each study's (or refinement round's)
:class:`~.secure_round.SecAggRound`, started at creation or resumed from the store after a
restart, the stage messages routed to it, and the decoding of its unmasked sum, from the sum the
store kept, under the study's claim. Coordinators sharing a database (``--shared``) each hold a
:class:`~.shared_round.SharedRound` of every running round, which catches up with the store on
each call; one that did not start a round takes it up on its first call or watcher tick
(:meth:`SecureStudies._adopted`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from fedsketch.common.net import signing
from fedsketch.common.secagg import wire as secagg_wire
from fedsketch.common.study.aggregate import check_sketch_sum
from fedsketch.common.study.refine import RoundSpec
from fedsketch.common.study.secure_calibration import SecureProtocol, secure_protocol
from fedsketch.common.study.secure_rounds import SecureRound
from fedsketch.common.study.validated import is_validated
from fedsketch.server.decode.pipeline import StudyResult, decode_sketch, integer_sketch
from fedsketch.server.errors import Code, Refusal
from fedsketch.server.service.messages import StageMessage
from fedsketch.server.service.rounds import Rounds, failure_detail
from fedsketch.server.service.secure_round import SecAggRound
from fedsketch.server.service.shared_round import SharedRound
from fedsketch.server.service.validated_round import ValidatedRound
from fedsketch.server.store.base import ACCEPTING, SecureRoundRow, Store

log = logging.getLogger("fedsketch.coordinator")

#: The most seconds a round resumed after a restart waits before closing a stage whose timeout
#: passed while the coordinator was down (:func:`restart_grace`).
RESTART_GRACE_SECONDS = 10.0


def restart_grace(stage_timeout: float) -> float:
    """Seconds a resumed round keeps a stage open that is past its timeout: the devices retried
    with backoff while the coordinator was down (:func:`fedsketch.client.daemon.backoff`), and
    their next try should find the stage still open; at most ``stage_timeout``, so a resumed
    stage never waits longer than a fresh one."""
    return min(stage_timeout, RESTART_GRACE_SECONDS)


class SecureStudies:
    """A mixin of :class:`~fedsketch.server.service.coordinator.Coordinator`, which provides
    ``store``, ``spec``, ``rounds``, ``refinement``, ``_lock``, ``_decoder``, ``_enrolled_key``,
    ``_decode`` and ``_publish``."""

    store: Store
    rounds: dict[str, SecAggRound]
    #: the token the helper of validated studies gave this coordinator (None: it serves none)
    helper_token: str | None = None
    refinement: Rounds
    _lock: threading.Lock
    _decoder: ThreadPoolExecutor

    def _resume_rounds(self) -> None:
        """Rebuild every secure-aggregation round the store holds as running (a study or a
        refinement round still accepting), at the stage it was in (:meth:`SecAggRound.resume`),
        and, for who may read what (:mod:`.reads`), the roster of every round that had ended
        (:meth:`SecAggRound.ended`). A round that cannot be rebuilt (its kept messages no
        longer pass this coordinator's checks) fails its study with the reason; the others
        resume. Under ``--shared`` a running round is taken up blank, with the restart's grace
        (:func:`restart_grace`): its first call catches up under the round's lock
        in the database, as other coordinators may be serving it."""
        for row in self.store.list_studies():
            try:
                protocol = self._protocol(row.study_id)
            except ValueError:  # an earlier release's round: failed at start-up, or finished
                continue
            if protocol is None:
                continue
            if row.state not in ACCEPTING:
                kept = self.store.secure_round(row.study_id)
                if kept is not None and kept.members is not None:
                    with self._lock:
                        self.rounds[row.study_id] = self._round_kind(protocol).ended(
                            row.study_id, protocol, self.store, kept.members)
                continue
            grace = time.time() + restart_grace(protocol.secure_aggregation.stage_timeout)
            if self.store.shared:
                round_ = self._new_round(row.study_id, protocol)
                round_.grace_until = grace
                with self._lock:
                    self.rounds[row.study_id] = round_
                continue
            finish, fail = self._round_ends(row.study_id)
            try:
                round_ = self._round_kind(protocol).resume(row.study_id, protocol, self.store,
                                                           finish, fail, grace)
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
        sketch round) from its stored unmasked sum (once its round ended, or after a restart
        while it decoded), unless a sketch study's rounds have begun already."""
        total = np.frombuffer(kept.total, dtype="<i8").astype(np.int64)
        spec = self.spec(study_id)
        if isinstance(spec, RoundSpec):
            self.refinement.decode_secure(study_id, spec, total, kept.devices, kept.records)
        elif spec.box is not None:  # reads the box and opens the boxed study, or goes on
            self.refinement.boxes.read(study_id, (total, kept.devices))
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
            check_sketch_sum(spec, total, records, devices, secure=True)  # AggregateError fails it
            return decode_sketch(spec, integer_sketch(spec, total.reshape(2, m), records), devices,
                                 records, draws=devices / spec.assumptions.min_honest)

        self._publish(study_id, decode)

    def _protocol(self, study_id: str) -> SecureProtocol | None:
        """The secure protocol of a study (round 0 or sketch), a sketch round or a refinement
        round; None for a plain one (ValueError for a spec this release does not read)."""
        spec = self.spec(study_id)
        if spec.secure_aggregation is None:
            return None
        return (SecureRound(self.spec(spec.parent_id), spec) if isinstance(spec, RoundSpec)
                else secure_protocol(spec))

    def _new_round(self, study_id: str, spec: SecureProtocol) -> SecAggRound:
        """The secure-aggregation round of a study (or sketch round), of a round 0 (σ from its
        sum) or of a refinement round (its cells); a :class:`SharedRound` under ``--shared``."""
        kind = SharedRound if self.store.shared else self._round_kind(spec)
        return kind(study_id, spec, self.store, *self._round_ends(study_id))

    def _round_kind(self, spec: SecureProtocol) -> type[SecAggRound]:
        """:class:`ValidatedRound` (with this coordinator's helper token) for a study validated
        by a helper, else :class:`SecAggRound`."""
        if not is_validated(spec):
            return SecAggRound
        return type("ValidatedRound", (ValidatedRound,), {"helper_token": self.helper_token})

    def _adopted(self, study_id: str) -> SecAggRound | None:
        """The study's round in this process; under ``--shared``, one that another coordinator
        started is taken up (blank: it catches up on its first call). Alone, a running round not
        yet held is one whose start this call overtook (a refinement round is listed once its
        study row is stored, a moment before :meth:`_secure_round_opened`): it is rebuilt from
        the store, as after a restart. None for a plain study or an ended round not held;
        Refusal not_found for an unknown study."""
        with self._lock:
            found = self.rounds.get(study_id)
        if found is not None:
            return found
        try:
            protocol = self._protocol(study_id)
        except ValueError:  # an earlier release's round, failed at start-up
            return None
        if protocol is None:
            return None
        if self.store.shared:
            round_ = self._new_round(study_id, protocol)
        elif self.store.get_study(study_id).state in ACCEPTING:
            round_ = self._round_kind(protocol).resume(study_id, protocol, self.store,
                                                       *self._round_ends(study_id))
        else:
            return None
        with self._lock:
            return self.rounds.setdefault(study_id, round_)

    def _round_ends(self, study_id: str) -> tuple[Callable, Callable]:
        """(finish, fail) of a round (:class:`SecAggRound`), called once the round's end is
        stored: decode the stored unmasked sum under the study's claim (:meth:`_decode`: a
        refinement round's becomes its cells, a round 0's gives σ and the sketch round), or log
        the abort; a round's end, or abort, lets its study go on (under the study's claim)."""
        def finish(*_) -> None:
            self._decoder.submit(self._decode, study_id)

        def fail(reason: str) -> None:
            log.warning("study %s: %s", study_id, reason)
            if (parent := self.store.get_study(study_id).parent) is not None:  # a round's
                self._decoder.submit(self._decode, parent)

        return finish, fail

    def _secure_round_opened(self, round_id: str, rnd: RoundSpec | None) -> None:
        """Start the secure round of a refinement round (``rnd`` None: a sketch round) just opened."""
        round_ = self._new_round(round_id, self._protocol(round_id))
        with self._lock:  # a device's call may have taken it up already (:meth:`_adopted`)
            self.rounds.setdefault(round_id, round_)

    def _round(self, study_id: str) -> SecAggRound:
        """The running round of a study (not_found / failed_precondition). A round exists only
        for a created study, so the store is read only when none is found."""
        if (found := self._adopted(study_id)) is None:
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
