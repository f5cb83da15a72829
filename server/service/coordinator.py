"""The coordinator's logic: the study lifecycle and the validation of every message, over a durable
:class:`~fedsketch.server.store.base.Store`. Nothing here knows about gRPC, so the rules read without
the transport and :mod:`.api` stays a thin translation.

Lifecycle (the transitions are defined once, in :mod:`fedsketch.server.store.base`): open → collecting
(first stored contribution) → decoding → done | failed. A plain study first fills its roster: devices
register (signed, spending nothing) until ``min_devices`` have, and only then may roster devices submit,
so no device spends on a study that cannot reach its quorum. The roster takes devices up to the spec's
``roster`` (≥ ``min_devices``). A study closes once its whole roster has contributed, at its deadline,
or ``collect_seconds`` after its quorum registered, whichever comes first; it then decodes if
``min_devices`` have contributed, otherwise it fails (a study whose quorum never registered fails
without anyone having spent), so a roster device that never sends delays the study by the collection
window at most and, with a roster larger than the quorum, costs it nothing. An operator may close a
study early (same rule). A device spends only after the coordinator has told it, in the transaction that
records its spend, that it may send: that answer is an input ticket of :data:`TICKET_SECONDS`, and a
close requested (deadline or operator) while tickets are outstanding waits until their contributions
arrive or the tickets expire, giving no new one. Decoding runs on a worker thread so that a submission
is answered at once; a coordinator that restarts re-decodes any study it left in ``decoding`` (a secure
one from its stored unmasked sum), resumes secure-aggregation rounds at the stage they were in
(:mod:`.secure_round`) and closes studies whose deadline passed. A study with refinement rounds stays
``decoding`` after its sketch while its rounds, studies of their own, run (:mod:`.rounds`); a round
study that ends lets its study go on.

Every contribution is checked before it is stored, and a :class:`Refusal` changes nothing: unknown study
(not_found), closed or still registering study or spec-hash mismatch (failed_precondition), unenrolled
device or bad signature (unauthenticated), a device not in the roster (permission_denied), no payload,
wrong length, NaN/inf or a value beyond what the mechanism can produce (invalid_argument), a second,
different contribution (conflict). An identical re-send is acknowledged again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from fedsketch.common.net import signing
from fedsketch.common.net.tls import MAX_MESSAGE_BYTES
from fedsketch.common.study import wire
from fedsketch.common.study.aggregate import AggregateError
from fedsketch.common.study.calibration_round import check_release
from fedsketch.common.study.refine import CellsError, RoundSpec, check_cells
from fedsketch.common.study.secure_calibration import secure_protocol
from fedsketch.common.study.study import StudySpec, spec_sha256
from fedsketch.common.study.validated import check_validated
from fedsketch.server.decode.pipeline import StudyResult, decode_study
from fedsketch.server.errors import Code, Refusal
from fedsketch.server.service.accounting import study_cost
from fedsketch.server.service.messages import Submission
from fedsketch.server.service.reads import Reads
from fedsketch.server.service.roster import MAX_KEYS, Roster
from fedsketch.server.service.rounds import Rounds, tick_each
from fedsketch.server.service.secure_aborts import SecureAborts
from fedsketch.server.service.secure_round import SecAggRound
from fedsketch.server.service.secure_studies import SecureStudies
from fedsketch.server.service.shared import Shared
from fedsketch.server.store.base import (
    ABANDON,
    ACCEPTING,
    DECODE,
    DECODING_FAILED,
    ContributionRow,
    Store,
    StudyRow,
    Transition,
)
from fedsketch.server.store.faults import StoreUnavailable

log = logging.getLogger("fedsketch.coordinator")

#: How often the deadline watcher wakes (seconds).
WATCH_INTERVAL = 0.5
#: Most enrollment tokens one operator call may issue.
MAX_TOKENS = 100_000
#: Most bytes of a device's sketch (2m words of 8 bytes, 4 for a plain quantized study's
#: int32 pairs): one message's worth, less 4 KiB for its ids, count and signature.
MAX_SKETCH_BYTES = MAX_MESSAGE_BYTES - 4096


class Coordinator(SecureStudies, SecureAborts, Roster, Reads, Shared):
    """Study lifecycle and validation, shared by the device and operator services."""

    def __init__(self, store: Store, audiences: frozenset[str] | None = None) -> None:
        """``audiences``: the names a device's signed read may be meant for, those of the
        certificate served (:class:`~fedsketch.server.service.reads.Reads`); None when serving
        plaintext, which proves no name."""
        self.store = store
        self.audiences = audiences
        self._specs: dict[str, StudySpec] = {}
        self._hashes: dict[str, str] = {}  # study → its spec's SHA-256 (never changes)
        self._keys: dict[str, bytes] = {}  # device → its enrolled key (never changes)
        self._lock = threading.Lock()
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")
        self._stalled: set[str] = set()  # studies whose decoding waits for the store
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="deadlines", daemon=True)
        self.rounds: dict[str, SecAggRound] = {}
        self.refinement = Rounds(store, self.spec, self._settle, self._secure_round_opened)

    def start(self) -> None:
        """Read the enrolled keys (the newest :data:`~.roster.MAX_KEYS`), fail the running
        studies this release cannot read, resume interrupted decodings (a secure study's from
        its stored unmasked sum) and secure-aggregation rounds (rebuilt from the store), and
        start the deadline watcher."""
        self._keys.update(self.store.device_keys(MAX_KEYS))
        self._retire_unreadable()
        for row in self.store.list_studies(("decoding",)):
            self._decoder.submit(self._decode, row.study_id)
        self._resume_rounds()
        self._watcher.start()

    def _retire_unreadable(self) -> None:
        """Fail each running study whose spec this release does not read (a refinement round in
        an earlier release's format, fedsketch.round/1), with why, so that it neither stops the
        coordinator nor stays open; finished ones keep their state and result."""
        for row in self.store.list_studies((*ACCEPTING, "decoding")):
            try:
                self.spec(row.study_id)
            except ValueError as exc:
                log.warning("study %s: its spec is unreadable here: %s", row.study_id, exc)
                self._settle(row.study_id, ABANDON if row.state in ACCEPTING else DECODING_FAILED,
                             f"this coordinator does not read the study's spec, written by an earlier "
                             f"release ({exc})")

    def stop(self) -> None:
        """Stop the watcher and wait for a running decoding to finish."""
        self._stop.set()
        if self._watcher.is_alive():
            self._watcher.join()
        self._decoder.shutdown(wait=True)

    def _move(self, study_id: str, transition: Transition, detail: str) -> StudyRow:
        """Make one lifecycle transition as a compare-and-set (StoreError 'failed_precondition'
        if the study has left the transition's sources meanwhile)."""
        return self.store.set_state(study_id, transition.target, detail, expect=transition.sources)

    def _settle(self, study_id: str, transition: Transition, detail: str) -> bool:
        """:meth:`_move` for the coordinator's own threads (start-up, the decoder, a round's end),
        where no client waits for a refusal: a study that already left the transition's sources
        is left as it is, and the skipped transition is logged. True when the study moved."""
        try:
            self._move(study_id, transition, detail)
        except Refusal as exc:
            log.warning("study %s: no move to %s (%s)", study_id, transition.target, exc)
            return False
        return True

    # --- devices -------------------------------------------------------------------------------

    def enroll(self, token: str, public_key: bytes, label: str,
               budget: tuple[float, float] | None = None) -> str:
        """Trade a one-time token for a device id bound to the raw Ed25519 ``public_key`` and
        the total (ε, δ) ``budget`` it declares (:mod:`.accounting`)."""
        if len(public_key) != signing.PUBLIC_KEY_BYTES:
            raise Refusal(Code.INVALID_ARGUMENT, "public_key must be 32 raw bytes")
        device_id = self.store.enroll(token, public_key, label, budget)
        self._remember_key(device_id, public_key)
        return device_id

    def issue_tokens(self, count: int) -> list[str]:
        """``count`` fresh one-time enrollment tokens, stored (as digests) before they are returned."""
        if not 1 <= count <= MAX_TOKENS:
            raise Refusal(Code.INVALID_ARGUMENT, f"count must be in 1..{MAX_TOKENS}")
        tokens = [secrets.token_urlsafe(24) for _ in range(count)]
        self.store.add_tokens(tokens)
        return tokens

    # --- studies -------------------------------------------------------------------------------

    def spec(self, study_id: str) -> StudySpec | RoundSpec:
        """The parsed spec of a study, or of a refinement round (cached; specs never change)."""
        with self._lock:
            spec = self._specs.get(study_id)
        if spec is None:
            spec = self.refinement.parse(self.store.get_study(study_id).spec_json)
            with self._lock:
                self._specs[study_id] = spec
        return spec

    def spec_hash(self, study_id: str) -> str:
        """The SHA-256 of a study's spec, as stored (cached: it never changes)."""
        digest = self._hashes.get(study_id)
        if digest is None:
            digest = self._hashes[study_id] = self.store.get_study(study_id).spec_sha256
        return digest

    def study(self, study_id: str) -> StudyRow:
        """One study (not_found for an unknown one)."""
        return self.store.get_study(study_id)

    def studies(self, include_closed: bool = False) -> list[StudyRow]:
        """Studies that accept contributions, or all of them, oldest first."""
        return self.store.list_studies(None if include_closed else ACCEPTING)

    def round_of(self, study_id: str) -> SecAggRound | None:
        """The study's secure-aggregation round, if one was started in this process; under
        ``--shared``, any running one, at the stage the store records (:meth:`_adopted`)."""
        if not self.store.shared:
            return self.rounds.get(study_id)
        if (found := self._adopted(study_id)) is not None:
            found.follow()
        return found

    def create(self, spec_json: str) -> StudyRow:
        """Validate and canonicalize an operator's spec, check its Ω hash, and open the study."""
        try:
            spec = StudySpec.from_json(spec_json)
            spec.check_new()
            check_validated(spec, self.helper_token is not None and not self.store.shared)
            m = spec.sketch.frequencies.m
            width = 4 if spec.sketch.feature == "quantized" and spec.secure_aggregation is None else 8
            if 2 * m * width > MAX_SKETCH_BYTES:
                raise ValueError(f"m = {m} is too large: a device's sketch (2m·{width} bytes) "
                                 f"would not fit one {MAX_MESSAGE_BYTES}-byte message")
            expected = StudySpec.create(spec.name, spec.sketch, spec.k, spec.lo, spec.hi)
        except ValueError as exc:
            raise Refusal(Code.INVALID_ARGUMENT, f"bad study spec: {exc}") from None
        except MemoryError:  # the m × d frequencies, drawn to check omega_sha256
            raise Refusal(Code.INVALID_ARGUMENT, "bad study spec: its m × d frequencies do not fit "
                          "in the coordinator's memory") from None
        if expected.omega_sha256 != spec.omega_sha256:
            raise Refusal(Code.INVALID_ARGUMENT, "omega_sha256 does not match the frequency spec")
        text = spec.to_json()
        study_id = "st-" + secrets.token_hex(8)
        row = self.store.create_study(study_id, text, spec_sha256(text), spec.deadline,
                                      spec.min_devices, roster=spec.roster)
        with self._lock:
            self._specs[study_id] = spec
            if spec.secure_aggregation is not None:
                self.rounds[study_id] = self._new_round(study_id, secure_protocol(spec))
        self.store.audit("operator", "create_study", row.study_id)
        return row

    def close(self, study_id: str, reason: str) -> StudyRow:
        """Stop collecting: decode if the quorum holds, otherwise fail the study. The request is
        recorded first (from then on the study takes no registration, gives no ticket and takes
        input only from devices holding a live ticket), so the decision below cannot race a
        device told to send; while such devices remain, it waits (the watcher finishes it)."""
        row = self.store.get_study(study_id)
        if row.state not in ACCEPTING:
            raise Refusal(Code.FAILED_PRECONDITION, f"study {study_id} is already {row.state}")
        if self.spec(study_id).secure_aggregation is not None:
            raise Refusal(Code.FAILED_PRECONDITION,
                          "a secure-aggregation study closes its stages by their timeouts")
        if row.closing is None:
            row = self.store.request_close(study_id, reason)
        if self.store.outstanding(study_id, time.time()):
            return row
        row = self.store.get_study(study_id)
        if not row.roster_full:
            return self._abandon(row, f"{reason}: {row.registered} of {row.min_devices} devices "
                                 "registered; none of them spent anything")
        if row.contributions < row.min_devices:
            return self._abandon(row, f"{reason}: {row.contributions} of {row.min_devices} "
                                 "devices contributed")
        row = self._move(study_id, DECODE, reason)
        self._decoder.submit(self._decode, study_id)
        return row

    def _abandon(self, row: StudyRow, detail: str) -> StudyRow:
        """Fail a study closed without quorum; a failed round lets its study go on."""
        failed = self._move(row.study_id, ABANDON, self.refinement.failure(row.study_id, detail))
        if row.parent is not None:  # its study's next step, under its claim (_decode)
            self._decoder.submit(self._decode, row.parent)
        return failed

    def result(self, study_id: str) -> tuple[StudySpec, dict]:
        """The spec and published result (``StudyResult.to_dict()``) of a done study."""
        row = self.store.get_study(study_id)
        if row.parent is not None:
            raise Refusal(Code.FAILED_PRECONDITION, f"study {study_id} is a refinement round of "
                          f"{row.parent}: read that study's result")
        text = self.store.get_result(study_id)
        if text is None:
            raise Refusal(Code.FAILED_PRECONDITION, f"study {study_id} is {row.state}; no result"
                          + (f" ({row.detail})" if row.detail else ""))
        return self.spec(study_id), json.loads(text)

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL):
            try:
                self._watch_once(time.time())
            except StoreUnavailable as exc:  # the watcher outlives the fault, and tries again
                log.warning("watcher: the store failed (%s at %s); trying again in %g s",
                            exc.cause, exc.where, WATCH_INTERVAL)

    def _watch_once(self, now: float) -> None:
        """One pass of the watcher: deadlines, windows and stage timeouts, and decodings that
        waited for the store."""
        self._sweep(now)  # shared coordinators: studies left decoding by one that died
        accepting = self.store.list_studies(ACCEPTING)
        self._adopt(accepting)  # shared coordinators: rounds started by another one
        with self._lock:
            rounds, stalled, self._stalled = list(self.rounds.values()), self._stalled, set()
        for study_id in stalled:
            self._decoder.submit(self._decode, study_id)
        tick_each(rounds, now)
        for row in accepting:
            collect = getattr(self.spec(row.study_id), "collect_seconds", None)
            if (reason := row.close_due(now, collect)) is not None:
                try:
                    self.close(row.study_id, reason)
                except Refusal:
                    pass  # closed concurrently

    # --- decoding ------------------------------------------------------------------------------

    def _decode(self, study_id: str) -> None:
        """Decode a closed study: a refinement round's cells, or a sketch (whose study then publishes
        its result, or begins its rounds), under its claim (a round's: its study's), if still decoding."""
        try:
            with self.store.claim(self.store.get_study(study_id).parent or study_id):
                if self.store.get_study(study_id).state == "decoding":
                    self._decode_claimed(study_id, self.spec(study_id))
        except StoreUnavailable as exc:  # left decoding; the watcher queues it again
            log.warning("decoding study %s waits for the store (%s at %s)", study_id, exc.cause,
                        exc.where)
            with self._lock:
                self._stalled.add(study_id)

    def _decode_claimed(self, study_id: str, spec: StudySpec | RoundSpec) -> None:
        kept = self.store.secure_round(study_id)
        if kept is not None and kept.total is not None:  # never the plain decoder: no contributions
            self._decode_unmasked(study_id, kept)
            return
        if isinstance(spec, RoundSpec):
            return self.refinement.decode(study_id, spec)
        if spec.box is not None:  # the box round closed (or its study resumed)
            return self.refinement.boxes.read(study_id)
        if spec.calibration is not None:  # round 0 closed (or its study resumed)
            return self.refinement.calibrate(study_id)
        if spec.refine is not None and self.refinement.started(study_id):
            return self.refinement.advance(study_id)

        def decode() -> StudyResult:
            m = spec.sketch.frequencies.m
            return decode_study(spec, ((r.n, wire.decode(r.kind, r.payload, m))
                                       for r in self.store.contributions(study_id)))

        self._publish(study_id, decode)

    def _publish(self, study_id: str, decode: Callable[[], StudyResult]) -> None:
        """Store ``decode()``'s result (the study becomes done), or begin the study's refinement
        rounds from it, or fail the study with why."""
        try:
            result = decode()
            if self.spec(study_id).refine is not None:
                self.refinement.begin(study_id, result)
                return
            self.store.put_result(study_id, json.dumps(result.to_dict()))
            log.info("study %s decoded from %d devices", study_id, result.devices)
        except StoreUnavailable:
            raise  # not the decoding's fault: the study stays decoding (:meth:`_decode`)
        except AggregateError as exc:  # the inputs' fault, not a bug: no traceback
            log.warning("decoding study %s failed: %s", study_id, exc)
            self._settle(study_id, DECODING_FAILED, f"decoding failed: {exc}")
        except Exception as exc:  # a failed decoding fails the study, with the reason
            log.exception("decoding study %s failed", study_id)
            self._settle(study_id, DECODING_FAILED, f"decoding failed: {exc}")
        if (parent := self.store.get_study(study_id).parent) is not None:  # a sketch round
            self.refinement.advance(parent)

    # --- contributions -------------------------------------------------------------------------

    def submit(self, c: Submission) -> tuple[bool, str]:
        """Validate and store one contribution; (duplicate, receipt). Raises Refusal."""
        self._plain_study(c.study_id, c.spec_sha256, "contribution")  # the store refuses a closed one
        key = self._enrolled_key(c.device_id)
        if c.kind is None:
            raise Refusal(Code.INVALID_ARGUMENT, "contribution has no payload")
        payload_sha256 = hashlib.sha256(c.payload).digest()  # signed, and the receipt: hashed once
        digest = signing.contribution_digest_of(c.study_id, c.device_id, c.n, c.spec_sha256, payload_sha256)
        if not signing.verify(key, digest, c.signature):
            raise Refusal(Code.UNAUTHENTICATED, "invalid signature for this device and payload")
        spec = self.spec(c.study_id)
        try:
            if isinstance(spec, RoundSpec):
                check_cells(self.spec(spec.parent_id), spec, c.kind, c.payload, c.n)
            else:  # the study's sketch, or its round 0
                check_release(spec, c.kind, c.payload, c.n)
        except (wire.PayloadError, CellsError) as exc:
            raise Refusal(Code.INVALID_ARGUMENT, str(exc)) from None
        receipt = payload_sha256.hex()
        epsilon, delta = study_cost(self.spec, c.study_id)  # counted against the declared total
        stored, row = self.store.contribute(ContributionRow(
            c.study_id, c.device_id, c.n, c.kind, c.payload, receipt, c.signature, time.time(),
            epsilon, delta))
        if row is not None:
            if row.contributions >= row.capacity:  # nothing more can come
                try:
                    self.close(c.study_id, "every roster device contributed")
                except Refusal:
                    pass  # another submission closed it first
        return not stored, receipt
