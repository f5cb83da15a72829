"""The abort statements of failed secure rounds, in the SQL store for every backend (rule B of
docs/secure-aggregation.md, "When a failed round gives ε back"; schema 9, and 10: the round's
instance and one per coordinator name).

A device of a round that failed signs that it aborts the round's instance R (the SHA-256 of the
ADVERTISE_KEYS bundle it received, :mod:`fedsketch.common.secagg.abort`); the coordinator keeps
one statement per round, device and coordinator name it was signed for (the first: Ed25519
signatures are deterministic, so an honest re-send is the same bytes; a statement for one of
the coordinator's names does not displace one for another) and
hands every statement of the round back as the certificate collected so far. When the
certificate it hands a device suffices for that device's masked input, it marks the device's
statement ``certified_at``: from then on the round no longer counts against the device's
declared budget (:mod:`.accounts`), as the device's ledger gives the spend back with the same
certificate. A mixin of :class:`~fedsketch.server.store.sql.SQLStore` (``_tx``, ``_query``,
``_study``)."""

from __future__ import annotations

import time
from typing import NamedTuple

from fedsketch.server.errors import Code
from fedsketch.server.store.base import StoreError


class AbortStatementRow(NamedTuple):
    """One device's abort statement of a round: who, for which coordinator name, its
    signature, when it arrived (Unix seconds), and the round instance R it names (empty: a
    version-1 statement kept before schema 10)."""

    device_id: str
    audience: str
    signature: bytes
    received_at: float
    round_sha256: bytes = b""


class AbortStatements:
    """The abort-statement methods of :class:`~fedsketch.server.store.base.Store` in SQL."""

    def add_abort_statement(self, study_id: str, device_id: str, audience: str,
                            signature: bytes, round_sha256: bytes = b"") -> bool:
        """Keep ``device_id``'s statement for the round of ``study_id`` and the coordinator name
        ``audience`` (True), or nothing if it has one already (False); StoreError
        'failed_precondition' unless the study failed."""
        with self._tx(study_id) as c:
            if (state := self._study(c, study_id).state) != "failed":
                raise StoreError(Code.FAILED_PRECONDITION, f"study {study_id!r} is {state!r}: only "
                                 "a failed secure round is aborted")
            return c.execute("INSERT INTO abort_statements (study_id, device_id, audience, "
                             "round_sha256, signature, received_at) VALUES (?, ?, ?, ?, ?, ?) ON "
                             "CONFLICT (study_id, device_id, audience) DO NOTHING",
                             (study_id, device_id, audience, bytes(round_sha256), bytes(signature),
                              time.time())).rowcount == 1

    def abort_statements(self, study_id: str) -> list[AbortStatementRow]:
        """Every statement kept for the round of ``study_id``, oldest first."""
        rows = self._query("SELECT device_id, audience, signature, received_at, round_sha256 FROM "
                           "abort_statements WHERE study_id = ? ORDER BY received_at, device_id, "
                           "audience", (study_id,))
        return [AbortStatementRow(d, a, bytes(s), float(t), bytes(r)) for d, a, s, t, r in rows]

    def certify_abort(self, study_id: str, device_id: str) -> None:
        """Record that the coordinator handed ``device_id`` a certificate of abort that suffices
        for its masked input in the round of ``study_id`` (its statement must be kept)."""
        with self._tx(study_id) as c:
            c.execute("UPDATE abort_statements SET certified_at = ? WHERE study_id = ? AND "
                      "device_id = ? AND certified_at IS NULL", (time.time(), study_id, device_id))
