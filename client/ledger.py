"""The device's privacy-budget ledger: one SQLite file (WAL, ``synchronous=FULL``) on the device.

Contract:
    * A device releases at most one sketch per study. The spend (ε, δ) and the exact payload bytes are
      committed in ONE transaction BEFORE anything is sent; every retry or restart re-sends those stored
      bytes (:meth:`Ledger.find`, :meth:`Ledger.pending`) and never draws fresh noise.
    * Budgets are per dataset fingerprint (:func:`fingerprint_file`) under sequential composition:
      ε and δ add up across studies on the same dataset. ε is dimensionless; δ is a probability.
    * The check and the insert run under ``BEGIN IMMEDIATE``, so two processes sharing the file
      cannot both pass the check.
    * The file also keeps the device identity (Ed25519 private key bytes, device id, coordinator
      address), so it is created owner-only (mode 0600).

A connection is used from the thread that opened the ledger (sqlite3's default).
"""

from __future__ import annotations

import hashlib
import math
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

SCHEMA_VERSION = 1

_FORMAT = "fedsketch.ledger"
_EPS_SLACK = 1e-12
_DELTA_SLACK = 1e-15
_CHUNK = 1 << 20
_BUSY_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE spends (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    study_id       TEXT NOT NULL UNIQUE,
    fingerprint    TEXT NOT NULL,
    epsilon        REAL NOT NULL CHECK (epsilon > 0),
    delta          REAL NOT NULL CHECK (delta >= 0),
    n              REAL NOT NULL,
    kind           TEXT NOT NULL,
    payload        BLOB NOT NULL,
    payload_sha256 TEXT NOT NULL,
    spec_sha256    TEXT NOT NULL,
    spent_at       REAL NOT NULL,
    acked_at       REAL,
    receipt        TEXT
);
CREATE INDEX spends_by_fingerprint ON spends (fingerprint);
CREATE TABLE identity (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    device_id   TEXT NOT NULL,
    private_key BLOB NOT NULL,
    coordinator TEXT NOT NULL
);
"""

_SPEND_COLUMNS = ("study_id, fingerprint, epsilon, delta, n, kind, payload, payload_sha256, spec_sha256, "
                  "spent_at, acked_at, receipt")


class BudgetExceeded(Exception):
    """Refusal: the spend would take the dataset past its budget. The message states the remaining ε
    and the asked ε."""


class LedgerError(Exception):
    """A corrupt, foreign or newer-version ledger file, or a conflicting record."""


@dataclass(frozen=True)
class Spend:
    """One recorded release: the privacy cost (ε dimensionless, δ a probability), the released record
    count ``n``, the exact payload bytes to (re-)send, and when it was spent / acknowledged (Unix seconds)."""

    study_id: str
    fingerprint: str
    epsilon: float
    delta: float
    n: float
    kind: str
    payload: bytes
    payload_sha256: str
    spec_sha256: str
    spent_at: float
    acked_at: float | None
    receipt: str | None


@dataclass(frozen=True)
class Identity:
    """The device's identity: its id, raw Ed25519 private key bytes and its coordinator's address."""

    device_id: str
    private_key: bytes
    coordinator: str


def fingerprint_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of the file's bytes, read in 1 MiB chunks (constant memory); keys budgets per dataset."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


class Ledger:
    """An open ledger file. ``budget`` is the total ε allowed per dataset fingerprint (finite, > 0) and
    ``budget_delta`` the total δ (finite, in [0, 1)); the values given at each open are the ones enforced
    and are recorded in the ``settings`` table. Raises :class:`LedgerError` for a file that is not a
    readable ledger of this schema version."""

    def __init__(self, path: str | os.PathLike, budget: float, budget_delta: float = 0.0) -> None:
        if not (math.isfinite(budget) and budget > 0):
            raise ValueError(f"budget must be finite and > 0, got {budget!r}")
        if not (math.isfinite(budget_delta) and 0 <= budget_delta < 1):
            raise ValueError(f"budget_delta must be in [0, 1), got {budget_delta!r}")
        self.path = os.fspath(path)
        self.budget = float(budget)
        self.budget_delta = float(budget_delta)
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        self._conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
        try:
            self._open()
        except BaseException as exc:
            self._conn.close()
            if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
                raise LedgerError(f"{self.path} is not a readable ledger: {exc}") from exc
            raise

    def _open(self) -> None:
        mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            raise LedgerError(f"{self.path}: cannot use WAL journal mode (got {mode!r})")
        self._conn.execute("PRAGMA synchronous=FULL")
        check = self._conn.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise LedgerError(f"{self.path} is corrupt: {check}")
        with self._write() as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                self._set(db, format=_FORMAT, schema_version=str(SCHEMA_VERSION))
            elif "settings" not in tables:
                raise LedgerError(f"{self.path} is an SQLite file but not a fedsketch ledger")
            settings = dict(db.execute("SELECT key, value FROM settings"))
            if settings.get("format") != _FORMAT:
                raise LedgerError(f"{self.path} is an SQLite file but not a fedsketch ledger")
            version = settings.get("schema_version", "")
            if version != str(SCHEMA_VERSION):
                raise LedgerError(f"{self.path} has ledger schema version {version!r}; this code reads "
                                  f"version {SCHEMA_VERSION} only (written by a newer fedsketch?)")
            self._set(db, budget=repr(self.budget), budget_delta=repr(self.budget_delta))

    @staticmethod
    def _set(db: sqlite3.Connection, **values: str) -> None:
        db.executemany("INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)", values.items())

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken with BEGIN IMMEDIATE (the write lock first, then any checks)."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def close(self) -> None:
        """Close the file (idempotent). Every recorded spend was already committed."""
        self._conn.close()

    def spent(self, fingerprint: str) -> tuple[float, float]:
        """(Σε, Σδ) over all spends on the dataset ``fingerprint``; (0.0, 0.0) if none."""
        return self._sums(self._conn, fingerprint)

    @staticmethod
    def _sums(db: sqlite3.Connection, fingerprint: str) -> tuple[float, float]:
        sql = "SELECT epsilon, delta FROM spends WHERE fingerprint = ?"
        rows = db.execute(sql, (fingerprint,)).fetchall()
        return math.fsum(r[0] for r in rows), math.fsum(r[1] for r in rows)

    def remaining(self, fingerprint: str) -> float:
        """The ε still allowed on the dataset: budget − Σε, floored at 0."""
        return max(0.0, self.budget - self.spent(fingerprint)[0])

    def find(self, study_id: str) -> Spend | None:
        """The one spend of this study (on any dataset), or None if the device never released for it."""
        row = self._conn.execute(f"SELECT {_SPEND_COLUMNS} FROM spends WHERE study_id = ?", (study_id,))
        return None if (row := row.fetchone()) is None else Spend(*row)

    def record_spend(self, *, study_id: str, fingerprint: str, epsilon: float, delta: float, n: float,
                     kind: str, payload: bytes, spec_sha256: str) -> Spend:
        """Record the release of ``payload`` for ``study_id`` in one committed transaction; call it BEFORE
        sending, and send only the bytes of the returned Spend.

        Raises ValueError for ε not finite and > 0, δ not finite and ≥ 0, or n not finite; LedgerError if
        this study already has a spend; BudgetExceeded if Σε + ε > budget (+1e-12) or, for δ > 0,
        Σδ + δ > budget_delta (+1e-15). A refusal writes nothing."""
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
        if not (math.isfinite(delta) and delta >= 0):
            raise ValueError(f"delta must be finite and >= 0, got {delta!r}")
        if not math.isfinite(n):
            raise ValueError(f"n must be finite, got {n!r}")
        payload = bytes(payload)
        spend = Spend(study_id=study_id, fingerprint=fingerprint, epsilon=float(epsilon), delta=float(delta),
                      n=float(n), kind=kind, payload=payload,
                      payload_sha256=hashlib.sha256(payload).hexdigest(), spec_sha256=spec_sha256,
                      spent_at=time.time(), acked_at=None, receipt=None)
        with self._write() as db:
            if db.execute("SELECT 1 FROM spends WHERE study_id = ?", (study_id,)).fetchone():
                raise LedgerError(f"the device already released a sketch for study {study_id!r}; "
                                  "it re-sends the stored bytes instead")
            eps_sum, delta_sum = self._sums(db, fingerprint)
            eps_left = max(0.0, self.budget - eps_sum)
            if math.fsum((eps_sum, epsilon)) > self.budget + _EPS_SLACK:
                raise BudgetExceeded(f"dataset {fingerprint}: {eps_left:g} ε remains of {self.budget:g}, "
                                     f"study {study_id!r} asks ε={epsilon:g}")
            if delta > 0 and math.fsum((delta_sum, delta)) > self.budget_delta + _DELTA_SLACK:
                raise BudgetExceeded(f"dataset {fingerprint}: {max(0.0, self.budget_delta - delta_sum):g} δ "
                                     f"remains of {self.budget_delta:g} ({eps_left:g} ε remains), study "
                                     f"{study_id!r} asks δ={delta:g} (ε={epsilon:g})")
            db.execute(f"INSERT INTO spends ({_SPEND_COLUMNS}) VALUES ({', '.join('?' * 12)})",
                       (spend.study_id, spend.fingerprint, spend.epsilon, spend.delta, spend.n, spend.kind,
                        spend.payload, spend.payload_sha256, spend.spec_sha256, spend.spent_at, None, None))
        return spend

    def mark_acked(self, study_id: str, receipt: str) -> None:
        """Record the coordinator's receipt for the study's release. Idempotent for the same receipt;
        LedgerError for a study without a spend or one already acked with a different receipt."""
        with self._write() as db:
            row = db.execute("SELECT receipt FROM spends WHERE study_id = ?", (study_id,)).fetchone()
            if row is None:
                raise LedgerError(f"no spend recorded for study {study_id!r}")
            if row[0] == receipt:
                return
            if row[0] is not None:
                raise LedgerError(f"study {study_id!r} was already acked with receipt {row[0]!r}, "
                                  f"not {receipt!r}")
            db.execute("UPDATE spends SET acked_at = ?, receipt = ? WHERE study_id = ?",
                       (time.time(), receipt, study_id))

    def pending(self) -> list[Spend]:
        """Spends not yet acknowledged, oldest first: the payloads to (re-)send."""
        rows = self._conn.execute(f"SELECT {_SPEND_COLUMNS} FROM spends WHERE acked_at IS NULL ORDER BY seq")
        return [Spend(*r) for r in rows]

    def spends(self) -> list[Spend]:
        """All spends, oldest first."""
        return [Spend(*r) for r in self._conn.execute(f"SELECT {_SPEND_COLUMNS} FROM spends ORDER BY seq")]

    def identity(self) -> Identity | None:
        """The stored device identity, or None before the first :meth:`set_identity`."""
        row = self._conn.execute("SELECT device_id, private_key, coordinator FROM identity").fetchone()
        return None if row is None else Identity(*row)

    def set_identity(self, identity: Identity) -> None:
        """Store the device identity. Storing the same identity again is a no-op; LedgerError if a
        different one is already stored (a device keeps its key)."""
        identity = Identity(identity.device_id, bytes(identity.private_key), identity.coordinator)
        with self._write() as db:
            row = db.execute("SELECT device_id, private_key, coordinator FROM identity").fetchone()
            if row is not None:
                if Identity(*row) != identity:
                    raise LedgerError(f"{self.path} already holds identity of device {row[0]!r}; "
                                      "refusing to overwrite it")
                return
            db.execute("INSERT INTO identity (id, device_id, private_key, coordinator) VALUES (1, ?, ?, ?)",
                       (identity.device_id, identity.private_key, identity.coordinator))
