"""The coordinator's gRPC edge: the Device and Operator services over a :class:`Coordinator`.

This module and :mod:`.handlers` are the only ones that speak gRPC. This one turns parsed
requests into the coordinator's calls and rows into messages; :mod:`.handlers` receives each
request as raw bytes, refuses one over its method's size limit or not a well-formed message
(INVALID_ARGUMENT), turns every :class:`~fedsketch.server.errors.Refusal` (the service's and
the store's) into a status with its message (:data:`.handlers.STATUS`), and anything else (a bug)
into INTERNAL with an error id that the coordinator logs with the traceback. Messages larger
than the transport's limit are refused by gRPC itself (RESOURCE_EXHAUSTED). Operator calls need
``authorization: Bearer <token>`` metadata matching the operator token (UNAUTHENTICATED without
one, PERMISSION_DENIED for a wrong one); a device reads studies and results with a signed read
(``DeviceRead``), judged by :mod:`.reads`, which says who reads what.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc

from fedsketch.common.net.tls import MAX_MESSAGE_BYTES, ServerTLS
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import wire as secagg_wire
from fedsketch.server.errors import Code, Refusal
from fedsketch.server.service.accounting import declared_budget
from fedsketch.server.service.coordinator import Coordinator
from fedsketch.server.service.events import EventStore
from fedsketch.server.service.handlers import add_service
from fedsketch.server.service.messages import (
    ReadMessage,
    RefusalMessage,
    RegistrationMessage,
    StageMessage,
    Submission,
)
from fedsketch.server.service.operator_view import REASONS, audit_reply, status_reply
from fedsketch.server.service.study_wire import STUDY_STATES, plain_stage, result_message, study_message
from fedsketch.server.store.base import Store

__all__ = ["STUDY_STATES", "DeviceService", "OperatorService", "build_server"]


def _read(method: str, request: pb.DeviceRead) -> ReadMessage:
    """The signed read of a Device ``method`` (:mod:`.reads` judges it)."""
    return ReadMessage(method, request.device_id, request.study_id, request.signed_at,
                       request.signature, request.audience, request.format)


def _stage_message(request: pb.SecAggMessage) -> StageMessage:
    """The stage message of a request; INVALID_ARGUMENT for a number that is no ``Stage`` of the
    proto (proto3 lets any int32 through; the signature covers the stage as an unsigned 32-bit
    number). A known stage that is not open is the round's to refuse (FAILED_PRECONDITION)."""
    if request.stage not in pb.Stage.values():
        names = ", ".join(pb.Stage.Name(s) for s in secagg_wire.STAGES)
        raise Refusal(Code.INVALID_ARGUMENT, f"stage {request.stage} is not a stage of the protocol "
                      f"(a secure-aggregation study runs {names})")
    return StageMessage(request.study_id, request.device_id, request.stage, bytes(request.body),
                        request.signature)


class DeviceService:
    """What devices call."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.c = coordinator

    def Enroll(self, request, context):  # noqa: N802 (gRPC method names)
        """Trade a one-time token for a device id bound to the public key."""
        budget = declared_budget(request.budget_epsilon, request.budget_delta)
        return pb.EnrollResponse(device_id=self.c.enroll(request.token, bytes(request.public_key),
                                                         request.label, budget))

    def ListStudies(self, request, context):  # noqa: N802
        """The accepting studies the signing device may join."""
        rows = self.c.read_studies(_read("ListStudies", request))
        return pb.ListStudiesResponse(studies=[study_message(r, self.c.round_of(r.study_id)) for r in rows])

    def GetStudy(self, request, context):  # noqa: N802
        """One study the signing device may read."""
        row = self.c.read_study(_read("GetStudy", request))
        return study_message(row, self.c.round_of(row.study_id))

    def Register(self, request, context):  # noqa: N802
        """Join a plain study's roster."""
        duplicate, row, seconds = self.c.register(RegistrationMessage(
            request.study_id, request.device_id, request.spec_sha256, request.signature,
            not request.join_only))
        return pb.RegisterReply(duplicate=duplicate, stage=plain_stage(row),
                                registered=row.registered, input_seconds=seconds)

    def Leave(self, request, context):  # noqa: N802
        """Leave a plain study's roster before contributing."""
        left, row = self.c.leave(RegistrationMessage(
            request.study_id, request.device_id, request.spec_sha256, request.signature))
        return pb.LeaveReply(left=left, registered=row.registered)

    def Submit(self, request, context):  # noqa: N802
        """One signed contribution."""
        kind = request.WhichOneof("payload")
        duplicate, receipt = self.c.submit(Submission(
            request.study_id, request.device_id, request.n, request.spec_sha256, kind,
            b"" if kind is None else getattr(request, kind), request.signature))
        return pb.SubmitReply(duplicate=duplicate, receipt=receipt)

    def SecAggSend(self, request, context):  # noqa: N802
        """One signed secure-aggregation stage message."""
        return pb.SecAggAck(duplicate=self.c.send_stage(_stage_message(request)))

    def SecAggFetch(self, request, context):  # noqa: N802
        """What the coordinator routes to this device for the open stage."""
        return pb.SecAggBundle(stage=request.stage, body=self.c.fetch_stage(_stage_message(request)))

    def SecAggAbort(self, request, context):  # noqa: N802
        """A device's abort statement of a failed secure round; the certificate collected so far."""
        rows, final = self.c.abort_round(request.study_id, request.device_id, request.audience,
                                         request.round_sha256, request.signature)
        return pb.AbortCertificate(study_id=request.study_id, final=final, statements=[
            pb.AbortStatement(study_id=request.study_id, device_id=r.device_id, audience=r.audience,
                              signature=r.signature, round_sha256=r.round_sha256) for r in rows])

    def ReportRefusal(self, request, context):  # noqa: N802
        """A device's signed reason for declining a study; INVALID_ARGUMENT for a number that is
        no ``RefusalReason`` (or UNSPECIFIED)."""
        if request.reason not in REASONS:
            raise Refusal(Code.INVALID_ARGUMENT, f"reason {request.reason} is not a refusal reason "
                          f"({', '.join(pb.RefusalReason.Name(c) for c in REASONS)})")
        duplicate = self.c.report_refusal(RefusalMessage(
            request.study_id, request.device_id, request.spec_sha256, REASONS[request.reason],
            request.reason, request.signature))
        return pb.RefusalAck(duplicate=duplicate)

    def GetResult(self, request, context):  # noqa: N802
        """The published result of a done study the signing device contributed to."""
        return result_message(request.study_id, *self.c.read_result(_read("GetResult", request)))

    def GetAccount(self, request, context):  # noqa: N802
        """What the coordinator counts against the signing device's declared budget."""
        acc = self.c.read_account(_read("GetAccount", request))
        eps, delta = acc.budget or (0.0, 0.0)
        charged = acc.charged
        return pb.Account(budget_epsilon=eps, budget_delta=delta, charged_epsilon=charged[0],
                          charged_delta=charged[1], charges=[
                              pb.Charge(study_id=c.study_id, epsilon=c.epsilon, delta=c.delta,
                                        secure=c.secure, running=c.running)
                              for c in acc.charges])


class OperatorService:
    """Admin calls; each checks the bearer token first."""

    def __init__(self, coordinator: Coordinator, token_sha256: str) -> None:
        self.c = coordinator
        self._token_sha256 = token_sha256

    def _authorize(self, context) -> None:
        header = dict(context.invocation_metadata()).get("authorization", "")
        if not header.startswith("Bearer "):
            raise Refusal(Code.UNAUTHENTICATED, "operator credential required: "
                          "`authorization: Bearer <operator token>` metadata")
        digest = hashlib.sha256(header[len("Bearer "):].encode()).hexdigest()
        if not hmac.compare_digest(digest, self._token_sha256):
            raise Refusal(Code.PERMISSION_DENIED, "bad operator credential")

    def CreateStudy(self, request, context):  # noqa: N802
        self._authorize(context)
        return study_message(self.c.create(request.spec_json))

    def ListStudies(self, request, context):  # noqa: N802
        self._authorize(context)
        rows = self.c.studies(include_closed=request.include_closed)
        return pb.ListStudiesResponse(studies=[study_message(r, self.c.round_of(r.study_id)) for r in rows])

    def ShowStudy(self, request, context):  # noqa: N802
        self._authorize(context)
        return study_message(self.c.study(request.study_id), self.c.round_of(request.study_id))

    def GetResult(self, request, context):  # noqa: N802
        self._authorize(context)
        return result_message(request.study_id, *self.c.result(request.study_id))

    def CloseStudy(self, request, context):  # noqa: N802
        self._authorize(context)
        return study_message(self.c.close(request.study_id, "closed by the operator"))

    def IssueTokens(self, request, context):  # noqa: N802
        self._authorize(context)
        return pb.IssueTokensReply(tokens=self.c.issue_tokens(request.count))

    def StudyStatus(self, request, context):  # noqa: N802
        self._authorize(context)
        return status_reply(self.c, request.study_id, request.limit)

    def Audit(self, request, context):  # noqa: N802
        self._authorize(context)
        return audit_reply(self.c, request.limit, request.study_id)


def build_server(store: Store, token_sha256: str, listen: str, tls: ServerTLS | None,
                 workers: int = 16, interceptors: Sequence[grpc.ServerInterceptor] = (),
                 add_more: Callable[[grpc.Server], None] | None = None,
                 helper_token: str | None = None) -> tuple[grpc.Server, Coordinator, int]:
    """A started gRPC server with both services on ``listen``; returns (server, coordinator,
    bound port). ``tls`` None means plaintext (the explicit ``--insecure`` opt-out); else a
    device's read must be signed for one of its certificate's names (:mod:`.reads`).
    ``interceptors`` see every call (the console's metrics); ``add_more`` adds other services
    before the server starts (the console's health service); ``helper_token`` is what the
    coordinator shows the helper of a study validated by one (None: it creates no such study)."""
    names = None if tls is None else tls.names
    coordinator = Coordinator(EventStore(store), names)  # each event the operator watches, logged
    coordinator.helper_token = helper_token
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
               ("grpc.so_reuseport", 0)]  # a second server on a busy address fails to bind
    server = grpc.server(ThreadPoolExecutor(max_workers=workers), options=options,
                         interceptors=list(interceptors))
    add_service(server, "Device", DeviceService(coordinator))
    add_service(server, "Operator", OperatorService(coordinator, token_sha256))
    if add_more is not None:
        add_more(server)
    try:
        if tls is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, tls.credentials)
    except RuntimeError:  # grpcio's "Failed to bind"
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {listen}: the address is in use (another coordinator?) "
                      "or not available here")
    coordinator.start()
    server.start()
    return server, coordinator, port
