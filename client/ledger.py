"""The device's privacy-budget ledger: one SQLite file (WAL, ``synchronous=FULL``) on the device.

Contract:
    * The budget belongs to the device, not to a file. The ledger holds each *source*'s total
      budget (ε dimensionless, δ a probability), set once by the owner (``fedsketch device init``
      or the daemon's first run); every spend counts against its source under sequential
      composition, whatever file, format or row count the data has that day. A device starts with
      one source, :data:`DEFAULT_SOURCE`. An owner whose data holds disjoint groups of people may
      declare more sources by name (:meth:`Ledger.declare`), each with its own budget (parallel
      composition); the name is the owner's declaration, never derived from the data's bytes.
    * A budget can be lowered at any time (:meth:`Ledger.lower`, e.g. by a smaller ``--budget``);
      raising it is a separate owner action (:meth:`Ledger.raise_budget`) with a stated reason.
      Every change, and every change of the owner's :class:`~fedsketch.client.policy.Policy`, is
      appended to a log that nothing deletes (:meth:`Ledger.history`).
    * A device releases at most once per study (a refinement round is a study of its own). The
      spend (ε, δ) and the exact payload bytes are committed in ONE transaction BEFORE anything
      is sent; every retry or restart re-sends those stored bytes (:meth:`Ledger.find`,
      :meth:`Ledger.pending`) and never draws fresh noise.
      Checks and insert run under ``BEGIN IMMEDIATE``, so two processes sharing the file cannot
      both pass the check.
    * While the device waits in the roster of a plain study it joined, it sets the study's cost
      aside (:meth:`Ledger.reserve`, :mod:`.ledger_reservations`) until it spends on it, leaves
      it, or the reservation expires (the study's deadline, else a day after joining). The
      reservations are rows of the file, so a restarted daemon still counts them:
      :meth:`Ledger.refusal` sets them aside; :meth:`Ledger.record_spend` does not.
    * A release after which its study has more rounds keeps their ε aside until the device
      learns that the study ended, or until a time its rounds' lengths bound
      (:func:`~.ledger_schema.promises`): both :meth:`Ledger.refusal` and
      :meth:`Ledger.record_spend` set it aside for every other study.
    * The file also keeps the device identity (Ed25519 private key bytes, device id, coordinator
      address), so it is created owner-only (mode 0600).

Opening a file of an older schema migrates it once (:mod:`.ledger_schema`); the records the
ledger returns are in :mod:`.ledger_records`.

A connection is used from the thread that opened the ledger (sqlite3's default).
"""

from __future__ import annotations

import math
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fedsketch.client.ledger_identity import IdentityStore
from fedsketch.client.ledger_records import (
    Budget,
    BudgetChange,
    BudgetExceeded,
    Identity,
    LedgerError,
    LedgerUnavailable,
    Spend,
    check_budget,
    check_source,
)
from fedsketch.client.ledger_reservations import Reservation, Reservations
from fedsketch.client.ledger_schema import (
    DEFAULT_SOURCE,
    FORMAT,
    NOT_VOID,
    SCHEMA_VERSION,
    create_schema,
    log_change,
    set_settings,
    upgrade,
)
from fedsketch.client.ledger_sessions import SecureSessions
from fedsketch.client.ledger_spends import Spends
from fedsketch.client.ledger_voids import Void, Voids
from fedsketch.client.policy import Policy

__all__ = ["DEFAULT_SOURCE", "SCHEMA_VERSION", "Budget", "BudgetChange", "BudgetExceeded",
           "Identity", "Ledger", "LedgerError", "LedgerUnavailable", "Reservation", "Spend", "Void"]

_BUSY_TIMEOUT_S = 30.0


#: SQLite result codes that are the file's or the machine's state, with what the owner can do:
#: BUSY 5, LOCKED 6, NOMEM 7, READONLY 8, IOERR 10, FULL 13, CANTOPEN 14, PROTOCOL 15.
_FAULTS = {5: " (another process holds it)", 6: "", 7: "", 8: " (it, or its folder, is read-only)",
           10: " (the disk failed to read or write it)", 13: " (the disk under it is full: free "
           "space and run again)", 14: " (check that its folder exists and is writable)", 15: ""}


#: Free bytes under which a ledger's folder counts as full (256 pages of 4 KiB).
FULL_BELOW = 1 << 20


def disk_full(path: str) -> bool:
    """Whether the file system holding ``path`` has less than :data:`FULL_BELOW` bytes free.
    SQLite reports a write that found no space as FULL (13) or, when the OS refused a write of
    the WAL or of the file itself (ENOSPC), as the generic I/O error (10): measured on a full
    4 MiB tmpfs under a ledger, `device run` got error 10."""
    try:
        return shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free < FULL_BELOW
    except OSError:
        return False


def unavailable(path: str, exc: sqlite3.OperationalError) -> LedgerError:
    """The ledger error, in words, for SQLite's ``exc`` on ``path``: LedgerUnavailable for a
    fault of the file or the disk (:data:`_FAULTS`; an I/O error on a full disk is said to be
    the full disk), else LedgerError."""
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
    if code == 10 and disk_full(path):
        code = 13
    if code not in _FAULTS:
        return LedgerError(f"the ledger {path} failed: {exc}")
    return LedgerUnavailable(f"cannot use the ledger {path}: {exc}{_FAULTS[code]}; nothing "
                             "was recorded and nothing was sent")


class Ledger(Spends, Voids, Reservations, SecureSessions, IdentityStore):
    """An open ledger file (created empty, owner-only, if missing). Raises :class:`LedgerError` for a
    file that is not a readable ledger of a schema version this code reads. Its spend methods
    come from :class:`~.ledger_spends.Spends`, its reservation methods from
    :class:`~.ledger_reservations.Reservations`, its secure-round states from
    :class:`~.ledger_sessions.SecureSessions`, its voids from :class:`~.ledger_voids.Voids`, its
    identity methods from
    :class:`~.ledger_identity.IdentityStore`."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        try:
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        except OSError as exc:
            raise LedgerUnavailable(f"cannot open the ledger {self.path}: {exc.strerror}") from exc
        self._conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
        try:
            self._open()
        except BaseException as exc:
            self._conn.close()
            if isinstance(exc, sqlite3.OperationalError):
                raise unavailable(self.path, exc) from exc
            if isinstance(exc, sqlite3.DatabaseError):
                raise LedgerError(f"{self.path} is not a readable ledger: {exc}") from exc
            raise

    @classmethod
    def create(cls, path: str | os.PathLike, epsilon: float, delta: float = 0.0, *,
               source: str = DEFAULT_SOURCE, policy: Policy | None = None) -> Ledger:
        """Open (creating if need be) a ledger and declare ``source`` with budget (ε, δ) and the
        owner's ``policy``; LedgerError if the source already has a budget."""
        ledger = cls(path)
        try:
            ledger.declare(source, epsilon, delta, action="init")
            if policy is not None:
                ledger.set_policy(policy)
        except BaseException:
            ledger.close()
            raise
        return ledger

    def _open(self) -> None:
        mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            raise LedgerError(f"{self.path}: cannot use WAL journal mode (got {mode!r})")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        self._conn.execute("PRAGMA secure_delete=ON")  # a dropped round's secrets are overwritten
        check = self._conn.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise LedgerError(f"{self.path} is corrupt: {check}")
        with self._write() as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables:
                create_schema(db)
                set_settings(db, format=FORMAT, schema_version=str(SCHEMA_VERSION),
                          policy=Policy().to_json())
                return
            if "settings" not in tables:
                raise LedgerError(f"{self.path} is an SQLite file but not a fedsketch ledger")
            upgrade(db, self.path)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken with BEGIN IMMEDIATE (the write lock first, then any checks)."""
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:  # a full disk, a read-only file system, I/O
            if self._conn.in_transaction:
                try:
                    self._conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            fault = unavailable(self.path, exc)
            if not isinstance(fault, LedgerUnavailable):
                raise
            raise fault from exc

    def close(self) -> None:
        """Close the file (idempotent). Every recorded spend was already committed."""
        self._conn.close()

    # -- budgets ------------------------------------------------------------------------------

    def sources(self) -> dict[str, Budget]:
        """Every declared source and its budget, in the order they were declared."""
        rows = self._conn.execute("SELECT name, epsilon, delta FROM sources ORDER BY created_at, name")
        return {name: Budget(eps, delta) for name, eps, delta in rows}

    def budget(self, source: str) -> Budget:
        """The budget of ``source``; LedgerError if it was never declared."""
        return self._budget(self._conn, source)

    def _budget(self, db: sqlite3.Connection, source: str) -> Budget:
        row = db.execute("SELECT epsilon, delta FROM sources WHERE name = ?", (source,)).fetchone()
        if row is None:
            known = ", ".join(repr(s) for s in self.sources()) or "none yet"
            raise LedgerError(f"{self.path} has no budget for source {source!r} (declared: {known}); "
                              "declare it with `fedsketch device init` or `fedsketch device add-source`")
        return Budget(*row)

    def declare(self, source: str, epsilon: float, delta: float = 0.0, *,
                action: str = "add-source") -> Budget:
        """Declare a new source with its total budget (logged). LedgerError if it exists: a budget
        is set once, then only lowered or explicitly raised. With ``action="init"`` (the first
        budget of the device) also if any source exists: checked in the same transaction, so two
        first runs racing on one file cannot both declare one."""
        check_source(source)
        budget = check_budget(epsilon, delta)
        with self._write() as db:
            if action == "init" and db.execute("SELECT 1 FROM sources").fetchone():
                raise LedgerError(f"{self.path} already holds a budget; see `fedsketch device "
                                  "budget`, and `fedsketch device add-source` for other people's data")
            if db.execute("SELECT 1 FROM sources WHERE name = ?", (source,)).fetchone():
                raise LedgerError(f"source {source!r} already has a budget; lower it with a smaller "
                                  "--budget, raise it with `fedsketch device raise-budget`")
            db.execute("INSERT INTO sources (name, epsilon, delta, created_at) VALUES (?, ?, ?, ?)",
                       (source, budget.epsilon, budget.delta, time.time()))
            log_change(db, action, source, budget.epsilon, budget.delta,
                      f"source {source!r} declared with ε = {budget.epsilon:g}, δ = {budget.delta:g}")
        return budget

    def lower(self, source: str, epsilon: float | None = None, delta: float | None = None) -> Budget:
        """Lower the budget of ``source`` to the given ε and/or δ (logged; no change, no log line).
        ValueError if a value would raise it."""
        with self._write() as db:
            old = self._budget(db, source)
            new = check_budget(old.epsilon if epsilon is None else epsilon,
                               old.delta if delta is None else delta)
            if new.epsilon > old.epsilon or new.delta > old.delta:
                raise ValueError(f"source {source!r}: ε = {new.epsilon:g}, δ = {new.delta:g} would "
                                 f"raise its budget (ε = {old.epsilon:g}, δ = {old.delta:g}); raising "
                                 "is `fedsketch device raise-budget`")
            if new != old:
                self._update(db, "lower", source, old, new, "lowered")
        return new

    def raise_budget(self, source: str, epsilon: float, delta: float | None, reason: str) -> Budget:
        """The owner's explicit raise of ``source``'s budget, logged with ``reason``. ValueError if
        the new budget is not above the old one, or without a reason."""
        if not reason.strip():
            raise ValueError("raising a budget needs a reason, which the ledger keeps")
        with self._write() as db:
            old = self._budget(db, source)
            new = check_budget(epsilon, old.delta if delta is None else delta)
            if new.epsilon < old.epsilon or new.delta < old.delta or new == old:
                raise ValueError(f"source {source!r}: ε = {new.epsilon:g}, δ = {new.delta:g} does "
                                 f"not raise its budget (ε = {old.epsilon:g}, δ = {old.delta:g})")
            self._update(db, "raise", source, old, new, f"raised by the owner: {reason.strip()}")
        return new

    def _update(self, db: sqlite3.Connection, action: str, source: str, old: Budget, new: Budget,
                why: str) -> None:
        db.execute("UPDATE sources SET epsilon = ?, delta = ? WHERE name = ?",
                   (new.epsilon, new.delta, source))
        log_change(db, action, source, new.epsilon, new.delta,
                  f"{why}: ε {old.epsilon:g} → {new.epsilon:g}, δ {old.delta:g} → {new.delta:g}")

    def spent(self, source: str) -> tuple[float, float]:
        """(Σε, Σδ) over the spends of ``source`` that were not given back
        (:mod:`.ledger_voids`); (0.0, 0.0) if none."""
        return self._sums(self._conn, source)

    @staticmethod
    def _sums(db: sqlite3.Connection, source: str) -> tuple[float, float]:
        rows = db.execute(f"SELECT epsilon, delta FROM spends WHERE source = ? AND {NOT_VOID}",
                          (source,)).fetchall()
        return math.fsum(r[0] for r in rows), math.fsum(r[1] for r in rows)

    def remaining(self, source: str) -> Budget:
        """What ``source`` may still spend: budget − Σ, each floored at 0."""
        budget = self.budget(source)
        eps, delta = self.spent(source)
        return Budget(max(0.0, budget.epsilon - eps), max(0.0, budget.delta - delta))

    def history(self) -> list[BudgetChange]:
        """The owner's log, oldest first."""
        rows = self._conn.execute("SELECT at, action, source, epsilon, delta, detail FROM budget_log "
                                  "ORDER BY seq")
        return [BudgetChange(*r) for r in rows]

    # -- policy -------------------------------------------------------------------------------

    def policy(self) -> Policy:
        """The owner's policy (the permissive default until one is set)."""
        return self._policy(self._conn)

    def _policy(self, db: sqlite3.Connection) -> Policy:
        row = db.execute("SELECT value FROM settings WHERE key = 'policy'").fetchone()
        try:
            return Policy.from_json(row[0])
        except (TypeError, ValueError) as exc:
            raise LedgerError(f"{self.path}: {exc}") from None

    def set_policy(self, policy: Policy) -> None:
        """Store the owner's policy (logged when it changes)."""
        with self._write() as db:
            old = db.execute("SELECT value FROM settings WHERE key = 'policy'").fetchone()
            if old is not None and old[0] == policy.to_json():
                return
            set_settings(db, policy=policy.to_json())
            log_change(db, "policy", None, None, None, f"policy set to {policy.to_json()}")
