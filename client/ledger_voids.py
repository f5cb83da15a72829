"""Voids: a secure round's spend given back (schema 8; the argument is in
docs/secure-aggregation.md, "When a failed round gives ε back").

A spend row is never deleted or edited. A spend is given back by a *void* row that names it: the
ledger's sums (:meth:`~.ledger.Ledger.spent`, the per-study totals) leave a voided spend out,
and a voided spend is never sent (:meth:`~.ledger_spends.Spends.pending`). The agent voids only
a secure round's spend whose masked input y never left the device (rule A: the device declined,
was dropped, timed out, or the round ended before it sent MASKED_INPUT; :mod:`.secure_steps`);
a void without that is refused here unless it carries a certificate of abort (rule B: the round
FAILED and enough holders of the device's shares signed that they never unmask it,
:mod:`.secure_abort`) that suffices and is of the round terms the spend recorded before its
masked input left (schema 9): the void checks it, and ``--verify`` again, both with
:func:`.ledger_chain.certificate_problem`.

Each void is a link of the same chain as the spends (:mod:`.ledger_chain`):

    chain_i = SHA-256("fedsketch/ledger-void/v1" ‖ chain_{i-1} ‖ study ‖ the spend's link ‖
                      reason ‖ time ‖ SHA-256(certificate) or nothing)

signed with the device's key; ``position`` is its place in the chain (the number of links
before it), so ``fedsketch device budget --verify`` checks void rows as it checks spends: one
deleted, edited or added by hand is reported, and a void cannot be moved to another spend.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from fedsketch.client.ledger_chain import MASKED, certificate_problem, seal_void
from fedsketch.client.ledger_records import LedgerError


@dataclass(frozen=True)
class Void:
    """A spend given back: its study, why (in words), when (Unix seconds), and the certificate
    of abort it rests on (None: the masked input never left the device)."""

    study_id: str
    reason: str
    voided_at: float
    certificate: bytes | None = None


class Voids:
    """The void methods of :class:`~.ledger.Ledger` (a mixin: the ledger provides its connection
    and its write transaction)."""

    _conn: sqlite3.Connection
    _write: Callable[[], AbstractContextManager[sqlite3.Connection]]

    def void(self, study_id: str, reason: str, certificate: bytes | None = None) -> Void:
        """Give back the spend of ``study_id`` (committed; idempotent: a voided spend returns its
        void). LedgerError if there is no such spend, or if its bytes were acknowledged by the
        coordinator and no ``certificate`` is given (they left the device); LedgerError for a
        ``certificate`` that does not give it back: one that does not suffice, or is not of the
        round terms the spend recorded, or a spend that recorded none (its spend stands)."""
        with self._write() as db:
            held = self._void(db, study_id)
            if held is not None:
                return held
            row = db.execute("SELECT chain, acked_at, receipt, kind, round_terms FROM spends "
                             "WHERE study_id = ?", (study_id,)).fetchone()
            if row is None:
                raise LedgerError(f"no spend recorded for study {study_id!r}: nothing to give back")
            link, acked_at, receipt, kind, terms = row
            if kind != MASKED:
                raise LedgerError(f"the spend of study {study_id!r} is a plain release: only a "
                                  "secure round's spend can be given back")
            if certificate is None and acked_at is not None:
                raise LedgerError(f"the release of study {study_id!r} was sent (receipt "
                                  f"{receipt!r}): its spend stands without a certificate of abort")
            if link is None:
                raise LedgerError(f"the spend of study {study_id!r} is not sealed")
            if certificate is not None:
                if terms is None:
                    raise LedgerError(f"the spend of study {study_id!r} recorded no round terms "
                                      "(before ledger schema 9): no certificate of abort gives "
                                      "it back; it stands")
                identity = db.execute("SELECT device_id, private_key FROM identity").fetchone()
                if (why := certificate_problem(certificate, None, study_id, identity,
                                               bytes(terms))) is not None:
                    raise LedgerError(f"the spend of study {study_id!r} stands: the void would "
                                      f"rest on {why}")
            position = int(dict(db.execute("SELECT key, value FROM settings WHERE key = "
                                           "'chain_count'")).get("chain_count", "0"))
            now = time.time()
            cursor = db.execute(
                "INSERT INTO voids (study_id, reason, voided_at, certificate, certificate_sha256, "
                "spend_chain, position) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (study_id, reason, now, certificate,
                 "" if certificate is None else hashlib.sha256(certificate).hexdigest(),
                 bytes(link), position))
            seal_void(db, cursor.lastrowid)
        return Void(study_id, reason, now, certificate)

    @staticmethod
    def _void(db: sqlite3.Connection, study_id: str) -> Void | None:
        row = db.execute("SELECT study_id, reason, voided_at, certificate FROM voids WHERE "
                         "study_id = ?", (study_id,)).fetchone()
        return None if row is None else Void(*row)

    def voided(self, study_id: str) -> bool:
        """Whether the spend of ``study_id`` was given back: its bytes are never sent."""
        return self._void(self._conn, study_id) is not None

    def voids(self) -> dict[str, Void]:
        """Every void, by study id, oldest first."""
        rows = self._conn.execute("SELECT study_id, reason, voided_at, certificate FROM voids "
                                  "ORDER BY position")
        return {r[0]: Void(*r) for r in rows}
