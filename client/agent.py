"""One device's work on the round: enroll, check studies, sketch, spend, sign and submit.

The order is what makes a release safe (DESIGN §3, §6):

1. the study's spec JSON hashes to the announced spec hash, its Ω‖ξ hash recomputes, d matches
   the local data, the device holds at least ``min_records`` records, and the remaining budget
   covers ε — otherwise the study is refused with the reason and nothing is spent;
2. the sketch is computed and noised once (noise from the OS CSPRNG);
3. the spend and the exact payload bytes are committed to the ledger in one transaction;
4. only then is the payload signed and sent; every retry or restart re-sends the stored bytes.

The ledger refuses a second spend for the same study, so a study is never noised twice.
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
from fedsketch.common.frequencies import draw_frequencies
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.privacy import privatize
from fedsketch.common.sketching import feature_sum
from fedsketch.common.study import StudySpec, spec_sha256

from .ledger import BudgetExceeded, Identity, Ledger, LedgerError, Spend

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


@dataclass(frozen=True)
class LocalData:
    """The device's records: a chunk iterator factory, n records of dimension d, a fingerprint."""

    chunks: Callable[[], Iterable[np.ndarray]]
    n: int
    d: int
    fingerprint: str


@dataclass
class Outcome:
    """What one pass over the open studies did."""

    submitted: list[str] = field(default_factory=list)
    resent: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


class Agent:
    """A device's protocol logic over one gRPC channel and one ledger."""

    def __init__(self, channel: grpc.Channel, ledger: Ledger, data: LocalData) -> None:
        self.stub = pb_grpc.DeviceStub(channel)
        self.ledger = ledger
        self.data = data
        self.bytes_sent = 0
        self._refused: set[str] = set()

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
        studies = self.stub.ListStudies(pb.ListStudiesRequest(), timeout=RPC_TIMEOUT).studies
        for study in studies:
            if study.study_id in self._refused or self.ledger.find(study.study_id) is not None:
                continue
            reason = self._contribute(identity, study)
            if reason is None:
                out.submitted.append(study.study_id)
            else:
                self._refused.add(study.study_id)
                out.refused[study.study_id] = reason
                log.warning("refused study %s: %s", study.study_id, reason)
        return out

    def _check(self, study: pb.Study) -> StudySpec | str:
        """The parsed spec if this device may contribute, else the reason it may not."""
        if spec_sha256(study.spec_json) != study.spec_sha256:
            return "the spec does not hash to the announced spec hash"
        try:
            spec = StudySpec.from_json(study.spec_json)
        except ValueError as exc:
            return f"unreadable spec: {exc}"
        if spec.sketch.frequencies.d != self.data.d:
            return f"the study wants d = {spec.sketch.frequencies.d}, the data has {self.data.d}"
        if self.data.n < spec.min_records:
            return f"the study needs {spec.min_records} records, the device has {self.data.n}"
        eps = spec.sketch.privacy.epsilon
        remaining = self.ledger.remaining(self.data.fingerprint)
        if eps > remaining + 1e-12:
            return f"insufficient budget: the study asks ε = {eps:g}, {remaining:g} remains"
        if draw_frequencies(spec.sketch.frequencies).sha256 != spec.omega_sha256:
            return "the frequencies Ω, ξ do not match the spec's hash on this platform"
        return spec

    def _contribute(self, identity: Identity, study: pb.Study) -> str | None:
        spec = self._check(study)
        if isinstance(spec, str):
            return spec
        freqs = draw_frequencies(spec.sketch.frequencies)
        fs = feature_sum(self.data.chunks(), freqs, spec.sketch.feature, spec.sketch.r)
        release = privatize(fs, spec.sketch.privacy)
        kind, payload = wire.encode(release, spec.sketch.feature)
        try:
            spend = self.ledger.record_spend(
                study_id=study.study_id, fingerprint=self.data.fingerprint,
                epsilon=spec.sketch.privacy.epsilon, delta=spec.sketch.privacy.delta,
                n=release.n, kind=kind, payload=payload, spec_sha256=study.spec_sha256)
        except BudgetExceeded as exc:
            return str(exc)
        if os.environ.get(FAULT_ENV) == "kill-after-commit":
            os.kill(os.getpid(), signal.SIGKILL)
        self._send(identity, spend)
        return None

    def _send(self, identity: Identity, spend: Spend) -> None:
        digest = signing.contribution_digest(spend.study_id, identity.device_id, spend.n,
                                             spend.spec_sha256, spend.payload)
        msg = pb.Contribution(study_id=spend.study_id, device_id=identity.device_id,
                              spec_sha256=spend.spec_sha256, n=spend.n,
                              signature=signing.sign(identity.private_key, digest),
                              **{spend.kind: spend.payload})
        self.bytes_sent += msg.ByteSize()
        reply = self.stub.Submit(msg, timeout=RPC_TIMEOUT)
        self.ledger.mark_acked(spend.study_id, reply.receipt)
