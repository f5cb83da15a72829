"""One device's work on the round: enroll, check studies, sketch, spend, sign and submit.

The order is what makes a release safe (DESIGN §3, §6):

1. public checks: the study's spec JSON hashes to the announced spec hash, its Ω‖ξ hash
   recomputes, the owner's policy (:mod:`.policy`) allows the study's name and ε, and the
   remaining budget of the device's source covers ε and δ;
2. the data are opened afresh for this study (the agent's :data:`~.localdata.DataFeed` is called
   per study, so a file replaced since the daemon started is read with its own layout) and must
   have the study's d;
3. one pass over that file computes the sketch of the records clipped into the study's box
   and noises it once (exact noise from OS bits); a NaN or an infinity stops it; how many
   records were clipped goes to the device's log only;
4. under replace-one (n public) at least ``min_records`` records were read; under add/remove
   no decision depends on n (a study there cannot ask for more than one record);
5. the spend and the exact payload bytes are committed to the ledger in one transaction, which
   re-checks the budget and the owner's largest ε per study;
6. only then is the payload signed and sent; every retry or restart re-sends the stored bytes.

A refusal at any step spends nothing. A refusal because of the data (:class:`Retry`: the file
is unreadable, changed during the pass or holds a NaN) is tried again on the next pass; any
other lasts as long as the daemon. The ledger refuses a second spend for the same study, so a
study is never noised twice, and a study the ledger already holds is never handled again.

A secure-aggregation study (``Study.stage`` REGISTER … UNMASK, replace-one) runs steps 1–2 and
counts the records at REGISTER; at MASKED_INPUT it sketches that same file version (it drops
out if the file changed or its count differs) and its one release is the masked input (integer
sum + a noise share + masks), committed to the ledger before it is sent. Devices that drop
before MASKED_INPUT spend nothing.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass, field

import grpc
import numpy as np

from fedsketch.common import signing, wire
from fedsketch.common.box import Box, Tally
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
from .localdata import DATA_ERRORS, DataFeed, LocalData, Retry, data_refusal, log_clipped

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


def _shown(text: str) -> str:
    """Coordinator text (a study id) safe for a log line: control characters escaped."""
    return text if text.isprintable() else repr(text)


def _fault_point() -> None:
    """Between the ledger commit and the first send: where crash tests kill the device."""
    if os.environ.get(FAULT_ENV) == "kill-after-commit":
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class _Admitted:
    """A study the device may contribute to: its spec, public box, and the data version opened
    for it."""

    spec: StudySpec
    box: Box
    data: LocalData


#: The ledger kind of a masked input.
SECURE_KIND = "secagg_masked"


@dataclass
class _Session:
    """This device's part in one secure-aggregation round (in memory: a restart drops out)."""

    spec: StudySpec
    box: Box
    data: LocalData
    n: int
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

    def __init__(self, channel: grpc.Channel, ledger: Ledger, data: DataFeed,
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
            if self.ledger.find(study.study_id) is not None and study.study_id not in self._sessions:
                continue  # released once already (the stored bytes are re-sent above)
            if study.stage in sw.STAGES:
                reason = self._secure_step(identity, study, out)
            else:
                reason = self._contribute(identity, study)
                if reason is None:
                    out.submitted.append(study.study_id)
            if reason is not None:
                if not isinstance(reason, Retry):
                    self._refused.add(study.study_id)
                out.refused[study.study_id] = reason
                log.warning("refused study %s: %s", _shown(study.study_id), reason)
        return out

    def _check(self, study: pb.Study) -> _Admitted | str:
        """Steps 1–2 of the module docstring: the study, its box and the data version opened for
        it if this device may contribute, else the reason it may not. Spends nothing; opening
        the data reads an ``.npy`` header, or counts a CSV's rows."""
        if spec_sha256(study.spec_json) != study.spec_sha256:
            return "the spec does not hash to the announced spec hash"
        try:
            spec = StudySpec.from_json(study.spec_json)
        except ValueError as exc:
            return f"unreadable spec: {exc}"
        eps, delta = spec.sketch.privacy.epsilon, spec.sketch.privacy.delta
        if (reason := self.ledger.policy().refusal(spec.name, eps)) is not None:
            return reason
        if (reason := self.ledger.refusal(self.source, eps, delta)) is not None:
            return reason
        freqs = draw_frequencies(spec.sketch.frequencies)
        if freqs.sha256 != spec.omega_sha256:
            return "the frequencies Ω, ξ do not match the spec's hash on this platform"
        try:
            box = Box(spec.lo, spec.hi)
            box.reduce(freqs)
        except ValueError as exc:
            return f"the study's box does not fit its frequencies: {exc}"
        try:
            data = self.data()
        except DATA_ERRORS as exc:
            return data_refusal(exc)
        if spec.sketch.frequencies.d != data.d:
            return f"the study wants d = {spec.sketch.frequencies.d}, the data has {data.d}"
        return _Admitted(spec, box, data)

    @staticmethod
    def _too_few(spec: StudySpec, n: int) -> str | None:
        """Step 4: why n records are too few (replace-one only: n is public there)."""
        if spec.sketch.privacy.neighbouring == "replace_one" and n < spec.min_records:
            return f"the study needs {spec.min_records} records, the device has {n}"
        return None

    def _contribute(self, identity: Identity, study: pb.Study) -> str | None:
        admitted = self._check(study)
        if isinstance(admitted, str):
            return admitted
        spec = admitted.spec
        tally = Tally()
        try:
            release = release_sketch(spec.sketch, admitted.data.chunks(), admitted.box, tally=tally)
        except DATA_ERRORS as exc:
            return data_refusal(exc)
        if (reason := self._too_few(spec, tally.records)) is not None:
            return reason
        log_clipped(study.study_id, tally)
        kind, payload = wire.encode(release, spec.sketch.feature)
        try:
            spend = self.ledger.record_spend(
                study_id=study.study_id, study_name=spec.name, source=self.source,
                epsilon=spec.sketch.privacy.epsilon, delta=spec.sketch.privacy.delta,
                n=release.n, kind=kind, payload=payload, spec_sha256=study.spec_sha256)
        except (BudgetExceeded, LedgerError) as exc:  # e.g. another daemon on this ledger spent
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
            try:
                n = sum(chunk.shape[0] for chunk in admitted.data.chunks())
            except DATA_ERRORS as exc:
                return data_refusal(exc)
            if (reason := self._too_few(admitted.spec, n)) is not None:
                return reason
            self._stage_send(identity, sid, pb.REGISTER, sw.dump({"n": n}))
            self._sessions[sid] = _Session(admitted.spec, admitted.box, admitted.data, n)
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
            fs = feature_sum(box.centred(session.data.chunks(), tally),
                             box.reduce(draw_frequencies(spec.sketch.frequencies)),
                             spec.sketch.feature, r)
        except DATA_ERRORS as exc:  # the file changed since REGISTER
            session.left = True
            return f"the data cannot be sketched for this study: {exc}"
        if fs.n != session.n:
            session.left = True
            return (f"the data changed since REGISTER ({session.n} records registered, "
                    f"{fs.n} read now); nothing was spent")
        log_clipped(study.study_id, tally)
        term = integer_sum_term(spec.sketch.feature, spec.sketch.privacy.epsilon, r, "replace_one")
        noise = dlap_noise_share(term.epsilon, term.sensitivity, spec.secure_aggregation.min_honest,
                                 2 * m)
        y = session.client.masked_input(np.concatenate([fs.re, fs.im]), inbox, noise)
        try:
            spend = self.ledger.record_spend(
                study_id=study.study_id, study_name=spec.name, source=self.source,
                epsilon=spec.sketch.privacy.epsilon, delta=0.0, n=float(fs.n),
                kind=SECURE_KIND, payload=sw.masked_to_bytes(y), spec_sha256=study.spec_sha256)
        except (BudgetExceeded, LedgerError) as exc:
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
