"""The store's SQL layout, for every backend: its tables (schema version :data:`SCHEMA_VERSION`),
the queries that read rows back, and the migrations from each older schema, in one ordered list
(:func:`migrate`).

The SQL is written once, in SQLite's spelling; :func:`postgres_sql` turns a statement into
PostgreSQL's, the one place where the two dialects differ (types, placeholders, one function).
A new store runs :data:`SCHEMA`, an older one runs the steps of :func:`migrate` from its version
on, in the backend's write transaction, and then records :data:`SCHEMA_VERSION` (SQLite in
``PRAGMA user_version``, PostgreSQL in the table ``fedsketch_store``). To add schema N+1: append
its tables to :data:`SCHEMA`, write ``migrate_vN(c)`` creating them (from the same constants),
append ``(migrate_vN, "what changed")`` to the steps, and set ``SCHEMA_VERSION = N + 1``; both
backends then create and migrate alike. A PostgreSQL store is created at schema 6 or later, so
the steps before (below: table rebuilds that only SQLite needs) only ever run on SQLite files.

Schema 2 adds ``registrations``, a plain study's roster (:meth:`~fedsketch.server.store.base.
Store.register`) with each member's input ticket (``ticket_until``, Unix seconds:
:meth:`~fedsketch.server.store.base.Store.ticket`), and ``studies.close_requested``, the reason
of a close that waits for those tickets. :func:`migrate_v1` adds both to a schema-1 file and
enrolls in each study's roster every device that had contributed to it, so open studies go on
where they were.

Schema 3 adds ``studies.parent``, the study whose refinement round a study is (NULL for a study
an operator created), and lets ``contributions.kind`` be ``int64_cells`` (a round's release).
:func:`migrate_v2` rebuilds ``contributions`` with the wider CHECK and adds the column.

Schema 4 adds ``studies.roster``, the most devices a roster takes (NULL: ``min_devices``), and
``studies.filled_at``, when the quorum had registered. :func:`migrate_v3` adds both and sets
``filled_at`` of every study whose quorum had registered to its last registration (its rosters
were never larger than the quorum).

Schema 5 keeps, in each ``studies`` row, the counts every Submit and poll reads:
``contributed`` (its contributions), ``records`` (the sum of their ``n``) and ``registered``
(its roster's size), written in the same transaction as the contribution or registration (or
leave) that changes them, so a study row is read in O(1) of its stored contributions, never by
counting them. :func:`migrate_v4` adds the columns and fills them by one recount of the rows, and
indexes ``registrations`` by ticket, so counting the live tickets (:data:`OUTSTANDING_SQL`)
reads only those.

Schema 6 adds ``refusals``, the reason each device reported when it declined a study (one row
per study and device: :meth:`~fedsketch.server.store.base.Store.add_refusal`); :func:`migrate_v5`
creates it.

Schema 7 keeps a secure-aggregation round where a restarted coordinator can resume it:
``stage_messages``, each device's message of each stage as received (one row per study, stage
and device: :meth:`~fedsketch.server.store.base.Store.add_stage_message`), and ``secure_rounds``,
each round's open stage, when it opened, and once it has ended its roster (JSON: device →
whether its masked input is in the sum) and, if it unmasked, its sum (int64 words), the devices
in it and their declared records. :func:`migrate_v6` creates both.

Schema 8 keeps the two-sided account of each device's privacy budget: ``devices.budget_epsilon``
and ``budget_delta``, the total it declared at enrollment (NULL: none, an older device), and
``epsilon`` and ``delta`` on ``contributions`` and on a secure round's REGISTER row of
``stage_messages``, the cost of that release to the device (NULL for rows stored before: not
counted). :meth:`~fedsketch.server.store.base.Store.add_contribution` and the REGISTER of
:meth:`~fedsketch.server.store.base.Store.add_stage_message` refuse a release that would take a
device past its declared total, in the transaction that stores it (:mod:`.accounts`).
:func:`migrate_v7` adds the columns; a new store is :data:`SCHEMA` and then that step.

Schema 9 keeps the abort statements of failed secure rounds (rule B, ``abort_statements``,
:func:`migrate_v8`); schema 10 binds each to the round's instance (``round_sha256``) and keys it
per coordinator name too (:func:`migrate_v9` rebuilds the table). A new store runs those steps
after :data:`SCHEMA` as well.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Protocol

from fedsketch.server.store.base import KINDS, STATES, StudyRow

SCHEMA_VERSION = 10

#: Marks a database as a fedsketch store: SQLite's ``PRAGMA application_id`` ("FSKS" in the file
#: header), PostgreSQL's ``fedsketch_store.application_id``.
APPLICATION_ID = 0x46534B53


class Connection(Protocol):
    """What the store's SQL runs on: ``sqlite3.Connection``, or the PostgreSQL store's adapter
    (:class:`fedsketch.server.store.postgres.PostgresConnection`), with ``?`` placeholders."""

    def execute(self, sql: str, params: tuple | list = ()) -> Any: ...

    def executemany(self, sql: str, rows: list[tuple]) -> Any: ...


#: SQLite's spelling -> PostgreSQL's, in table definitions (CREATE and ALTER statements): 8-byte
#: floats, byte strings, a generated key, and text compared byte by byte as SQLite does.
_POSTGRES_DDL = (
    (re.compile(r"\bINTEGER PRIMARY KEY AUTOINCREMENT\b"), "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\bBLOB\b"), "BYTEA"),
    (re.compile(r"\bTEXT\b"), 'TEXT COLLATE "C"'),
)


@functools.lru_cache(maxsize=512)
def postgres_sql(sql: str) -> str:
    """``sql`` (SQLite's spelling, ``?`` placeholders) in PostgreSQL's: ``%s`` placeholders,
    ``strpos`` for ``instr`` (the same arguments), and in a CREATE or ALTER statement the types
    of :data:`_POSTGRES_DDL`. The store's SQL holds no ``%`` and no ``?`` inside a literal."""
    if "%" in sql:
        raise ValueError(f"a literal % in store SQL would be read as a placeholder: {sql!r}")
    out = sql.replace("?", "%s").replace("instr(", "strpos(")
    if re.match(r"\s*(CREATE|ALTER)\b", out, re.IGNORECASE):
        for pattern, spelling in _POSTGRES_DDL:
            out = pattern.sub(spelling, out)
    return out


def sql_list(values: tuple[str, ...]) -> str:
    """``'a', 'b'`` for a CHECK constraint (the values are constants of this package, not input)."""
    return ", ".join(f"'{v}'" for v in values)


REGISTRATIONS = """CREATE TABLE registrations (
        study_id TEXT NOT NULL REFERENCES studies(study_id),
        device_id TEXT NOT NULL REFERENCES devices(device_id),
        registered_at REAL NOT NULL,
        ticket_until REAL,
        PRIMARY KEY (study_id, device_id))"""

CONTRIBUTIONS = f"""CREATE TABLE contributions (
        study_id TEXT NOT NULL REFERENCES studies(study_id),
        device_id TEXT NOT NULL REFERENCES devices(device_id),
        n REAL NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ({sql_list(KINDS)})),
        payload BLOB NOT NULL,
        payload_sha256 TEXT NOT NULL,
        signature BLOB NOT NULL,
        received_at REAL NOT NULL,
        PRIMARY KEY (study_id, device_id))"""

REFUSALS = """CREATE TABLE refusals (
        study_id TEXT NOT NULL REFERENCES studies(study_id),
        device_id TEXT NOT NULL REFERENCES devices(device_id),
        reason TEXT NOT NULL,
        reported_at REAL NOT NULL,
        PRIMARY KEY (study_id, device_id))"""

STAGE_MESSAGES = """CREATE TABLE stage_messages (
        study_id TEXT NOT NULL REFERENCES studies(study_id),
        stage INTEGER NOT NULL,
        device_id TEXT NOT NULL REFERENCES devices(device_id),
        body BLOB NOT NULL,
        received_at REAL NOT NULL,
        PRIMARY KEY (study_id, stage, device_id))"""

SECURE_ROUNDS = """CREATE TABLE secure_rounds (
        study_id TEXT PRIMARY KEY REFERENCES studies(study_id),
        stage INTEGER NOT NULL,
        opened_at REAL NOT NULL,
        ended INTEGER NOT NULL DEFAULT 0,
        total BLOB,
        devices INTEGER NOT NULL DEFAULT 0,
        records REAL NOT NULL DEFAULT 0.0,
        members TEXT)"""

SECURE_CHARGES = """CREATE TABLE secure_charges (
        study_id TEXT NOT NULL REFERENCES studies(study_id),
        device_id TEXT NOT NULL REFERENCES devices(device_id),
        epsilon REAL NOT NULL,
        delta REAL,
        PRIMARY KEY (study_id, device_id))"""

#: Schema 9's abort statements (version 1: one per round and device), which schema 10 rebuilds.
ABORT_STATEMENTS_V9 = """CREATE TABLE abort_statements (
        study_id TEXT NOT NULL REFERENCES studies(study_id),
        device_id TEXT NOT NULL REFERENCES devices(device_id),
        audience TEXT NOT NULL,
        signature BLOB NOT NULL,
        received_at REAL NOT NULL,
        certified_at REAL,
        PRIMARY KEY (study_id, device_id))"""

ABORT_STATEMENTS = """CREATE TABLE abort_statements_v10 (
        study_id TEXT NOT NULL REFERENCES studies(study_id),
        device_id TEXT NOT NULL REFERENCES devices(device_id),
        audience TEXT NOT NULL,
        round_sha256 BLOB NOT NULL,
        signature BLOB NOT NULL,
        received_at REAL NOT NULL,
        certified_at REAL,
        PRIMARY KEY (study_id, device_id, audience))"""

SCHEMA = (
    """CREATE TABLE devices (
        device_id TEXT PRIMARY KEY,
        public_key BLOB NOT NULL UNIQUE,
        label TEXT NOT NULL,
        enrolled_at REAL NOT NULL)""",
    """CREATE TABLE tokens (
        token_sha256 TEXT PRIMARY KEY,
        added_at REAL NOT NULL,
        used_by TEXT REFERENCES devices(device_id),
        used_at REAL)""",
    f"""CREATE TABLE studies (
        study_id TEXT PRIMARY KEY,
        spec_json TEXT NOT NULL,
        spec_sha256 TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ({sql_list(STATES)})),
        detail TEXT NOT NULL,
        created_at REAL NOT NULL,
        deadline REAL,
        min_devices INTEGER NOT NULL,
        close_requested TEXT,
        parent TEXT REFERENCES studies(study_id),
        roster INTEGER,
        filled_at REAL,
        contributed INTEGER NOT NULL DEFAULT 0,
        records REAL NOT NULL DEFAULT 0.0,
        registered INTEGER NOT NULL DEFAULT 0)""",
    "CREATE INDEX studies_by_parent ON studies(parent)",
    CONTRIBUTIONS,
    "CREATE INDEX contributions_by_time ON contributions(study_id, received_at)",
    REGISTRATIONS,
    "CREATE INDEX registrations_by_ticket ON registrations(study_id, ticket_until)",
    """CREATE TABLE results (
        study_id TEXT PRIMARY KEY REFERENCES studies(study_id),
        result_json TEXT NOT NULL,
        created_at REAL NOT NULL)""",
    """CREATE TABLE audit (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        at REAL NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        detail TEXT NOT NULL)""",
    REFUSALS,
    STAGE_MESSAGES,
    SECURE_ROUNDS,
)

#: Studies with their totals as stored (O(1) per study: no row of another table is read).
STUDY_SQL = """
SELECT s.study_id, s.spec_json, s.spec_sha256, s.state, s.detail, s.created_at, s.deadline,
       s.min_devices, s.contributed, s.records, s.registered,
       s.close_requested, s.parent, s.roster, s.filled_at
FROM studies AS s
{where}
ORDER BY s.created_at, s.study_id
"""

def study_row(row: tuple) -> StudyRow:
    """A row of :data:`STUDY_SQL` as a :class:`StudyRow`."""
    return StudyRow(*row[:9], records=float(row[9]), registered=row[10], closing=row[11],
                    parent=row[12], roster=row[13], filled_at=row[14])


#: The columns of ``contributions`` before schema 8 (what :func:`migrate_v2` copies).
V7_CONTRIBUTION_COLUMNS = "study_id, device_id, n, kind, payload, payload_sha256, signature, received_at"
CONTRIBUTION_COLUMNS = V7_CONTRIBUTION_COLUMNS + ", epsilon, delta"


def migrate_v1(c: Connection) -> None:
    """Schema 1 → 2 inside the caller's write transaction (module docstring)."""
    c.execute(REGISTRATIONS)
    c.execute("ALTER TABLE studies ADD COLUMN close_requested TEXT")
    c.execute("INSERT INTO registrations (study_id, device_id, registered_at) "
              "SELECT study_id, device_id, received_at FROM contributions")


def migrate_v2(c: Connection) -> None:
    """Schema 2 → 3 inside the caller's write transaction (module docstring)."""
    c.execute("ALTER TABLE studies ADD COLUMN parent TEXT REFERENCES studies(study_id)")
    c.execute("CREATE INDEX studies_by_parent ON studies(parent)")
    c.execute("ALTER TABLE contributions RENAME TO contributions_v2")
    c.execute(CONTRIBUTIONS)
    c.execute(f"INSERT INTO contributions ({V7_CONTRIBUTION_COLUMNS}) SELECT "
              f"{V7_CONTRIBUTION_COLUMNS} FROM contributions_v2")
    c.execute("DROP TABLE contributions_v2")
    c.execute("CREATE INDEX contributions_by_time ON contributions(study_id, received_at)")


def migrate_v3(c: Connection) -> None:
    """Schema 3 → 4 inside the caller's write transaction (module docstring)."""
    c.execute("ALTER TABLE studies ADD COLUMN roster INTEGER")
    c.execute("ALTER TABLE studies ADD COLUMN filled_at REAL")
    c.execute("UPDATE studies SET filled_at = (SELECT MAX(r.registered_at) FROM registrations AS r "
              "WHERE r.study_id = studies.study_id) WHERE min_devices <= (SELECT COUNT(*) FROM "
              "registrations AS r WHERE r.study_id = studies.study_id)")


def migrate_v4(c: Connection) -> None:
    """Schema 4 → 5 inside the caller's write transaction (module docstring)."""
    c.execute("ALTER TABLE studies ADD COLUMN contributed INTEGER NOT NULL DEFAULT 0")
    c.execute("ALTER TABLE studies ADD COLUMN records REAL NOT NULL DEFAULT 0.0")
    c.execute("ALTER TABLE studies ADD COLUMN registered INTEGER NOT NULL DEFAULT 0")
    c.execute("UPDATE studies SET "
              "contributed = (SELECT COUNT(*) FROM contributions AS c WHERE c.study_id = studies.study_id), "
              "records = (SELECT COALESCE(SUM(c.n), 0.0) FROM contributions AS c "
              "WHERE c.study_id = studies.study_id), "
              "registered = (SELECT COUNT(*) FROM registrations AS r WHERE r.study_id = studies.study_id)")
    c.execute("CREATE INDEX registrations_by_ticket ON registrations(study_id, ticket_until)")


def migrate_v5(c: Connection) -> None:
    """Schema 5 → 6 inside the caller's write transaction (module docstring)."""
    c.execute(REFUSALS)


def migrate_v6(c: Connection) -> None:
    """Schema 6 → 7 inside the caller's write transaction (module docstring)."""
    c.execute(STAGE_MESSAGES)
    c.execute(SECURE_ROUNDS)


def migrate_v7(c: Connection) -> None:
    """Schema 7 → 8 inside the caller's write transaction (module docstring): the budget a
    device declares, and the (ε, δ) of each release stored (NULL for those stored before:
    not counted)."""
    for table, columns in (("devices", ("budget_epsilon", "budget_delta")),
                           ("contributions", ("epsilon", "delta")),
                           ("stage_messages", ("epsilon", "delta"))):
        for column in columns:
            c.execute(f"ALTER TABLE {table} ADD COLUMN {column} REAL")
    c.execute(SECURE_CHARGES)
    for table in ("contributions", "stage_messages", "secure_charges"):  # a device's account
        c.execute(f"CREATE INDEX {table}_by_device ON {table}(device_id)")


def migrate_v8(c: Connection) -> None:
    """Schema 8 → 9: the abort statements of failed secure rounds, and which device was handed
    a certificate of abort that gives its ε back (rule B, :mod:`.abort_statements`)."""
    c.execute(ABORT_STATEMENTS_V9)


def migrate_v9(c: Connection) -> None:
    """Schema 9 → 10: an abort statement names the round's instance (``round_sha256``, the
    SHA-256 of the ADVERTISE_KEYS bundle; statement version 2), and a device keeps one per
    coordinator name it signed for (the key gains ``audience``). The table is rebuilt (a primary
    key changes) under a new name, then renamed; the rows kept before are version-1 statements
    (``round_sha256`` empty), which no certificate counts any more, and keep ``certified_at``
    (the rounds they certified stay out of the devices' accounts)."""
    c.execute(ABORT_STATEMENTS)
    c.execute("INSERT INTO abort_statements_v10 (study_id, device_id, audience, round_sha256, "
              "signature, received_at, certified_at) SELECT study_id, device_id, audience, ?, "
              "signature, received_at, certified_at FROM abort_statements", (b"",))
    c.execute("DROP TABLE abort_statements")
    c.execute("ALTER TABLE abort_statements_v10 RENAME TO abort_statements")


def migrate(c: Connection, version: int) -> list[str]:
    """Bring a schema-``version`` store (0: empty, created here from :data:`SCHEMA`) to
    :data:`SCHEMA_VERSION` inside the caller's write transaction; what each step changed, for
    the audit log."""
    if version == 0:
        for statement in SCHEMA:
            c.execute(statement)
        migrate_v7(c)  # the tables of SCHEMA are schema 7's; schema 8 adds columns to them
        migrate_v8(c)
        migrate_v9(c)
    steps = ((migrate_v1, "contributors joined their studies' rosters"),
             (migrate_v2, "studies may have refinement rounds"),
             (migrate_v3, "rosters may be larger than the quorum"),
             (migrate_v4, "studies keep their totals (contributions, records, registered)"),
             (migrate_v5, "devices may report why they declined a study"),
             (migrate_v6, "secure-aggregation rounds are kept and resume after a restart"),
             (migrate_v7, "devices declare their total budget, and each release stored keeps its "
                          "(epsilon, delta)"),
             (migrate_v8, "failed secure rounds keep their abort statements and certificates"),
             (migrate_v9, "abort statements name the round's instance (version 2) and are kept "
                          "per coordinator name"))
    done = []
    for old, (step, what) in enumerate(steps, start=1):
        if 1 <= version <= old:
            step(c)
            done.append(f"store schema {old} -> {old + 1}: {what}")
    return done


#: Roster devices told they may send (a live ticket) that have not contributed yet.
OUTSTANDING_SQL = """
SELECT COUNT(*) FROM registrations AS r
WHERE r.study_id = ? AND r.ticket_until > ?
  AND NOT EXISTS (SELECT 1 FROM contributions AS c
                  WHERE c.study_id = r.study_id AND c.device_id = r.device_id)
"""
