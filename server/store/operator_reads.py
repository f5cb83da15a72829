"""What the operator watches, read from (and, for refusals, written to) the store: a study's
roster with labels and contribution times, the refusals devices reported, and the audit log;
and the memberships that decide what a device may read. A mixin of
:class:`~fedsketch.server.store.sql.SQLStore`, which provides the connection (``_tx``,
``_query``), the audit writer ``_log`` and the study reader ``_study``; the SQL is the shared
dialect of :mod:`.schema`."""

from __future__ import annotations

import time

from fedsketch.server.errors import Code
from fedsketch.server.store.base import REFUSAL_REASONS, RefusalRow, RosterEntry, StoreError

ROSTER_SQL = """
SELECT r.device_id, d.label, r.registered_at, c.received_at
FROM registrations AS r JOIN devices AS d ON d.device_id = r.device_id
LEFT JOIN contributions AS c ON c.study_id = r.study_id AND c.device_id = r.device_id
WHERE r.study_id = ? ORDER BY r.registered_at, r.device_id LIMIT ?
"""

REFUSALS_SQL = """
SELECT f.device_id, d.label, f.reason, f.reported_at
FROM refusals AS f JOIN devices AS d ON d.device_id = f.device_id
WHERE f.study_id = ? ORDER BY f.reported_at, f.device_id LIMIT ?
"""

#: The studies among a list whose roster holds a device, and whether it contributed to each (by
#: the primary keys (study_id, device_id) of both tables; "{ids}" is one "?" per study).
MEMBERSHIPS_SQL = """
SELECT r.study_id, c.device_id IS NOT NULL
FROM registrations AS r
LEFT JOIN contributions AS c ON c.study_id = r.study_id AND c.device_id = r.device_id
WHERE r.device_id = ? AND r.study_id IN ({ids})
"""


class OperatorReads:
    """The operator's reads of :class:`~fedsketch.server.store.base.Store`, :meth:`add_refusal`
    and :meth:`memberships`."""

    def add_refusal(self, study_id: str, device_id: str, reason: str) -> bool:
        if reason not in REFUSAL_REASONS:
            raise ValueError(f"unknown refusal reason {reason!r}; expected one of {REFUSAL_REASONS}")
        with self._tx(study_id) as c:
            self._study(c, study_id)  # not_found for an unknown study
            if not c.execute("SELECT 1 FROM devices WHERE device_id = ?", (device_id,)).fetchone():
                raise StoreError(Code.NOT_FOUND, f"no enrolled device {device_id!r}")
            if c.execute("SELECT 1 FROM refusals WHERE study_id = ? AND device_id = ?",
                         (study_id, device_id)).fetchone():
                return False
            c.execute("INSERT INTO refusals (study_id, device_id, reason, reported_at) "
                      "VALUES (?, ?, ?, ?)", (study_id, device_id, reason, time.time()))
            self._log(c, device_id, "refuse", f"study {study_id!r}: {reason}")
            return True

    def roster_entries(self, study_id: str, limit: int) -> list[RosterEntry]:
        return [RosterEntry(*row) for row in self._query(ROSTER_SQL, (study_id, limit))]

    def refusals(self, study_id: str, limit: int) -> tuple[list[RefusalRow], int]:
        rows = [RefusalRow(*row) for row in self._query(REFUSALS_SQL, (study_id, limit))]
        total = self._query("SELECT COUNT(*) FROM refusals WHERE study_id = ?", (study_id,))[0][0]
        return rows, total

    def device_count(self) -> int:
        return self._query("SELECT COUNT(*) FROM devices")[0][0]

    def memberships(self, device_id: str, study_ids: tuple[str, ...]) -> dict[str, bool]:
        if not study_ids:
            return {}
        rows = self._query(MEMBERSHIPS_SQL.format(ids=", ".join("?" * len(study_ids))),
                           (device_id, *study_ids))
        return {study_id: bool(contributed) for study_id, contributed in rows}

    def audit_log(self, limit: int = 100,
                  study_ids: tuple[str, ...] = ()) -> list[tuple[float, str, str, str]]:
        where = " OR ".join("instr(detail, ?) > 0" for _ in study_ids)
        rows = self._query(f"SELECT at, actor, action, detail FROM audit "
                           f"{'WHERE ' + where if where else ''} ORDER BY seq DESC LIMIT ?",
                           (*study_ids, limit))
        return rows[::-1]
