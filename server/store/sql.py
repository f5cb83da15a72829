"""The store's logic, once for every SQL backend: :class:`SQLStore` implements
:class:`fedsketch.server.store.base.Store` (the contract: transactions, refusals, the study
lifecycle) in the SQL of :mod:`.schema`, over the two things a backend provides:

- ``_tx(key)``, one write transaction, committed durably on normal exit and rolled back on any
  error, and serialized with every other write transaction on the same ``key`` (a study id, or
  a name for the writes that are not a study's), in this process and in any other using the
  same database. Each method reads what it checks inside that transaction, so a check and the
  write it allows are one atomic step: SQLite serializes every write (``BEGIN IMMEDIATE``), the
  PostgreSQL backend each key's writes (a transaction-scoped advisory lock).
- ``_reading()``, a connection for reads, which see every write that returned.

Contributions, stored by group commit (several in one durable transaction), are in
:mod:`.contributing`; the operator's reads, and refusals, in :mod:`.operator_reads`;
secure-aggregation rounds in :mod:`.secure_rounds`; a device's account against its declared
budget in :mod:`.accounts` (a write that counts against it also takes the device's lock,
``_also_lock``).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from abc import abstractmethod
from contextlib import AbstractContextManager

from fedsketch.server.errors import Code
from fedsketch.server.store import accounts
from fedsketch.server.store.abort_statements import AbortStatements
from fedsketch.server.store.base import (
    ACCEPTING,
    PUBLISH,
    STATES,
    Store,
    StoreError,
    StudyRow,
)
from fedsketch.server.store.contributing import Contributions
from fedsketch.server.store.operator_reads import OperatorReads
from fedsketch.server.store.schema import (
    OUTSTANDING_SQL,
    STUDY_SQL,
    Connection,
    study_row,
)
from fedsketch.server.store.secure_rounds import SecureRounds

COORDINATOR = "coordinator"  # audit actor for writes not made on behalf of a device
#: The ``_tx`` key of enrollments (they check a key's uniqueness across tokens) and of tokens.
ENROLLMENT = "enrollment"


def _sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class SQLStore(Contributions, OperatorReads, SecureRounds, AbortStatements, Store):
    """The coordinator's state in a SQL database; a backend subclasses it with its connections."""

    @abstractmethod
    def _tx(self, key: str = COORDINATOR) -> AbstractContextManager[Connection]:
        """One write transaction, serialized with the others on ``key`` (module docstring)."""

    @abstractmethod
    def _reading(self) -> AbstractContextManager[Connection]:
        """A connection to read from, outside any write transaction."""

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._reading() as c:
            return c.execute(sql, params).fetchall()

    @staticmethod
    def _log(c: Connection, actor: str, action: str, detail: str) -> None:
        c.execute("INSERT INTO audit (at, actor, action, detail) VALUES (?, ?, ?, ?)",
                  (time.time(), actor, action, detail))

    @staticmethod
    def _study(c: Connection, study_id: str) -> StudyRow:
        row = c.execute(STUDY_SQL.format(where="WHERE s.study_id = ?"), (study_id,)).fetchone()
        if row is None:
            raise StoreError(Code.NOT_FOUND, f"no study {study_id!r}")
        return study_row(row)

    # enrollment

    def add_tokens(self, tokens: list[str]) -> None:
        if any(not t for t in tokens):
            raise ValueError("enrollment tokens must be non-empty")
        now = time.time()
        with self._tx(ENROLLMENT) as c:
            c.executemany(
                "INSERT INTO tokens (token_sha256, added_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
                [(_sha256_hex(t), now) for t in tokens],
            )
            self._log(c, COORDINATOR, "add_tokens", f"{len(tokens)} tokens")

    def enroll(self, token: str, public_key: bytes, label: str,
               budget: tuple[float, float] | None = None) -> str:
        public_key = bytes(public_key)
        if len(public_key) != 32:
            raise ValueError(f"public key must be 32 bytes, got {len(public_key)}")
        digest = _sha256_hex(token)
        device_id = "dev-" + secrets.token_hex(8)
        now = time.time()
        with self._tx(ENROLLMENT) as c:
            token = c.execute("SELECT used_by FROM tokens WHERE token_sha256 = ?", (digest,)).fetchone()
            if token is None:
                raise StoreError(Code.PERMISSION_DENIED, "unknown or already used enrollment token")
            if (enrolled := token[0]) is not None:  # a lost reply: the same key may ask again
                if c.execute("SELECT 1 FROM devices WHERE device_id = ? AND public_key = ?",
                             (enrolled, public_key)).fetchone():
                    return enrolled
                raise StoreError(Code.PERMISSION_DENIED, "unknown or already used enrollment token")
            if c.execute("SELECT 1 FROM devices WHERE public_key = ?", (public_key,)).fetchone():
                raise StoreError(Code.CONFLICT, "this public key is already enrolled")
            c.execute("INSERT INTO devices (device_id, public_key, label, enrolled_at, budget_epsilon, "
                      "budget_delta) VALUES (?, ?, ?, ?, ?, ?)", (device_id, public_key, label, now,
                                                                 *(budget or (None, None))))
            c.execute("UPDATE tokens SET used_by = ?, used_at = ? WHERE token_sha256 = ?",
                      (device_id, now, digest))
            self._log(c, device_id, "enroll", f"label={label!r}" + (
                "" if budget is None else f" budget=({budget[0]:g}, {budget[1]:g})"))
        return device_id

    def account(self, device_id: str) -> accounts.Account:
        with self._reading() as c:
            return accounts.account(c, device_id)

    def _also_lock(self, c: Connection, key: str) -> None:
        """Inside a write transaction, also take the lock of ``key`` (after the transaction's
        own): a no-op where every write is serialized (SQLite); PostgreSQL's store overrides it."""

    def device_key(self, device_id: str) -> bytes | None:
        rows = self._query("SELECT public_key FROM devices WHERE device_id = ?", (device_id,))
        return rows[0][0] if rows else None

    def device_keys(self, limit: int) -> dict[str, bytes]:
        rows = self._query("SELECT device_id, public_key FROM devices ORDER BY enrolled_at DESC "
                           "LIMIT ?", (limit,))
        return {device: bytes(key) for device, key in rows}

    # studies

    def create_study(
        self, study_id: str, spec_json: str, spec_sha256: str, deadline: float | None, min_devices: int,
        parent: str | None = None, roster: int | None = None,
    ) -> StudyRow:
        with self._tx(study_id) as c:
            if c.execute("SELECT 1 FROM studies WHERE study_id = ?", (study_id,)).fetchone():
                raise StoreError(Code.CONFLICT, f"study {study_id!r} already exists")
            if parent is not None:
                self._study(c, parent)  # not_found for an unknown parent
            c.execute(
                "INSERT INTO studies (study_id, spec_json, spec_sha256, state, detail, created_at, deadline,"
                " min_devices, parent, roster) VALUES (?, ?, ?, ?, '', ?, ?, ?, ?, ?)",
                (study_id, spec_json, spec_sha256, STATES[0], time.time(), deadline, min_devices, parent,
                 roster),
            )
            self._log(c, COORDINATOR, "create_study", f"study {study_id!r} spec_sha256 {spec_sha256}")
            return self._study(c, study_id)

    def get_study(self, study_id: str) -> StudyRow:
        with self._reading() as c:
            return self._study(c, study_id)

    def list_studies(self, states: tuple[str, ...] | None = None) -> list[StudyRow]:
        where = "" if states is None else f"WHERE s.state IN ({', '.join('?' * len(states))})"
        return [study_row(r) for r in self._query(STUDY_SQL.format(where=where), tuple(states or ()))]

    def rounds(self, parent: str) -> list[StudyRow]:
        return [study_row(r) for r in self._query(STUDY_SQL.format(where="WHERE s.parent = ?"),
                                                   (parent,))]

    def set_state(
        self, study_id: str, state: str, detail: str = "", expect: tuple[str, ...] | None = None
    ) -> StudyRow:
        if state not in STATES:
            raise ValueError(f"unknown study state {state!r}; expected one of {STATES}")
        with self._tx(study_id) as c:
            current = self._study(c, study_id).state
            if expect is not None and current not in expect:
                raise StoreError(
                    Code.FAILED_PRECONDITION, f"study {study_id!r} is {current!r}, expected one of {expect}"
                )
            c.execute(
                "UPDATE studies SET state = ?, detail = ? WHERE study_id = ?", (state, detail, study_id)
            )
            change = f"study {study_id!r}: {current} -> {state} {detail}".rstrip()
            self._log(c, COORDINATOR, "set_state", change)
            return self._study(c, study_id)

    # rosters

    def register(self, study_id: str, device_id: str,
                 cost: tuple[float, float] | None = None) -> tuple[bool, StudyRow]:
        with self._tx(study_id) as c:
            study = self._study(c, study_id)
            if not c.execute("SELECT 1 FROM devices WHERE device_id = ?", (device_id,)).fetchone():
                raise StoreError(Code.NOT_FOUND, f"no enrolled device {device_id!r}")
            if self._in_roster(c, study_id, device_id):
                return False, study
            if study.state not in ACCEPTING or study.closing is not None:
                state = "closing" if study.state in ACCEPTING else repr(study.state)
                raise StoreError(Code.FAILED_PRECONDITION,
                                 f"study {study_id!r} is {state} and takes no registrations")
            if study.registered >= study.capacity:
                raise StoreError(Code.FAILED_PRECONDITION, f"the roster of study {study_id!r} is "
                                 f"full ({study.registered} devices)")
            accounts.check(c, device_id, study_id, cost)  # early: its contribution is checked again
            now = time.time()
            c.execute("INSERT INTO registrations (study_id, device_id, registered_at) VALUES (?, ?, ?)",
                      (study_id, device_id, now))
            c.execute("UPDATE studies SET registered = registered + 1 WHERE study_id = ?", (study_id,))
            if study.filled_at is None and study.registered + 1 >= study.min_devices:
                c.execute("UPDATE studies SET filled_at = ? WHERE study_id = ?", (now, study_id))
            self._log(c, device_id, "register", f"study {study_id!r}")
            return True, self._study(c, study_id)

    def leave(self, study_id: str, device_id: str) -> tuple[bool, StudyRow]:
        with self._tx(study_id) as c:
            study = self._study(c, study_id)
            if study.state not in ACCEPTING:
                raise StoreError(Code.FAILED_PRECONDITION, f"study {study_id!r} is {study.state!r}")
            if self._contributed(c, study_id, device_id):
                raise StoreError(Code.FAILED_PRECONDITION, f"device {device_id!r} contributed to "
                                 f"study {study_id!r}: a release cannot be withdrawn")
            if self._holds_ticket(c, study_id, device_id):
                raise StoreError(Code.ABORTED, f"device {device_id!r} holds an input "
                                 "ticket (it may have spent): it cannot leave until the ticket ends")
            if not self._in_roster(c, study_id, device_id):
                return False, study
            c.execute("DELETE FROM registrations WHERE study_id = ? AND device_id = ?",
                      (study_id, device_id))
            c.execute("UPDATE studies SET registered = registered - 1 WHERE study_id = ?", (study_id,))
            self._log(c, device_id, "leave", f"study {study_id!r}")
            return True, self._study(c, study_id)

    def ticket(self, study_id: str, device_id: str, seconds: float) -> float:
        with self._tx(study_id) as c:
            study = self._study(c, study_id)
            if (study.state not in ACCEPTING or study.closing is not None or not study.roster_full
                    or not self._in_roster(c, study_id, device_id)
                    or self._contributed(c, study_id, device_id)):
                return 0.0
            c.execute("UPDATE registrations SET ticket_until = ? WHERE study_id = ? AND device_id = ?",
                      (time.time() + seconds, study_id, device_id))
            return float(seconds)

    def outstanding(self, study_id: str, now: float) -> int:
        return self._query(OUTSTANDING_SQL, (study_id, now))[0][0]

    def request_close(self, study_id: str, reason: str) -> StudyRow:
        with self._tx(study_id) as c:
            study = self._study(c, study_id)
            if study.state not in ACCEPTING:
                raise StoreError(Code.FAILED_PRECONDITION, f"study {study_id!r} is {study.state!r}")
            if study.closing is None:
                c.execute("UPDATE studies SET close_requested = ?, detail = ? WHERE study_id = ?",
                          (reason, f"closing ({reason}): waiting for the devices told to send",
                           study_id))
                self._log(c, COORDINATOR, "request_close", f"study {study_id!r}: {reason}")
            return self._study(c, study_id)

    @staticmethod
    def _in_roster(c: Connection, study_id: str, device_id: str) -> bool:
        return c.execute("SELECT 1 FROM registrations WHERE study_id = ? AND device_id = ?",
                         (study_id, device_id)).fetchone() is not None

    @staticmethod
    def _contributed(c: Connection, study_id: str, device_id: str) -> bool:
        return c.execute("SELECT 1 FROM contributions WHERE study_id = ? AND device_id = ?",
                         (study_id, device_id)).fetchone() is not None

    @staticmethod
    def _holds_ticket(c: Connection, study_id: str, device_id: str) -> bool:
        return c.execute("SELECT 1 FROM registrations WHERE study_id = ? AND device_id = ? AND "
                         "ticket_until > ?", (study_id, device_id, time.time())).fetchone() is not None

    # results

    def put_result(self, study_id: str, result_json: str) -> None:
        with self._tx(study_id) as c:
            current = self._study(c, study_id).state
            if c.execute("SELECT 1 FROM results WHERE study_id = ?", (study_id,)).fetchone():
                raise StoreError(Code.CONFLICT, f"study {study_id!r} already has a result")
            if current not in PUBLISH.sources:
                raise StoreError(Code.FAILED_PRECONDITION, f"study {study_id!r} is {current!r}, not decoding")
            c.execute("INSERT INTO results (study_id, result_json, created_at) VALUES (?, ?, ?)",
                      (study_id, result_json, time.time()))
            c.execute("UPDATE studies SET state = ?, detail = '' WHERE study_id = ?",
                      (PUBLISH.target, study_id))
            self._log(c, COORDINATOR, "put_result", f"study {study_id!r}: {current} -> {PUBLISH.target}")

    def get_result(self, study_id: str) -> str | None:
        rows = self._query("SELECT result_json FROM results WHERE study_id = ?", (study_id,))
        return rows[0][0] if rows else None

    # audit log

    def audit(self, actor: str, action: str, detail: str) -> None:
        with self._tx() as c:
            self._log(c, actor, action, detail)
