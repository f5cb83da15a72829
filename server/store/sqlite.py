"""The coordinator's durable state in one SQLite file in WAL mode: :class:`SQLiteStore`.

It is the shared :class:`fedsketch.server.store.sql.SQLStore` over one connection; every write
is committed with ``synchronous=FULL`` before it returns, which is what makes a returned write
survive a SIGKILL. One process writes at a time (``BEGIN IMMEDIATE``), whatever the ``_tx`` key.

A file is marked as a fedsketch store by ``PRAGMA application_id`` and versioned by ``PRAGMA
user_version`` (``SCHEMA_VERSION``); any other file is refused before it is modified. Schema 1
(before rosters) is migrated when opened: every device that had contributed to a study joins
its roster, so open studies go on where they were; schemas 2 to 5 are migrated too
(:mod:`.schema`, where both backends' tables and migrations are).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from fedsketch.server.errors import Code
from fedsketch.server.store.base import StoreError
from fedsketch.server.store.faults import from_sqlite
from fedsketch.server.store.schema import APPLICATION_ID, SCHEMA_VERSION, migrate
from fedsketch.server.store.sql import COORDINATOR, SQLStore

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "SQLiteStore", "schema_version"]


def schema_version(c: sqlite3.Connection, path: str) -> int:
    """The store's schema version, 0 for an empty database (to be created); StoreError
    'failed_precondition' unless it is a fedsketch store of a version this code reads (1 to
    SCHEMA_VERSION; older ones are migrated by :func:`.schema.migrate`)."""
    app_id = c.execute("PRAGMA application_id").fetchone()[0]
    version = c.execute("PRAGMA user_version").fetchone()[0]
    if app_id == 0 and c.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0:
        return 0
    if app_id != APPLICATION_ID:
        raise StoreError(Code.FAILED_PRECONDITION, f"{path} is SQLite but not a fedsketch store")
    if not 1 <= version <= SCHEMA_VERSION:
        newer = " (the file was written by a newer fedsketch)" if version > SCHEMA_VERSION else ""
        raise StoreError(Code.FAILED_PRECONDITION, f"{path} has store schema version {version}; "
                         f"this fedsketch reads 1 to {SCHEMA_VERSION}{newer}")
    return version


class SQLiteStore(SQLStore):
    """The coordinator's state in one SQLite file; one connection is shared under a lock, so
    calls are serialized."""

    def __init__(self, path: str | os.PathLike, *, exclusive: bool = False) -> None:
        """Open or create the store at ``path`` (WAL, foreign keys, synchronous=FULL).

        With ``exclusive`` (what ``coordinator serve`` uses unless told ``--db-readers``) the
        connection takes SQLite's EXCLUSIVE locking mode before its first access, so WAL keeps
        its index in this process's heap instead of the ``<file>-shm`` shared memory: no other
        process can read the file while it is open, and nothing another process does to a
        ``-shm`` file (truncating it, making it unwritable) can kill this one with SIGBUS, which
        a memory-mapped ``-shm`` that shrank under it does. A fault of the file while it serves
        (full, read-only, I/O error) is a :class:`~.faults.StoreUnavailable`.

        Raises StoreError 'failed_precondition' if the file is not a SQLite database, is a SQLite
        database that is not a fedsketch store, or has a schema version outside 1 to SCHEMA_VERSION
        (the older ones are migrated: module docstring); such a file is left unmodified. A new
        file is created owner-only (0600; SQLite gives its WAL files the same mode). A
        coordinator holds the file for itself with :func:`.filelock.hold_exclusive` first.
        """
        self.path = os.fspath(path)
        self.exclusive = exclusive
        self._lock = threading.Lock()
        self._start_group_commit()
        self._claims: dict[str, tuple[threading.Lock, int]] = {}  # key: (lock, holders and waiters)
        try:
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            self._conn = sqlite3.connect(
                self.path, timeout=10.0, isolation_level=None, check_same_thread=False
            )
            try:
                self._open()
            except BaseException:
                self._conn.close()
                raise
        except sqlite3.DatabaseError as exc:
            message = f"cannot open {self.path} as a fedsketch store: {exc}"
            raise StoreError(Code.FAILED_PRECONDITION, message) from exc

    def _open(self) -> None:
        if self.exclusive:  # before any access: WAL then never maps a -shm file
            self._conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        schema_version(self._conn, self.path)  # before anything below can modify a foreign file
        mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            message = f"{self.path}: cannot enable WAL (journal mode {mode})"
            raise StoreError(Code.FAILED_PRECONDITION, message)
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        with self._tx() as c:
            version = schema_version(c, self.path)  # again under the write lock: another process won?
            if version == 0:
                c.execute(f"PRAGMA application_id={APPLICATION_ID}")
            for change in migrate(c, version):
                self._log(c, COORDINATOR, "migrate", change)
            c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _batch_key(self, study_id: str) -> str:
        """Every write is serialized here: contributions to any study share a commit."""
        return COORDINATOR

    @contextmanager
    def _tx(self, key: str = COORDINATOR) -> Iterator[sqlite3.Connection]:
        """Hold the lock for one write transaction: committed on normal exit, rolled back on any
        error. Every write is serialized, whatever its ``key``."""
        with self._lock, self._faults():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    try:
                        self._conn.execute("ROLLBACK")
                    except sqlite3.Error:  # SQLite rolled back itself (a failed COMMIT on FULL)
                        pass
                raise

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._faults():
            yield self._conn

    @contextmanager
    def _faults(self) -> Iterator[None]:
        """A fault of the file (:func:`.faults.from_sqlite`) raised as StoreUnavailable."""
        try:
            yield
        except sqlite3.Error as exc:
            fault = from_sqlite(exc, self.path)
            if fault is None:
                raise
            raise fault from exc

    @contextmanager
    def claim(self, key: str) -> Iterator[None]:
        """One process serves a SQLite file (:mod:`.filelock`): a claim is a lock of this one,
        kept while some thread holds or waits for it."""
        with self._lock:
            lock, users = self._claims.get(key, (threading.Lock(), 0))
            self._claims[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._lock:
                users = self._claims[key][1] - 1
                if users:
                    self._claims[key] = (lock, users)
                else:
                    del self._claims[key]

    def claimed(self, key: str) -> bool:
        with self._lock:
            return key in self._claims

    def close(self) -> None:
        with self._lock:
            self._conn.close()
