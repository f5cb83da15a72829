"""One device's work on the round: enroll, check studies, sketch, spend, sign and submit.

The order is what makes a release safe (DESIGN §3, §6). A plain study first fills its roster:
the device joins it (steps 1–2, and a count of the records against the study's
``max_device_records`` and, under replace-one, ``min_records``), spending nothing, sets the
study's cost aside in its ledger (a reservation, :mod:`.ledger_reservations`: it joins no more
studies than its budget can pay for, after a restart too) and waits; only once the roster is
full does it go on. A reservation ends with the spend or once the study is no longer listed;
past the study's deadline or :data:`~.ledger_reservations.RESERVATION_SECONDS`, whichever is
first, it no longer counts, and if the roster fills later the budget is checked again (step 1).
The roster steps are in :mod:`.roster_steps`.

1. public checks: the study's spec JSON hashes to the announced spec hash, its Ω‖ξ hash
   recomputes, a secure-aggregation threshold is safe under the study's stated assumptions
   (:meth:`StudySpec.check_trust`), the owner's policy (:mod:`.policy`) allows the study's name
   and ε, and the remaining budget of the device's source covers ε and δ;
2. the data are opened afresh for this study (the agent's :data:`~.localdata.DataFeed` is called
   per study, so a file replaced since the daemon started is read with its own layout) and must
   have the study's d;
3. one pass over that file computes the sketch of the records clipped into the study's box
   and noises it once (exact noise from OS bits); a NaN or an infinity stops it; how many
   records were clipped goes to the device's log only;
4. at most the study's ``max_device_records`` records were read (the most one device may
   hold: a device with more refuses the study, saying so; under add/remove that refusal is the
   one decision that depends on the private n), and under replace-one (n public) at least
   ``min_records`` (a study under add/remove cannot ask for more than one record);
5. the spend and the exact payload bytes are committed to the ledger in one transaction, which
   re-checks the budget, the owner's largest ε per study, and, with the coordinator, that the
   study still takes this device's input;
6. only then is the payload signed and sent; every retry or restart re-sends the stored bytes.

A refusal at any step spends nothing. A refusal because of the data (:class:`Retry`: the file
is unreadable, changed during the pass or holds a NaN) is tried again on the next pass; any
other lasts as long as the daemon, and after a restart too for a study whose roster the device
had joined. A device that refuses a study whose roster it is on, unspent, leaves it (signed),
so its place goes to another device; a study the device left for good is not handled again.
The ledger refuses a second spend for the same study, so a study is never noised twice, and a
study the ledger already holds is never handled again.

A secure-aggregation study (``Study.stage`` REGISTER … UNMASK, replace-one) runs steps 1–2,
counts the records and computes its exact integer input and noise share before it registers
(:mod:`.secure_steps`: no timed stage reads the data); its one release is the masked input
(integer sum + a noise share + masks), committed to the ledger before it is sent. Devices that
drop before MASKED_INPUT spend nothing.
"""

from __future__ import annotations

import logging
import math

import grpc

from fedsketch.client.declines import Declined, out_of_range
from fedsketch.client.ledger import (
    DEFAULT_SOURCE,
    BudgetExceeded,
    Identity,
    Ledger,
    LedgerError,
    LedgerUnavailable,
    Spend,
)
from fedsketch.client.localdata import (
    DATA_ERRORS,
    DataFeed,
    Retry,
    count_records,
    data_refusal,
    log_clipped,
    summed_elsewhere_refusal,
)
from fedsketch.client.roster_steps import FINAL_REFUSALS, RosterSteps
from fedsketch.client.round_steps import RoundChecks, release
from fedsketch.client.secure_abort import SecureAbort
from fedsketch.client.secure_session import Session
from fedsketch.client.secure_steps import SECURE_KIND
from fedsketch.client.settling import Settling
from fedsketch.client.study_pass import (
    RPC_TIMEOUT,
    UNHANDLED,
    Admitted,
    Later,
    Outcome,
    fault_point,
    is_secure,
    later_rounds,
    release_cost,
    spend_labels,
)
from fedsketch.client.validated_steps import ValidatedSteps
from fedsketch.common.net import signing
from fedsketch.common.net.device_reads import signed_read
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.sketch.box import Box, Tally
from fedsketch.common.sketch.frequencies import draw_frequencies
from fedsketch.common.study.boxed_round import is_boxed_round
from fedsketch.common.study.calibration_round import SketchRound, is_sketch_round
from fedsketch.common.study.refine import RoundSpec, is_round
from fedsketch.common.study.study import StudySpec, spec_sha256
from fedsketch.common.text import printable

log = logging.getLogger("fedsketch.device")

#: How the coordinator's refusal of a release past the budget the device declared begins
#: (``fedsketch.server.store.accounts.REFUSED``: a wire contract).
DECLARED_BUDGET_EXCEEDED = "declared_budget_exceeded"

class Agent(ValidatedSteps, SecureAbort, RosterSteps, RoundChecks, Settling):
    """A device's protocol logic over one gRPC channel and one ledger."""

    def __init__(self, channel: grpc.Channel, ledger: Ledger, data: DataFeed,
                 source: str = DEFAULT_SOURCE) -> None:
        self.stub = pb_grpc.DeviceStub(channel)
        self.ledger = ledger
        self.data = data
        self.source = source
        self.bytes_sent = self.bytes_received = 0  # round messages sent / routed to it, bytes
        self._refused: set[str] = set()
        self._sessions: dict[str, Session] = {}
        self._unreported: dict[str, tuple[pb.Study, int]] = {}
        self._reported: set[str] = set()
        self._coordinator: str | None = None  # the --coordinator reached, named by ensure_enrolled

    @property
    def waiting(self) -> bool:
        """Whether the device should poll often: it holds a live reservation of its source (it
        joined a roster that is not full yet), or takes part in a secure-aggregation round that
        is still listed (each stage needs a pass before its timeout)."""
        return (any(not s.left for s in self._sessions.values())
                or any(r.source == self.source for r in self.ledger.reservations()))

    def ensure_enrolled(self, coordinator: str, token: str | None, label: str) -> Identity:
        """The stored identity, or a new Ed25519 key enrolled with ``token``; ``coordinator`` is
        the ``--coordinator`` the channel reaches, which the agent's reads are signed for
        (:func:`~fedsketch.common.net.device_reads.audience`), so it is called before :meth:`step`."""
        self._coordinator = coordinator
        identity = self.ledger.identity()
        if identity is not None:
            return identity
        if not token:
            raise LedgerError("this device is not enrolled yet: pass an enrollment token")
        key = self.ledger.enrollment_key()  # committed first: a lost reply is asked again
        eps, delta = self.ledger.declared() or (0.0, 0.0)  # the total the coordinator holds it to
        reply = self.stub.Enroll(pb.EnrollRequest(token=token, public_key=signing.public_key(key),
                                                  label=label, budget_epsilon=eps, budget_delta=delta),
                                 timeout=RPC_TIMEOUT)
        identity = Identity(reply.device_id, key, coordinator)
        self.ledger.set_identity(identity)
        log.info("enrolled as %s", reply.device_id)
        return identity

    def step(self) -> Outcome:
        """Re-send unacknowledged releases, then handle every open study once."""
        identity = self.ledger.identity()
        if identity is None:
            raise LedgerError("this device is not enrolled")
        out = Outcome()
        unsent = {sid for sid, text in self.ledger.sessions().items() if not Session.sent_masked(text)}
        for spend in self.ledger.pending():
            if spend.study_id in unsent:  # y never left: only its round's MASKED_INPUT sends it
                continue
            if (reason := self._deliver(identity, spend)) is not None:
                out.refused[spend.study_id] = reason
                log.warning("study %s: %s", printable(spend.study_id), reason)
            else:
                out.resent.append(spend.study_id)
        self._settle()
        studies = self.stub.ListStudies(self._read(identity, "ListStudies"), timeout=RPC_TIMEOUT).studies
        listed = {study.study_id for study in studies}
        self._resume_sessions(identity, listed)
        mine = [r for r in self.ledger.joined() if r.source == self.source]  # not another daemon's
        for closed in (r.study_id for r in mine if r.study_id not in listed):
            self.ledger.end_reservation(closed)
        left = {r.study_id for r in mine if r.left_at is not None}
        for study in studies:
            if study.study_id in self._refused or study.study_id in left:
                continue
            if self.ledger.find(study.study_id) is not None and study.study_id not in self._sessions:
                continue  # released once already (the stored bytes are re-sent above)
            reason = self._study_step(identity, study, out)
            if reason is not None:
                reason = self._while_rounds_run(reason, study.study_id)
                final = not isinstance(reason, Retry)
                if self._leave(identity, study, final) and final:
                    self._refused.add(study.study_id)  # a leave not done yet is tried next pass
                out.refused[study.study_id] = reason
                self._note_refusal(study, reason)
                log.warning("refused study %s: %s", printable(study.study_id), reason)
        self._report_refusals(identity, listed)  # at the pass's end, whatever each took
        return out

    def _study_step(self, identity: Identity, study: pb.Study, out: Outcome) -> str | None:
        """One study's step (:meth:`_secure_step` or :meth:`_plain_step`); the reason if refused.
        A study this device cannot handle (what the coordinator sent raises where no check
        expected it) is declined for good and logged with its traceback, so one study cannot
        stop the pass, and the daemon, for every other."""
        try:
            if is_secure(study):
                return self._secure_step(identity, study, out)
            return self._plain_step(identity, study, out)
        except UNHANDLED as exc:
            log.error("study %s: the device cannot handle it", printable(study.study_id), exc_info=True)
            if (session := self._sessions.get(study.study_id)) is not None:
                self._leave_session(study.study_id, session,  # for good, also after a restart
                                    "the device could not handle the study")
            return Declined(f"the device cannot handle this study ({type(exc).__name__}: {exc}); "
                            "it declines it", pb.OTHER)

    def _while_rounds_run(self, reason: str, study_id: str) -> str:
        """``reason``, but a :class:`Retry` if it is the coordinator's
        :data:`DECLARED_BUDGET_EXCEEDED` while this device is in other running secure rounds:
        the coordinator counts those from the registration, the ledger only from the masked
        input, so the two books agree again once the rounds end (or the device leaves them)."""
        if (DECLARED_BUDGET_EXCEEDED in reason and not isinstance(reason, Retry)
                and any(not s.left and pb.MASKED_INPUT not in s.done
                        for sid, s in self._sessions.items() if sid != study_id)):
            return Retry(f"{reason} (tried again once this device's running secure rounds end)",
                         pb.BUDGET)
        return reason

    def _read(self, identity: Identity, method: str, study_id: str = "") -> pb.DeviceRead:
        """The device's signed read of ``method`` (the coordinator shows studies and results
        only to enrolled devices, each what it may read), for the coordinator reached."""
        if self._coordinator is None:
            raise LedgerError("name the coordinator with ensure_enrolled before reading from it")
        return signed_read(identity.private_key, identity.device_id, self._coordinator, method, study_id)

    def _check(self, study: pb.Study) -> Admitted | str:
        """Steps 1–2 of the module docstring: the study, its box and the data version opened for
        it if this device may contribute, else the reason it may not. Spends nothing; opening
        the data reads an ``.npy`` header, or counts a CSV's rows. A study with refinement
        rounds is budgeted whole: its sketch and every round (:attr:`StudySpec.total_epsilon`)."""
        if spec_sha256(study.spec_json) != study.spec_sha256:
            return Declined("the spec does not hash to the announced spec hash", pb.SPEC_MISMATCH)
        if is_round(study.spec_json):
            return self._check_round(study)
        if is_sketch_round(study.spec_json):
            return self._check_sketch_round(study)
        if is_boxed_round(study.spec_json):
            return self._check_boxed_round(study)
        try:
            spec = StudySpec.from_json(study.spec_json)
        except ValueError as exc:
            return Declined(f"unreadable spec: {exc}", pb.SPEC_MISMATCH)
        if spec.secure_aggregation is not None:
            try:
                spec.check_trust()  # a threshold unsafe under the study's stated assumptions
            except ValueError as exc:
                return Declined(str(exc), pb.SPEC_MISMATCH)
        freqs = draw_frequencies(spec.sketch.frequencies)
        if freqs.sha256 != spec.omega_sha256:
            return Declined("the frequencies Ω, ξ do not match the spec's hash on this platform",
                            pb.SPEC_MISMATCH)
        try:
            Box(spec.lo, spec.hi).reduce(freqs)
        except ValueError as exc:
            return Declined(f"the study's box does not fit its frequencies: {exc}", pb.SPEC_MISMATCH)
        return self._admit(study.study_id, spec, later_rounds(spec, None))

    def _admit(self, study_id: str, spec: StudySpec, later: Later,
               rnd: RoundSpec | SketchRound | None = None, root: str | None = None) -> Admitted | str:
        """The checks every release shares: the owner's policy allows the study (its name and
        whole ε), the budget covers what the study asks from this release on (its (ε, δ) and
        ``later``'s ε) besides what the ledger's reservations and this agent's
        secure sessions set aside for other joined studies and the rounds still to come of
        studies it took part in (but those of the study of round ``rnd``, which pays from
        them), and the data opens with the study's d. ``spec`` is the study's, also for its
        rounds; ``root``: the study whose box round a boxed study (or its round) follows, which
        pays from what that study keeps."""
        if (reason := self.ledger.policy().refusal(spec.name, spec.total_epsilon)) is not None:
            return Declined(reason, pb.POLICY)
        epsilon, delta = release_cost(spec, rnd)
        parent = root if root is not None else None if rnd is None else rnd.parent_id
        asks = math.fsum((epsilon, later.epsilon))
        delta = math.fsum((delta, later.delta))
        if (reason := self.ledger.refusal(self.source, asks, delta, self._in_sessions(study_id),
                                          study_id=study_id, parent=parent)) is not None:
            return Retry(reason, pb.BUDGET)  # the budget: a reservation may end or the owner raise it
        try:
            data = self.data()
        except DATA_ERRORS as exc:
            return data_refusal(exc)
        if spec.sketch.frequencies.d != data.d:
            return Declined(f"the study wants d = {spec.sketch.frequencies.d}, the data has "
                            f"{data.d}", pb.DIMENSION_MISMATCH)
        if data.n is not None and (reason := summed_elsewhere_refusal(
                spec.secure_aggregation is not None, spec.refine is not None)) is not None:
            return reason
        return Admitted(spec, Box(spec.lo, spec.hi), data, rnd, later, root)

    def _in_sessions(self, other_than: str) -> tuple[float, float]:
        """(ε, δ) promised to secure-aggregation rounds this device joined and has not spent on
        yet (other than ``other_than``). They live in memory, as the round's keys do (a restart
        drops out of them); the plain studies joined are the ledger's reservations."""
        eps = [self._set_aside(s.epsilon, s.round, s.later, s.root) for sid, s in self._sessions.items()
               if sid != other_than and not s.left and pb.MASKED_INPUT not in s.done]
        return math.fsum(eps), 0.0

    def _count(self, admitted: Admitted) -> int | str:
        """n, or why the device cannot take part (:func:`~.localdata.count_records`)."""
        return count_records(admitted.data, admitted.spec)

    def _plain_step(self, identity: Identity, study: pb.Study, out: Outcome) -> str | None:
        """Join the study's roster (spending nothing; only with no more records than the study's
        cap and, under replace-one, enough, counted first) and reserve its cost, then, once the
        roster is full, contribute; the reason if refused. A study with a reservation (even
        expired; maybe from before a restart) was joined: it is waited for while its roster fills."""
        sid = study.study_id
        joined = self._joined(sid) is not None
        if study.stage == pb.REGISTER and joined:  # waiting: confirm the place (a crash may
            reply = self._register(identity, study)  # have come between reserving and joining)
            return reply if isinstance(reply, str) else None
        admitted = self._check(study)
        if isinstance(admitted, str):
            return admitted
        if not joined and isinstance(counted := self._count(admitted), str):
            return counted
        if not joined:  # before the registration: a crash after it still leaves on a refusal
            self._reserve(study, admitted)
        reply = self._register(identity, study)
        if isinstance(reply, str):
            if not joined:
                self.ledger.end_reservation(sid)
            return reply
        if reply.stage == pb.REGISTER:
            if not joined:
                out.registered.append(sid)
            return None
        if reply.stage != pb.PLAIN_INPUT:
            self.ledger.end_reservation(sid)
            return None  # closing: no input is taken from devices not told to send already
        reason = self._contribute(identity, study, admitted)
        if reason is None:
            out.submitted.append(sid)
            self.ledger.end_reservation(sid)  # the spend counts instead
        return reason

    def _contribute(self, identity: Identity, study: pb.Study, admitted: Admitted) -> str | None:
        """Steps 3–6: sketch, count, commit the spend (the study re-checked in that transaction),
        send; the reason if refused."""
        spec, rnd = admitted.spec, admitted.round
        tally = Tally()
        try:
            n, kind, payload = self._release(admitted, tally)
        except DATA_ERRORS as exc:
            return data_refusal(exc)
        if (reason := out_of_range(spec, tally.records)) is not None:
            return reason
        log_clipped(study.study_id, tally)
        epsilon, delta = admitted.cost
        try:
            spend = self.ledger.record_spend(
                study_id=study.study_id, source=self.source, epsilon=epsilon, delta=delta, n=n,
                kind=kind, payload=payload, spec_sha256=study.spec_sha256,
                recheck=lambda: self._input_open(identity, study),
                **spend_labels(spec, rnd, admitted.later, admitted.deadline, admitted.root))
        except BudgetExceeded as exc:  # e.g. another daemon on this ledger spent
            return Declined(str(exc), pb.BUDGET)
        except LedgerUnavailable:  # the file, not the study: nothing recorded, tried next pass
            raise
        except LedgerError as exc:  # the coordinator's re-check, or the ledger's bookkeeping
            return str(exc)
        fault_point()
        return self._deliver(identity, spend)

    #: The plain release (:func:`fedsketch.client.round_steps.release`); the secure input is
    #: :meth:`_exact_input`. The simulator's hostile devices (server/sim/hostile.py) replace them.
    _release = staticmethod(release)

    def _deliver(self, identity: Identity, spend: Spend) -> str | None:
        """Send a spend's stored bytes; the coordinator's reason if it refuses them for good (the
        spend stays on the books, marked refused). A transient error propagates: the bytes are
        sent again on the next pass. A spend given back (void) is never sent."""
        if self.ledger.voided(spend.study_id):
            return "the spend was given back (void): its release is never sent"
        try:
            self._send(identity, spend)
        except grpc.RpcError as exc:
            if exc.code() not in FINAL_REFUSALS:
                raise
            self.ledger.mark_acked(spend.study_id, f"refused: {exc.code().name}")
            return f"the coordinator refused the release: {exc.details() or exc.code().name}"
        return None

    def _send(self, identity: Identity, spend: Spend) -> None:
        if spend.kind == SECURE_KIND:
            self._stage_send(identity, spend.study_id, pb.MASKED_INPUT, spend.payload)
            self.ledger.mark_acked(spend.study_id, spend.payload_sha256)
            return
        digest = signing.contribution_digest(spend.study_id, identity.device_id, spend.n,
                                             spend.spec_sha256, spend.payload)
        msg = pb.Contribution(study_id=spend.study_id, device_id=identity.device_id,
                              spec_sha256=spend.spec_sha256, n=spend.n,
                              signature=signing.sign(identity.private_key, digest),
                              **{spend.kind: spend.payload})
        self.bytes_sent += msg.ByteSize()
        reply = self.stub.Submit(msg, timeout=RPC_TIMEOUT)
        self.ledger.mark_acked(spend.study_id, reply.receipt)
