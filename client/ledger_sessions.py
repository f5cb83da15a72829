"""The device's part in the secure-aggregation rounds it is in, kept in its ledger (schema 6).

A secure round runs over several stages, minutes apart. Its secrets (the device's X25519 keys
and mask seed b, the shares of its neighbours' secrets it holds) and each stage's message as
first computed are written here *before* the message is sent, so that a restarted daemon goes
on with the round and re-sends those very bytes: it draws no new keys, masks its input once,
signs one survivor list and reveals one kind of share per peer
(:mod:`fedsketch.common.secagg.client`). A row is deleted once the round is no longer listed
and the coordinator says it ended (or that the device may not read it); the file overwrites
what it deletes (``PRAGMA secure_delete``) and its write-ahead log is truncated then. The
secrets are as sensitive as the device's own key, which the same owner-only file keeps; the
session also holds the exact input x and noise share e the device prepared before it
registered (:mod:`.secure_session`), as the spend keeps their sum x + e (:mod:`.ledger_schema`,
schema 5).
A row belongs to one source's daemon: another source cannot replace or delete it.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from fedsketch.client.ledger_records import LedgerError


class SecureSessions:
    """The secure-session methods of :class:`~.ledger.Ledger` (a mixin: the ledger provides its
    connection and its write transaction)."""

    _conn: sqlite3.Connection
    _write: Callable[[], AbstractContextManager[sqlite3.Connection]]

    def save_session(self, study_id: str, source: str, state: bytes, scrub: bool = False) -> None:
        """Store (or replace) ``source``'s state in the round of ``study_id``, committed.
        LedgerError if another source's daemon holds that round: one device takes part once.
        ``scrub``: the new state drops secrets the old one held (x and e, the round's keys);
        the old row's pages are overwritten (``secure_delete``) and the write-ahead log, which
        holds copies of them, is truncated."""
        with self._write() as db:
            row = db.execute("SELECT source FROM secure_sessions WHERE study_id = ?", (study_id,)).fetchone()
            if row is not None and row[0] != source:
                raise LedgerError(f"study {study_id!r}: the daemon of source {row[0]!r} takes part "
                                  "in this secure round for this device")
            db.execute("INSERT OR REPLACE INTO secure_sessions (study_id, source, state, saved_at) "
                       "VALUES (?, ?, ?, ?)", (study_id, source, bytes(state), time.time()))
        if scrub:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def sessions(self, source: str | None = None) -> dict[str, bytes]:
        """The stored states of ``source``'s rounds (of every source's: None), by study id."""
        rows = self._conn.execute("SELECT study_id, state FROM secure_sessions WHERE ? IS NULL "
                                  "OR source = ?", (source, source))
        return dict(rows.fetchall())

    def drop_session(self, study_id: str, source: str) -> None:
        """Forget ``source``'s state in the round of ``study_id`` (nothing if none is stored),
        and truncate the write-ahead log so that the secrets do not linger there (the ledger
        overwrites deleted content: ``secure_delete``)."""
        with self._write() as db:
            gone = db.execute("DELETE FROM secure_sessions WHERE study_id = ? AND source = ?",
                              (study_id, source)).rowcount
        if gone:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
