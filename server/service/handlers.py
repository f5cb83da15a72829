"""How the coordinator's gRPC methods take their requests: as raw bytes, parsed here.

gRPC is given no request deserializer (it hands over the bytes as they came), so that every
untrusted byte is judged by the coordinator's own code, in this order:

1. the size: over the method's :data:`MAX_REQUEST_BYTES` → INVALID_ARGUMENT, before any parsing
   (gRPC's own transport cap, :data:`~fedsketch.common.net.tls.MAX_MESSAGE_BYTES`, still answers
   RESOURCE_EXHAUSTED above 4 MiB);
2. the protobuf: ``FromString`` of the method's request type; bytes that are not one →
   INVALID_ARGUMENT naming the type. (grpcio's generated path, which parses in its own
   deserializer, answered garbage with a generic INTERNAL and kept about 16 KB per such request:
   issue 12, finding 1; ``benchmarks/bench_garbage.py`` measures both.)
3. the method: a :class:`~fedsketch.server.errors.Refusal` raised anywhere below becomes its
   status (:data:`STATUS`) with its message; a store that cannot read or write
   (:class:`~fedsketch.server.store.faults.StoreUnavailable`: a full disk, a read-only or failing
   file, a lost database) answers RESOURCE_EXHAUSTED (full) or UNAVAILABLE with the cause, and
   the server logs the cause and the file (nothing of the request was stored; the client
   retries); anything else is a bug: the client gets INTERNAL with a short error id, and the
   server logs that id with the traceback. No reply is UNKNOWN and no traceback reaches a client.

The methods, and their request and response types, are read from the proto's service
descriptors, so a method added to the proto without a size limit or an implementation fails
at start-up rather than answering UNIMPLEMENTED.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable

import grpc
from google.protobuf.message import DecodeError, Message

from fedsketch.common.net.tls import MAX_MESSAGE_BYTES
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.server.errors import Code, Refusal
from fedsketch.server.store.faults import StoreUnavailable

log = logging.getLogger("fedsketch.coordinator")

#: The proto package of the services.
PACKAGE = "fedsketch.v1"

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

#: Bytes of a request made only of ids (a study id is 19 characters, a device id 20), a hex
#: SHA-256 (64), an Ed25519 signature (64), an enrollment token (32) or key (32), a few numbers,
#: and a device's label: 4 KiB leaves the label about 3.8 KB of the free text an owner gives.
ENVELOPE_BYTES = 4 * 1024
#: Bytes of a study spec: its JSON grows with d (lo and hi, 2d numbers of at most 25 characters
#: each); 1 MiB holds the spec of a study with d up to 20,000.
SPEC_BYTES = 1024 * 1024
#: The most each method accepts, before parsing. Submit and SecAggSend carry a sketch: 2m words
#: of 8 bytes (int64 pairs of a complex sketch, a MASKED_INPUT's uint64 words; int32 pairs of a
#: plain quantized one), so they take all the transport allows, and a study whose sketch would
#: not fit is refused at creation (:data:`.coordinator.MAX_SKETCH_BYTES`: m up to 261,888 at 8
#: bytes a word). SHARE_KEYS and UNMASK bodies (one ciphertext or share per neighbour) are
#: smaller than a sketch.
MAX_REQUEST_BYTES: dict[str, int] = {
    "Device/Enroll": ENVELOPE_BYTES,
    "Device/ListStudies": ENVELOPE_BYTES,
    "Device/GetStudy": ENVELOPE_BYTES,
    "Device/Register": ENVELOPE_BYTES,
    "Device/Leave": ENVELOPE_BYTES,
    "Device/Submit": MAX_MESSAGE_BYTES,
    "Device/GetResult": ENVELOPE_BYTES,
    "Device/SecAggSend": MAX_MESSAGE_BYTES,
    "Device/SecAggFetch": ENVELOPE_BYTES,  # its body is empty
    "Device/ReportRefusal": ENVELOPE_BYTES,
    "Device/SecAggAbort": ENVELOPE_BYTES,
    "Device/GetAccount": ENVELOPE_BYTES,
    "Operator/CreateStudy": SPEC_BYTES,
    "Operator/ListStudies": ENVELOPE_BYTES,
    "Operator/ShowStudy": ENVELOPE_BYTES,
    "Operator/GetResult": ENVELOPE_BYTES,
    "Operator/CloseStudy": ENVELOPE_BYTES,
    "Operator/IssueTokens": ENVELOPE_BYTES,
    "Operator/StudyStatus": ENVELOPE_BYTES,
    "Operator/Audit": ENVELOPE_BYTES,
    # the helper's service (fedsketch.server.helper): a device's share is four short fields; the
    # coordinator's calls carry one entry per report (Aggregate: its verifier shares, about 6 kB
    # a report at m = 1000), up to what the helper's server accepts (HELPER_MESSAGE_BYTES)
    "Helper/Upload": ENVELOPE_BYTES,
    "Helper/CloseCollection": ENVELOPE_BYTES,
    "Helper/Prepare": 64 * 1024 * 1024,
    "Helper/Aggregate": 64 * 1024 * 1024,
}
#: Longest status message sent (a refusal may quote a client's field; gRPC carries the message
#: in a trailer, which clients cap at 8 KiB by default).
MAX_DETAILS = 1000

#: What a method does with its parsed request: the response, or a raised Refusal.
Behaviour = Callable[[Message, grpc.ServicerContext], Message]


def message_type(name: str) -> type[Message]:
    """The generated class of the proto message ``name`` (e.g. ``fedsketch.v1.Contribution``)."""
    return getattr(pb, name.removeprefix(PACKAGE + "."))


def _server(path: str) -> str:
    """Who answers ``path``: the helper for its own service, else the coordinator."""
    return "helper" if path.startswith("Helper/") else "coordinator"


def _short(text: str) -> str:
    return text if len(text) <= MAX_DETAILS else text[:MAX_DETAILS] + "…"


def unary(path: str, request_type: type[Message], response_type: type[Message],
          behaviour: Behaviour, max_bytes: int) -> grpc.RpcMethodHandler:
    """A unary handler for the method ``path`` ("Service/Method") that receives raw bytes and
    judges them as the module docstring says."""
    what = request_type.DESCRIPTOR.full_name

    def handle(raw: bytes, context: grpc.ServicerContext) -> Message:
        try:
            if len(raw) > max_bytes:
                raise Refusal(Code.INVALID_ARGUMENT, f"{path} takes requests of at most "
                              f"{max_bytes} bytes; this one has {len(raw)}")
            try:
                request = request_type.FromString(raw)
            except DecodeError:
                raise Refusal(Code.INVALID_ARGUMENT, f"the request is not a well-formed {what} "
                              "message (protobuf wire format, UTF-8 strings)") from None
            return behaviour(request, context)
        except Refusal as exc:
            status, details = STATUS[exc.code], exc.message
        except StoreUnavailable as exc:
            log.error("store fault in %s: %s (at %s); the request was not stored", path,
                      exc.cause, exc.where)
            status = grpc.StatusCode.RESOURCE_EXHAUSTED if exc.full else grpc.StatusCode.UNAVAILABLE
            details = exc.for_client()
        except Exception:  # a bug: the client gets an id to quote, the log gets the traceback
            error_id = secrets.token_hex(4)
            log.exception("internal error %s in %s", error_id, path)
            status, details = grpc.StatusCode.INTERNAL, (
                f"internal error {error_id} in the {_server(path)}; its operator finds the "
                f"cause under this id in the {_server(path)}'s log")
        context.abort(status, _short(details))

    return grpc.unary_unary_rpc_method_handler(handle, request_deserializer=None,
                                               response_serializer=response_type.SerializeToString)


def add_service(server: grpc.Server, service: str, servicer: object) -> None:
    """Register every method of the proto's ``service`` ("Device", "Operator") on ``server``,
    each answered by the servicer's method of the same name through :func:`unary`.
    AttributeError or KeyError (at start-up) if the servicer lacks a method or the method has
    no size limit."""
    descriptor = pb.DESCRIPTOR.services_by_name[service]
    handlers = {
        m.name: unary(f"{service}/{m.name}", message_type(m.input_type.full_name),
                      message_type(m.output_type.full_name), getattr(servicer, m.name),
                      MAX_REQUEST_BYTES[f"{service}/{m.name}"])
        for m in descriptor.methods
    }
    name = descriptor.full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)
