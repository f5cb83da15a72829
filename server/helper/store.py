"""The helper's durable state in one SQLite file (WAL, ``synchronous=FULL``): every write is
committed before the call that made it returns, so a share acknowledged survives a SIGKILL.

Tables: ``uploads`` (one helper share per study and report nonce), ``closes`` (a study's
collection closed: the coordinator's commitment and the helper's query seed, drawn once),
``circuits`` (the circuit of each report the coordinator asked about, fixed by the first
Prepare, with the coordinator's revealed seed) and ``aggregates`` (the one answer per study:
the accepted nonces and the share). A file is marked as the helper's by ``PRAGMA
application_id``; any other non-empty file is refused before it is modified.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: ``PRAGMA application_id`` of a helper store ("fshp").
APPLICATION_ID = 0x66736870

SCHEMA = """
CREATE TABLE uploads (study_id TEXT NOT NULL, nonce BLOB NOT NULL, seed BLOB NOT NULL,
                      blind BLOB NOT NULL, peer_part BLOB NOT NULL, PRIMARY KEY (study_id, nonce));
CREATE TABLE closes (study_id TEXT PRIMARY KEY, commitment BLOB NOT NULL, seed BLOB NOT NULL,
                     leader_seed BLOB);
CREATE TABLE circuits (study_id TEXT NOT NULL, nonce BLOB NOT NULL, entries INTEGER NOT NULL,
                       bound INTEGER NOT NULL, l1_bound INTEGER NOT NULL,
                       PRIMARY KEY (study_id, nonce));
CREATE TABLE aggregates (study_id TEXT PRIMARY KEY, request_sha256 BLOB NOT NULL,
                         accepted TEXT NOT NULL, share BLOB NOT NULL);
"""


class HelperStoreError(Exception):
    """A file that is not a helper store."""


class HelperStore:
    """The helper's SQLite file; one connection under a lock (calls are serialized)."""

    def __init__(self, path: str) -> None:
        self._c = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        app = self._c.execute("PRAGMA application_id").fetchone()[0]
        empty = self._c.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0
        if app != APPLICATION_ID and not (app == 0 and empty):
            self._c.close()
            raise HelperStoreError(f"{path} is not a fedsketch helper store")
        self._c.execute("PRAGMA journal_mode=WAL")
        self._c.execute("PRAGMA synchronous=FULL")
        if empty:
            with self._tx() as c:
                c.executescript("BEGIN IMMEDIATE;" + SCHEMA +
                                f"PRAGMA application_id={APPLICATION_ID}; COMMIT;")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._c

    def _write(self, sql: str, args: tuple) -> None:
        with self._tx() as c:
            c.execute("BEGIN IMMEDIATE")
            try:
                c.execute(sql, args)
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise

    def upload(self, study_id: str, nonce: bytes, seed: bytes, blind: bytes,
               peer_part: bytes) -> bool | None:
        """Keep a helper share: True if new, False if the same bytes were kept already, None if
        the nonce holds different bytes (nothing written)."""
        row = (seed, blind, peer_part)
        with self._tx() as c:
            c.execute("BEGIN IMMEDIATE")
            try:
                old = c.execute("SELECT seed, blind, peer_part FROM uploads WHERE study_id = ? "
                                "AND nonce = ?", (study_id, nonce)).fetchone()
                if old is None:
                    c.execute("INSERT INTO uploads VALUES (?, ?, ?, ?, ?)", (study_id, nonce, *row))
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise
        if old is None:
            return True
        return None if tuple(bytes(v) for v in old) != row else False

    def share(self, study_id: str, nonce: bytes) -> tuple[bytes, bytes, bytes] | None:
        with self._tx() as c:
            row = c.execute("SELECT seed, blind, peer_part FROM uploads WHERE study_id = ? AND "
                            "nonce = ?", (study_id, nonce)).fetchone()
        return None if row is None else tuple(bytes(v) for v in row)

    def count(self, study_id: str) -> int:
        with self._tx() as c:
            return c.execute("SELECT COUNT(*) FROM uploads WHERE study_id = ?",
                             (study_id,)).fetchone()[0]

    def close(self, study_id: str, commitment: bytes, seed: bytes) -> tuple[bytes, bytes]:
        """Close the study's collection with ``commitment`` and the helper's ``seed`` unless it
        was closed before; (commitment, seed) as stored (the first close's)."""
        with self._tx() as c:
            c.execute("BEGIN IMMEDIATE")
            try:
                c.execute("INSERT OR IGNORE INTO closes (study_id, commitment, seed) "
                          "VALUES (?, ?, ?)", (study_id, commitment, seed))
                row = c.execute("SELECT commitment, seed FROM closes WHERE study_id = ?",
                                (study_id,)).fetchone()
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise
        return bytes(row[0]), bytes(row[1])

    def closed(self, study_id: str) -> tuple[bytes, bytes, bytes | None] | None:
        """(commitment, helper seed, the coordinator's revealed seed or None), None if open."""
        with self._tx() as c:
            row = c.execute("SELECT commitment, seed, leader_seed FROM closes WHERE study_id = ?",
                            (study_id,)).fetchone()
        return None if row is None else (bytes(row[0]), bytes(row[1]),
                                         None if row[2] is None else bytes(row[2]))

    def fix_circuits(self, study_id: str, leader_seed: bytes,
                     circuits: dict[bytes, tuple[int, int, int]]) -> dict[bytes, tuple[int, int, int]]:
        """Keep the revealed seed and the reports' circuits of the first Prepare; later ones add
        no report and change none: the stored ones are returned, to be compared."""
        with self._tx() as c:
            c.execute("BEGIN IMMEDIATE")
            try:
                c.execute("UPDATE closes SET leader_seed = ? WHERE study_id = ? AND leader_seed "
                          "IS NULL", (leader_seed, study_id))
                if not c.execute("SELECT COUNT(*) FROM circuits WHERE study_id = ?",
                                 (study_id,)).fetchone()[0]:
                    c.executemany("INSERT INTO circuits VALUES (?, ?, ?, ?, ?)",
                                  [(study_id, n, *circ) for n, circ in circuits.items()])
                rows = c.execute("SELECT nonce, entries, bound, l1_bound FROM circuits WHERE "
                                 "study_id = ?", (study_id,)).fetchall()
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise
        return {bytes(r[0]): (r[1], r[2], r[3]) for r in rows}

    def aggregate(self, study_id: str) -> tuple[bytes, list[bytes], bytes] | None:
        """(SHA-256 of the request answered, accepted nonces, share), None before the answer."""
        with self._tx() as c:
            row = c.execute("SELECT request_sha256, accepted, share FROM aggregates WHERE "
                            "study_id = ?", (study_id,)).fetchone()
        if row is None:
            return None
        return bytes(row[0]), [bytes.fromhex(h) for h in json.loads(row[1])], bytes(row[2])

    def keep_aggregate(self, study_id: str, request_sha256: bytes, accepted: list[bytes],
                       share: bytes) -> None:
        """Keep the study's one answer (before it is sent)."""
        self._write("INSERT INTO aggregates VALUES (?, ?, ?, ?)",
                    (study_id, request_sha256, json.dumps([n.hex() for n in accepted]), share))

    def shut(self) -> None:
        self._c.close()
