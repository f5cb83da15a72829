"""One device's work on the round: enroll, check studies, sketch, spend, sign and submit.

The order is what makes a release safe (DESIGN §3, §6):

1. the study's spec JSON hashes to the announced spec hash, its Ω‖ξ hash recomputes, d matches
   the local data, the owner's policy (:mod:`.policy`) allows the study's name and ε, the
   remaining budget of the device's source covers ε and δ, and one pass over the data finds
   every record finite, at least ``min_records`` of them, and — if the policy refuses
   out-of-box records — all inside the study's public box; otherwise the study is refused
   with the reason and nothing is spent;
2. the sketch of the records clipped into the box is computed and noised once (exact noise from
   OS bits); how many records were clipped goes to the device's log only;
3. the spend and the exact payload bytes are committed to the ledger in one transaction;
4. only then is the payload signed and sent; every retry or restart re-sends the stored bytes.

The ledger refuses a second spend for the same study, so a study is never noised twice.

A secure-aggregation study (``Study.stage`` REGISTER … UNMASK) follows the same checks at
REGISTER; its one release is the masked input (integer sum + a noise share + masks), committed
to the ledger before it is sent. Devices that drop before MASKED_INPUT spend nothing.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc
import numpy as np

from fedsketch.common import signing, wire
from fedsketch.common.box import Box, Tally
from fedsketch.common.dataio import DataError
from fedsketch.common.dp.plan import integer_sum_term
from fedsketch.common.dp.samplers import dlap_noise_share
from fedsketch.common.frequencies import draw_frequencies
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.secagg import Client, SecAggAbort
from fedsketch.common.secagg import wire as sw
from fedsketch.common.sketching import feature_sum
from fedsketch.common.spec import release_sketch
from fedsketch.common.study import StudySpec, spec_sha256

from .ledger import DEFAULT_SOURCE, BudgetExceeded, Identity, Ledger, LedgerError, Spend

log = logging.getLogger("fedsketch.device")

#: Fault injection for crash tests: with FEDSKETCH_FAULT=kill-after-commit the process sends
#: itself SIGKILL right after the ledger commit and before the first send.
FAULT_ENV = "FEDSKETCH_FAULT"
#: Deadline (seconds) of each RPC.
RPC_TIMEOUT = 60.0
#: Refusals after which re-sending the same bytes can never succeed.
FINAL_REFUSALS = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
                  grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS,
                  grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


def _log_clipped(study_id: str, tally: Tally) -> None:
    """Tell the device's own log how many records were clipped into the box (never sent)."""
    if tally.clipped:
        log.info("study %s: %d of %d records lay outside the study's box and were clipped into it "
                 "(this count stays on the device)", study_id, tally.clipped, tally.records)


def _fault_point() -> None:
    """Between the ledger commit and the first send: where crash tests kill the device."""
    if os.environ.get(FAULT_ENV) == "kill-after-commit":
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class LocalData:
    """The device's records: a factory of chunk iterators (each chunk (rows, d), finite values,
    any real dtype) and the dimension d. The record count is taken afresh for every study."""

    chunks: Callable[[], Iterable[np.ndarray]]
    d: int


@dataclass(frozen=True)
class _Admitted:
    """A study the device may contribute to: its spec, public box, and the records counted now."""

    spec: StudySpec
    box: Box
    n: int


#: The ledger kind of a masked input.
SECURE_KIND = "secagg_masked"


@dataclass
class _Session:
    """This device's part in one secure-aggregation round (in memory: a restart drops out)."""

    spec: StudySpec
    box: Box
    client: Client | None = None
    done: set[int] = field(default_factory=set)
    left: bool = False


@dataclass
class Outcome:
    """What one pass over the open studies did."""

    submitted: list[str] = field(default_factory=list)
    resent: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


class Agent:
    """A device's protocol logic over one gRPC channel and one ledger."""

    def __init__(self, channel: grpc.Channel, ledger: Ledger, data: LocalData,
                 source: str = DEFAULT_SOURCE) -> None:
        self.stub = pb_grpc.DeviceStub(channel)
        self.ledger = ledger
        self.data = data
        self.source = source
        self.bytes_sent = 0
        self._refused: set[str] = set()
        self._sessions: dict[str, _Session] = {}

    def ensure_enrolled(self, coordinator: str, token: str | None, label: str) -> Identity:
        """The stored identity, or a new Ed25519 key enrolled with ``token``."""
        identity = self.ledger.identity()
        if identity is not None:
            return identity
        if not token:
            raise LedgerError("this device is not enrolled yet: pass an enrollment token")
        key = signing.new_private_key()
        reply = self.stub.Enroll(pb.EnrollRequest(token=token, public_key=signing.public_key(key),
                                                  label=label), timeout=RPC_TIMEOUT)
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
        for spend in self.ledger.pending():
            try:
                self._send(identity, spend)
            except grpc.RpcError as exc:
                if exc.code() not in FINAL_REFUSALS:
                    raise  # transient: keep the bytes and try again on the next pass
                # the coordinator will never take these bytes; the spend stays on the books
                self.ledger.mark_acked(spend.study_id, f"refused: {exc.code().name}")
                out.refused[spend.study_id] = exc.details() or exc.code().name
                continue
            out.resent.append(spend.study_id)
        self._settle()
        studies = self.stub.ListStudies(pb.ListStudiesRequest(), timeout=RPC_TIMEOUT).studies
        for study in studies:
            if study.study_id in self._refused:
                continue
            if study.stage in sw.STAGES:
                reason = self._secure_step(identity, study, out)
            elif self.ledger.find(study.study_id) is not None:
                continue
            else:
                reason = self._contribute(identity, study)
                if reason is None:
                    out.submitted.append(study.study_id)
            if reason is not None:
                self._refused.add(study.study_id)
                out.refused[study.study_id] = reason
                log.warning("refused study %s: %s", study.study_id, reason)
        return out

    def _check(self, study: pb.Study) -> _Admitted | str:
        """The study, its box and the current record count if this device may contribute, else
        the reason it may not. Spends nothing; the data pass happens only once every public check
        has passed."""
        if spec_sha256(study.spec_json) != study.spec_sha256:
            return "the spec does not hash to the announced spec hash"
        try:
            spec = StudySpec.from_json(study.spec_json)
        except ValueError as exc:
            return f"unreadable spec: {exc}"
        if spec.sketch.frequencies.d != self.data.d:
            return f"the study wants d = {spec.sketch.frequencies.d}, the data has {self.data.d}"
        eps, delta = spec.sketch.privacy.epsilon, spec.sketch.privacy.delta
        policy = self.ledger.policy()
        if (reason := policy.refusal(spec.name, eps)) is not None:
            return reason
        left = self.ledger.remaining(self.source)
        if eps > left.epsilon + 1e-12:
            return (f"insufficient budget: the study asks ε = {eps:g}, {left.epsilon:g} remains "
                    f"for source {self.source!r}")
        if delta > left.delta + 1e-15:
            return (f"insufficient budget: the study asks δ = {delta:g}, {left.delta:g} remains "
                    f"for source {self.source!r}")
        freqs = draw_frequencies(spec.sketch.frequencies)
        if freqs.sha256 != spec.omega_sha256:
            return "the frequencies Ω, ξ do not match the spec's hash on this platform"
        try:
            box = Box(spec.lo, spec.hi)
            box.reduce(freqs)
            seen = box.count_outside(self.data.chunks())
        except (DataError, ValueError) as exc:
            return f"the data cannot be sketched for this study: {exc}"
        if seen.records < spec.min_records:
            return f"the study needs {spec.min_records} records, the device has {seen.records}"
        if seen.clipped and policy.out_of_box == "refuse":
            return (f"{seen.clipped} of {seen.records} records lie outside the study's box and the "
                    "device's policy refuses out-of-box records (out-of-box = refuse)")
        return _Admitted(spec, box, seen.records)

    def _contribute(self, identity: Identity, study: pb.Study) -> str | None:
        admitted = self._check(study)
        if isinstance(admitted, str):
            return admitted
        spec = admitted.spec
        tally = Tally()
        try:
            release = release_sketch(spec.sketch, self.data.chunks(), admitted.box, tally=tally)
        except (DataError, ValueError) as exc:  # the file changed since the check
            return f"the data cannot be sketched for this study: {exc}"
        _log_clipped(study.study_id, tally)
        kind, payload = wire.encode(release, spec.sketch.feature)
        try:
            spend = self.ledger.record_spend(
                study_id=study.study_id, study_name=spec.name, source=self.source,
                epsilon=spec.sketch.privacy.epsilon, delta=spec.sketch.privacy.delta,
                n=release.n, kind=kind, payload=payload, spec_sha256=study.spec_sha256)
        except BudgetExceeded as exc:
            return str(exc)
        _fault_point()
        self._send(identity, spend)
        return None

    def _secure_step(self, identity: Identity, study: pb.Study, out: Outcome) -> str | None:
        """Act on the open stage of a secure-aggregation study; the reason if refused."""
        sid, stage = study.study_id, study.stage
        session = self._sessions.get(sid)
        if stage == pb.REGISTER:
            if session is not None:
                return None
            admitted = self._check(study)
            if isinstance(admitted, str):
                return admitted
            self._stage_send(identity, sid, pb.REGISTER, sw.dump({"n": admitted.n}))
            self._sessions[sid] = _Session(admitted.spec, admitted.box)
            return None
        if session is None or stage in session.done or session.left:
            return None
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
                session.client = Client(params, identity.device_id, identity.private_key, keys)
                reply = sw.dump(sw.advert_to_json(session.client.advertise()))
            elif stage == pb.SHARE_KEYS:
                adverts = {v: sw.advert_from_json(a) for v, a in sw.load(body).items()}
                reply = sw.dump(sw.bytes_map_to_json(session.client.share_keys(adverts)))
            elif stage == pb.MASKED_INPUT:
                inbox = sw.bytes_map_from_json(sw.load(body))
                session.done.add(stage)
                return self._masked_input(identity, study, session, inbox, out)
            else:
                req = sw.request_from_json(sw.load(body))
                shares = session.client.unmask(req.survivors, req.dropped)
                reply = sw.dump(sw.unmask_to_json(shares))
        except (SecAggAbort, ValueError) as exc:
            session.left = True
            return f"secure aggregation: {exc}"
        self._stage_send(identity, sid, stage, reply)
        session.done.add(stage)
        return None

    def _masked_input(self, identity: Identity, study: pb.Study, session: _Session,
                      inbox: dict[str, bytes], out: Outcome) -> str | None:
        """Sketch, add a noise share, mask, commit the spend with the bytes, then send.

        The shares of min_honest devices add up to the study's integer-sum term (MECHANISMS §4.2).
        """
        spec, box, tally = session.spec, session.box, Tally()
        m, r = spec.sketch.frequencies.m, spec.sketch.r
        try:
            fs = feature_sum(box.centred(self.data.chunks(), tally),
                             box.reduce(draw_frequencies(spec.sketch.frequencies)),
                             spec.sketch.feature, r)
        except (DataError, ValueError) as exc:  # the file changed since REGISTER
            session.left = True
            return f"the data cannot be sketched for this study: {exc}"
        _log_clipped(study.study_id, tally)
        term = integer_sum_term(spec.sketch.feature, spec.sketch.privacy.epsilon, r, "replace_one")
        noise = dlap_noise_share(term.epsilon, term.sensitivity, spec.secure_aggregation.min_honest,
                                 2 * m)
        y = session.client.masked_input(np.concatenate([fs.re, fs.im]), inbox, noise)
        try:
            spend = self.ledger.record_spend(
                study_id=study.study_id, study_name=spec.name, source=self.source,
                epsilon=spec.sketch.privacy.epsilon, delta=0.0, n=float(fs.n),
                kind=SECURE_KIND, payload=sw.masked_to_bytes(y), spec_sha256=study.spec_sha256)
        except BudgetExceeded as exc:
            session.left = True
            return str(exc)
        _fault_point()
        self._send(identity, spend)
        out.submitted.append(study.study_id)
        return None

    def _settle(self) -> None:
        """Record the final state (DONE or FAILED) of studies this device spent on, once they end,
        so that ``fedsketch device budget`` can show what each spend bought."""
        for spend in self.ledger.unsettled():
            try:
                study = self.stub.GetStudy(pb.StudyRef(study_id=spend.study_id), timeout=RPC_TIMEOUT)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                self.ledger.set_final_state(spend.study_id, "UNKNOWN to the coordinator")
                continue
            if study.state in (pb.DONE, pb.FAILED):
                self.ledger.set_final_state(spend.study_id, pb.StudyState.Name(study.state))

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
