"""The device's identity in its ledger: its id, Ed25519 private key and coordinator address,
and the key of an enrollment in progress.

Enrollment must survive a lost reply: the coordinator commits the enrollment, the reply never
arrives, and the device asks again. So the device draws its key once (OS CSPRNG), commits it to
the ledger (``settings.enrollment_key``) *before* it calls Enroll, and sends that same key on
every retry; the coordinator treats a token already traded for that very key as success and
returns the same device id. Storing the identity drops the pending key.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager

from fedsketch.client.ledger_records import Identity, LedgerError
from fedsketch.client.ledger_schema import set_settings
from fedsketch.common.net import signing

#: ``settings`` key of the private key of an enrollment in progress (hex).
PENDING_KEY = "enrollment_key"


class IdentityStore:
    """The identity methods of :class:`~.ledger.Ledger` (a mixin: the ledger provides its path,
    connection and write transaction)."""

    path: str
    _conn: sqlite3.Connection
    _write: Callable[[], AbstractContextManager[sqlite3.Connection]]

    def identity(self) -> Identity | None:
        """The stored device identity, or None before the first :meth:`set_identity`."""
        row = self._conn.execute("SELECT device_id, private_key, coordinator FROM identity").fetchone()
        return None if row is None else Identity(*row)

    def enrollment_key(self) -> bytes:
        """The raw Ed25519 private key to enroll with: drawn and committed on the first call,
        the same on every later one until :meth:`set_identity` (LedgerError once the device has
        an identity: it keeps its key)."""
        with self._write() as db:
            if db.execute("SELECT 1 FROM identity").fetchone():
                raise LedgerError(f"{self.path} already holds this device's identity")
            row = db.execute("SELECT value FROM settings WHERE key = ?", (PENDING_KEY,)).fetchone()
            if row is not None:
                return bytes.fromhex(row[0])
            key = signing.new_private_key()
            set_settings(db, **{PENDING_KEY: key.hex()})
            return key

    def set_identity(self, identity: Identity) -> None:
        """Store the device identity (and drop the pending enrollment key). Storing the same
        identity again is a no-op; LedgerError if a different one is already stored (a device
        keeps its key)."""
        identity = Identity(identity.device_id, bytes(identity.private_key), identity.coordinator)
        with self._write() as db:
            row = db.execute("SELECT device_id, private_key, coordinator FROM identity").fetchone()
            if row is not None:
                if Identity(*row) != identity:
                    raise LedgerError(f"{self.path} already holds identity of device {row[0]!r}; "
                                      "refusing to overwrite it")
                return
            db.execute("INSERT INTO identity (id, device_id, private_key, coordinator) VALUES (1, ?, ?, ?)",
                       (identity.device_id, identity.private_key, identity.coordinator))
            db.execute("DELETE FROM settings WHERE key = ?", (PENDING_KEY,))
