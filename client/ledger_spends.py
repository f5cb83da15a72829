"""The spends in a device's ledger: the budget check a release must pass, recording a release
before it is sent (once per study, and once per round of a study), its receipt and final
state, and the ε the device keeps for the rounds still to come of studies it took part in
(:func:`~.ledger_schema.promises`)."""

from __future__ import annotations

import hashlib
import math
import sqlite3
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace

from fedsketch.client.ledger_chain import Verdict, seal, verify
from fedsketch.client.ledger_records import Budget, BudgetExceeded, LedgerError, Spend, over_budget
from fedsketch.client.ledger_schema import (
    NOT_VOID,
    SPEND_COLUMNS,
    promised,
    promises,
    round_taken,
    study_spent,
)
from fedsketch.client.policy import Policy


class Spends:
    """The spend methods of :class:`~.ledger.Ledger` (a mixin: the ledger provides its
    connection, its write transaction, the budget and policy lookups, the sums of a source's
    spends and its reservations)."""

    _conn: sqlite3.Connection
    _write: Callable[[], AbstractContextManager[sqlite3.Connection]]
    _budget: Callable[[sqlite3.Connection, str], Budget]
    _policy: Callable[[sqlite3.Connection], Policy]
    _sums: Callable[[sqlite3.Connection, str], tuple[float, float]]
    reserved: Callable[..., tuple[float, float]]

    def find(self, study_id: str) -> Spend | None:
        """The one spend of this study, or None if the device never released for it."""
        row = self._conn.execute(f"SELECT {SPEND_COLUMNS} FROM spends WHERE study_id = ?", (study_id,))
        return None if (row := row.fetchone()) is None else Spend(*row)

    def refusal(self, source: str, epsilon: float, delta: float,
                extra: tuple[float, float] = (0.0, 0.0), *, study_id: str | None = None,
                parent: str | None = None) -> str | None:
        """Why a study asking (ε, δ) cannot be charged to ``source`` now, or None: the owner's
        largest ε per study, or a budget that cannot cover it besides what is set aside: the live
        reservations of studies the device joined (:meth:`reserved`; not that of ``study_id``,
        the study asking), ``extra`` (ε, δ) promised outside the ledger (the agent's secure
        sessions, held in its memory), and the rounds to come of studies it took part in
        (:func:`~.ledger_schema.promised`; not those of ``parent``, whose round asks and is paid
        from them). :meth:`record_spend` decides the same way, without reservations."""
        joined, kept = self.reserved(source, other_than=study_id), promised(self._conn, source, parent)
        set_aside = (math.fsum((extra[0], joined[0], kept)), math.fsum((extra[1], joined[1])))
        return self._refusal(self._conn, source, epsilon, delta, set_aside)

    def _refusal(self, db: sqlite3.Connection, source: str, epsilon: float, delta: float,
                 reserved: tuple[float, float] = (0.0, 0.0), parent: str | None = None) -> str | None:
        budget = self._budget(db, source)
        max_eps = self._policy(db).max_epsilon
        study = epsilon if parent is None else math.fsum((study_spent(db, parent), epsilon))
        if max_eps is not None and study > max_eps:
            return f"it asks ε = {study:g}; the device's policy allows at most {max_eps:g} per study"
        return over_budget(source, budget, self._sums(db, source), reserved, epsilon, delta)

    def promises(self, source: str | None = None) -> list[tuple[str, str, str, float, float]]:
        """The live promises (of ``source``, or all): (study id, release name, source, ε kept,
        until when in Unix seconds), :func:`~.ledger_schema.promises`."""
        return promises(self._conn, source)

    def keeps(self, study_id: str, source: str) -> bool:
        """Whether ``source`` keeps ε for the rounds to come of ``study_id`` (a live promise): a
        round of it is paid from that, so the device sets nothing more aside for it."""
        return any(study == study_id for study, *_ in promises(self._conn, source))

    def round_refusal(self, parent: str, round: int) -> str | None:
        """Why the device may not release for round ``round`` of study ``parent`` (it already
        did, under any round study id), or None: :func:`~.ledger_schema.round_taken`."""
        return round_taken(self._conn, parent, round)

    def record_spend(self, *, study_id: str, study_name: str, source: str, epsilon: float,
                     delta: float, n: float, kind: str, payload: bytes, spec_sha256: str,
                     recheck: Callable[[], str | None] | None = None, parent: str | None = None,
                     round: int = 0, later_epsilon: float = 0.0, keep_seconds: float = 0.0,
                     premask: bytes | None = None, round_terms: bytes | None = None) -> Spend:
        """Record the release of ``payload`` for ``study_id`` in one committed transaction; call it
        BEFORE sending, and send only the bytes of the returned Spend.

        Raises ValueError for ε not finite and > 0, δ not finite and ≥ 0, or n not finite;
        LedgerError if this study already has a spend or ``source`` has no budget; BudgetExceeded
        if the owner's policy declines ε or the budget cannot cover it (:func:`.fits`, for ε and
        for δ; for a refinement ``round`` of the study ``parent``, the owner's largest ε per study
        caps what that study has taken in all, and LedgerError if that round was released
        already, under any study id). ``later_epsilon`` > 0: the study has more rounds after
        this release, which ask that much ε in all; the spend keeps it aside for
        ``keep_seconds`` (recorded as the study's whole ε for this device, ``study_epsilon`` =
        what it spent on the study before + ε + ``later_epsilon``, and ``kept_until``;
        :mod:`.ledger_schema`, schema 6). The budget must cover ε + ``later_epsilon`` besides
        what the device keeps for the rounds of its other studies
        (:func:`~.ledger_schema.promised`). ``premask``: a masked release's input before its
        masks (schema 5); ``round_terms``: a secure round's terms, as the device saw them before
        its masked input leaves it (schema 9; sealed with the row, :mod:`.ledger_voids` gives
        the spend back only with a certificate of abort of those terms). The checks run inside
        the write transaction, last ``recheck()`` (the agent asks the coordinator whether the
        study still takes this device's input): a reason from it raises LedgerError. A refusal,
        or any exception from ``recheck``, writes nothing."""
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
        if not (math.isfinite(delta) and delta >= 0):
            raise ValueError(f"delta must be finite and >= 0, got {delta!r}")
        if not math.isfinite(n):
            raise ValueError(f"n must be finite, got {n!r}")
        for name, value in (("later_epsilon", later_epsilon), ("keep_seconds", keep_seconds)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        payload, now = bytes(payload), time.time()
        spend = Spend(study_id=study_id, study_name=study_name, source=source, epsilon=float(epsilon),
                      delta=float(delta), n=float(n), kind=kind, payload=payload,
                      payload_sha256=hashlib.sha256(payload).hexdigest(), spec_sha256=spec_sha256,
                      spent_at=now, acked_at=None, receipt=None, final_state=None,
                      parent=parent, round=round, premask=None if premask is None else bytes(premask),
                      round_terms=None if round_terms is None else bytes(round_terms))
        with self._write() as db:
            if db.execute("SELECT 1 FROM spends WHERE study_id = ?", (study_id,)).fetchone():
                raise LedgerError(f"the device already released a sketch for study {study_id!r}; "
                                  "it re-sends the stored bytes instead")
            if parent is not None and (why := round_taken(db, parent, round)) is not None:
                raise LedgerError(f"study {study_id!r}: {why}")
            study = parent or study_id
            kept, asks = (promised(db, source, study), 0.0), math.fsum((epsilon, later_epsilon))
            if (why := self._refusal(db, source, asks, delta, kept, parent)) is not None:
                raise BudgetExceeded(f"study {study_id!r}: {why}")
            if recheck is not None and (why := recheck()) is not None:
                raise LedgerError(f"study {study_id!r}: {why}; nothing was spent")
            if later_epsilon > 0:  # the study's whole ε for this device, kept until kept_until
                whole = math.fsum((study_spent(db, study), spend.epsilon, later_epsilon))
                spend = replace(spend, study_epsilon=whole, kept_until=now + keep_seconds)
            cursor = db.execute(f"INSERT INTO spends ({SPEND_COLUMNS}) VALUES ({', '.join('?' * 20)})",
                       (spend.study_id, spend.study_name, spend.source, spend.epsilon, spend.delta,
                        spend.n, spend.kind, spend.payload, spend.payload_sha256, spend.spec_sha256,
                        spend.spent_at, None, None, None, parent, round, spend.study_epsilon,
                        spend.premask, spend.kept_until, spend.round_terms))
            seal(db, cursor.lastrowid)  # chained and signed in the same transaction
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

    def set_final_state(self, study_id: str, state: str) -> None:
        """Record how the study ended (e.g. ``DONE`` or ``FAILED``), as the coordinator reported it."""
        with self._write() as db:
            if db.execute("UPDATE spends SET final_state = ? WHERE study_id = ?",
                          (state, study_id)).rowcount != 1:
                raise LedgerError(f"no spend recorded for study {study_id!r}")

    def pending(self) -> list[Spend]:
        """Spends not yet acknowledged, oldest first: the payloads to (re-)send (never one given
        back: its bytes must not leave the device, :mod:`.ledger_voids`)."""
        rows = self._conn.execute(f"SELECT {SPEND_COLUMNS} FROM spends WHERE acked_at IS NULL "
                                  f"AND {NOT_VOID} ORDER BY seq")
        return [Spend(*r) for r in rows]

    def unsettled(self) -> list[Spend]:
        """Acknowledged spends whose study's end the device has not learnt yet, oldest first."""
        rows = self._conn.execute(f"SELECT {SPEND_COLUMNS} FROM spends WHERE acked_at IS NOT NULL "
                                  "AND final_state IS NULL ORDER BY seq")
        return [Spend(*r) for r in rows]

    def verify_chain(self) -> Verdict:
        """The spend rows checked against their seal (:func:`.ledger_chain.verify`)."""
        return verify(self._conn)

    def spends(self) -> list[Spend]:
        """All spends, oldest first."""
        return [Spend(*r) for r in self._conn.execute(f"SELECT {SPEND_COLUMNS} FROM spends ORDER BY seq")]
