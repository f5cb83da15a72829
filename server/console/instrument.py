"""Where the process metrics (:class:`~.metrics.Metrics`) are counted: a store wrapper that times
every store call and counts what the operator watches, and a gRPC server interceptor that counts
every answered call by method and status code. Neither changes what it wraps: each call goes
through unchanged and its result or exception is returned or raised as it was.

:class:`MeteredStore` sits under the coordinator's :class:`~fedsketch.server.service.events.EventStore`,
so it sees every store call the coordinator makes:

- ``fedsketch_store_seconds{operation}`` for every call but ``claim`` (a lock, held for as
  long as its caller works), ``fedsketch_store_errors_total{operation}`` for one that failed with
  anything but a :class:`~fedsketch.server.errors.Refusal` (a refusal is an answer);
- ``fedsketch_contributions_total{kind}``, ``fedsketch_secure_messages_total{stage}`` and
  ``fedsketch_refusals_total{reason}`` for each stored contribution, stage message and refusal
  (an idempotent re-send is not counted: the store says it stored nothing);
- ``fedsketch_secure_stage_seconds{stage}``: when a stage opens (or the round ends), the stage
  that closed stayed open from the ``opened_at`` the store recorded for it (REGISTER: from the
  first registration this process stored; not observed under ``--shared``) to the new one's;
- ``fedsketch_secure_dropouts_total{stage}``: when a stage closes, the devices whose message of
  the stage before it this process stored but whose message of it did not come. Counted from the
  messages this process stored (a round it resumed after a restart undercounts); not counted
  under ``--shared``, where each coordinator stores only some of a round's messages;
- ``fedsketch_decode_seconds``: from a study's move to decoding to its result or failure, both
  made through this process (:data:`MAX_DECODING` starts remembered at most).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc

from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import wire as secagg_wire
from fedsketch.server.console.metrics import Metrics
from fedsketch.server.errors import Refusal
from fedsketch.server.store.base import ContributionRow, Store, StudyRow

#: Store methods not timed (module docstring).
UNTIMED = frozenset({"claim"})
#: Most decodings whose start is remembered (under ``--shared`` another coordinator may end one).
MAX_DECODING = 1000


class MeteredStore:
    """A :class:`Store` that feeds :class:`Metrics` (module docstring); every attribute is the
    wrapped store's."""

    def __init__(self, store: Store, metrics: Metrics) -> None:
        self._store = store
        self._m = metrics
        self._lock = threading.Lock()
        self._decoding: dict[str, float] = {}  # study → monotonic time it began decoding here
        self._sent: dict[str, dict[int, set[str]]] = {}  # study → stage → devices, this process's
        self._first_register: dict[str, float] = {}  # study → first REGISTER stored here (Unix s)

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if name.startswith("_") or name in UNTIMED or not callable(found):
            return found

        def timed(*args: Any, **kwargs: Any) -> Any:
            return self._timed(name, found, *args, **kwargs)

        return timed

    def _timed(self, operation: str, call, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        except Refusal:
            raise
        except Exception:
            self._m.store_errors.labels(operation).inc()
            raise
        finally:
            self._m.store_seconds.labels(operation).observe(time.perf_counter() - start)

    def add_contribution(self, row: ContributionRow) -> bool:
        return self.contribute(row)[0]

    def contribute(self, row: ContributionRow) -> tuple[bool, StudyRow | None]:
        stored, study = self._timed("add_contribution", self._store.contribute, row)
        if stored:
            self._m.contributions.labels(row.kind).inc()
        return stored, study

    def add_refusal(self, study_id: str, device_id: str, reason: str) -> bool:
        added = self._timed("add_refusal", self._store.add_refusal, study_id, device_id, reason)
        if added:
            self._m.refusals.labels(reason).inc()
        return added

    def add_stage_message(self, study_id: str, stage: int, device_id: str, body: bytes,
                          cost: tuple[float, float] | None = None) -> bool:
        stored = self._timed("add_stage_message", self._store.add_stage_message, study_id, stage,
                             device_id, body, cost)
        if stored:
            self._m.stage_messages.labels(pb.Stage.Name(stage)).inc()
            if self._store.shared:  # this process sees only some of the round's messages
                return stored
            with self._lock:
                self._sent.setdefault(study_id, {}).setdefault(stage, set()).add(device_id)
                if stage == secagg_wire.STAGES[0]:
                    self._first_register.setdefault(study_id, time.time())
        return stored

    def _stage_closed(self, study_id: str, now: float) -> None:
        """Observe the stage of ``study_id`` that closes at ``now`` (Unix seconds): its duration
        and its dropouts (module docstring)."""
        row = self._store.secure_round(study_id)
        with self._lock:
            if row is not None and row.ended:
                return
            stage = secagg_wire.STAGES[0] if row is None else row.stage
            opened = self._first_register.get(study_id) if row is None else row.opened_at
            sent = self._sent.get(study_id, {})
            index = secagg_wire.STAGES.index(stage)
            before = sent.get(secagg_wire.STAGES[index - 1], set()) if index else set()
            dropped = len(before - sent.get(stage, set()))
        name = pb.Stage.Name(stage)
        if opened is not None:
            self._m.stage_seconds.labels(name).observe(max(0.0, now - opened))
        if not self._store.shared:
            self._m.dropouts.labels(name).inc(dropped)

    def open_stage(self, study_id: str, stage: int, opened_at: float) -> None:
        self._stage_closed(study_id, opened_at)
        self._timed("open_stage", self._store.open_stage, study_id, stage, opened_at)

    def end_secure_round(self, study_id: str, *args: Any, **kwargs: Any) -> StudyRow:
        self._stage_closed(study_id, time.time())
        row = self._timed("end_secure_round", self._store.end_secure_round, study_id, *args, **kwargs)
        with self._lock:
            self._sent.pop(study_id, None)
            self._first_register.pop(study_id, None)
        self._decode_moved(row)
        return row

    def set_state(self, study_id: str, state: str, detail: str = "",
                  expect: tuple[str, ...] | None = None) -> StudyRow:
        row = self._timed("set_state", self._store.set_state, study_id, state, detail, expect)
        self._decode_moved(row)
        return row

    def put_result(self, study_id: str, result_json: str) -> None:
        self._timed("put_result", self._store.put_result, study_id, result_json)
        self._decode_moved(self._store.get_study(study_id))

    def _decode_moved(self, row: StudyRow) -> None:
        """A study moved: start its decoding clock, or observe the decoding it ended."""
        with self._lock:
            if row.state == "decoding":
                if len(self._decoding) >= MAX_DECODING:  # ended by another coordinator, or forgotten
                    del self._decoding[min(self._decoding, key=self._decoding.__getitem__)]
                self._decoding.setdefault(row.study_id, time.monotonic())
                return
            started = self._decoding.pop(row.study_id, None)
        if started is not None:
            self._m.decode_seconds.observe(time.monotonic() - started)


class RpcMetrics(grpc.ServerInterceptor):
    """Counts each unary call a registered method answered (``fedsketch_rpcs_total{method,
    code}``, ``fedsketch_rpc_seconds{method}``); ``method`` is "Service/Method" without the proto
    package. Calls to unknown methods, and streams (the health service's Watch), are not counted:
    their names are the caller's choice."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        service, _, method = handler_call_details.method.lstrip("/").partition("/")
        label = f"{service.rpartition('.')[2]}/{method}"
        behaviour = handler.unary_unary

        def counted(request, context):
            start = time.perf_counter()
            code = "OK"
            try:
                return behaviour(request, context)
            except BaseException:
                found = context.code()
                code = found.name if isinstance(found, grpc.StatusCode) else "UNKNOWN"
                raise
            finally:
                self._m.rpcs.labels(label, code).inc()
                self._m.rpc_seconds.labels(label).observe(time.perf_counter() - start)

        return grpc.unary_unary_rpc_method_handler(
            counted, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
