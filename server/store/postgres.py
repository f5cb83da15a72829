"""The coordinator's durable state in a PostgreSQL database: :class:`PostgresStore`, for
deployments where several ``coordinator serve`` processes share one database.

It is the shared :class:`fedsketch.server.store.sql.SQLStore` over a psycopg connection pool
(psycopg 3, the ``postgres`` extra); every statement is the store's one SQL, turned into
PostgreSQL's by :func:`.schema.postgres_sql`. A write transaction first takes the advisory lock
of its key (``pg_advisory_xact_lock(APPLICATION_ID, hashtext(key))``, held until it commits or
rolls back), so the writes on one study, from any process on the database, run one after the
other, each reading what it checks after the previous one committed: a close at quorum, a
compare-and-set of the state or a result is made once, by whichever process comes first.
Writes on different studies run side by side. A write is durable when it returns as far as the
server's ``synchronous_commit`` makes a commit durable (on, by default).

``coordinator serve`` holds the database (:meth:`PostgresStore.hold`) for itself, as it holds a
SQLite file, or with ``--shared`` together with other coordinators started so; the coordinator's
decoder steps on a study run under the study's :meth:`PostgresStore.claim`, so one process at a
time decodes it (and the store publishes its result once); :meth:`PostgresStore.claimed` lets a
coordinator find the studies nobody is decoding (:mod:`fedsketch.server.service.shared`).

The database is marked and versioned by the one-row table ``fedsketch_store``
(``application_id``, ``schema_version``); a database holding other tables and not that one is
refused before it is modified. Creating and migrating the schema happens in one transaction
under its own advisory lock, so processes starting together create it once.

Credentials: the URL's password may be left out; libpq then takes it from ``PGPASSWORD`` or the
password file (``PGPASSFILE``, default ``~/.pgpass``), as every PostgreSQL client does. Errors
and logs name the database by :func:`redact`, never with a password.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from fedsketch.server.errors import Code
from fedsketch.server.store.base import StoreError
from fedsketch.server.store.contributing import DEVICE_KEY
from fedsketch.server.store.faults import StoreUnavailable, from_postgres
from fedsketch.server.store.schema import APPLICATION_ID, SCHEMA_VERSION, migrate, postgres_sql
from fedsketch.server.store.sql import COORDINATOR, SQLStore

#: Most connections one coordinator process holds: its gRPC workers (16), decoder and watcher.
POOL_SIZE = 20
#: Seconds to wait for a connection unless the URL says (``connect_timeout``).
CONNECT_TIMEOUT = 10
#: The advisory-lock key of schema creation and migration.
SCHEMA_KEY = "schema"
#: The session advisory lock a serving coordinator holds: (this namespace, 0), apart from the
#: ``_tx`` locks (APPLICATION_ID, hash of a key), which it would otherwise block on a collision.
SERVING_NAMESPACE = APPLICATION_ID + 1
#: The namespace of :meth:`PostgresStore.claim`'s session advisory locks (key: hash of a study id).
CLAIM_NAMESPACE = APPLICATION_ID + 2
_LOCK = "SELECT pg_advisory_xact_lock(?, hashtext(?))"
_PASSWORD = (re.compile(r"(://[^/?#@:]*):[^/?#@]*@"), re.compile(r"(password=)[^&\s]*"))


def redact(url: str) -> str:
    """``url`` with any password (``user:PASSWORD@`` or ``password=...``) replaced by ``***``."""
    return _PASSWORD[1].sub(r"\1***", _PASSWORD[0].sub(r"\1:***@", url))


class PostgresConnection:
    """A psycopg connection that runs the store's SQL (``?`` placeholders, SQLite's spelling)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: tuple | list = ()) -> psycopg.Cursor:
        return self._conn.execute(postgres_sql(sql), params)

    def executemany(self, sql: str, rows: list[tuple]) -> psycopg.Cursor:
        cursor = self._conn.cursor()
        cursor.executemany(postgres_sql(sql), rows)
        return cursor


def schema_version(c: PostgresConnection, where: str) -> int:
    """The store's schema version, 0 for a database without tables (to be created); StoreError
    'failed_precondition' unless it is a fedsketch store of a version this code reads."""
    if c.execute("SELECT to_regclass('fedsketch_store')").fetchone()[0] is None:
        tables = c.execute("SELECT COUNT(*) FROM information_schema.tables "
                           "WHERE table_schema = current_schema()").fetchone()[0]
        if tables:
            raise StoreError(Code.FAILED_PRECONDITION, f"{where} holds {tables} tables but is not a "
                             "fedsketch store (no table fedsketch_store); give an empty database")
        return 0
    row = c.execute("SELECT application_id, schema_version FROM fedsketch_store").fetchone()
    if row is None or row[0] != APPLICATION_ID:
        raise StoreError(Code.FAILED_PRECONDITION, f"{where} is not a fedsketch store")
    if not 1 <= row[1] <= SCHEMA_VERSION:
        newer = " (written by a newer fedsketch)" if row[1] > SCHEMA_VERSION else ""
        raise StoreError(Code.FAILED_PRECONDITION, f"{where} has store schema version {row[1]}; "
                         f"this fedsketch reads 1 to {SCHEMA_VERSION}{newer}")
    return row[1]


class PostgresStore(SQLStore):
    """The coordinator's state in a PostgreSQL database, through a pool of connections; safe to
    share between threads and between processes."""

    def __init__(self, url: str, pool_size: int = POOL_SIZE) -> None:
        """Open the store at ``url`` (libpq's URL:
        ``postgresql://[user[:password]@][host][:port]/database[?param=value...]``), creating its
        tables in an empty database.

        StoreError 'failed_precondition' if the server cannot be reached or refuses the login,
        or the database is not a fedsketch store of a schema this code reads (left unmodified).
        """
        self.where = redact(url)
        self._start_group_commit()
        self._holder: psycopg.Connection | None = None
        options: dict[str, Any] = {"autocommit": True}
        try:
            if "connect_timeout" not in conninfo_to_dict(url):
                options["connect_timeout"] = CONNECT_TIMEOUT
            with psycopg.connect(url, **options) as conn:
                self._create(PostgresConnection(conn), conn)
        except psycopg.Error as exc:
            raise StoreError(Code.FAILED_PRECONDITION, f"cannot open {self.where} as a fedsketch store: "
                             f"{redact(str(exc)).strip()}") from None
        self._pool = ConnectionPool(url, kwargs=options, min_size=1, max_size=pool_size, open=False,
                                    name="fedsketch-store")
        self._pool.open()

    def _create(self, c: PostgresConnection, conn: psycopg.Connection) -> None:
        with conn.transaction():
            c.execute(_LOCK, (APPLICATION_ID, SCHEMA_KEY))  # processes starting together: one creates
            version = schema_version(c, self.where)
            if version == 0:
                c.execute("CREATE TABLE fedsketch_store (application_id INTEGER NOT NULL, "
                          "schema_version INTEGER NOT NULL)")
                c.execute("INSERT INTO fedsketch_store VALUES (?, 0)", (APPLICATION_ID,))
            for change in migrate(c, version):
                self._log(c, COORDINATOR, "migrate", change)
            c.execute("UPDATE fedsketch_store SET schema_version = ?", (SCHEMA_VERSION,))

    @contextmanager
    def _tx(self, key: str = COORDINATOR) -> Iterator[PostgresConnection]:
        """One transaction on a pooled connection, after the advisory lock of ``key``: committed
        on normal exit, rolled back on any error."""
        with self._faults(), self._pool.connection() as conn, conn.transaction():
            c = PostgresConnection(conn)
            c.execute(_LOCK, (APPLICATION_ID, key))
            yield c

    def _also_lock(self, c: PostgresConnection, key: str) -> None:
        """The transaction-scoped advisory lock of ``key`` too (always after the transaction's
        own, a study's: so no two transactions take two locks in opposite orders)."""
        c.execute(_LOCK, (APPLICATION_ID, key))

    def _also_lock_devices(self, c: PostgresConnection, device_ids) -> None:
        """The advisory lock of each device of a batch, in one statement, in the order of the
        locks' numbers (PostgreSQL evaluates a volatile output column after ORDER BY), so two
        batches holding several device locks never wait for each other in a cycle."""
        c.execute("SELECT pg_advisory_xact_lock(?, h) FROM (SELECT DISTINCT hashtext(k) AS h "
                  "FROM unnest(?::text[]) AS k) AS locks ORDER BY h",
                  (APPLICATION_ID, [DEVICE_KEY + d for d in device_ids]))

    @contextmanager
    def _reading(self) -> Iterator[PostgresConnection]:
        with self._faults(), self._pool.connection() as conn:
            yield PostgresConnection(conn)

    @contextmanager
    def _faults(self) -> Iterator[None]:
        """A fault of the server or the connection (:func:`.faults.from_postgres`), or a pool that
        found no connection in time, raised as StoreUnavailable."""
        try:
            yield
        except (psycopg.Error, PoolTimeout) as exc:
            fault = (StoreUnavailable(f"no connection to the database: {exc}", self.where)
                     if isinstance(exc, PoolTimeout) else from_postgres(exc, self.where))
            if fault is None:
                raise
            raise fault from exc

    def hold(self, shared: bool = False) -> None:
        """Hold the database as its one coordinator, or with ``shared`` as one of several (each
        holds it shared), until :meth:`close` or the process's death: a session advisory lock on
        a connection of its own. StoreError 'failed_precondition' if a coordinator holds it the
        other way, or, without ``shared``, at all."""
        options = {"connect_timeout": CONNECT_TIMEOUT} if "connect_timeout" not in conninfo_to_dict(
            self._pool.conninfo) else {}
        lock = "pg_try_advisory_lock_shared" if shared else "pg_try_advisory_lock"
        try:
            holder = psycopg.connect(self._pool.conninfo, autocommit=True, **options)
            held = holder.execute(f"SELECT {lock}(%s, 0)", (SERVING_NAMESPACE,)).fetchone()[0]
        except psycopg.Error as exc:
            raise StoreError(Code.FAILED_PRECONDITION, f"cannot hold {self.where}: "
                             f"{redact(str(exc)).strip()}") from None
        if not held:
            holder.close()
            how = ("by a coordinator not started with --shared" if shared else
                   "by another coordinator: one coordinator serves one database, unless every one "
                   "of them is started with --shared")
            raise StoreError(Code.FAILED_PRECONDITION, f"{self.where} is in use {how}")
        self._holder, self.shared = holder, shared

    @contextmanager
    def claim(self, key: str) -> Iterator[None]:
        """A session advisory lock on a pooled connection, held for the block (the connection
        ends with the process that holds it, and the lock with it)."""
        with self._pool.connection() as conn:
            conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (CLAIM_NAMESPACE, key))
            try:
                yield
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (CLAIM_NAMESPACE, key))

    def claimed(self, key: str) -> bool:
        """Tried: a free claim is taken and given back at once, on one pooled connection."""
        with self._pool.connection() as conn:
            if not conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (CLAIM_NAMESPACE, key)
                                ).fetchone()[0]:
                return True
            conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (CLAIM_NAMESPACE, key))
            return False

    def close(self) -> None:
        if self._holder is not None:
            self._holder.close()
        self._pool.close()
