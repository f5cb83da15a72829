"""The coordinator's durable state in one SQLite file in WAL mode: :class:`SQLiteStore`.

It implements :class:`fedsketch.server.store.base.Store` (the contract: transactions, refusals,
the study lifecycle); every write is committed with ``synchronous=FULL`` before it returns, which
is what makes a returned write survive a SIGKILL. All SQL lives in this module.

A file is marked as a fedsketch store by ``PRAGMA application_id`` and versioned by ``PRAGMA
user_version`` (``SCHEMA_VERSION``); any other file is refused before it is modified.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fedsketch.server.errors import Code
from fedsketch.server.store.base import (
    ACCEPTING,
    COLLECT,
    KINDS,
    PUBLISH,
    STATES,
    ContributionRow,
    Store,
    StoreError,
    StudyRow,
)

SCHEMA_VERSION = 1

_APPLICATION_ID = 0x46534B53  # "FSKS" in the SQLite header
_COORDINATOR = "coordinator"  # audit actor for writes not made on behalf of a device


def _sql_list(values: tuple[str, ...]) -> str:
    """``'a', 'b'`` for a CHECK constraint (the values are constants of this package, not input)."""
    return ", ".join(f"'{v}'" for v in values)


_SCHEMA = (
    """CREATE TABLE devices (
        device_id TEXT PRIMARY KEY,
        public_key BLOB NOT NULL UNIQUE,
        label TEXT NOT NULL,
        enrolled_at REAL NOT NULL)""",
    """CREATE TABLE tokens (
        token_sha256 TEXT PRIMARY KEY,
        added_at REAL NOT NULL,
        used_by TEXT REFERENCES devices(device_id),
        used_at REAL)""",
    f"""CREATE TABLE studies (
        study_id TEXT PRIMARY KEY,
        spec_json TEXT NOT NULL,
        spec_sha256 TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ({_sql_list(STATES)})),
        detail TEXT NOT NULL,
        created_at REAL NOT NULL,
        deadline REAL,
        min_devices INTEGER NOT NULL)""",
    f"""CREATE TABLE contributions (
        study_id TEXT NOT NULL REFERENCES studies(study_id),
        device_id TEXT NOT NULL REFERENCES devices(device_id),
        n REAL NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ({_sql_list(KINDS)})),
        payload BLOB NOT NULL,
        payload_sha256 TEXT NOT NULL,
        signature BLOB NOT NULL,
        received_at REAL NOT NULL,
        PRIMARY KEY (study_id, device_id))""",
    "CREATE INDEX contributions_by_time ON contributions(study_id, received_at)",
    """CREATE TABLE results (
        study_id TEXT PRIMARY KEY REFERENCES studies(study_id),
        result_json TEXT NOT NULL,
        created_at REAL NOT NULL)""",
    """CREATE TABLE audit (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        at REAL NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        detail TEXT NOT NULL)""",
)

_STUDY_SQL = """
SELECT s.study_id, s.spec_json, s.spec_sha256, s.state, s.detail, s.created_at, s.deadline,
       s.min_devices, COUNT(c.device_id), COALESCE(SUM(c.n), 0.0)
FROM studies AS s LEFT JOIN contributions AS c ON c.study_id = s.study_id
{where}
GROUP BY s.study_id
ORDER BY s.created_at, s.study_id
"""

_CONTRIBUTION_COLUMNS = "study_id, device_id, n, kind, payload, payload_sha256, signature, received_at"


def _sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _study_row(row: tuple) -> StudyRow:
    return StudyRow(*row[:9], records=float(row[9]))


class SQLiteStore(Store):
    """The coordinator's state in one SQLite file; one connection is shared under a lock, so
    calls are serialized."""

    def __init__(self, path: str | os.PathLike) -> None:
        """Open or create the store at ``path`` (WAL, foreign keys, synchronous=FULL).

        Raises StoreError 'failed_precondition' if the file is not a SQLite database, is a SQLite
        database that is not a fedsketch store, or has a schema version other than SCHEMA_VERSION;
        such a file is left unmodified.
        """
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        try:
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
        self._check_identity()  # before anything below can modify a foreign file
        mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            message = f"{self.path}: cannot enable WAL (journal mode {mode})"
            raise StoreError(Code.FAILED_PRECONDITION, message)
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        with self._tx() as c:
            if self._check_identity():  # checked again under the write lock: another process may have won
                for statement in _SCHEMA:
                    c.execute(statement)
                c.execute(f"PRAGMA application_id={_APPLICATION_ID}")
                c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _check_identity(self) -> bool:
        """True for an empty database (to be created); raises unless it is a current fedsketch store."""
        c = self._conn
        app_id = c.execute("PRAGMA application_id").fetchone()[0]
        version = c.execute("PRAGMA user_version").fetchone()[0]
        if app_id == 0 and c.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0:
            return True
        if app_id != _APPLICATION_ID:
            raise StoreError(Code.FAILED_PRECONDITION, f"{self.path} is SQLite but not a fedsketch store")
        if version != SCHEMA_VERSION:
            raise StoreError(
                Code.FAILED_PRECONDITION,
                f"{self.path} has store schema version {version}; this fedsketch reads {SCHEMA_VERSION}"
                + (" (the file was written by a newer fedsketch)" if version > SCHEMA_VERSION else ""),
            )
        return False

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """Hold the lock for one write transaction: committed on normal exit, rolled back on any error."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    @staticmethod
    def _log(c: sqlite3.Connection, actor: str, action: str, detail: str) -> None:
        c.execute(
            "INSERT INTO audit (at, actor, action, detail) VALUES (?, ?, ?, ?)",
            (time.time(), actor, action, detail),
        )

    @staticmethod
    def _study(c: sqlite3.Connection, study_id: str) -> StudyRow:
        row = c.execute(_STUDY_SQL.format(where="WHERE s.study_id = ?"), (study_id,)).fetchone()
        if row is None:
            raise StoreError(Code.NOT_FOUND, f"no study {study_id!r}")
        return _study_row(row)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # enrollment

    def add_tokens(self, tokens: list[str]) -> None:
        if any(not t for t in tokens):
            raise ValueError("enrollment tokens must be non-empty")
        now = time.time()
        with self._tx() as c:
            c.executemany(
                "INSERT OR IGNORE INTO tokens (token_sha256, added_at) VALUES (?, ?)",
                [(_sha256_hex(t), now) for t in tokens],
            )
            self._log(c, _COORDINATOR, "add_tokens", f"{len(tokens)} tokens")

    def enroll(self, token: str, public_key: bytes, label: str) -> str:
        public_key = bytes(public_key)
        if len(public_key) != 32:
            raise ValueError(f"public key must be 32 bytes, got {len(public_key)}")
        digest = _sha256_hex(token)
        device_id = "dev-" + secrets.token_hex(8)
        now = time.time()
        with self._tx() as c:
            unused = c.execute(
                "SELECT 1 FROM tokens WHERE token_sha256 = ? AND used_by IS NULL", (digest,)
            ).fetchone()
            if unused is None:
                raise StoreError(Code.PERMISSION_DENIED, "unknown or already used enrollment token")
            if c.execute("SELECT 1 FROM devices WHERE public_key = ?", (public_key,)).fetchone():
                raise StoreError(Code.CONFLICT, "this public key is already enrolled")
            c.execute(
                "INSERT INTO devices (device_id, public_key, label, enrolled_at) VALUES (?, ?, ?, ?)",
                (device_id, public_key, label, now),
            )
            c.execute(
                "UPDATE tokens SET used_by = ?, used_at = ? WHERE token_sha256 = ?", (device_id, now, digest)
            )
            self._log(c, device_id, "enroll", f"label={label!r}")
        return device_id

    def device_key(self, device_id: str) -> bytes | None:
        rows = self._query("SELECT public_key FROM devices WHERE device_id = ?", (device_id,))
        return rows[0][0] if rows else None

    # studies

    def create_study(
        self, study_id: str, spec_json: str, spec_sha256: str, deadline: float | None, min_devices: int
    ) -> StudyRow:
        with self._tx() as c:
            if c.execute("SELECT 1 FROM studies WHERE study_id = ?", (study_id,)).fetchone():
                raise StoreError(Code.CONFLICT, f"study {study_id!r} already exists")
            c.execute(
                "INSERT INTO studies (study_id, spec_json, spec_sha256, state, detail, created_at, deadline,"
                " min_devices) VALUES (?, ?, ?, ?, '', ?, ?, ?)",
                (study_id, spec_json, spec_sha256, STATES[0], time.time(), deadline, min_devices),
            )
            self._log(c, _COORDINATOR, "create_study", f"study {study_id!r} spec_sha256 {spec_sha256}")
            return self._study(c, study_id)

    def get_study(self, study_id: str) -> StudyRow:
        with self._lock:
            return self._study(self._conn, study_id)

    def list_studies(self, states: tuple[str, ...] | None = None) -> list[StudyRow]:
        if states is None:
            rows = self._query(_STUDY_SQL.format(where=""))
        else:
            marks = ", ".join("?" * len(states))
            rows = self._query(_STUDY_SQL.format(where=f"WHERE s.state IN ({marks})"), tuple(states))
        return [_study_row(r) for r in rows]

    def set_state(
        self, study_id: str, state: str, detail: str = "", expect: tuple[str, ...] | None = None
    ) -> StudyRow:
        if state not in STATES:
            raise ValueError(f"unknown study state {state!r}; expected one of {STATES}")
        with self._tx() as c:
            current = self._study(c, study_id).state
            if expect is not None and current not in expect:
                raise StoreError(
                    Code.FAILED_PRECONDITION, f"study {study_id!r} is {current!r}, expected one of {expect}"
                )
            c.execute(
                "UPDATE studies SET state = ?, detail = ? WHERE study_id = ?", (state, detail, study_id)
            )
            change = f"study {study_id!r}: {current} -> {state} {detail}".rstrip()
            self._log(c, _COORDINATOR, "set_state", change)
            return self._study(c, study_id)

    # contributions

    def add_contribution(self, row: ContributionRow) -> bool:
        if row.kind not in KINDS:
            raise ValueError(f"unknown contribution kind {row.kind!r}; expected one of {KINDS}")
        with self._tx() as c:
            state = self._study(c, row.study_id).state
            if not c.execute("SELECT 1 FROM devices WHERE device_id = ?", (row.device_id,)).fetchone():
                raise StoreError(Code.NOT_FOUND, f"no enrolled device {row.device_id!r}")
            prior = c.execute(
                "SELECT payload_sha256, n FROM contributions WHERE study_id = ? AND device_id = ?",
                (row.study_id, row.device_id),
            ).fetchone()
            if prior is not None:  # checked before the state: a lost ack is re-acknowledged
                if prior == (row.payload_sha256, row.n):
                    return False
                raise StoreError(
                    Code.CONFLICT,
                    f"device {row.device_id!r} already contributed different bytes to study {row.study_id!r}",
                )
            if state not in ACCEPTING:
                message = f"study {row.study_id!r} is {state!r} and accepts no contributions"
                raise StoreError(Code.FAILED_PRECONDITION, message)
            c.execute(
                f"INSERT INTO contributions ({_CONTRIBUTION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (row.study_id, row.device_id, row.n, row.kind, bytes(row.payload), row.payload_sha256,
                 bytes(row.signature), row.received_at),
            )
            if state in COLLECT.sources:
                c.execute("UPDATE studies SET state = ? WHERE study_id = ?", (COLLECT.target, row.study_id))
            self._log(
                c, row.device_id, "contribute",
                f"study {row.study_id!r} n={row.n} payload_sha256 {row.payload_sha256}",
            )
            return True

    def contributions(self, study_id: str) -> list[ContributionRow]:
        rows = self._query(
            f"SELECT {_CONTRIBUTION_COLUMNS} FROM contributions WHERE study_id = ?"
            " ORDER BY received_at, device_id",
            (study_id,),
        )
        return [ContributionRow(*r) for r in rows]

    # results

    def put_result(self, study_id: str, result_json: str) -> None:
        with self._tx() as c:
            current = self._study(c, study_id).state
            if c.execute("SELECT 1 FROM results WHERE study_id = ?", (study_id,)).fetchone():
                raise StoreError(Code.CONFLICT, f"study {study_id!r} already has a result")
            if current not in PUBLISH.sources:
                raise StoreError(Code.FAILED_PRECONDITION, f"study {study_id!r} is {current!r}, not decoding")
            c.execute(
                "INSERT INTO results (study_id, result_json, created_at) VALUES (?, ?, ?)",
                (study_id, result_json, time.time()),
            )
            c.execute(
                "UPDATE studies SET state = ?, detail = '' WHERE study_id = ?", (PUBLISH.target, study_id)
            )
            self._log(c, _COORDINATOR, "put_result", f"study {study_id!r}: {current} -> {PUBLISH.target}")

    def get_result(self, study_id: str) -> str | None:
        rows = self._query("SELECT result_json FROM results WHERE study_id = ?", (study_id,))
        return rows[0][0] if rows else None

    # audit log

    def audit(self, actor: str, action: str, detail: str) -> None:
        with self._tx() as c:
            self._log(c, actor, action, detail)

    def audit_log(self, limit: int = 100) -> list[tuple[float, str, str, str]]:
        rows = self._query("SELECT at, actor, action, detail FROM audit ORDER BY seq DESC LIMIT ?", (limit,))
        return rows[::-1]
