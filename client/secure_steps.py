"""The device's side of a secure-aggregation round (Bonawitz et al. 2017; MECHANISMS §4).

A secure study runs REGISTER, ADVERTISE_KEYS, SHARE_KEYS, MASKED_INPUT, CONSISTENCY and UNMASK.

* REGISTER: the agent's checks (among them: a threshold that is unsafe under the study's
  stated dropouts and colluders is refused, :meth:`StudySpec.check_trust`); the device counts
  its records (replace-one: n is public), then reads them once more into its exact integer
  input x (the sketch's integer sum, round 0's calibration sum, or in a refinement round of a
  secure study the round's exact cells, :mod:`fedsketch.common.study.secure_rounds`) and draws its
  noise share e, and keeps both in its session in the ledger; it sends its REGISTER on its
  next pass. This is the only data work of the round, and it comes before the device's first
  message: the stage timeouts that follow bound network and crypto alone (their sizing:
  docs/secure-aggregation.md). Registering a pass later means a loop of devices (the
  in-process simulator, a daemon in several rounds) does all its data work before any of its
  REGISTERs starts that stage's clock.
* ADVERTISE_KEYS: round parameters other than those the spec implies for the advertised
  roster are refused (:meth:`StudySpec.check_round`).
* MASKED_INPUT: the device masks the x + e it prepared (no data are read), keeps the masked
  bytes, commits the spend with them to the ledger, and only then sends.
* CONSISTENCY and UNMASK: the device signs one survivor list and reveals shares only as that
  list implies, against the consistency quorum of signatures on it
  (:meth:`fedsketch.common.secagg.Client.unmask`).

A device that drops before MASKED_INPUT spends nothing; one that spent but whose masked input
never left it (no send was tried: MASKED_INPUT is kept in the session's ``done`` before the
first) gives the spend back when it leaves the round or learns that it ended (rule A,
:meth:`SecureSteps._void_unsent`, :mod:`.ledger_voids`), and signs and unmasks nothing in it;
one whose y left gets it back from a certificate of abort of a FAILED round (rule B, :mod:`.secure_abort`).
Every way out of a round has a reason that the pass logs, and a :class:`Declined` one (the device's
own decision, or a coordinator that has nothing for it: it came too late) is reported to the
coordinator (:mod:`.declines`).

Riding through a coordinator restart (the coordinator keeps the round in its store and resumes
it: :mod:`fedsketch.server.service.secure_round`): a call that fails for a reason other than a
final refusal (UNAVAILABLE while the coordinator is down) propagates, the daemon retries the
pass with backoff (:func:`fedsketch.client.daemon.backoff`), and each stage's reply is computed
once and kept in the session, so a retry re-sends the same bytes (a second computation would
draw new keys, masks or shares, which the round refuses as a conflict); the masked input is
re-sent from the ledger, byte-identical.

Riding through a *device* restart: the session (the round's secrets, and each stage's message
as computed) is committed to the ledger before each message is sent
(:mod:`.secure_session`, :mod:`.ledger_sessions`), and a restarted daemon takes it up on its
first pass and goes on where it was: same keys, same bytes, one masked input, one signed
survivor list. The masked bytes are committed before the spend, and the spend before they are
sent: a daemon restarted between any two of these goes on with the next, with the same bytes
(:meth:`SecureSteps._masked_step`); only one restarted after MASKED_INPUT closed leaves the
round, its spend (if it had committed one) given back, and says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
import numpy as np

from fedsketch.client.declines import Declined
from fedsketch.client.ledger import BudgetExceeded, Identity, Ledger, LedgerError, Spend
from fedsketch.client.ledger_chain import MASKED
from fedsketch.client.localdata import DATA_ERRORS, LocalData, Retry, data_refusal, log_clipped
from fedsketch.client.roster_steps import FINAL_REFUSALS
from fedsketch.client.secure_session import Session
from fedsketch.client.study_pass import RPC_TIMEOUT, Admitted, Outcome, fault_point, spend_labels
from fedsketch.common.dp.plan import integer_sum_term
from fedsketch.common.dp.samplers import dlap_noise_share
from fedsketch.common.net import signing
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.secagg import Client, SecAggAbort
from fedsketch.common.secagg import wire as sw
from fedsketch.common.sketch.box import Tally
from fedsketch.common.sketch.frequencies import draw_frequencies
from fedsketch.common.sketch.sketching import feature_sum
from fedsketch.common.study.refine import RoundSpec, round_cells
from fedsketch.common.study.secure_box import SecureBox
from fedsketch.common.study.secure_calibration import SecureCalibration
from fedsketch.common.study.secure_rounds import SecureRound
from fedsketch.common.text import printable

log = logging.getLogger("fedsketch.device")

#: The ledger kind of a masked input (one name with the ledger's checks of voids).
SECURE_KIND = MASKED


class SecureSteps:
    """The secure-aggregation steps of :class:`fedsketch.client.agent.Agent` (a mixin: the agent
    provides the stub, the ledger, its source and sessions, and ``_check``, ``_count``,
    ``_ended`` and ``_deliver``)."""

    stub: pb_grpc.DeviceStub
    ledger: Ledger
    source: str
    bytes_sent: int
    bytes_received: int
    _sessions: dict[str, Session]
    _ended: Callable[[Identity, str], str | None]
    _check: Callable[[pb.Study], Admitted | str]
    _count: Callable[[Admitted], int | str]
    _deliver: Callable[[Identity, Spend], str | None]
    _forget_round: Callable[[Identity, str, bytes, str], None]

    def _resume_sessions(self, identity: Identity, listed: set[str]) -> None:
        """Hold the sessions of the rounds ``listed`` (open, and this device may read them),
        taking up from the ledger the session of a listed round this daemon does not hold (it
        restarted mid-round: :mod:`.secure_session`). A round no longer listed is forgotten, in
        memory and in the ledger, once the coordinator says it ended (or may not be read): one
        listing that leaves it out does not make the device forget its keys (a round whose abort
        it signed stays as a tombstone: :meth:`Session.tombstone`). A stored session that does
        not load is dropped, and the device is out of that round."""
        for sid, text in self.ledger.sessions(self.source).items():
            if sid not in listed:
                if Session.is_tombstone(text):
                    continue  # rule B: kept so that the device never joins a round relisted as sid
                if (ended := self._ended(identity, sid)) is not None:
                    self._forget_round(identity, sid, text, ended)
            elif sid not in self._sessions:
                try:
                    self._sessions[sid] = session = Session.load(sid, text, identity)
                except ValueError as exc:
                    log.warning("%s; the device drops out of the round (a spend on it, if any, "
                                "stands: whether its masked input left cannot be read)", exc)
                    self.ledger.drop_session(sid, self.source)
                    continue
                log.info("study %s: %s", printable(sid), "had left the secure round before the "
                         "restart, and stays out of it" if session.left else
                         "went on with the secure round from the ledger")
        self._sessions = {sid: s for sid, s in self._sessions.items() if sid in listed}

    def _keep(self, study_id: str, session: Session) -> None:
        """Commit the session to the ledger: before each message it sends, the state it was
        computed from (:mod:`.ledger_sessions`)."""
        self.ledger.save_session(study_id, self.source, session.dump())

    def _drop(self, study_id: str, session: Session, reason: str) -> str:
        """Leave the round for good (kept in the ledger: also after a restart); ``reason``, which
        the pass logs and, if the device decided it (:class:`Declined`), reports. A left
        session needs only ``left``: its input x, noise share e and the round's secrets are
        erased at once (:meth:`_leave_session`), not when the coordinator says the round ended."""
        self._leave_session(study_id, session, reason)
        return reason

    def _leave_session(self, study_id: str, session: Session, why: str) -> None:
        """Mark ``session`` left, erase x, e and the client's secrets from it, and keep it so,
        the old row overwritten and the write-ahead log truncated (:meth:`Ledger.save_session`
        with ``scrub``); then a spend on the round whose masked input never left is given back
        (:meth:`_void_unsent`)."""
        sent = pb.MASKED_INPUT in session.done
        session.left = True
        session.input = session.noise = session.client = session.helper_upload = None
        self.ledger.save_session(study_id, self.source, session.dump(), scrub=True)
        # left before void: a crash between the two keeps the spend (the safe side), never a
        # void on a session that could still send
        self._void_unsent(study_id, sent, why)

    def _void_unsent(self, study_id: str, sent: bool, why: str, ended: str | None = None) -> None:
        """Rule A (docs/secure-aggregation.md, "When a failed round gives ε back"): the device is
        out of the round, and if it recorded a spend on it but never sent the masked input y
        (``sent``: MASKED_INPUT is in the session's ``done``, which is kept before the first
        send, so False means y never left), the spend is void: nobody holds anything computed
        from x, so nothing about it can be learned. A sent y's spend stands, logged once the round
        ``ended`` other than DONE (then it bought the result; until it ends, rule B may still
        give it back: :mod:`.secure_abort`)."""
        spend = self.ledger.find(study_id)
        if spend is None or spend.kind != SECURE_KIND or self.ledger.voided(study_id):
            return  # (voided: rule A before, or rule B's certificate of abort)
        if sent or spend.acked_at is not None:
            if ended not in (None, "DONE"):
                log.info("study %s: the device is out of the secure round after its masked "
                         "input was sent; its spend of ε = %g stands (no certificate of abort)",
                         printable(study_id), spend.epsilon)
            return
        self.ledger.void(study_id, f"the masked input never left the device: {why}")
        log.warning("study %s: the masked input never left the device (%s); its spend of "
                    "ε = %g is void and given back", printable(study_id), why, spend.epsilon)

    def _secure_step(self, identity: Identity, study: pb.Study, out: Outcome) -> str | None:
        """Act on the open stage of a secure-aggregation study; the reason if refused (or out of
        the round: every way out has one)."""
        sid, stage = study.study_id, study.stage
        session = self._sessions.get(sid)
        if stage == pb.REGISTER:
            if session is not None and session.left:
                return None  # left before registering (e.g. declined, then restarted): stays out
            if session is None:
                prepared = self._prepare(identity, study)
                if isinstance(prepared, str):
                    return prepared
                try:
                    self._keep(sid, prepared)
                except LedgerError as exc:  # another source's daemon is in this round
                    return Declined(str(exc), pb.OTHER)
                self._sessions[sid] = prepared
                log.info("study %s: input prepared for the secure round (%d records); the device "
                         "registers on its next pass", printable(sid), prepared.n)
                return None
            if pb.REGISTER in session.done:
                return None
            if (refused := self._stage_refused(identity, sid, pb.REGISTER,
                                               session.replies[pb.REGISTER])) is not None:
                del self._sessions[sid]
                self.ledger.drop_session(sid, self.source)
                return refused
            session.done.add(pb.REGISTER)
            return None
        if session is None or stage in session.done or session.left:
            return None
        if stage != pb.ADVERTISE_KEYS and session.client is None:
            return self._drop(sid, session, Declined(
                f"the round went on to {pb.Stage.Name(stage)} without this device's keys: it is "
                "out of the round, unspent", pb.OTHER))
        if stage == pb.MASKED_INPUT:
            return self._masked_step(identity, study, session, out)
        if stage not in session.replies:
            reply = self._stage_reply(identity, study, session)
            if not isinstance(reply, bytes):
                return reply
            session.replies[stage] = reply
            self._keep(sid, session)
        if (refused := self._stage_refused(identity, sid, stage, session.replies[stage])) is not None:
            return self._drop(sid, session, refused)
        session.done.add(stage)
        return None

    def _prepare(self, identity: Identity, study: pb.Study) -> Session | str:
        """REGISTER's work, before anything goes out: the agent's checks, a count of the records
        (n, public under replace-one), then the exact integer input and this device's noise
        share: a session holding them and the REGISTER message (not stored yet); or why the
        device does not take part (nothing is spent either way). The data are read here and
        never again in the round: no timed stage waits on them."""
        admitted = self._check(study)
        if isinstance(admitted, str):
            return admitted
        if isinstance(n := self._count(admitted), str):
            return n
        session = Session(admitted.spec, admitted.box, n, round=admitted.round, later=admitted.later,
                          study_id=study.study_id, device_id=identity.device_id, root=admitted.root)
        tally = Tally()
        try:
            session.input, read, session.noise = self._exact_input(session, admitted.data, tally)
        except DATA_ERRORS as exc:
            return data_refusal(exc)
        if read != n:  # a feed that keeps no stamp: the data changed between the two passes
            return Retry(f"the data changed while the device read them ({n} records counted, "
                         f"{read} read next); nothing was sent", pb.DATA_UNREADABLE)
        log_clipped(study.study_id, tally)
        session.replies[pb.REGISTER] = sw.register_body(n)
        return session

    def _fetch(self, identity: Identity, sid: str, session: Session, stage: int) -> bytes | str | None:
        """What the coordinator routes to this device at ``stage``; None if the stage is not open
        (it moved on, or has not opened yet: the next pass sees which), or why the device is out
        of the round (the coordinator has nothing for it: it is not in the roster or was dropped,
        e.g. a message of an earlier stage came too late)."""
        try:
            return self._stage_fetch(identity, sid, stage)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                return None
            if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                return self._drop(sid, session, Declined(
                    f"the coordinator has nothing for this device at {pb.Stage.Name(stage)} "
                    f"({printable(exc.details())}): it is out of the round", pb.OTHER))
            raise

    def _stage_reply(self, identity: Identity, study: pb.Study, session: Session) -> bytes | str | None:
        """This device's message for the open stage (but MASKED_INPUT), computed from what the
        coordinator routes to it; or, with nothing to send, the reason it is out of the round
        (None: nothing to do this pass)."""
        sid, stage = study.study_id, study.stage
        body = self._fetch(identity, sid, session, stage)
        if not isinstance(body, bytes):
            return body
        if stage in (pb.CONSISTENCY, pb.UNMASK) and pb.MASKED_INPUT not in session.done:
            return self._drop(sid, session, Declined(  # a coordinator that routes it anything
                f"the round is at {pb.Stage.Name(stage)} and this device sent no masked input: "
                "it signs and unmasks nothing in it", pb.OTHER))
        try:
            if stage == pb.ADVERTISE_KEYS:
                params, keys, _ = sw.params_from_json(sid, sw.load(body))
                session.protocol.check_round(params)
                session.client = Client(params, identity.device_id, identity.private_key, keys)
                session.setup = body
                return sw.dump(sw.advert_to_json(session.client.advertise()))
            if stage == pb.SHARE_KEYS:
                adverts = {v: sw.advert_from_json(a) for v, a in sw.load(body).items()}
                return sw.dump(sw.bytes_map_to_json(session.client.share_keys(adverts)))
            if stage == pb.CONSISTENCY:
                signature = session.client.sign_survivors(sw.survivors_from_json(sw.load(body)))
                return sw.dump(sw.signature_to_json(signature))
            if stage == pb.UNMASK:
                shares = session.client.unmask(sw.signed_from_json(sw.load(body)))
                return sw.dump(sw.unmask_to_json(shares))
            raise ValueError(f"the study is at stage {stage}, which this device does not know")
        except (SecAggAbort, ValueError) as exc:
            return self._drop(sid, session, Declined(f"secure aggregation: {exc}", pb.OTHER))

    def _stage_refused(self, identity: Identity, study_id: str, stage: int, body: bytes) -> str | None:
        """Send a stage message: None once taken, or the coordinator's reason if it refuses the
        message for good (:data:`~.roster_steps.FINAL_REFUSALS`: a malformed message, a count
        beyond the study's bounds, a stage that moved on); a transient error propagates, and the
        next pass tries again."""
        try:
            self._stage_send(identity, study_id, stage, body)
        except grpc.RpcError as exc:
            if exc.code() not in FINAL_REFUSALS:
                raise
            return (f"the coordinator refused the {pb.Stage.Name(stage)} message: "
                    f"{exc.code().name}: {printable(exc.details())}")
        return None

    def _masked_step(self, identity: Identity, study: pb.Study, session: Session,
                     out: Outcome) -> str | None:
        """MASKED_INPUT: mask the prepared input x + e (no data are read), keep the masked bytes,
        commit the spend with them (and x + e, which the coordinator's unmasked sum adds up),
        then send. Each step is kept before the next, so a daemon restarted anywhere in it goes
        on from there with the same bytes: masks the input once, spends once (the ledger holds
        at most one spend per study), and sends only what it spent on; a restart that finds
        the stage closed leaves the round, unspent, saying so.

        The shares of h_min = L − D − C devices add up to the release's integer-sum term
        (MECHANISMS §4.2, :mod:`fedsketch.common.secagg.trust`,
        :mod:`fedsketch.common.study.secure_rounds`).
        """
        sid, stage = study.study_id, pb.MASKED_INPUT
        if session.input is None or session.noise is None:
            return self._drop(sid, session, Declined(
                "the round's session was stored by an earlier release, which read the data only "
                "at MASKED_INPUT: the device leaves the round, unspent", pb.OTHER))
        if stage not in session.replies:
            body = self._fetch(identity, sid, session, stage)
            if not isinstance(body, bytes):
                return body
            try:
                inbox = sw.bytes_map_from_json(sw.load(body))
                y = session.client.masked_input(session.input, inbox, session.noise)
            except (SecAggAbort, ValueError) as exc:
                return self._drop(sid, session, Declined(f"secure aggregation: {exc}", pb.OTHER))
            session.replies[stage] = sw.masked_to_bytes(y)
            self._keep(sid, session)  # masked once: a restart spends on and sends these bytes
            fault_point("kill-after-mask")
        if (spend := self.ledger.find(sid)) is None:
            premask = (session.input + session.noise).astype("<i8").tobytes()
            try:
                spend = self.ledger.record_spend(
                    study_id=sid, source=self.source, epsilon=session.epsilon, delta=0.0,
                    n=float(session.n), kind=SECURE_KIND, payload=session.replies[stage],
                    spec_sha256=study.spec_sha256, premask=premask, round_terms=session.terms,
                    **spend_labels(session.spec, session.round, session.later, root=session.root))
            except BudgetExceeded as exc:
                return self._drop(sid, session, Declined(str(exc), pb.BUDGET))
            except LedgerError as exc:
                return self._drop(sid, session, str(exc))
            fault_point()
        session.done.add(stage)
        session.input = session.noise = None  # x and e served only y; the spend keeps x + e
        self.ledger.save_session(sid, self.source, session.dump(), scrub=True)
        if spend.acked_at is None:  # else this pass's re-send of pending releases took it
            if (refused := self._deliver(identity, spend)) is not None:
                return self._drop(sid, session, refused)
            out.submitted.append(sid)
        return None

    @staticmethod
    def _exact_input(session: Session, data: LocalData,
                     tally: Tally) -> tuple[np.ndarray, int, np.ndarray]:
        """(the exact integer input, records read, this device's noise shares), int64: the sketch's
        integer sum (2m), a box round's histograms, round 0's sum (2·m0) or a round's cells."""
        spec, box = session.spec, session.box
        if isinstance(protocol := session.protocol, SecureBox):  # raw records, nothing clipped
            return (*protocol.exact_input(data.chunks(), tally), protocol.noise_shares())
        if isinstance(protocol, SecureCalibration):
            x, n = protocol.exact_input(box, data.chunks(), tally)
            return np.asarray(x, np.int64), n, protocol.noise_shares()
        if isinstance(session.round, RoundSpec):
            counts, sums, n = round_cells(box, session.round, data.chunks(), tally)
            noise = SecureRound(spec, session.round).noise_shares()
            return np.concatenate([counts, sums.ravel()]).astype(np.int64), n, noise
        m, r = spec.sketch.frequencies.m, spec.sketch.r
        fs = feature_sum(box.centred(data.chunks(), tally),
                         box.reduce(draw_frequencies(spec.sketch.frequencies)), spec.sketch.feature, r)
        term = integer_sum_term(spec.sketch.feature, spec.sketch.privacy.epsilon, r, "replace_one")
        noise = dlap_noise_share(term.epsilon, term.sensitivity, spec.assumptions.min_honest, 2 * m)
        return np.concatenate([fs.re, fs.im]).astype(np.int64), fs.n, noise

    def _stage_send(self, identity: Identity, study_id: str, stage: int, body: bytes) -> None:
        digest = sw.message_digest(study_id, identity.device_id, stage, body)
        msg = pb.SecAggMessage(study_id=study_id, device_id=identity.device_id, stage=stage,
                               body=body, signature=signing.sign(identity.private_key, digest))
        self.bytes_sent += msg.ByteSize()
        self.stub.SecAggSend(msg, timeout=RPC_TIMEOUT)

    def _stage_fetch(self, identity: Identity, study_id: str, stage: int) -> bytes:
        digest = sw.message_digest(study_id, identity.device_id, stage, b"")
        msg = pb.SecAggMessage(study_id=study_id, device_id=identity.device_id, stage=stage,
                               signature=signing.sign(identity.private_key, digest))
        self.bytes_received += len(body := self.stub.SecAggFetch(msg, timeout=RPC_TIMEOUT).body)
        return body
