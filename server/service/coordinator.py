"""The coordinator: gRPC Device and Operator services over a durable :class:`Store`.

Study lifecycle: open → collecting (first stored contribution) → decoding → done | failed.
A study without a deadline closes as soon as it holds ``min_devices`` contributions (quorum);
a study with a deadline collects until the deadline and then decodes if it holds
``min_devices`` contributions, otherwise it fails. An operator may close a study early (same
rule). Decoding runs on a worker thread so that ``Submit`` answers at once; a coordinator that
restarts re-decodes any study it left in ``decoding`` and closes studies whose deadline passed.

Every contribution is checked before it is stored, and a refusal changes nothing: unknown study
(NOT_FOUND), closed study or spec-hash mismatch (FAILED_PRECONDITION), unenrolled device or bad
signature (UNAUTHENTICATED), malformed payload, wrong length, NaN/inf or a value beyond what the
mechanism can produce (INVALID_ARGUMENT), a second, different contribution from the same device
(ALREADY_EXISTS). An identical re-send is acknowledged again. Messages larger than the server's
limit are refused by gRPC (RESOURCE_EXHAUSTED). Operator calls need ``authorization: Bearer
<token>`` metadata matching the operator token (PERMISSION_DENIED / UNAUTHENTICATED otherwise).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc

from fedsketch.common import secagg_wire, signing, wire
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.study import StudySpec, spec_sha256
from fedsketch.common.tls import MAX_MESSAGE_BYTES
from fedsketch.server.decode.pipeline import StudyResult, decode_sketch, decode_study, integer_sketch
from fedsketch.server.service.secure_round import Refusal, SecAggRound
from fedsketch.server.store.base import ACCEPTING, ContributionRow, Store, StoreError, StudyRow

log = logging.getLogger("fedsketch.coordinator")

STATES = {"open": pb.OPEN, "collecting": pb.COLLECTING, "decoding": pb.DECODING,
          "done": pb.DONE, "failed": pb.FAILED}
STORE_CODES = {
    "not_found": grpc.StatusCode.NOT_FOUND,
    "conflict": grpc.StatusCode.ALREADY_EXISTS,
    "failed_precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "permission_denied": grpc.StatusCode.PERMISSION_DENIED,
}
#: How often the deadline watcher wakes (seconds).
WATCH_INTERVAL = 0.5


def _guard(method):
    """Turn Refusal and StoreError into gRPC statuses; nothing else is caught."""

    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except Refusal as exc:
            context.abort(exc.code, str(exc))
        except StoreError as exc:
            context.abort(STORE_CODES[exc.code], str(exc))

    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper


class Coordinator:
    """Study lifecycle and validation, shared by both gRPC services."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._specs: dict[str, StudySpec] = {}
        self._lock = threading.Lock()
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="deadlines", daemon=True)
        self.rounds: dict[str, SecAggRound] = {}

    def start(self) -> None:
        """Resume interrupted decodings, fail interrupted secure-aggregation rounds (their
        state, and the devices', was in memory), and start the deadline watcher."""
        for row in self.store.list_studies(("decoding",)):
            self._decoder.submit(self._decode, row.study_id)
        for row in self.store.list_studies(ACCEPTING):
            if self.spec(row.study_id).secure_aggregation is not None:
                self.store.set_state(row.study_id, "failed", "the coordinator restarted during "
                                     "secure aggregation; the round cannot resume")
        self._watcher.start()

    def stop(self) -> None:
        """Stop the watcher and wait for a running decoding to finish."""
        self._stop.set()
        if self._watcher.is_alive():
            self._watcher.join()
        self._decoder.shutdown(wait=True)

    # --- studies -------------------------------------------------------------------------------

    def spec(self, study_id: str) -> StudySpec:
        """The parsed spec of a study (cached; specs never change)."""
        with self._lock:
            spec = self._specs.get(study_id)
        if spec is None:
            spec = StudySpec.from_json(self.store.get_study(study_id).spec_json)
            with self._lock:
                self._specs[study_id] = spec
        return spec

    def create(self, spec_json: str) -> StudyRow:
        """Validate and canonicalize a spec, check its Ω hash, and open the study."""
        try:
            spec = StudySpec.from_json(spec_json)
            expected = StudySpec.create(spec.name, spec.sketch, spec.k, spec.lo, spec.hi)
        except ValueError as exc:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"bad study spec: {exc}") from None
        if expected.omega_sha256 != spec.omega_sha256:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                          "omega_sha256 does not match the frequency spec")
        text = spec.to_json()
        study_id = "st-" + secrets.token_hex(8)
        row = self.store.create_study(study_id, text, spec_sha256(text), spec.deadline,
                                      spec.min_devices)
        with self._lock:
            self._specs[study_id] = spec
            if spec.secure_aggregation is not None:
                self.rounds[study_id] = self._new_round(study_id, spec)
        return row

    def _new_round(self, study_id: str, spec: StudySpec) -> SecAggRound:
        def finish(total, devices: int, records: float) -> None:
            self.store.set_state(study_id, "decoding", "secure aggregate unmasked")
            self._decoder.submit(self._decode_secure, study_id, total, devices, records)

        def fail(reason: str) -> None:
            log.warning("study %s: %s", study_id, reason)
            self.store.set_state(study_id, "failed", reason)

        return SecAggRound(study_id, spec, self.store.device_key, finish, fail)

    def _decode_secure(self, study_id: str, total, devices: int, records: float) -> None:
        def decode() -> StudyResult:
            spec = self.spec(study_id)
            return decode_sketch(spec, integer_sketch(spec, total, records), devices, records)

        self._publish(study_id, decode)

    def _publish(self, study_id: str, decode: Callable[[], StudyResult]) -> None:
        """Store ``decode()``'s result (the study becomes done) or fail the study with why."""
        try:
            result = decode()
            self.store.put_result(study_id, json.dumps(result.to_dict()))
            log.info("study %s decoded from %d devices", study_id, result.devices)
        except Exception as exc:  # a failed decoding fails the study, with the reason
            log.exception("decoding study %s failed", study_id)
            self.store.set_state(study_id, "failed", f"decoding failed: {exc}")

    def round(self, study_id: str) -> SecAggRound:
        """The secure-aggregation round of a study (NOT_FOUND / FAILED_PRECONDITION). A round
        exists only for a created study, so the store is read only when none is found."""
        with self._lock:
            found = self.rounds.get(study_id)
        if found is None:
            self.store.get_study(study_id)  # NOT_FOUND for an unknown study
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                          f"study {study_id} has no secure-aggregation round running")
        return found

    def _enrolled_key(self, device_id: str) -> bytes:
        """The device's enrolled Ed25519 public key (UNAUTHENTICATED for an unknown device)."""
        key = self.store.device_key(device_id)
        if key is None:
            raise Refusal(grpc.StatusCode.UNAUTHENTICATED, f"unenrolled device {device_id!r}")
        return key

    def authenticate(self, msg: pb.SecAggMessage) -> None:
        """Check a stage message's signature against the device's enrolled key."""
        key = self._enrolled_key(msg.device_id)
        digest = secagg_wire.message_digest(msg.study_id, msg.device_id, msg.stage, msg.body)
        if not signing.verify(key, digest, msg.signature):
            raise Refusal(grpc.StatusCode.UNAUTHENTICATED, "invalid signature on a stage message")

    def close(self, study_id: str, reason: str) -> StudyRow:
        """Stop collecting: decode if the quorum holds, otherwise fail the study."""
        row = self.store.get_study(study_id)
        if row.state not in ACCEPTING:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                          f"study {study_id} is already {row.state}")
        if self.spec(study_id).secure_aggregation is not None:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                          "a secure-aggregation study closes its stages by their timeouts")
        if row.contributions < row.min_devices:
            return self.store.set_state(
                study_id, "failed", f"{reason}: {row.contributions} of {row.min_devices} "
                "devices contributed", expect=ACCEPTING)
        row = self.store.set_state(study_id, "decoding", reason, expect=ACCEPTING)
        self._decoder.submit(self._decode, study_id)
        return row

    def _decode(self, study_id: str) -> None:
        def decode() -> StudyResult:
            spec = self.spec(study_id)
            m = spec.sketch.frequencies.m
            return decode_study(spec, ((r.n, wire.decode(r.kind, r.payload, m))
                                       for r in self.store.contributions(study_id)))

        self._publish(study_id, decode)

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL):
            now = time.time()
            with self._lock:
                rounds = list(self.rounds.values())
            for r in rounds:
                r.tick(now)
            for row in self.store.list_studies(ACCEPTING):
                if row.deadline is not None and row.deadline <= now:
                    try:
                        self.close(row.study_id, "deadline reached")
                    except (Refusal, StoreError):
                        pass  # closed concurrently

    # --- contributions -------------------------------------------------------------------------

    def submit(self, c: pb.Contribution) -> tuple[bool, str]:
        """Validate and store one contribution; (duplicate, receipt). Raises Refusal."""
        row = self.store.get_study(c.study_id)  # the store refuses a closed study
        if self.spec(c.study_id).secure_aggregation is not None:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                          "this study uses secure aggregation: send stage messages instead")
        if c.spec_sha256 != row.spec_sha256:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                          "spec hash mismatch: the contribution was made for another spec")
        key = self._enrolled_key(c.device_id)
        kind = c.WhichOneof("payload")
        if kind is None:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "contribution has no payload")
        payload = getattr(c, kind)
        digest = signing.contribution_digest(c.study_id, c.device_id, c.n, c.spec_sha256, payload)
        if not signing.verify(key, digest, c.signature):
            raise Refusal(grpc.StatusCode.UNAUTHENTICATED,
                          "invalid signature for this device and payload")
        try:
            wire.check_payload(self.spec(c.study_id), kind, payload, c.n)
        except wire.PayloadError as exc:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        receipt = hashlib.sha256(payload).hexdigest()
        stored = self.store.add_contribution(ContributionRow(
            c.study_id, c.device_id, c.n, kind, payload, receipt, c.signature, time.time()))
        if stored:
            row = self.store.get_study(c.study_id)
            if row.deadline is None and row.contributions >= row.min_devices:
                try:
                    self.close(c.study_id, "quorum reached")
                except (Refusal, StoreError):
                    pass  # another submission closed it first
        return not stored, receipt


def study_message(row: StudyRow, secure_round: SecAggRound | None = None) -> pb.Study:
    """The wire form of a study row (its stage from the secure-aggregation round, if any)."""
    if row.state not in ACCEPTING:
        stage = pb.FINISHED
    else:
        stage = pb.PLAIN_INPUT if secure_round is None else secure_round.stage
    return pb.Study(study_id=row.study_id, spec_json=row.spec_json, spec_sha256=row.spec_sha256,
                    state=STATES[row.state], stage=stage,
                    contributions=row.contributions, records=row.records, detail=row.detail)


class DeviceService(pb_grpc.DeviceServicer):
    """What devices call."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.c = coordinator

    @_guard
    def Enroll(self, request, context):  # noqa: N802 (gRPC method names)
        """Trade a one-time token for a device id bound to the public key."""
        if len(request.public_key) != signing.PUBLIC_KEY_BYTES:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "public_key must be 32 raw bytes")
        device_id = self.c.store.enroll(request.token, bytes(request.public_key), request.label)
        return pb.EnrollResponse(device_id=device_id)

    @_guard
    def ListStudies(self, request, context):  # noqa: N802
        """Studies that accept contributions."""
        rows = self.c.store.list_studies(ACCEPTING)
        return pb.ListStudiesResponse(studies=[study_message(r, self.c.rounds.get(r.study_id)) for r in rows])

    @_guard
    def GetStudy(self, request, context):  # noqa: N802
        """One study."""
        return study_message(self.c.store.get_study(request.study_id),
                             self.c.rounds.get(request.study_id))

    @_guard
    def Submit(self, request, context):  # noqa: N802
        """One signed contribution."""
        duplicate, receipt = self.c.submit(request)
        return pb.SubmitReply(duplicate=duplicate, receipt=receipt)

    @_guard
    def SecAggSend(self, request, context):  # noqa: N802
        """One signed secure-aggregation stage message."""
        self.c.authenticate(request)
        duplicate = self.c.round(request.study_id).receive(request.device_id, request.stage,
                                                           bytes(request.body))
        return pb.SecAggAck(duplicate=duplicate)

    @_guard
    def SecAggFetch(self, request, context):  # noqa: N802
        """What the coordinator routes to this device for the open stage."""
        self.c.authenticate(request)
        body = self.c.round(request.study_id).fetch(request.device_id, request.stage)
        return pb.SecAggBundle(stage=request.stage, body=body)

    @_guard
    def GetResult(self, request, context):  # noqa: N802
        """The published result of a done study."""
        row = self.c.store.get_study(request.study_id)
        text = self.c.store.get_result(request.study_id)
        if text is None:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                          f"study {request.study_id} is {row.state}; no result"
                          + (f" ({row.detail})" if row.detail else ""))
        res = json.loads(text)
        spec = self.c.spec(request.study_id)
        return pb.Result(study_id=request.study_id, k=spec.k,
                         d=spec.sketch.frequencies.d,
                         centroids=[v for row_ in res["centroids"] for v in row_],
                         weights=res["weights"], residual=res["residual"],
                         devices=res["devices"], records=res["records"])


class OperatorService(pb_grpc.OperatorServicer):
    """Admin calls; each checks the bearer token first."""

    def __init__(self, coordinator: Coordinator, token_sha256: str) -> None:
        self.c = coordinator
        self._token_sha256 = token_sha256

    def _authorize(self, context) -> None:
        header = dict(context.invocation_metadata()).get("authorization", "")
        if not header.startswith("Bearer "):
            raise Refusal(grpc.StatusCode.UNAUTHENTICATED, "operator credential required")
        digest = hashlib.sha256(header[len("Bearer "):].encode()).hexdigest()
        if not hmac.compare_digest(digest, self._token_sha256):
            raise Refusal(grpc.StatusCode.PERMISSION_DENIED, "bad operator credential")

    @_guard
    def CreateStudy(self, request, context):  # noqa: N802
        self._authorize(context)
        row = self.c.create(request.spec_json)
        self.c.store.audit("operator", "create_study", row.study_id)
        return study_message(row)

    @_guard
    def ListStudies(self, request, context):  # noqa: N802
        self._authorize(context)
        rows = self.c.store.list_studies(None if request.include_closed else ACCEPTING)
        return pb.ListStudiesResponse(studies=[study_message(r, self.c.rounds.get(r.study_id)) for r in rows])

    @_guard
    def ShowStudy(self, request, context):  # noqa: N802
        self._authorize(context)
        return study_message(self.c.store.get_study(request.study_id),
                             self.c.rounds.get(request.study_id))

    @_guard
    def CloseStudy(self, request, context):  # noqa: N802
        self._authorize(context)
        return study_message(self.c.close(request.study_id, "closed by the operator"))

    @_guard
    def IssueTokens(self, request, context):  # noqa: N802
        self._authorize(context)
        if not 1 <= request.count <= 100_000:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "count must be in 1..100000")
        tokens = [secrets.token_urlsafe(24) for _ in range(request.count)]
        self.c.store.add_tokens(tokens)
        return pb.IssueTokensReply(tokens=tokens)


def build_server(store: Store, token_sha256: str, listen: str,
                 credentials: grpc.ServerCredentials | None,
                 workers: int = 16) -> tuple[grpc.Server, Coordinator, int]:
    """A started gRPC server with both services on ``listen``; returns (server, coordinator,
    bound port). ``credentials`` None means plaintext (the explicit ``--insecure`` opt-out)."""
    coordinator = Coordinator(store)
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    server = grpc.server(ThreadPoolExecutor(max_workers=workers), options=options)
    pb_grpc.add_DeviceServicer_to_server(DeviceService(coordinator), server)
    pb_grpc.add_OperatorServicer_to_server(OperatorService(coordinator, token_sha256), server)
    if credentials is None:
        port = server.add_insecure_port(listen)
    else:
        port = server.add_secure_port(listen, credentials)
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    coordinator.start()
    server.start()
    return server, coordinator, port
