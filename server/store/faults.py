"""A store that cannot do its work: :class:`StoreUnavailable`, and how a backend's error becomes one.

A full disk, a database file or file system that turned read-only, an I/O error, a lock held too
long, a lost PostgreSQL connection: none of these is a bug of the coordinator nor a refusal of
the request, and none of them changes what the store holds (the write's transaction is rolled
back, and a write is acknowledged only after its commit). The gRPC edge
(:mod:`fedsketch.server.service.handlers`) answers them RESOURCE_EXHAUSTED (full) or UNAVAILABLE
(anything else) with :meth:`StoreUnavailable.for_client`, and logs the cause and the file or
database; a device retries such answers (:data:`fedsketch.client.daemon.TRANSIENT`). Reads go on
while writes fail, as far as the backend can still read. Other services (a health check) catch
the same type.

Which errors are faults and which are bugs: SQLite's result codes (``sqlite_errorcode``, Python
3.11) FULL, IOERR, READONLY, CANTOPEN, BUSY, LOCKED, NOMEM, PROTOCOL and NOTADB/CORRUPT are the
file's or the machine's state; any other ``OperationalError`` (a malformed statement, a missing
column) stays a bug. For PostgreSQL, ``psycopg.OperationalError`` (the connection, the server,
class 53 "insufficient resources" such as disk full, class 58 system errors) is a fault.
"""

from __future__ import annotations

import sqlite3

#: SQLite primary result codes (https://sqlite.org/rescode.html) that mean the file or the machine
#: failed, not the statement: BUSY 5, LOCKED 6, NOMEM 7, READONLY 8, IOERR 10, CORRUPT 11, FULL 13,
#: CANTOPEN 14, PROTOCOL 15, NOTADB 26.
SQLITE_FAULTS = {5: "busy", 6: "locked", 7: "out of memory", 8: "read-only", 10: "I/O error",
                 11: "corrupt", 13: "full", 14: "cannot open", 15: "locking protocol", 26: "not a database"}
SQLITE_FULL = 13


class StoreUnavailable(Exception):
    """The store could not read or write (``cause``, one line) at ``where`` (a file, or a
    database URL without its password); ``full`` when it ran out of space. Nothing of the
    failed transaction was kept."""

    def __init__(self, cause: str, where: str, *, full: bool = False) -> None:
        super().__init__(f"{where}: {cause}")
        self.cause, self.where, self.full = cause, where, full

    def for_client(self) -> str:
        """The reason a device or operator is given: the cause, not the server's file layout."""
        what = ("is full (no space left on the disk under its database)" if self.full
                else f"cannot be used: {self.cause}")
        return (f"the coordinator's store {what}; nothing of this request was stored, retry "
                "later (the coordinator's log names the file)")


def from_sqlite(exc: sqlite3.Error, where: str) -> StoreUnavailable | None:
    """The fault ``exc`` reports on the SQLite file ``where``, or None when it is no fault (a
    bug, to be raised as it is)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None or code & 0xFF not in SQLITE_FAULTS:
        return None
    name = getattr(exc, "sqlite_errorname", "SQLITE_?")
    return StoreUnavailable(f"{exc} ({name})", where, full=code & 0xFF == SQLITE_FULL)


def from_postgres(exc: Exception, where: str) -> StoreUnavailable | None:
    """The fault a psycopg error reports on the database ``where`` (redacted URL), or None."""
    import psycopg  # only a PostgreSQL store calls this

    if not isinstance(exc, psycopg.OperationalError):
        return None
    state = getattr(exc, "sqlstate", None) or ""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return StoreUnavailable(f"{first} (SQLSTATE {state or 'none'})", where,
                            full=state == "53100")  # disk_full
