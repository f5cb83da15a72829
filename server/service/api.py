"""The coordinator's gRPC edge: the Device and Operator services over a :class:`Coordinator`.

This module is the only one that speaks gRPC: it turns requests into the coordinator's calls,
rows into messages, and every :class:`~fedsketch.server.errors.Refusal` (the service's and
the store's) into a status with its message unchanged, through :data:`STATUS`. Anything else
raised is a bug and reaches the client as UNKNOWN. Messages larger than the server's limit are
refused by gRPC itself (RESOURCE_EXHAUSTED). Operator calls need ``authorization: Bearer <token>``
metadata matching the operator token (UNAUTHENTICATED without one, PERMISSION_DENIED for a wrong
one).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from concurrent.futures import ThreadPoolExecutor

import grpc

from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.tls import MAX_MESSAGE_BYTES
from fedsketch.server.errors import Code, Refusal
from fedsketch.server.service.coordinator import Coordinator
from fedsketch.server.service.messages import RegistrationMessage, StageMessage, Submission
from fedsketch.server.service.secure_round import SecAggRound
from fedsketch.server.store.base import ACCEPTING, STATES, Store, StudyRow

#: The gRPC status each refusal code is sent as.
STATUS = {
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.CONFLICT: grpc.StatusCode.ALREADY_EXISTS,
    Code.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Code.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Code.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Code.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    Code.ABORTED: grpc.StatusCode.ABORTED,
}
#: ``StudyState`` of each store state: the proto spells each state's name in capitals.
STUDY_STATES = {state: pb.StudyState.Value(state.upper()) for state in STATES}


def _guard(method):
    """Turn a Refusal into its gRPC status; nothing else is caught."""

    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except Refusal as exc:
            context.abort(STATUS[exc.code], str(exc))

    return wrapper


def plain_stage(row: StudyRow) -> int:
    """The open stage of a plain study: REGISTER until its roster is full, then PLAIN_INPUT until
    a close is requested."""
    if row.state not in ACCEPTING or row.closing is not None:
        return pb.FINISHED
    return pb.PLAIN_INPUT if row.roster_full else pb.REGISTER


def study_message(row: StudyRow, secure_round: SecAggRound | None = None) -> pb.Study:
    """The wire form of a study row (its stage from the secure-aggregation round, if any)."""
    if secure_round is None or row.state not in ACCEPTING:
        stage = plain_stage(row)
    else:
        stage = secure_round.stage
    return pb.Study(study_id=row.study_id, spec_json=row.spec_json, spec_sha256=row.spec_sha256,
                    state=STUDY_STATES[row.state], stage=stage,
                    contributions=row.contributions, records=row.records, detail=row.detail,
                    registered=row.registered)


def _stage_message(request: pb.SecAggMessage) -> StageMessage:
    return StageMessage(request.study_id, request.device_id, request.stage, bytes(request.body),
                        request.signature)


class DeviceService(pb_grpc.DeviceServicer):
    """What devices call."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.c = coordinator

    @_guard
    def Enroll(self, request, context):  # noqa: N802 (gRPC method names)
        """Trade a one-time token for a device id bound to the public key."""
        return pb.EnrollResponse(device_id=self.c.enroll(request.token, bytes(request.public_key),
                                                         request.label))

    @_guard
    def ListStudies(self, request, context):  # noqa: N802
        """Studies that accept contributions."""
        rows = self.c.studies()
        return pb.ListStudiesResponse(studies=[study_message(r, self.c.round_of(r.study_id)) for r in rows])

    @_guard
    def GetStudy(self, request, context):  # noqa: N802
        """One study."""
        return study_message(self.c.study(request.study_id), self.c.round_of(request.study_id))

    @_guard
    def Register(self, request, context):  # noqa: N802
        """Join a plain study's roster."""
        duplicate, row, seconds = self.c.register(RegistrationMessage(
            request.study_id, request.device_id, request.spec_sha256, request.signature,
            not request.join_only))
        return pb.RegisterReply(duplicate=duplicate, stage=plain_stage(row),
                                registered=row.registered, input_seconds=seconds)

    @_guard
    def Leave(self, request, context):  # noqa: N802
        """Leave a plain study's roster before contributing."""
        left, row = self.c.leave(RegistrationMessage(
            request.study_id, request.device_id, request.spec_sha256, request.signature))
        return pb.LeaveReply(left=left, registered=row.registered)

    @_guard
    def Submit(self, request, context):  # noqa: N802
        """One signed contribution."""
        kind = request.WhichOneof("payload")
        duplicate, receipt = self.c.submit(Submission(
            request.study_id, request.device_id, request.n, request.spec_sha256, kind,
            b"" if kind is None else getattr(request, kind), request.signature))
        return pb.SubmitReply(duplicate=duplicate, receipt=receipt)

    @_guard
    def SecAggSend(self, request, context):  # noqa: N802
        """One signed secure-aggregation stage message."""
        return pb.SecAggAck(duplicate=self.c.send_stage(_stage_message(request)))

    @_guard
    def SecAggFetch(self, request, context):  # noqa: N802
        """What the coordinator routes to this device for the open stage."""
        return pb.SecAggBundle(stage=request.stage, body=self.c.fetch_stage(_stage_message(request)))

    @_guard
    def GetResult(self, request, context):  # noqa: N802
        """The published result of a done study."""
        spec, res = self.c.result(request.study_id)
        verdict = res.get("identifiability", {})
        return pb.Result(study_id=request.study_id, k=spec.k,
                         d=spec.sketch.frequencies.d,
                         centroids=[v for row in res["centroids"] for v in row],
                         weights=res["weights"], residual=res["residual"],
                         devices=res["devices"], records=res["records"],
                         status=verdict.get("status", ""), status_reason=verdict.get("reason", ""),
                         z=verdict.get("z", []), threshold=verdict.get("threshold", 0.0),
                         rounds=res.get("refined_rounds", 0))


class OperatorService(pb_grpc.OperatorServicer):
    """Admin calls; each checks the bearer token first."""

    def __init__(self, coordinator: Coordinator, token_sha256: str) -> None:
        self.c = coordinator
        self._token_sha256 = token_sha256

    def _authorize(self, context) -> None:
        header = dict(context.invocation_metadata()).get("authorization", "")
        if not header.startswith("Bearer "):
            raise Refusal(Code.UNAUTHENTICATED, "operator credential required")
        digest = hashlib.sha256(header[len("Bearer "):].encode()).hexdigest()
        if not hmac.compare_digest(digest, self._token_sha256):
            raise Refusal(Code.PERMISSION_DENIED, "bad operator credential")

    @_guard
    def CreateStudy(self, request, context):  # noqa: N802
        self._authorize(context)
        return study_message(self.c.create(request.spec_json))

    @_guard
    def ListStudies(self, request, context):  # noqa: N802
        self._authorize(context)
        rows = self.c.studies(include_closed=request.include_closed)
        return pb.ListStudiesResponse(studies=[study_message(r, self.c.round_of(r.study_id)) for r in rows])

    @_guard
    def ShowStudy(self, request, context):  # noqa: N802
        self._authorize(context)
        return study_message(self.c.study(request.study_id), self.c.round_of(request.study_id))

    @_guard
    def CloseStudy(self, request, context):  # noqa: N802
        self._authorize(context)
        return study_message(self.c.close(request.study_id, "closed by the operator"))

    @_guard
    def IssueTokens(self, request, context):  # noqa: N802
        self._authorize(context)
        return pb.IssueTokensReply(tokens=self.c.issue_tokens(request.count))


def build_server(store: Store, token_sha256: str, listen: str,
                 credentials: grpc.ServerCredentials | None,
                 workers: int = 16) -> tuple[grpc.Server, Coordinator, int]:
    """A started gRPC server with both services on ``listen``; returns (server, coordinator,
    bound port). ``credentials`` None means plaintext (the explicit ``--insecure`` opt-out)."""
    coordinator = Coordinator(store)
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
               ("grpc.so_reuseport", 0)]  # a second server on a busy address fails to bind
    server = grpc.server(ThreadPoolExecutor(max_workers=workers), options=options)
    pb_grpc.add_DeviceServicer_to_server(DeviceService(coordinator), server)
    pb_grpc.add_OperatorServicer_to_server(OperatorService(coordinator, token_sha256), server)
    try:
        if credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials)
    except RuntimeError:  # grpcio's "Failed to bind"
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {listen}: the address is in use (another coordinator?) "
                      "or not available here")
    coordinator.start()
    server.start()
    return server, coordinator, port
