"""The coordinator's event log: one structured line for each thing an operator watches.

:class:`EventStore` wraps the coordinator's :class:`~fedsketch.server.store.base.Store`; after
each write that returned (so the event is durable), it logs one record on the logger
``fedsketch.events`` whose ``event`` attribute names what happened and whose ``fields`` hold
ids and public numbers only, never a payload, a record count or a label:

==========  ===================================================================================
create      a study or refinement round opened: ``study``, ``parent``, ``quorum``, ``roster``,
            ``deadline`` (Unix seconds)
enroll      a device enrolled: ``device``
register    a device joined a roster: ``study``, ``device``, ``registered`` (after), ``quorum``,
            ``roster``
leave       a device left a roster: ``study``, ``device``, ``registered`` (after)
contribute  a contribution was stored: ``study``, ``device``
refusal     a device reported why it declined: ``study``, ``device``, ``reason``
closing     a close was requested and waits for devices holding an input ticket: ``study``,
            ``reason``
state       a study changed state: ``study``, ``state`` (the new one), ``detail``
stage       a secure-aggregation stage opened: ``study``, ``stage`` (its name)
message     a device's secure-aggregation stage message was stored: ``study``, ``device``,
            ``stage`` (its name)
==========  ===================================================================================

Idempotent re-sends (a registration, contribution or refusal the store already held) log
nothing, so a line is one event. Coordinators sharing a database (``--shared``) each log the
events of the writes they made; the ``state`` event of a study's first contribution (``open`` →
``collecting``, made inside the store's write) comes from the coordinator that stored it: one
that did not create the study, or whose study another one moved, reads its state before its
first contribution to it (two coordinators storing a study's first two contributions at the
same moment may both log it). How a record is written (key=value text or JSON lines) is the
log handler's business: :mod:`fedsketch.server.cli.logformat`.

A ``contribute`` line is *deferred*: the Submit that stored it only appends (time, event,
fields) to a queue, and a thread of the log's own (``event-log``) writes what is queued about
:data:`DEFER_SECONDS` after the first of a burst, with the time of the store's write, so a
Submit's thread spends no time in :mod:`logging` (its record, its formatting, the handler's
lock and the write to stderr cost 18 % of the coordinator's time under load, RESULTS.md §22).
Every other event is logged at once, after writing out what is queued, so the log keeps the
order the events happened in (a study's ``state`` ``collecting`` after its first
``contribute``). The queue is written out at exit; a coordinator killed with SIGKILL may not
have logged the contributions of its last moments, which its database holds (its audit log).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import deque
from typing import Any

from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.server.store.base import COLLECT, ContributionRow, Store, StudyRow

log = logging.getLogger("fedsketch.events")


#: Seconds the log's thread waits after the first deferred event of a burst, to write the
#: others of the burst with it.
DEFER_SECONDS = 0.05

_pending: deque[tuple[float, str, dict[str, Any]]] = deque()  # deferred, oldest first
_wanted = threading.Event()  # set when a deferred event waits for the log's thread
_order = threading.Lock()  # one writer at a time: the log keeps the events' order
_writer: list[threading.Thread] = []  # the log's thread, once started


def emit(event: str, **fields: Any) -> None:
    """Log one event now (after the deferred ones before it): the message is ``event``; the
    record carries ``event`` and ``fields``."""
    with _order:
        _write_pending()
        log.info(event, extra={"event": event, "fields": fields})


def defer(event: str, **fields: Any) -> None:
    """Queue one event for the log's thread (module docstring), stamped with the time now."""
    _pending.append((time.time(), event, fields))
    if not _wanted.is_set():
        if not _writer:
            _start_writer()
        _wanted.set()


def flush() -> None:
    """Write every deferred event now (at exit; and before any event logged at once)."""
    with _order:
        _write_pending()


def _write_pending() -> None:
    """Log the queued events in order, each with its own time (the caller holds ``_order``)."""
    while _pending:
        created, event, fields = _pending.popleft()
        if not log.isEnabledFor(logging.INFO):
            continue
        record = log.makeRecord(log.name, logging.INFO, "(deferred)", 0, event, (), None,
                                extra={"event": event, "fields": fields})
        record.created, record.msecs = created, (created % 1) * 1000
        log.handle(record)


def _start_writer() -> None:
    with _order:
        if not _writer:
            _writer.append(threading.Thread(target=_write_bursts, name="event-log", daemon=True))
            _writer[0].start()


def _write_bursts() -> None:
    while True:
        _wanted.wait()
        time.sleep(DEFER_SECONDS)
        _wanted.clear()
        flush()


atexit.register(flush)
os.register_at_fork(after_in_child=_writer.clear)  # a forked child starts a thread of its own


class EventStore:
    """A :class:`Store` that logs an event after each write the operator watches (module
    docstring); every other call goes to the wrapped store unchanged."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        #: Studies in state "open": their first stored contribution moves them to "collecting"
        #: inside the store's write (COLLECT), which returns no state.
        self._open = {row.study_id for row in store.list_studies(COLLECT.sources)}
        #: Under ``--shared``: studies known to have left "open" (no state read before a
        #: contribution to them).
        self._moved: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def create_study(self, study_id: str, *args: Any, **kwargs: Any) -> StudyRow:
        row = self._store.create_study(study_id, *args, **kwargs)
        with self._lock:
            self._open.add(study_id)
        emit("create", study=study_id, parent=row.parent, quorum=row.min_devices,
             roster=row.capacity, deadline=row.deadline)
        return row

    def enroll(self, token: str, public_key: bytes, label: str,
               budget: tuple[float, float] | None = None) -> str:
        device_id = self._store.enroll(token, public_key, label, budget)
        emit("enroll", device=device_id)
        return device_id

    def register(self, study_id: str, device_id: str,
                 cost: tuple[float, float] | None = None) -> tuple[bool, StudyRow]:
        added, row = self._store.register(study_id, device_id, cost)
        if added:
            emit("register", study=study_id, device=device_id, registered=row.registered,
                 quorum=row.min_devices, roster=row.capacity)
        return added, row

    def leave(self, study_id: str, device_id: str) -> tuple[bool, StudyRow]:
        left, row = self._store.leave(study_id, device_id)
        if left:
            emit("leave", study=study_id, device=device_id, registered=row.registered)
        return left, row

    def _recheck(self, study_id: str) -> None:
        """Under ``--shared``, read whether the study is still open (another coordinator may
        have created it, or stored its first contribution), unless it is known to have left."""
        with self._lock:
            if study_id in self._moved:
                return
        state = self._store.get_study(study_id).state
        with self._lock:
            if state in COLLECT.sources:
                self._open.add(study_id)
            else:
                self._open.discard(study_id)
                self._moved.add(study_id)

    def add_contribution(self, row: ContributionRow) -> bool:
        return self.contribute(row)[0]

    def contribute(self, row: ContributionRow) -> tuple[bool, StudyRow | None]:
        if self._store.shared:
            self._recheck(row.study_id)
        stored, study = self._store.contribute(row)
        if stored:
            with self._lock:
                first = row.study_id in self._open
                self._open.discard(row.study_id)
            defer("contribute", study=row.study_id, device=row.device_id)
            if first:
                emit("state", study=row.study_id, state=COLLECT.target, detail="")
        return stored, study

    def add_refusal(self, study_id: str, device_id: str, reason: str) -> bool:
        added = self._store.add_refusal(study_id, device_id, reason)
        if added:
            emit("refusal", study=study_id, device=device_id, reason=reason)
        return added

    def request_close(self, study_id: str, reason: str) -> StudyRow:
        row = self._store.request_close(study_id, reason)
        emit("closing", study=study_id, reason=row.closing)
        return row

    def set_state(self, study_id: str, state: str, detail: str = "",
                  expect: tuple[str, ...] | None = None) -> StudyRow:
        row = self._store.set_state(study_id, state, detail, expect)
        if state not in COLLECT.sources:
            with self._lock:
                self._open.discard(study_id)
        emit("state", study=study_id, state=row.state, detail=row.detail)
        return row

    def put_result(self, study_id: str, result_json: str) -> None:
        self._store.put_result(study_id, result_json)
        emit("state", study=study_id, state="done", detail="")

    def add_stage_message(self, study_id: str, stage: int, device_id: str, body: bytes,
                          cost: tuple[float, float] | None = None) -> bool:
        stored = self._store.add_stage_message(study_id, stage, device_id, body, cost)
        if stored:
            emit("message", study=study_id, device=device_id, stage=pb.Stage.Name(stage))
        return stored

    def open_stage(self, study_id: str, stage: int, opened_at: float) -> None:
        self._store.open_stage(study_id, stage, opened_at)
        emit("stage", study=study_id, stage=pb.Stage.Name(stage))

    def end_secure_round(self, study_id: str, *args: Any, **kwargs: Any) -> StudyRow:
        row = self._store.end_secure_round(study_id, *args, **kwargs)
        with self._lock:
            self._open.discard(study_id)
        emit("state", study=study_id, state=row.state, detail=row.detail)
        return row
