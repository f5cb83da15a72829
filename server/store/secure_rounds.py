"""Secure-aggregation rounds in the SQL store, for every backend: each device's stage messages
and each round's progress (open stage, when it opened, its roster and the unmasked sum once it
ended), so a restarted coordinator resumes a round where it was
(:mod:`fedsketch.server.service.secure_round`). A mixin of
:class:`~fedsketch.server.store.sql.SQLStore`, which provides the write transactions (``_tx``,
keyed by the study), ``_query``, the audit writer ``_log`` and the study reader ``_study``; the
contract is :class:`~fedsketch.server.store.base.Store`'s."""

from __future__ import annotations

import json
import time
from collections.abc import Collection

from fedsketch.server.errors import Code
from fedsketch.server.store import accounts
from fedsketch.server.store.base import (
    ABANDON,
    ACCEPTING,
    DECODE,
    SecureRoundRow,
    StageMessageRow,
    StoreError,
    StudyRow,
)
from fedsketch.server.store.schema import Connection

_ACTOR = "coordinator"


class SecureRounds:
    """The secure-aggregation methods of :class:`~fedsketch.server.store.base.Store` in SQL."""

    def _accepting(self, c: Connection, study_id: str) -> StudyRow:
        """The study (not_found), refused 'failed_precondition' unless it is in ``ACCEPTING``."""
        study = self._study(c, study_id)
        if study.state not in ACCEPTING:
            raise StoreError(Code.FAILED_PRECONDITION, f"study {study_id!r} is {study.state!r} and "
                             "runs no secure-aggregation round")
        return study

    def add_stage_message(self, study_id: str, stage: int, device_id: str, body: bytes,
                          cost: tuple[float, float] | None = None) -> bool:
        body = bytes(body)
        with self._tx(study_id) as c:
            self._study(c, study_id)  # not_found for an unknown study
            prior = c.execute("SELECT body FROM stage_messages WHERE study_id = ? AND stage = ? "
                              "AND device_id = ?", (study_id, stage, device_id)).fetchone()
            if prior is not None:  # checked before the state: a lost ack is re-acknowledged
                if prior[0] == body:
                    return False
                raise StoreError(Code.CONFLICT, f"device {device_id!r} already sent different "
                                 f"bytes at stage {stage} of study {study_id!r}")
            self._accepting(c, study_id)
            if not c.execute("SELECT 1 FROM devices WHERE device_id = ?", (device_id,)).fetchone():
                raise StoreError(Code.NOT_FOUND, f"no enrolled device {device_id!r}")
            if cost is not None:  # a REGISTER: the round counts against the declared budget
                self._also_lock(c, "device:" + device_id)
                accounts.check(c, device_id, study_id, cost)
            c.execute("INSERT INTO stage_messages (study_id, stage, device_id, body, received_at, "
                      "epsilon, delta) VALUES (?, ?, ?, ?, ?, ?, ?)",
                      (study_id, stage, device_id, body, time.time(), *(cost or (None, None))))
            return True

    def stage_messages(self, study_id: str, stages: tuple[int, ...] | None = None,
                       held: Collection[str] = ()) -> list[StageMessageRow]:
        where, params = "study_id = ?", [study_id]
        if stages is not None:
            where += f" AND stage IN ({', '.join('?' * len(stages))})"
            params += stages
            if held:
                where += f" AND NOT (stage = ? AND device_id IN ({', '.join('?' * len(held))}))"
                params += [stages[0], *held]
        rows = self._query("SELECT stage, device_id, body, received_at FROM stage_messages "
                           f"WHERE {where} ORDER BY received_at, stage, device_id", tuple(params))
        return [StageMessageRow(*row) for row in rows]

    def open_stage(self, study_id: str, stage: int, opened_at: float) -> None:
        with self._tx(study_id) as c:
            self._accepting(c, study_id)
            c.execute("INSERT INTO secure_rounds (study_id, stage, opened_at) VALUES (?, ?, ?) "
                      "ON CONFLICT (study_id) DO UPDATE SET stage = excluded.stage, "
                      "opened_at = excluded.opened_at", (study_id, stage, opened_at))

    def secure_round(self, study_id: str) -> SecureRoundRow | None:
        rows = self._query("SELECT stage, opened_at, ended, total, devices, records, members "
                           "FROM secure_rounds WHERE study_id = ?", (study_id,))
        if not rows:
            return None
        stage, opened_at, ended, total, devices, records, members = rows[0]
        return SecureRoundRow(stage, opened_at, bool(ended), total, devices, float(records),
                              None if members is None else json.loads(members))

    def end_secure_round(self, study_id: str, detail: str, total: bytes | None = None,
                         devices: int = 0, records: float = 0.0,
                         members: dict[str, bool] | None = None) -> StudyRow:
        transition = ABANDON if total is None else DECODE
        with self._tx(study_id) as c:
            current = self._accepting(c, study_id).state
            c.execute("INSERT INTO secure_rounds (study_id, stage, opened_at) VALUES (?, 0, ?) "
                      "ON CONFLICT (study_id) DO NOTHING", (study_id, time.time()))
            c.execute("UPDATE secure_rounds SET ended = 1, total = ?, devices = ?, records = ?, "
                      "members = ? WHERE study_id = ?",
                      (None if total is None else bytes(total), devices, records,
                       None if members is None else json.dumps(members, sort_keys=True), study_id))
            c.execute(accounts.KEEP_SECURE_CHARGES, (study_id,))  # before its messages go
            c.execute("DELETE FROM stage_messages WHERE study_id = ?", (study_id,))
            c.execute("UPDATE studies SET state = ?, detail = ? WHERE study_id = ?",
                      (transition.target, detail, study_id))
            self._log(c, _ACTOR, "end_secure_round",
                      f"study {study_id!r}: {current} -> {transition.target} {detail}".rstrip())
            return self._study(c, study_id)
