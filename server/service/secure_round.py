"""The coordinator's side of a secure-aggregation study: stages, routing, and the unmasked sum.

Stages (``Study.stage``): REGISTER → ADVERTISE_KEYS → SHARE_KEYS → MASKED_INPUT → CONSISTENCY → UNMASK. A
stage closes as soon as every expected device has sent its message, or ``stage_timeout`` seconds after it
opened (REGISTER: after the first device registered); devices that did not answer have dropped (Bonawitz et
al. handle them). REGISTER admits up to ``min_devices`` devices, each declaring its record count n (public
under replace-one) in a body of a fixed schema (``{"n": integer}``, a few bytes); a REGISTER with other keys,
a count outside ``min_records`` .. the study's ``max_device_records``, or one that would bring Σn above
``max_records`` is refused alone (INVALID_ARGUMENT), so it cannot abort the round of the others. The round
needs at least L − D registered devices (the study's stated dropouts D:
:mod:`fedsketch.common.secagg.trust`). The round's parameters are :meth:`StudySpec.round_params`, which every
device recomputes: the modulus has the bits of :func:`fedsketch.common.secagg.modulus_bits` for N ≤
max_records, DLap(a) with a = exp(−ε/Δ1) (:meth:`StudySpec.noise_param`), and noise shape roster/h_min. At
CONSISTENCY the survivors sign the survivor list Y; UNMASK opens only with the consistency quorum of
signatures on Y.

The coordinator learns only Σ_{u∈Y}(S_u + e_u) mod 2^B over the devices Y whose masked input arrived: their
integer sums plus noise shares of which at least h_min = L − D − C are unknown to it, adding up to DLap(a) or
more. It decodes s = Σ / (γ·α·N_Y·√m) like a plain study. Below the threshold at any stage, with fewer than L
− D registered devices (nobody has spent yet), fewer than L − D masked inputs (the unknown shares could add
up to less than one DLap(a)) or fewer signatures on Y than the consistency quorum, the study fails and
nothing is released.

Durability: every stage message is kept in the store (:meth:`Store.add_stage_message
<fedsketch.server.store.base.Store.add_stage_message>`; a REGISTER counts against the device's declared
budget, :mod:`.accounting`) before it is acknowledged, every stage that opens is recorded with when it
opened, and the unmasked sum is stored, with the devices in it and their declared records, in the transaction
that moves the study to decoding (:meth:`~fedsketch.server.store.base.Store.end_secure_round`). The
Aggregator is deterministic given each stage's messages, and the routed bundles are canonical JSON, so
:meth:`SecAggRound.resume` rebuilds a round from the store by replaying every closed stage's messages: a
coordinator restarted at any point gives every device the same bytes as before and resumes the open stage,
whose deadline stays ``stage_timeout`` after it opened (REGISTER's after its first registration) but, if that
passed while it was down, comes no sooner than a short grace after the restart
(:func:`~.secure_studies.restart_grace`), and a restart while decoding decodes the stored sum again;
coordinators sharing a database serve one round together the same way (:mod:`.shared_round`). A device sends
one message per stage, kept once: an identical re-send is acknowledged again (also once its stage has closed,
while the round runs: its first acknowledgement may have been lost in a restart), different bytes are refused
(CONFLICT), and so is a message longer than its stage needs (:data:`STAGE_BYTES`): the store holds at most a
bounded message per stage and roster device, deleted when the round ends. A device rides through the
coordinator's restart by retrying its calls (:mod:`fedsketch.client.secure_steps`). Stages are the protocol's
``Stage`` numbers (:data:`fedsketch.common.secagg.wire.STAGES`), covered by each message's signature: part of
the wire contract. Refusals carry domain codes (:mod:`.api` makes them gRPC statuses).
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import numpy as np

from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import Aggregator, SecAggAbort, SecAggParams
from fedsketch.common.secagg import wire as sw
from fedsketch.common.study.secure_rounds import SecureRound
from fedsketch.common.study.study import StudySpec
from fedsketch.server.errors import Code, Refusal
from fedsketch.server.service.accounting import release_cost
from fedsketch.server.service.rounds import failure_detail
from fedsketch.server.service.stage_clock import StageClock
from fedsketch.server.store.base import SecureRoundRow, StageMessageRow, Store

log = logging.getLogger("fedsketch.coordinator")


#: Most bytes of an ADVERTISE_KEYS or CONSISTENCY message, and of a SHARE_KEYS or UNMASK message
#: per roster device: about 5 times what an honest device sends (an advert about 250 bytes; per
#: peer a device id and a base64 ciphertext, about 420 bytes, or share, about 210).
STAGE_BYTES = 2048


class SecAggRound(StageClock):
    """One study's round: a sketch study's (``spec`` a StudySpec) or a refinement round's (a
    :class:`~fedsketch.common.study.secure_rounds.SecureRound`), kept in ``store`` as it goes
    (module docstring). ``finish(total, devices, records)`` gets the unmasked integer sum (the
    payload's words, int64) once it is stored and the study is decoding; ``fail(reason)`` is
    called once an abort is stored (the study failed)."""
    STAGES: tuple[int, ...] = sw.STAGES  #: the stages, in order (a validated round has two)

    def __init__(self, study_id: str, spec: StudySpec | SecureRound, store: Store,
                 finish: Callable[[np.ndarray, int, float], None],
                 fail: Callable[[str], None]) -> None:
        self.study_id = study_id
        self.spec = spec
        self.sa = spec.secure_aggregation
        self._store = store
        self._finish, self._fail = finish, fail
        self._lock = threading.Lock()
        #: No open stage closes by its timeout before this (Unix seconds; :meth:`resume`).
        self.grace_until = 0.0
        #: Wall seconds the coordinator spent closing each stage, and each stage stayed open.
        self.stage_seconds: dict[str, float] = {}
        self.stage_open: dict[str, float] = {}
        self._blank()

    def _blank(self) -> None:
        """The round as nobody has sent anything yet (also a shared round's reset)."""
        self.stage = pb.REGISTER
        self._opened_at = math.inf  # when the open stage opened (REGISTER: its first device)
        self.deadline = math.inf  # REGISTER's clock starts with the first device
        # stage → device → (SHA-256 of the message as received, its parsed content)
        self._inbox: dict[int, dict[str, tuple[bytes, object]]] = {s: {} for s in sw.STAGES}
        self._outbox: dict[str, bytes] = {}
        self._shared_body: bytes | None = None
        self._records: dict[str, float] = {}  # the roster's declared record counts
        self._survivors: tuple[str, ...] = ()  # whose masked input arrived (MASKED_INPUT closed)
        self._aggregator: Aggregator | None = None
        self._params: SecAggParams | None = None

    @classmethod
    def resume(cls, study_id: str, spec: StudySpec | SecureRound, store: Store,
               finish: Callable[[np.ndarray, int, float], None],
               fail: Callable[[str], None], grace_until: float = 0.0) -> SecAggRound:
        """The round as the store holds it, at the stage it was in: every closed stage's kept
        messages replayed in order of arrival, the open stage's taken back, its deadline
        ``stage_timeout`` after it opened (REGISTER: after the first registration), but not
        before ``grace_until`` (a restart's grace). A stage that was full when the coordinator
        stopped closes now."""
        r = cls(study_id, spec, store, finish, fail)
        r.grace_until = grace_until
        with r._lock:
            r._replay(store.secure_round(study_id), store.stage_messages(study_id))
        return r

    @classmethod
    def ended(cls, study_id: str, spec: StudySpec | SecureRound, store: Store,
              members: dict[str, bool]) -> SecAggRound:
        """A round that ended before a restart, as the store kept it: finished, answering
        :meth:`members` (its roster, and whose masked input is in the sum) and nothing else."""
        r = cls(study_id, spec, store, lambda *_: None, lambda _: None)
        r._ended_as(members)
        return r

    def _ended_as(self, members: dict[str, bool]) -> None:
        """End the round as the store kept it (lock held): its roster, and who is in the sum."""
        self._records = dict.fromkeys(members, 0.0)  # the roster; the counts served only the sum
        self._survivors = tuple(sorted(u for u, counted in members.items() if counted))
        self._end()

    def _replay(self, row: SecureRoundRow | None, messages: list[StageMessageRow]) -> None:
        """Bring the round from its stage to the stage ``row`` records (lock held): the kept ``messages``
        it lacks taken in, every stage between (of :attr:`STAGES`) closed as it closed before (the
        aggregator is deterministic given a stage's messages), the open stage's deadline set; a full
        open stage closes now. :meth:`resume`'s work, from REGISTER."""
        at = pb.REGISTER if row is None else row.stage
        for stage in self.STAGES[self.STAGES.index(self.stage):self.STAGES.index(at) + 1]:
            for m in messages:
                if m.stage == stage and m.device_id not in self._inbox[stage]:
                    self._inbox[stage][m.device_id] = (hashlib.sha256(m.body).digest(),
                                                       self._parse(stage, m.body))
            if stage != at:
                self._advance(replaying=True)
                if self.finished:
                    return
        if at == pb.REGISTER:
            self._opened_at = min([self._opened_at, *(m.received_at for m in messages
                                                       if m.stage == pb.REGISTER)])
        else:
            self._opened_at = row.opened_at
        self.deadline = max(self._opened_at + self.sa.stage_timeout, self.grace_until)
        if self._full():
            self._advance()

    @property
    def finished(self) -> bool:
        return self.stage == pb.FINISHED

    def follow(self) -> None:
        """Nothing: one coordinator's round is the store's (:meth:`.SharedRound.follow`)."""

    def _held(self) -> AbstractContextManager:
        """What :meth:`receive`, :meth:`fetch` and :meth:`tick` hold: the round's lock (and,
        shared, the database's: :class:`~.shared_round.SharedRound`)."""
        return self._lock

    def held_messages(self) -> int:
        """Stage messages and routed bundles the round still holds (0 once it is over)."""
        with self._lock:
            return sum(map(len, self._inbox.values())) + len(self._outbox)

    def _check_open(self, stage: int) -> None:
        """Refuse a message or fetch for any stage but the open one (lock held)."""
        if self.finished:
            raise Refusal(Code.FAILED_PRECONDITION,
                          "the secure-aggregation round is over; see the study's state")
        if stage != self.stage:
            raise Refusal(Code.FAILED_PRECONDITION, f"stage {pb.Stage.Name(stage)} is not open "
                          f"(the study is at {pb.Stage.Name(self.stage)})")

    def _end(self) -> None:
        """Mark the round FINISHED (lock held) and drop what only a running round needs: the
        stage messages, the routed bundles and the aggregator (up to L masked inputs of 2m
        words), so a long-lived coordinator keeps only each round's stage and timings."""
        self.stage = pb.FINISHED
        self._inbox = {}
        self._outbox = {}
        self._shared_body = None
        self._aggregator = None

    def _expected(self) -> set[str] | None:
        """Who must answer the open stage: the roster at ADVERTISE_KEYS, then the devices the
        previous stage routed something to (None: anyone may register)."""
        if self.stage == pb.REGISTER:
            return None
        if self.stage == pb.ADVERTISE_KEYS:
            return set(self._params.device_ids)
        return set(self._outbox)

    def receive(self, device_id: str, stage: int, body: bytes) -> bool:
        """Store one stage message; True for an identical re-send, also of a stage that has
        closed since (its acknowledgement was lost) while the round runs. Closes the stage when
        full."""
        with self._held(), self._timed():
            digest = hashlib.sha256(body).digest()
            held = self._inbox.get(stage, {}).get(device_id)
            if held is not None:
                if held[0] == digest:
                    return True
                raise Refusal(Code.CONFLICT,
                              f"device {device_id} already sent a different {pb.Stage.Name(stage)}")
            self._check_open(stage)
            inbox = self._inbox[stage]
            expected = self._expected()
            if expected is not None and device_id not in expected:
                raise Refusal(Code.PERMISSION_DENIED,
                              f"device {device_id} is not in this round's roster")
            parsed = self._parse(stage, body)  # a malformed message is refused, not kept
            self._store.add_stage_message(self.study_id, stage, device_id, body,  # before the ack
                                          release_cost(self.spec) if stage == pb.REGISTER else None)
            if stage == pb.REGISTER and not inbox:
                self._opened_at = time.time()
                self.deadline = self._opened_at + self.sa.stage_timeout
            inbox[device_id] = (digest, parsed)
            if self._full():
                self._advance()
            return False

    def _full(self) -> bool:
        """Whether every device the open stage expects has sent (REGISTER: ``min_devices``)."""
        inbox, expected = self._inbox[self.stage], self._expected()
        return len(inbox) >= self.spec.min_devices if expected is None else set(inbox) >= expected

    def _records_of(self, body: bytes) -> float:
        """The record count n a REGISTER message declares (lock held); Refusal
        INVALID_ARGUMENT unless the body is :func:`~fedsketch.common.secagg.wire.register_from_body`'s
        schema with ``min_records`` ≤ n ≤ the study's ``device_cap`` and the registered
        devices' Σn, this one's included, stays within ``max_records``: a device that breaks the
        study's limits is refused alone, and the round never exceeds its modulus's bound."""
        most = min(self.spec.device_cap, self.sa.max_records)
        try:
            n = sw.register_from_body(body, self.spec.min_records, most)
        except ValueError as exc:
            raise Refusal(Code.INVALID_ARGUMENT, f"malformed REGISTER: {exc} (the study takes "
                          f"{self.spec.min_records:,} to {most:,} records per device)") from None
        held = sum(content for _, content in self._inbox[pb.REGISTER].values())
        if held + n > self.sa.max_records:
            raise Refusal(Code.INVALID_ARGUMENT,
                          f"{n:,} records would bring the registered devices' total to "
                          f"{held + n:,}, above the study's max_records {self.sa.max_records:,}")
        return float(n)

    def _parse(self, stage: int, body: bytes) -> object:
        """The content of a stage message, parsed once on arrival (lock held); Refusal
        INVALID_ARGUMENT if malformed, so one device's bad bytes never abort the round of the
        others, or longer than the stage's :data:`STAGE_BYTES` (per roster device at SHARE_KEYS
        and UNMASK), so what the store keeps of a round stays proportional to what honest
        devices send (a MASKED_INPUT has exactly the round's words, a REGISTER its schema)."""
        if stage == pb.REGISTER:
            return self._records_of(body)
        most = STAGE_BYTES * (len(self._params.device_ids) if stage in (pb.SHARE_KEYS, pb.UNMASK)
                              else 1)
        if stage != pb.MASKED_INPUT and len(body) > most:
            raise Refusal(Code.INVALID_ARGUMENT, f"malformed {pb.Stage.Name(stage)} message: "
                          f"{len(body):,} bytes, more than this round takes ({most:,})")
        try:
            if stage == pb.ADVERTISE_KEYS:
                return sw.advert_from_json(sw.load(body))
            if stage == pb.SHARE_KEYS:
                return sw.bytes_map_from_json(sw.load(body))
            if stage == pb.MASKED_INPUT:
                return sw.masked_from_bytes(body, self._params.dim)
            if stage == pb.CONSISTENCY:
                return sw.signature_from_json(sw.load(body))
            return sw.unmask_from_json(sw.load(body))
        except ValueError as exc:
            raise Refusal(Code.INVALID_ARGUMENT, f"malformed {pb.Stage.Name(stage)} message: {exc}") from None

    def fetch(self, device_id: str, stage: int) -> bytes:
        """What the coordinator routes to ``device_id`` for the open ``stage``."""
        with self._held(), self._timed():
            self._check_open(stage)
            if stage == pb.ADVERTISE_KEYS and self._shared_body is not None:
                if device_id not in self._params.share_x:
                    raise Refusal(Code.PERMISSION_DENIED,
                                  f"device {device_id} is not in this round's roster")
                return self._shared_body
            if device_id not in self._outbox:
                raise Refusal(Code.PERMISSION_DENIED,
                              f"nothing for device {device_id} at this stage (dropped?)")
            return self._outbox[device_id]

    def tick(self, now: float) -> None:
        """Close the open stage if its timeout has passed."""
        if self.finished:
            return
        with self._held(), self._timed():
            if not self.finished and now >= self.deadline:
                self._advance()

    def _advance(self, replaying: bool = False) -> None:
        """Close the open stage (lock held) and open the next, or finish or fail the round, each
        stored before anyone can see it; ``replaying``: a stage closed before a restart, whose
        next stage the store already records."""
        closing = self.stage
        parsed = {u: content for u, (_, content) in self._inbox[closing].items()}
        if not replaying:
            self.stage_open[pb.Stage.Name(closing)] = time.time() - self._opened_at
        started = time.perf_counter()
        try:
            if self.stage == pb.REGISTER:
                self._open_round(parsed)
            elif self.stage == pb.ADVERTISE_KEYS:
                routed = self._aggregator.collect_adverts(parsed)
                self._outbox = {u: sw.dump({v: sw.advert_to_json(a) for v, a in peers.items()})
                                for u, peers in routed.items()}
            elif self.stage == pb.SHARE_KEYS:
                routed = self._aggregator.collect_shares(parsed)
                self._outbox = {u: sw.dump(sw.bytes_map_to_json(c)) for u, c in routed.items()}
            elif self.stage == pb.MASKED_INPUT:
                self._survivors = self._aggregator.collect_masked(parsed)
                body = sw.dump(sw.survivors_to_json(self._survivors))
                self._outbox = dict.fromkeys(self._survivors, body)
            elif self.stage == pb.CONSISTENCY:
                requests = self._aggregator.collect_signatures(parsed)
                body = sw.dump(sw.signed_to_json(next(iter(requests.values()))))  # one for all
                self._outbox = dict.fromkeys(requests, body)
            else:
                total = self._aggregator.collect_unmask(parsed)
                self.stage_seconds[pb.Stage.Name(closing)] = time.perf_counter() - started
                self._conclude(total)
                return
        except (SecAggAbort, ValueError) as exc:
            rejected = "" if self._aggregator is None else "; ".join(
                f"{u}: {why}" for u, why in self._aggregator.rejected.items())
            self._conclude(None, failure_detail(self.spec, f"secure aggregation aborted at "
                                                f"{pb.Stage.Name(closing)}: {exc}"
                                                + (f" (rejected: {rejected})" if rejected else "")))
            return
        self.stage_seconds[pb.Stage.Name(closing)] = time.perf_counter() - started
        self.stage = sw.STAGES[sw.STAGES.index(closing) + 1]
        if not replaying:
            now = time.time()
            self._store.open_stage(self.study_id, self.stage, now)
            self._opened_at, self.deadline = now, now + self.sa.stage_timeout

    def _conclude(self, total: np.ndarray | None, reason: str = "") -> None:
        """End the round (lock held): store the unmasked ``total`` (the study decodes) or the
        abort's ``reason`` (the study fails), then tell the coordinator. A study that left its
        accepting states meanwhile is left as it is."""
        survivors = self._survivors if total is not None else ()
        records = sum(self._records[u] for u in survivors)
        members = {u: u in self._survivors for u in self._records}  # as members() answers
        self._end()
        try:
            self._store.end_secure_round(
                self.study_id, reason or "secure aggregate unmasked",
                None if total is None else total.astype("<i8").tobytes(), len(survivors), records,
                members)
        except Refusal as exc:
            log.warning("study %s: its secure round ended, but the study did not move (%s)",
                        self.study_id, exc)
            return
        if total is None:
            self._fail(reason)
        else:
            self._finish(total, len(survivors), records)

    def _open_round(self, records_of: dict[str, float]) -> None:
        roster = sorted(records_of)
        self._records = records_of
        records = sum(records_of.values())  # at most max_records: REGISTER refuses beyond it
        try:
            self._params = self.spec.round_params(self.study_id, tuple(roster))
        except ValueError as exc:
            raise SecAggAbort(f"{exc}; nobody has spent anything") from None
        keys = {u: self._store.device_key(u) for u in roster}
        self._aggregator = Aggregator(self._params, keys)
        self._shared_body = sw.dump(sw.params_to_json(self._params, keys, records))

    def members(self) -> dict[str, bool]:
        """The round's roster once REGISTER closed, each device mapped to whether its masked
        input is in the sum (known once MASKED_INPUT closed); empty before. What decides which
        studies and results a device may read (:mod:`.reads`)."""
        with self._lock:
            return {u: u in self._survivors for u in self._records}
