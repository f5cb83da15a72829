"""The device's side of a secure-aggregation round (Bonawitz et al. 2017; MECHANISMS §4).

A secure study runs REGISTER, ADVERTISE_KEYS, SHARE_KEYS, MASKED_INPUT, CONSISTENCY and
UNMASK.

* REGISTER: the agent's checks (among them: a threshold that is unsafe under the study's
  stated dropouts and colluders is refused, :meth:`StudySpec.check_trust`); the device counts
  its records (replace-one: n is public).
* ADVERTISE_KEYS: round parameters other than those the spec implies for the advertised
  roster are refused (:meth:`StudySpec.check_round`).
* MASKED_INPUT: the device sketches that same version of the data (it drops out, unspent, if
  the file changed or the count differs), adds its noise share, masks, commits the spend with
  the bytes to the ledger, and only then sends. In a refinement round of a secure study its
  input is the round's exact cells instead of the sketch (:mod:`fedsketch.common.study.secure_rounds`).
* CONSISTENCY and UNMASK: the device signs one survivor list and reveals shares only as that
  list implies, against the consistency quorum of signatures on it
  (:meth:`fedsketch.common.secagg.Client.unmask`).

A device that drops before MASKED_INPUT spends nothing.

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
survivor list. The state after masking is committed before the spend, so a crash between the
two drops out of the round unspent (the input cannot be masked twice).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
import numpy as np

from fedsketch.client.declines import Declined
from fedsketch.client.ledger import BudgetExceeded, Identity, Ledger, LedgerError
from fedsketch.client.localdata import DATA_ERRORS, LocalData, data_refusal, log_clipped
from fedsketch.client.roster_steps import FINAL_REFUSALS
from fedsketch.client.secure_session import Session
from fedsketch.client.study_pass import RPC_TIMEOUT, Outcome, fault_point, spend_labels
from fedsketch.common.cli import printable
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
from fedsketch.common.study.secure_calibration import SecureCalibration
from fedsketch.common.study.secure_rounds import SecureRound

log = logging.getLogger("fedsketch.device")

#: The ledger kind of a masked input.
SECURE_KIND = "secagg_masked"


class SecureSteps:
    """The secure-aggregation steps of :class:`fedsketch.client.agent.Agent` (a mixin: the agent
    provides the stub, the ledger, its source, data feed and sessions, and ``_check``,
    ``_count`` and ``_send``)."""

    stub: pb_grpc.DeviceStub
    ledger: Ledger
    source: str
    bytes_sent: int
    _sessions: dict[str, Session]
    data: Callable[[], LocalData]
    _ended: Callable[[Identity, str], str | None]

    def _resume_sessions(self, identity: Identity, listed: set[str]) -> None:
        """Hold the sessions of the rounds ``listed`` (open, and this device may read them),
        taking up from the ledger the session of a listed round this daemon does not hold (it
        restarted mid-round: :mod:`.secure_session`). A round no longer listed is forgotten, in
        memory and in the ledger, once the coordinator says it ended (or may not be read): one
        listing that leaves it out does not make the device forget its keys. A stored session
        that does not load is dropped, and the device is out of that round."""
        for sid, text in self.ledger.sessions(self.source).items():
            if sid not in listed:
                if self._ended(identity, sid) is not None:
                    self.ledger.drop_session(sid, self.source)
            elif sid not in self._sessions:
                try:
                    self._sessions[sid] = Session.load(sid, text, identity, self._data_or_none)
                    log.info("study %s: went on with the secure round from the ledger", printable(sid))
                except ValueError as exc:
                    log.warning("%s; the device drops out of the round", exc)
                    self.ledger.drop_session(sid, self.source)
        self._sessions = {sid: s for sid, s in self._sessions.items() if sid in listed}

    def _data_or_none(self) -> LocalData | None:
        """The device's data, or None if it does not open now (a resumed session reads it only
        at MASKED_INPUT, where it drops out, unspent, on data that changed)."""
        try:
            return self.data()
        except DATA_ERRORS:
            return None

    def _keep(self, study_id: str, session: Session) -> None:
        """Commit the session to the ledger: before each message it sends, the state it was
        computed from (:mod:`.ledger_sessions`)."""
        self.ledger.save_session(study_id, self.source, session.dump())

    def _secure_step(self, identity: Identity, study: pb.Study, out: Outcome) -> str | None:
        """Act on the open stage of a secure-aggregation study; the reason if refused."""
        sid, stage = study.study_id, study.stage
        session = self._sessions.get(sid)
        if stage == pb.REGISTER:
            if session is None:
                admitted = self._check(study)
                if isinstance(admitted, str):
                    return admitted
                if isinstance(n := self._count(admitted), str):
                    return n
                session = Session(admitted.spec, admitted.box, admitted.data, n, round=admitted.round,
                                  later=admitted.later, study_id=sid, device_id=identity.device_id)
                session.replies[pb.REGISTER] = sw.register_body(n)
                try:
                    self._keep(sid, session)
                except LedgerError as exc:  # another source's daemon is in this round
                    return Declined(str(exc), pb.OTHER)
                self._sessions[sid] = session
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
            session.left = True  # the round went on without this device's keys
            self._keep(sid, session)
            return None
        if stage not in session.replies:
            reply = self._stage_reply(identity, study, session, out)
            if session.left:
                self._keep(sid, session)
            if not isinstance(reply, bytes):
                return reply
            session.replies[stage] = reply
            self._keep(sid, session)
        if (refused := self._stage_refused(identity, sid, stage, session.replies[stage])) is not None:
            session.left = True
            self._keep(sid, session)
            return refused
        session.done.add(stage)
        return None

    def _stage_reply(self, identity: Identity, study: pb.Study, session: Session,
                     out: Outcome) -> bytes | str | None:
        """This device's message for the open stage, computed from what the coordinator routes
        to it; or, with nothing to send, the reason it refuses (None: nothing to do this pass;
        at MASKED_INPUT, whose release goes through the ledger, also None once it is sent)."""
        sid, stage = study.study_id, study.stage
        try:
            body = self._stage_fetch(identity, sid, stage)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                return None  # the stage moved on or is not open yet: next pass
            if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                session.left = True  # not in the roster, or dropped by the coordinator
                return None
            raise
        try:
            if stage == pb.ADVERTISE_KEYS:
                params, keys, _ = sw.params_from_json(sid, sw.load(body))
                session.protocol.check_round(params)
                session.client = Client(params, identity.device_id, identity.private_key, keys)
                session.setup = body
                reply = sw.dump(sw.advert_to_json(session.client.advertise()))
            elif stage == pb.SHARE_KEYS:
                adverts = {v: sw.advert_from_json(a) for v, a in sw.load(body).items()}
                reply = sw.dump(sw.bytes_map_to_json(session.client.share_keys(adverts)))
            elif stage == pb.MASKED_INPUT:
                inbox = sw.bytes_map_from_json(sw.load(body))
                session.done.add(stage)
                return self._masked_input(identity, study, session, inbox, out)
            elif stage == pb.CONSISTENCY:
                signature = session.client.sign_survivors(sw.survivors_from_json(sw.load(body)))
                reply = sw.dump(sw.signature_to_json(signature))
            elif stage == pb.UNMASK:
                shares = session.client.unmask(sw.signed_from_json(sw.load(body)))
                reply = sw.dump(sw.unmask_to_json(shares))
            else:
                raise ValueError(f"the study is at stage {stage}, which this device does not know")
        except (SecAggAbort, ValueError) as exc:
            session.left = True
            return Declined(f"secure aggregation: {exc}", pb.OTHER)
        return reply

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

    def _masked_input(self, identity: Identity, study: pb.Study, session: Session,
                      inbox: dict[str, bytes], out: Outcome) -> str | None:
        """Sketch (or, in a refinement round, count and sum the cells), add a noise share, mask,
        commit the spend with the bytes (and the input before the masks, x + e, which the
        coordinator's unmasked sum adds up), then send.

        The shares of h_min = L − D − C devices add up to the release's integer-sum term
        (MECHANISMS §4.2, :mod:`fedsketch.common.secagg.trust`,
        :mod:`fedsketch.common.study.secure_rounds`).
        """
        spec, tally = session.spec, Tally()
        try:
            if session.data is None:  # resumed while the data did not open: open it now
                session.data = self.data()
            x, n, noise = self._exact_input(session, tally)
        except DATA_ERRORS as exc:  # the file changed since REGISTER
            session.left = True
            return data_refusal(exc)
        if n != session.n:
            session.left = True
            return Declined(f"the data changed since REGISTER ({session.n} records registered, "
                            f"{n} read now); nothing was spent", pb.DATA_UNREADABLE)
        log_clipped(study.study_id, tally)
        y = session.client.masked_input(x, inbox, noise)
        self._keep(study.study_id, session)  # masked once: a crash before the spend drops out, unspent
        premask = (np.asarray(x, np.int64) + np.asarray(noise, np.int64)).astype("<i8").tobytes()
        try:
            spend = self.ledger.record_spend(
                study_id=study.study_id, source=self.source, epsilon=session.epsilon, delta=0.0,
                n=float(n), kind=SECURE_KIND, payload=sw.masked_to_bytes(y),
                spec_sha256=study.spec_sha256, premask=premask,
                **spend_labels(spec, session.round, session.later))
        except (BudgetExceeded, LedgerError) as exc:
            session.left = True
            return Declined(str(exc), pb.BUDGET) if isinstance(exc, BudgetExceeded) else str(exc)
        fault_point()
        self._send(identity, spend)
        out.submitted.append(study.study_id)
        return None

    @staticmethod
    def _exact_input(session: Session, tally: Tally) -> tuple[np.ndarray, int, np.ndarray]:
        """(the exact integer input, records read, this device's noise shares): the sketch's
        integer sum (2m), round 0's calibration sum (2·m0) or a round's cells (K(d + 1))."""
        spec, box = session.spec, session.box
        if isinstance(protocol := session.protocol, SecureCalibration):
            return (*protocol.exact_input(box, session.data.chunks(), tally), protocol.noise_shares())
        if isinstance(session.round, RoundSpec):
            counts, sums, n = round_cells(box, session.round, session.data.chunks(), tally)
            noise = SecureRound(spec, session.round).noise_shares()
            return np.concatenate([counts, sums.ravel()]), n, noise
        m, r = spec.sketch.frequencies.m, spec.sketch.r
        fs = feature_sum(box.centred(session.data.chunks(), tally),
                         box.reduce(draw_frequencies(spec.sketch.frequencies)), spec.sketch.feature, r)
        term = integer_sum_term(spec.sketch.feature, spec.sketch.privacy.epsilon, r, "replace_one")
        noise = dlap_noise_share(term.epsilon, term.sensitivity, spec.assumptions.min_honest, 2 * m)
        return np.concatenate([fs.re, fs.im]), fs.n, noise

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
        return self.stub.SecAggFetch(msg, timeout=RPC_TIMEOUT).body
