"""Group commit: writes that arrive while a commit is in flight are made in the next one.

A durable commit costs one flush of the log to disk (SQLite's WAL with ``synchronous=FULL``
fsyncs it; PostgreSQL's WAL with ``fsync`` on does the same), a fixed time t_c of the order of
a millisecond whatever the transaction holds, where the statements of one contribution take
tens of microseconds. One commit per write caps a store at 1/t_c writes/s; a commit of every
write waiting for it serves B writes per flush, so the rate under load is about B/(t_c + B·t_w)
with t_w the statements' time of one write.

:class:`GroupCommit` is the leader/follower scheme: a caller whose key has no batch in flight
becomes the *leader*, takes every item queued on its key (at most ``limit``) and runs them in
one call of ``commit`` (the store's: one transaction, durable before it returns); the callers
that queued meanwhile wait. When the commit returns, each item's outcome (its value, or the
exception it alone raised) goes to its caller, and the first caller queued since becomes the
next leader. If ``commit`` itself raises (the transaction failed, the disk is full, the
connection died), nothing of the batch was written and every caller of the batch gets that
exception: no caller is told "stored" before its write is durable, and none is told "refused"
for a write that is stored. Items are handed to ``commit`` in the order they queued, so a batch
is the same as the writes made one after the other in that order.

A caller waits on a bare lock of its own (taken when it queues, released once by whoever hands
it its outcome or the lead): one C call to wake it, where a :class:`threading.Event` costs a
condition, its lock and a list of waiters in Python on both sides (the leader of a batch of B
wakes B − 1 callers; a profile of the coordinator under load showed the events' ``set`` at 15 %
of its GIL-held time).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: The most items one commit takes (bounds a transaction's size and a batch's latency).
LIMIT = 256


class _Waiter(Generic[T, R]):
    """One caller's item, its outcome once committed, and the event that wakes it."""

    __slots__ = ("done", "error", "item", "lock", "value")

    def __init__(self, item: T) -> None:
        self.item = item
        self.lock = threading.Lock()
        self.lock.acquire()  # held until the caller is woken: ``wait`` blocks, ``wake`` releases
        self.done = False
        self.value: R | None = None
        self.error: BaseException | None = None

    def wait(self) -> None:
        self.lock.acquire()

    def wake(self) -> None:
        self.lock.release()

    def outcome(self) -> R:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


class GroupCommit(Generic[T, R]):
    """Runs ``commit(key, items)`` for batches of the items submitted on ``key``; ``commit``
    returns one outcome per item, in order: a value, or an exception that item raises."""

    def __init__(self, commit: Callable[[Hashable, Sequence[T]], list[R | BaseException]],
                 limit: int = LIMIT) -> None:
        self._commit = commit
        self._limit = limit
        self._lock = threading.Lock()
        self._queues: dict[Hashable, list[_Waiter[T, R]]] = {}
        self._busy: set[Hashable] = set()  # keys with a leader at work

    def submit(self, key: Hashable, item: T) -> R:
        """``item``'s outcome once the commit holding it is durable (or its exception)."""
        waiter: _Waiter[T, R] = _Waiter(item)
        with self._lock:
            self._queues.setdefault(key, []).append(waiter)
            leading = key not in self._busy
            self._busy.add(key)
        if not leading:
            waiter.wait()
            if waiter.done:
                return waiter.outcome()
        self._lead(key)  # this caller leads the next batch, which holds its item
        return waiter.outcome()

    def _lead(self, key: Hashable) -> None:
        """Commit the first ``limit`` items queued on ``key``, hand out their outcomes and pass
        the lead to the first caller still queued (or free the key)."""
        with self._lock:
            queue = self._queues[key]
            batch, rest = queue[:self._limit], queue[self._limit:]
            if rest:
                self._queues[key] = rest
            else:
                del self._queues[key]
        try:
            outcomes = self._commit(key, [w.item for w in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"group commit: {len(outcomes)} outcomes for {len(batch)} items")
        except BaseException as exc:  # nothing of the batch was written: each caller learns why
            outcomes = [exc] * len(batch)
        for waiter, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                waiter.error = outcome
            else:
                waiter.value = outcome
            waiter.done = True
        with self._lock:
            queue = self._queues.get(key)
            if queue:
                queue[0].wake()  # not done: it leads the next batch
            else:
                self._busy.discard(key)
        for waiter in batch:  # the leader's own lock is held too (never waited on, or re-taken)
            waiter.wake()
