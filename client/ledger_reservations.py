"""The budget a device sets aside for the plain studies whose roster it joined (ledger schema 4).

A device joins a study's roster spending nothing and waits until the roster is full; meanwhile
it sets the study's cost aside, so that it joins no more studies than its budget can pay for.
The reservation is a row of the ledger's ``reservations`` table, so a restarted daemon still
counts it. A reservation is *live* (it counts against its source's budget) while all hold:

* the device has not left the study (``left_at`` unset; a left study stays as a row so that
  the device does not join it again);
* ``expires_at`` (Unix seconds) is still ahead: :data:`RESERVATION_SECONDS` after joining, or
  the study's deadline if that comes first, so a roster that never fills holds the budget no
  longer. The device stays on the coordinator's roster; if input opens later it checks its
  budget again, as for any study, and contributes only if the budget still covers it;
* no spend is recorded for the study (the spend counts instead).

The row is deleted once the device learns that the study ended (:func:`delete`). The functions
here run on a connection, inside the caller's transaction; :class:`Reservations` gives
:class:`~.ledger.Ledger` its methods on them.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from fedsketch.client.ledger_records import Budget, LedgerError

#: Longest time (seconds) a device sets aside the cost of a study whose roster it joined: one
#: day (less if the study's deadline comes first). Afterwards the reservation no longer counts.
RESERVATION_SECONDS = 86400.0

COLUMNS = "study_id, study_name, source, epsilon, delta, joined_at, expires_at, left_at"
#: The condition on a row of ``reservations`` that makes it live at time ``?`` (Unix seconds).
_LIVE = ("left_at IS NULL AND expires_at > ? AND NOT EXISTS "
         "(SELECT 1 FROM spends WHERE spends.study_id = reservations.study_id)")


@dataclass(frozen=True)
class Reservation:
    """The device joined the roster of ``study_id`` (named ``study_name``) and sets (ε, δ) of
    ``source`` aside for it: since ``joined_at``, until ``expires_at`` (Unix seconds), unless it
    left the study at ``left_at``."""

    study_id: str
    study_name: str
    source: str
    epsilon: float
    delta: float
    joined_at: float
    expires_at: float
    left_at: float | None = None


def insert(db: sqlite3.Connection, study_id: str, study_name: str, source: str, epsilon: float,
           delta: float, expires_at: float, now: float) -> Reservation:
    """Insert the reservation of ``study_id`` joined at ``now`` (Unix seconds), unless the study
    has one already (that first row is kept); the stored row. ValueError for ε or δ not finite
    and ≥ 0 or an expiry that is no finite time."""
    if not (isinstance(study_id, str) and study_id):
        raise ValueError(f"a reservation needs a study id, got {study_id!r}")
    for name, value in (("epsilon", epsilon), ("delta", delta)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"a reservation's {name} must be finite and >= 0, got {value!r}")
    if not math.isfinite(expires_at):
        raise ValueError(f"a reservation expires at a finite Unix time, got {expires_at!r}")
    db.execute(f"INSERT OR IGNORE INTO reservations ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
               (study_id, study_name, source, float(epsilon), float(delta), now, float(expires_at)))
    return get(db, study_id)


def get(db: sqlite3.Connection, study_id: str) -> Reservation | None:
    """The reservation of ``study_id`` whether live or not, or None."""
    row = db.execute(f"SELECT {COLUMNS} FROM reservations WHERE study_id = ?", (study_id,))
    return None if (row := row.fetchone()) is None else Reservation(*row)


def every(db: sqlite3.Connection) -> list[Reservation]:
    """Every reservation row, live or not (left, expired, or of a study it spent on), oldest
    first."""
    rows = db.execute(f"SELECT {COLUMNS} FROM reservations ORDER BY joined_at, study_id")
    return [Reservation(*r) for r in rows]


def live(db: sqlite3.Connection, now: float, source: str | None = None,
         other_than: str | None = None) -> list[Reservation]:
    """The reservations live at ``now`` (module docstring), of ``source`` if given, but that of
    ``other_than``; oldest first."""
    rows = db.execute(f"SELECT {COLUMNS} FROM reservations WHERE {_LIVE} "
                      "ORDER BY joined_at, study_id", (now,))
    held = (Reservation(*r) for r in rows)
    return [r for r in held if (source is None or r.source == source) and r.study_id != other_than]


def set_aside(db: sqlite3.Connection, source: str, now: float,
              other_than: str | None = None) -> tuple[float, float]:
    """(Σε, Σδ) of ``source``'s reservations live at ``now`` but that of ``other_than`` (exact
    sums, math.fsum)."""
    held = live(db, now, source, other_than)
    return math.fsum(r.epsilon for r in held), math.fsum(r.delta for r in held)


def delete(db: sqlite3.Connection, study_id: str) -> bool:
    """Delete the reservation of ``study_id`` (the study ended, or the device spent on it);
    whether there was one."""
    return db.execute("DELETE FROM reservations WHERE study_id = ?", (study_id,)).rowcount > 0


def mark_left(db: sqlite3.Connection, study_id: str, now: float) -> Reservation:
    """Mark the device as having left ``study_id`` at ``now`` (Unix seconds; a second call keeps
    the first time); the row. LedgerError if the device never joined that study."""
    db.execute("UPDATE reservations SET left_at = ? WHERE study_id = ? AND left_at IS NULL",
               (now, study_id))
    if (held := get(db, study_id)) is None:
        raise LedgerError(f"the device holds no reservation for study {study_id!r}")
    return held


class Reservations:
    """The reservation methods of :class:`~.ledger.Ledger` (a mixin: the ledger provides its
    connection, its write transaction and the budget lookup that refuses an undeclared
    source)."""

    _conn: sqlite3.Connection
    _write: Callable[[], AbstractContextManager[sqlite3.Connection]]
    _budget: Callable[[sqlite3.Connection, str], Budget]

    def reserve(self, study_id: str, study_name: str, source: str, epsilon: float, delta: float,
                expires_at: float) -> Reservation:
        """Record that the device joined the roster of ``study_id``, setting (ε, δ) of ``source``
        aside until ``expires_at`` (Unix seconds); the stored row. Idempotent: a study reserved
        already keeps its first row. LedgerError for an undeclared source."""
        with self._write() as db:
            self._budget(db, source)
            return insert(db, study_id, study_name, source, epsilon, delta, expires_at, time.time())

    def reservation(self, study_id: str) -> Reservation | None:
        """The reservation of ``study_id``, live or not (left, expired, spent on), or None."""
        return get(self._conn, study_id)

    def joined(self) -> list[Reservation]:
        """Every reservation, live or not, oldest first."""
        return every(self._conn)

    def reservations(self, now: float | None = None) -> list[Reservation]:
        """The reservations live at ``now`` (Unix seconds; default: now): not left, not expired,
        no spend recorded for the study. Oldest first."""
        return live(self._conn, time.time() if now is None else now)

    def reserved(self, source: str, other_than: str | None = None,
                 now: float | None = None) -> tuple[float, float]:
        """(Σε, Σδ) of ``source``'s reservations live at ``now`` (default: now), but that of the
        study ``other_than``."""
        return set_aside(self._conn, source, time.time() if now is None else now, other_than)

    def end_reservation(self, study_id: str) -> None:
        """Forget the reservation of ``study_id`` (the study ended, or the device spent on it)."""
        with self._write() as db:
            delete(db, study_id)

    def leave(self, study_id: str) -> Reservation:
        """Record that the device left ``study_id`` now: its reservation no longer counts, and the
        row stays so that the device does not join the study again. LedgerError if it never
        joined it."""
        with self._write() as db:
            return mark_left(db, study_id, time.time())
