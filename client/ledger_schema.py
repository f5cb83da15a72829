"""The ledger's SQLite layout: schema version 9, and the one-time migrations from schemas 1 to 8.

Schema 9 adds ``spends.round_terms``: on a secure round's spend, the round's terms the device
saw before its masked input left it (R, t, C, the holders of its shares with their keys:
:class:`fedsketch.common.secagg.abort.RoundTerms`), sealed in the spend's link. A certificate
of abort gives the spend back only if it is of those terms (rule B, :mod:`.ledger_voids`).
:func:`migrate_v8` adds the column, NULL for older spends: their links stay as they were, and
no certificate gives such a spend back.

Schema 8 adds the ``voids`` table: a secure round's spend given back, one row per spend, which
stays (:mod:`.ledger_voids`); each void is a link of the spends' chain. :func:`migrate_v7` adds
the table, empty.

Schema 7 seals the spends: ``spends.chain`` (a SHA-256 hash chain over the rows) and
``spends.chain_signature`` (the device's Ed25519 signature of the link), with the settings
``chain_count`` and ``chain_head`` (:mod:`.ledger_chain`), so that a deleted or edited spend row
is found by ``fedsketch device budget --verify``. It also keeps ``declared_epsilon`` and
``declared_delta`` in the settings: the total budget the device declared to its coordinator at
enrollment, which the coordinator holds it to. :func:`migrate_v6` adds the columns and seals
the rows the file holds, in their order, at the migration (what was done to them before cannot
be known; the migration is logged).

Schema 6 adds ``spends.kept_until``: on a release after which its study has more rounds, the
time (Unix seconds) until which the device keeps those rounds' ε aside (:func:`promised`),
so that a study that never goes on (its coordinator gone, a round never opened) does not hold
the budget for ever. Any release can carry the promise, not only the study's own: a device
that missed round 0 (or the sketch) and takes the next round promises the rounds after it.
It also adds the ``secure_sessions`` table: the device's part in each secure-aggregation round
it is in, so that a restarted daemon goes on with the round (:mod:`.ledger_sessions`).
:func:`migrate_v5` gives the promises of an older ledger :data:`MIGRATED_KEEP_SECONDS` from
their spend, and adds the table, empty.

Schema 5 adds ``spends.premask``: for a secure-aggregation release (``secagg_masked``), the
device's input before the masks, x + e (its exact integer input plus its noise share, int64
little-endian words), recorded in the same transaction as the masked bytes it sent. The
coordinator's unmasked sum is the sum of these over the devices it counted, so the owner can
check what the release was; NULL for a plain release, whose payload is its input. It is the
device's own data, as the records are, and never leaves the device. :func:`migrate_v4` adds the
column.

Schema 4 adds the ``reservations`` table: the studies whose roster the device joined, with the
(ε, δ) it sets aside for each until it spends on it, leaves it, or the reservation expires
(:mod:`.ledger_reservations`). Schema 3 kept them in the daemon's memory, so a restart forgot
them and the device could join more studies than its budget could pay for.
:func:`migrate_v3` adds the table, empty (what a schema-3 daemon had joined was in its memory).

Schema 3 adds three columns to ``spends``: ``parent``, the study a refinement round's spend
belongs to (NULL for a study's own sketch), ``round`` (0 for the sketch, t for refinement round
t), so a study's total spend and each round's can be read back, and ``study_epsilon``, on a
sketch's spend the ε its whole study declares (sketch and rounds), which the device keeps for
the rounds it has not paid yet until the study ends. :func:`migrate_v2` adds them.

Schema 1 keyed budgets on the SHA-256 of a data file, so that appending a row gave the same
people a fresh budget. :func:`migrate_v1` moves all of its spends, in the caller's transaction, to
:data:`DEFAULT_SOURCE`, whose budget becomes what those spends add up to, and logs it: nothing
remains until the owner states the device's real total with ``fedsketch device raise-budget``.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import time

from fedsketch.client.ledger_chain import seal_all
from fedsketch.client.ledger_records import LedgerError
from fedsketch.client.policy import Policy

log = logging.getLogger("fedsketch.device")

SCHEMA_VERSION = 9
FORMAT = "fedsketch.ledger"
#: The source of a device that declares no other.
DEFAULT_SOURCE = "default"
#: The ε budget a migrated schema-1 ledger that never spent gets (a budget must be > 0).
MIGRATED_FLOOR = 1e-9
#: How long (seconds) after its spend a schema-5 ledger's promise is kept: one week (its study's
#: rounds and their lengths were not recorded).
MIGRATED_KEEP_SECONDS = 7 * 86400.0

SCHEMA = """
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sources (
    name       TEXT PRIMARY KEY,
    epsilon    REAL NOT NULL CHECK (epsilon > 0),
    delta      REAL NOT NULL CHECK (delta >= 0 AND delta < 1),
    created_at REAL NOT NULL
);
CREATE TABLE budget_log (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    at      REAL NOT NULL,
    action  TEXT NOT NULL,
    source  TEXT,
    epsilon REAL,
    delta   REAL,
    detail  TEXT NOT NULL
);
CREATE TABLE spends (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    study_id       TEXT NOT NULL UNIQUE,
    study_name     TEXT NOT NULL,
    source         TEXT NOT NULL REFERENCES sources (name),
    epsilon        REAL NOT NULL CHECK (epsilon > 0),
    delta          REAL NOT NULL CHECK (delta >= 0),
    n              REAL NOT NULL,
    kind           TEXT NOT NULL,
    payload        BLOB NOT NULL,
    payload_sha256 TEXT NOT NULL,
    spec_sha256    TEXT NOT NULL,
    spent_at       REAL NOT NULL,
    acked_at       REAL,
    receipt        TEXT,
    final_state    TEXT,
    parent         TEXT,
    round          INTEGER NOT NULL DEFAULT 0,
    study_epsilon  REAL,
    premask        BLOB,
    kept_until     REAL,
    chain          BLOB,
    chain_signature BLOB,
    round_terms    BLOB
);
CREATE INDEX spends_by_source ON spends (source);
CREATE TABLE reservations (
    study_id   TEXT PRIMARY KEY,
    study_name TEXT NOT NULL,
    source     TEXT NOT NULL REFERENCES sources (name),
    epsilon    REAL NOT NULL,
    delta      REAL NOT NULL,
    joined_at  REAL NOT NULL,
    expires_at REAL NOT NULL,
    left_at    REAL
);
CREATE TABLE secure_sessions (
    study_id TEXT PRIMARY KEY,
    source   TEXT NOT NULL REFERENCES sources (name),
    state    BLOB NOT NULL,
    saved_at REAL NOT NULL
);
CREATE TABLE voids (
    seq                INTEGER PRIMARY KEY AUTOINCREMENT,
    study_id           TEXT NOT NULL UNIQUE REFERENCES spends (study_id),
    reason             TEXT NOT NULL,
    voided_at          REAL NOT NULL,
    certificate        BLOB,
    certificate_sha256 TEXT NOT NULL,
    spend_chain        BLOB NOT NULL,
    position           INTEGER NOT NULL,
    chain              BLOB,
    chain_signature    BLOB
);
CREATE TABLE identity (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    device_id   TEXT NOT NULL,
    private_key BLOB NOT NULL,
    coordinator TEXT NOT NULL
);
"""

V2_COLUMNS = ("study_id, study_name, source, epsilon, delta, n, kind, payload, payload_sha256, "
              "spec_sha256, spent_at, acked_at, receipt, final_state")
SPEND_COLUMNS = V2_COLUMNS + ", parent, round, study_epsilon, premask, kept_until, round_terms"


def create_schema(db: sqlite3.Connection, *, skip: tuple[str, ...] = (),
                  only: tuple[str, ...] | None = None) -> None:
    """Create every table and index of :data:`SCHEMA` except the tables named in ``skip`` (or,
    with ``only``, just the tables named there)."""
    for statement in SCHEMA.split(";"):
        if not statement.strip() or any(f"TABLE {name} " in statement for name in skip):
            continue
        if only is None or any(f"TABLE {name} " in statement for name in only):
            db.execute(statement)


#: A spend that counts: not given back (:mod:`.ledger_voids`).
NOT_VOID = "study_id NOT IN (SELECT study_id FROM voids)"


def study_spent(db: sqlite3.Connection, study_id: str) -> float:
    """Σε spent on a study: its sketch and every refinement round of it (voids left out)."""
    rows = db.execute(f"SELECT epsilon FROM spends WHERE (study_id = ? OR parent = ?) AND {NOT_VOID}",
                      (study_id, study_id)).fetchall()
    return math.fsum(r[0] for r in rows)


def promises(db: sqlite3.Connection, source: str | None = None,
             now: float | None = None) -> list[tuple[str, str, str, float, float]]:
    """The live promises (of ``source``, or of every source), one per study: (study id, the name
    of the release that made it, source, ε kept, until when in Unix seconds). A study's rows
    are its own release and its rounds' (``COALESCE(parent, study_id)``); a release that
    carries ``study_epsilon`` promises the study's rounds after it, until ``kept_until``
    (``now`` by default) or until the device learns that the study ended (``final_state``,
    which :meth:`~.agent.Agent._settle` sets on such a release only once the study itself
    ended). The latest live release of a study says what is kept and until when: ε kept = the
    study's whole ε for this device (its ``study_epsilon``) less what it spent on the study,
    at least 0."""
    now = time.time() if now is None else now
    live = f"study_epsilon IS NOT NULL AND final_state IS NULL AND kept_until > ? AND {NOT_VOID}"
    rows = db.execute(f"SELECT COALESCE(parent, study_id) AS study, study_name, source, study_epsilon, "
                      f"kept_until FROM spends AS s WHERE {live} AND (? IS NULL OR source = ?) AND "
                      f"seq = (SELECT MAX(seq) FROM spends AS t WHERE {live} AND t.source = s.source "
                      "AND COALESCE(t.parent, t.study_id) = COALESCE(s.parent, s.study_id)) "
                      "ORDER BY seq", (now, source, source, now)).fetchall()
    return [(study, name, src, max(0.0, total - study_spent(db, study)), until)
            for study, name, src, total, until in rows]


def promised(db: sqlite3.Connection, source: str, other_than: str | None = None) -> float:
    """ε the device keeps for rounds of studies it took part in and has not paid yet
    (:func:`promises`), but those of study ``other_than``, whose round asks and is paid from them."""
    return math.fsum(kept for study, _, _, kept, _ in promises(db, source) if study != other_than)


def round_taken(db: sqlite3.Connection, parent: str, round: int) -> str | None:
    """Why round ``round`` of study ``parent`` may not be released: it was already, under some
    round study id (a coordinator that opens a round twice does not get two releases), or None."""
    row = db.execute("SELECT study_id FROM spends WHERE parent = ? AND round = ?",
                     (parent, round)).fetchone()
    if row is None:
        return None
    return (f"the device already released round {round} of study {parent!r} (as study "
            f"{row[0]!r}); a round is released once")


def set_settings(db: sqlite3.Connection, **values: str) -> None:
    """Insert or replace ``settings`` rows."""
    db.executemany("INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)", values.items())


def log_change(db: sqlite3.Connection, action: str, source: str | None, epsilon: float | None,
               delta: float | None, detail: str) -> None:
    """Append one line to the owner's log (``budget_log``), stamped now (Unix seconds)."""
    db.execute("INSERT INTO budget_log (at, action, source, epsilon, delta, detail) "
               "VALUES (?, ?, ?, ?, ?, ?)", (time.time(), action, source, epsilon, delta, detail))


def migrate_v1(db: sqlite3.Connection, settings: dict[str, str]) -> None:
    """Schema 1 → 2 (module docstring), inside the caller's write transaction.

    The new budget of :data:`DEFAULT_SOURCE` is what the old file's spends add up to (ε and δ;
    ε at least 10⁻⁹ when it never spent, since a budget is > 0), so nothing remains: schema 1
    rewrote its stored budget from every run's ``--budget``, so that value says nothing the owner
    decided. The owner states the real total once with ``fedsketch device raise-budget``."""
    db.execute("ALTER TABLE spends RENAME TO spends_v1")
    create_schema(db, skip=("settings", "identity"))
    files, spends = db.execute("SELECT COUNT(DISTINCT fingerprint), COUNT(*) FROM spends_v1").fetchone()
    rows = db.execute("SELECT epsilon, delta FROM spends_v1").fetchall()
    epsilon = max(math.fsum(r[0] for r in rows), MIGRATED_FLOOR)
    delta = min(math.fsum(r[1] for r in rows), 1.0 - 1e-12)
    db.execute("INSERT INTO sources (name, epsilon, delta, created_at) VALUES (?, ?, ?, ?)",
               (DEFAULT_SOURCE, epsilon, delta, time.time()))
    db.execute(f"INSERT INTO spends ({V2_COLUMNS}) SELECT study_id, study_id, ?, epsilon, "
               "delta, n, kind, payload, payload_sha256, spec_sha256, spent_at, acked_at, "
               "receipt, NULL FROM spends_v1 ORDER BY seq", (DEFAULT_SOURCE,))
    db.execute("DROP TABLE spends_v1")
    seal_all(db)
    db.execute("DELETE FROM settings WHERE key IN ('budget', 'budget_delta')")
    set_settings(db, schema_version=str(SCHEMA_VERSION), policy=Policy().to_json())
    log_change(db, "migrate", DEFAULT_SOURCE, epsilon, delta,
               f"schema 1 → {SCHEMA_VERSION}: {spends} spends on {files} data files (once keyed "
               f"by the file's SHA-256) now all count against source {DEFAULT_SOURCE!r}; its "
               f"budget is what they spent (the old file's --budget "
               f"{settings.get('budget', 'none')!r} was rewritten "
               "by every run), so nothing remains until the owner runs `fedsketch device "
               "raise-budget`")


def migrate_v2(db: sqlite3.Connection) -> None:
    """Schema 2 → 3 (module docstring), inside the caller's write transaction: every existing
    spend is a study's sketch (round 0, no parent)."""
    db.execute("ALTER TABLE spends ADD COLUMN parent TEXT")
    db.execute("ALTER TABLE spends ADD COLUMN round INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE spends ADD COLUMN study_epsilon REAL")
    set_settings(db, schema_version="3")
    log_change(db, "migrate", None, None, None, "schema 2 → 3: spends record the study a "
               "refinement round belongs to, the round, and a study's whole ε")


def migrate_v3(db: sqlite3.Connection) -> None:
    """Schema 3 → 4 (module docstring), inside the caller's write transaction: the empty
    ``reservations`` table."""
    create_schema(db, only=("reservations",))
    set_settings(db, schema_version="4")
    log_change(db, "migrate", None, None, None, "schema 3 → 4: the studies whose roster the "
               "device joined, and the budget set aside for them, are kept in the ledger")


def migrate_v4(db: sqlite3.Connection) -> None:
    """Schema 4 → 5 (module docstring), inside the caller's write transaction: every existing
    spend has no pre-mask input recorded (NULL)."""
    db.execute("ALTER TABLE spends ADD COLUMN premask BLOB")
    set_settings(db, schema_version="5")
    log_change(db, "migrate", None, None, None, "schema 4 → 5: a secure-aggregation release "
               "keeps the device's input before the masks")


def migrate_v5(db: sqlite3.Connection) -> None:
    """Schema 5 → 6 (module docstring), inside the caller's write transaction: a promise kept
    by an older release lapses :data:`MIGRATED_KEEP_SECONDS` after its spend."""
    db.execute("ALTER TABLE spends ADD COLUMN kept_until REAL")
    db.execute("UPDATE spends SET kept_until = spent_at + ? WHERE study_epsilon IS NOT NULL",
               (MIGRATED_KEEP_SECONDS,))
    create_schema(db, only=("secure_sessions",))
    set_settings(db, schema_version="6")
    log_change(db, "migrate", None, None, None, "schema 5 → 6: the ε a study's release keeps for "
               "its later rounds lapses at a time (the older ones a week after their spend); a "
               "secure-aggregation round survives a restart of the daemon")


def migrate_v6(db: sqlite3.Connection) -> None:
    """Schema 6 → 7 (module docstring), inside the caller's write transaction: the seal's
    columns, and every existing spend sealed in ``seq`` order."""
    db.execute("ALTER TABLE spends ADD COLUMN chain BLOB")
    db.execute("ALTER TABLE spends ADD COLUMN chain_signature BLOB")
    _add_round_terms(db)  # schema 9's column, NULL: the seal reads it (NULL links as before)
    sealed = seal_all(db)
    set_settings(db, schema_version="7")
    log_change(db, "migrate", None, None, None, f"schema 6 → 7: the {sealed} spends recorded so "
               "far were sealed now (a hash chain signed with the device's key); from here on a "
               "deleted or edited spend row is found by `fedsketch device budget --verify`")


def migrate_v7(db: sqlite3.Connection) -> None:
    """Schema 7 → 8 (module docstring), inside the caller's write transaction: the empty
    ``voids`` table."""
    create_schema(db, only=("voids",))
    set_settings(db, schema_version="8")
    log_change(db, "migrate", None, None, None, "schema 7 → 8: a secure round's spend whose "
               "masked input never left the device can be given back (a sealed void row)")


def _add_round_terms(db: sqlite3.Connection) -> None:
    """Add ``spends.round_terms`` (schema 9) unless an earlier step of the migration did."""
    if "round_terms" not in {r[1] for r in db.execute("PRAGMA table_info(spends)")}:
        db.execute("ALTER TABLE spends ADD COLUMN round_terms BLOB")


def migrate_v8(db: sqlite3.Connection) -> None:
    """Schema 8 → 9 (module docstring), inside the caller's write transaction: every existing
    spend has no round terms recorded (NULL; its link is unchanged)."""
    _add_round_terms(db)
    set_settings(db, schema_version="9")
    log_change(db, "migrate", None, None, None, "schema 8 → 9: a secure round's spend records "
               "the round's terms (its bundle's SHA-256, t, C, the holders of the device's "
               "shares); a certificate of abort gives back only a spend that recorded them")


def drop_out_of_box(db: sqlite3.Connection, settings: dict[str, str]) -> str | None:
    """Remove the ``out_of_box`` key that the first schema-2 release stored in the policy, inside
    the caller's write transaction (logged); the old value, or None if there was none.

    ``refuse`` is no longer offered (:mod:`fedsketch.client.policy` says why): records are
    clipped."""
    policy = json.loads(settings.get("policy", "{}"))
    if "out_of_box" not in policy:
        return None
    old = policy.pop("out_of_box")
    set_settings(db, policy=Policy.from_json(json.dumps(policy)).to_json())
    log_change(db, "policy", None, None, None,
               f"out-of-box = {old} dropped: a refusal that depends on where the records lie "
               "reveals them, so records outside a study's box are always clipped")
    return str(old)


def upgrade(db: sqlite3.Connection, path: str) -> None:
    """Bring an existing ledger to the current schema inside the caller's write transaction;
    LedgerError for a file that is not a fedsketch ledger or was written by a newer version."""
    settings = dict(db.execute("SELECT key, value FROM settings"))
    if settings.get("format") != FORMAT:
        raise LedgerError(f"{path} is an SQLite file but not a fedsketch ledger")
    version = settings.get("schema_version", "")
    if version == "1":  # straight to the current schema (its spends table is made anew)
        migrate_v1(db, settings)
        log.warning("%s: migrated from schema 1; its budget is what it had spent, so "
                    "nothing remains until `fedsketch device raise-budget`", path)
        return
    if version not in ("2", "3", "4", "5", "6", "7", "8", str(SCHEMA_VERSION)):
        raise LedgerError(f"{path} has ledger schema version {version!r}; this code reads "
                          f"versions 1 to {SCHEMA_VERSION} (written by a newer fedsketch?)")
    if version == "2":
        migrate_v2(db)
    if version in ("2", "3"):
        migrate_v3(db)
    if version in ("2", "3", "4"):
        migrate_v4(db)
    if version in ("2", "3", "4", "5"):
        migrate_v5(db)
    if version in ("2", "3", "4", "5", "6"):
        migrate_v6(db)
    if version in ("2", "3", "4", "5", "6", "7"):
        migrate_v7(db)
    if version in ("2", "3", "4", "5", "6", "7", "8"):
        migrate_v8(db)
    if drop_out_of_box(db, settings) == "refuse":
        log.warning("%s: the owner's policy out-of-box = refuse is no longer offered "
                    "(the refusal would reveal the records); records are clipped", path)
