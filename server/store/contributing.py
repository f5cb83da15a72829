"""Contributions in the SQL store, for every backend, stored by group commit.

A mixin of :class:`~fedsketch.server.store.sql.SQLStore` (which provides ``_tx``, ``_query``,
``_log``, ``_study`` and the roster readers); the contract is
:meth:`~fedsketch.server.store.base.Store.add_contribution`'s. Each call waits in a
:class:`~.group_commit.GroupCommit` keyed by :meth:`_batch_key` (the study: the key of the
write transaction); the batch's leader stores every queued contribution in **one** transaction
and each caller gets its own outcome once that transaction is durable.

One contribution is judged and written by :meth:`_admit` (reads only: every refusal is raised
there, before anything is written) and then :meth:`_insert` (writes only), both inside the
batch's transaction and after the contributions queued before it, so each sees what those
wrote: a batch is exactly the same contributions stored one after the other, in arrival order.
Two Submits of one device in one batch: the second is a duplicate (same bytes and n: nothing
written) or refused 'conflict'; a roster's last place, a declared budget's last ε, a study's
close are met by the first contribution in order, as one commit each would meet them. A
refusal of one contribution writes nothing and leaves the others of its batch alone; a failure
of the transaction (a fault of the file or server) stores none of them and every caller gets it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import replace

from fedsketch.server.errors import Code
from fedsketch.server.store import accounts
from fedsketch.server.store.base import (
    ACCEPTING,
    COLLECT,
    KINDS,
    ContributionRow,
    StoreError,
    StudyRow,
)
from fedsketch.server.store.group_commit import GroupCommit
from fedsketch.server.store.schema import CONTRIBUTION_COLUMNS, Connection

#: The lock a write that counts against a device's declared budget also takes (its id follows).
DEVICE_KEY = "device:"
#: What :meth:`Contributions._admit` reads of a contribution's device, study and roster at once.
_ADMIT = """SELECT EXISTS (SELECT 1 FROM devices WHERE device_id = ?),
    (SELECT payload_sha256 FROM contributions WHERE study_id = ? AND device_id = ?),
    (SELECT n FROM contributions WHERE study_id = ? AND device_id = ?),
    EXISTS (SELECT 1 FROM registrations WHERE study_id = ? AND device_id = ?)"""


class Contributions:
    """The contribution methods of :class:`~fedsketch.server.store.base.Store` in SQL."""

    _group: GroupCommit[ContributionRow, tuple[bool, StudyRow | None]]

    def _start_group_commit(self) -> None:
        """Create the batcher (a backend's ``__init__`` calls it)."""
        self._group = GroupCommit(self._commit_contributions)

    def _batch_key(self, study_id: str) -> Hashable:
        """Which contributions may share a transaction: those of one study (its ``_tx`` key);
        SQLite, whose writes are all serialized, overrides it to batch every study together."""
        return study_id

    def _also_lock_devices(self, c: Connection, device_ids: Sequence[str]) -> None:
        """Inside the batch's transaction, after its study's lock, the lock of every device of
        the batch (``DEVICE_KEY``), in one fixed order so that two batches never wait for each
        other's: a no-op where every write is serialized (SQLite)."""

    def add_contribution(self, row: ContributionRow) -> bool:
        return self.contribute(row)[0]

    def contribute(self, row: ContributionRow) -> tuple[bool, StudyRow | None]:
        if row.kind not in KINDS:
            raise ValueError(f"unknown contribution kind {row.kind!r}; expected one of {KINDS}")
        return self._group.submit(self._batch_key(row.study_id), row)

    def _commit_contributions(self, key: Hashable, rows: Sequence[ContributionRow],
                              ) -> list[tuple[bool, StudyRow | None] | BaseException]:
        """Store ``rows`` (queued on ``key``) in one transaction; each one's outcome: (True, the
        study after it), (False, None) for an identical re-send, or the StoreError that refused
        it."""
        outcomes: list[tuple[bool, StudyRow | None] | BaseException] = []
        studies: dict[str, StudyRow] = {}  # as this transaction left them (only it writes them)
        with self._tx(rows[0].study_id) as c:  # SQLite ignores the key; PostgreSQL batches a study
            self._also_lock_devices(c, sorted({r.device_id for r in rows}))
            for row in rows:
                try:
                    study = self._admit(c, row, studies.get(row.study_id))
                except StoreError as exc:  # nothing written for it; the others go on
                    outcomes.append(exc)
                    continue
                if study is None:
                    outcomes.append((False, None))
                else:
                    studies[row.study_id] = self._insert(c, row, study)
                    outcomes.append((True, studies[row.study_id]))
        return outcomes

    def _admit(self, c: Connection, row: ContributionRow, study: StudyRow | None) -> StudyRow | None:
        """The study ``row`` goes into if it is new, None for an identical re-send; raises the
        StoreError that refuses it (``Store.add_contribution``). Reads only, the device, its
        earlier contribution and its place on the roster in one statement (each statement is a
        round trip to a PostgreSQL server); ``study``, if given, is the study as this
        transaction's last write to it left it."""
        study = study or self._study(c, row.study_id)
        device, prior_sha, prior_n, in_roster = c.execute(_ADMIT, (
            row.device_id, row.study_id, row.device_id, row.study_id, row.device_id, row.study_id,
            row.device_id)).fetchone()
        if not device:
            raise StoreError(Code.NOT_FOUND, f"no enrolled device {row.device_id!r}")
        if prior_sha is not None:  # checked before the state: a lost ack is re-acknowledged
            if (prior_sha, prior_n) == (row.payload_sha256, row.n):
                return None
            raise StoreError(
                Code.CONFLICT,
                f"device {row.device_id!r} already contributed different bytes to study {row.study_id!r}",
            )
        if study.state not in ACCEPTING:
            message = f"study {row.study_id!r} is {study.state!r} and accepts no contributions"
            raise StoreError(Code.FAILED_PRECONDITION, message)
        if not in_roster:
            raise StoreError(Code.PERMISSION_DENIED, f"device {row.device_id!r} is not in the "
                             f"roster of study {row.study_id!r}")
        if not study.roster_full:
            raise StoreError(Code.FAILED_PRECONDITION, f"study {row.study_id!r} is still "
                             f"registering ({study.registered} of {study.min_devices} devices)")
        if study.closing is not None and not self._holds_ticket(c, row.study_id, row.device_id):
            raise StoreError(Code.FAILED_PRECONDITION, f"study {row.study_id!r} is closing and "
                             f"takes input only from devices holding a live input ticket")
        cost = None if row.epsilon is None else (row.epsilon, row.delta or 0.0)
        accounts.check(c, row.device_id, row.study_id, cost)
        return study

    def _insert(self, c: Connection, row: ContributionRow, study: StudyRow) -> StudyRow:
        """Write an admitted ``row``: the contribution, the study's totals (and its COLLECT
        transition), the audit row; the study as they leave it."""
        c.execute(
            f"INSERT INTO contributions ({CONTRIBUTION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (row.study_id, row.device_id, row.n, row.kind, bytes(row.payload), row.payload_sha256,
             bytes(row.signature), row.received_at, row.epsilon, row.delta),
        )
        state = COLLECT.target if study.state in COLLECT.sources else study.state
        c.execute("UPDATE studies SET contributed = contributed + 1, records = records + ?, state = ? "
                  "WHERE study_id = ?", (row.n, state, row.study_id))
        self._log(c, row.device_id, "contribute",
                  f"study {row.study_id!r} n={row.n} payload_sha256 {row.payload_sha256}")
        return replace(study, state=state, contributions=study.contributions + 1,
                       records=study.records + row.n)

    def contributions(self, study_id: str) -> list[ContributionRow]:
        rows = self._query(
            f"SELECT {CONTRIBUTION_COLUMNS} FROM contributions WHERE study_id = ?"
            " ORDER BY received_at, device_id",
            (study_id,),
        )
        return [ContributionRow(*r) for r in rows]
