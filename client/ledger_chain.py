"""The seal of the ledger's spends: a hash chain over the rows, each link signed with the
device's enrolled Ed25519 key (schema 7, :mod:`.ledger_schema`).

Each spend row i (in ``seq`` order) carries

    chain_i = SHA-256("fedsketch/ledger-chain/v1" ‖ chain_{i-1} ‖ the row's fixed fields)

(chain_0 is 32 zero bytes; the fields, :func:`row_digest`, are those a spend never changes: study,
source, ε, δ, n, kind, payload and spec hashes, time, parent, round, the study's ε, the pre-mask
input's hash and the promise's end, each length-prefixed or fixed-width) and
``signature_i`` = Ed25519(device key, chain_i), when the ledger holds an identity (a spend recorded
before enrollment is chained but unsigned). The settings ``chain_count`` and ``chain_head`` hold
how many rows were sealed and the last link, written in the same transaction as the row.

What it shows, and what it cannot: :func:`verify` recomputes every link and checks every
signature, so a row edited, a row deleted from the middle or the end, or rows added by hand
are reported. The key is in the same file, so whoever can write the file can also re-seal a
forged history, and a whole older copy of the file is consistent in itself. Those are caught by
the coordinator, which counts the ε of every contribution it stored from the device against
the total the device declared at enrollment (``fedsketch device budget --verify --coordinator``
compares the two; docs/device-owners.md).
"""

from __future__ import annotations

import hashlib
import sqlite3
import struct
from dataclasses import dataclass

DOMAIN = b"fedsketch/ledger-chain/v1"
GENESIS = bytes(32)
#: The spend columns a link covers, in order (none of them is ever updated).
SEALED = ("seq, study_id, study_name, source, epsilon, delta, n, kind, payload_sha256, "
          "spec_sha256, spent_at, parent, round, study_epsilon, premask, kept_until")


def field(data: str | bytes) -> bytes:
    """A length-prefixed field (uint32 little-endian length, then the bytes; UTF-8 for text), as
    :func:`fedsketch.common.net.signing.field` (not imported here: the command line's start loads no
    cryptography)."""
    raw = data.encode() if isinstance(data, str) else data
    return struct.pack("<I", len(raw)) + raw


def _optional(value: float | None) -> bytes:
    return b"\0" if value is None else b"\1" + struct.pack("<d", value)


def row_digest(prev: bytes, row: tuple) -> bytes:
    """chain_i for a row of :data:`SEALED` (its ``seq`` is not covered: rows are renumbered by
    nobody, and a gap is found by the chain) after the link ``prev``."""
    (_, study_id, name, source, eps, delta, n, kind, payload_sha, spec_sha, spent_at, parent,
     rnd, study_eps, premask, kept_until) = row
    h = hashlib.sha256(DOMAIN)
    h.update(prev)
    for part in (field(study_id), field(name), field(source), struct.pack("<ddd", eps, delta, n),
                 field(kind), field(payload_sha), field(spec_sha), struct.pack("<d", spent_at),
                 field(parent or ""), b"\1" if parent is not None else b"\0", struct.pack("<q", rnd),
                 _optional(study_eps), field(b"" if premask is None else hashlib.sha256(premask).digest()),
                 _optional(kept_until)):
        h.update(part)
    return h.digest()


def _key(db: sqlite3.Connection) -> bytes | None:
    row = db.execute("SELECT private_key FROM identity").fetchone()
    return None if row is None else bytes(row[0])


def _head(db: sqlite3.Connection) -> tuple[int, bytes]:
    settings = dict(db.execute("SELECT key, value FROM settings WHERE key IN ('chain_count', "
                               "'chain_head')"))
    return int(settings.get("chain_count", "0")), bytes.fromhex(settings.get("chain_head", GENESIS.hex()))


def seal(db: sqlite3.Connection, seq: int) -> None:
    """Chain and sign the spend row ``seq`` after the current head, inside the caller's write
    transaction, and move the head to it."""
    from fedsketch.common.net import signing

    count, head = _head(db)
    row = db.execute(f"SELECT {SEALED} FROM spends WHERE seq = ?", (seq,)).fetchone()
    link = row_digest(head, row)
    key = _key(db)
    db.execute("UPDATE spends SET chain = ?, chain_signature = ? WHERE seq = ?",
               (link, None if key is None else signing.sign(key, link), seq))
    db.executemany("INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)",
                   [("chain_count", str(count + 1)), ("chain_head", link.hex())])


def sign_unsigned(db: sqlite3.Connection) -> None:
    """Sign the sealed rows that were recorded before the ledger held a key (at enrollment)."""
    from fedsketch.common.net import signing

    key = _key(db)
    rows = db.execute("SELECT seq, chain FROM spends WHERE chain IS NOT NULL AND "
                      "chain_signature IS NULL").fetchall()
    if key is not None and rows:
        db.executemany("UPDATE spends SET chain_signature = ? WHERE seq = ?",
                       [(signing.sign(key, bytes(link)), seq) for seq, link in rows])


def seal_all(db: sqlite3.Connection) -> int:
    """Seal every row in ``seq`` order from the start (the migration to schema 7); how many."""
    db.execute("DELETE FROM settings WHERE key IN ('chain_count', 'chain_head')")
    seqs = [r[0] for r in db.execute("SELECT seq FROM spends ORDER BY seq")]
    for seq in seqs:
        seal(db, seq)
    return len(seqs)


@dataclass(frozen=True)
class Verdict:
    """What :func:`verify` found: how many rows it checked, and each problem in words."""

    rows: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(db: sqlite3.Connection) -> Verdict:
    """Recompute the chain over every spend row and check every signature against the device's
    key; compare the last link and the count with the sealed head (module docstring)."""
    from fedsketch.common.net import signing

    key = _key(db)
    public = None if key is None else signing.public_key(key)
    problems: list[str] = []
    prev = GENESIS
    rows = db.execute(f"SELECT {SEALED}, chain, chain_signature FROM spends ORDER BY seq").fetchall()
    for *fields, link, signature in rows:
        what = f"the spend of study {fields[1]!r} (row {fields[0]})"
        if link is None:
            problems.append(f"{what} is not sealed: it was written by hand, not by fedsketch")
            continue
        if row_digest(prev, tuple(fields)) != bytes(link):
            problems.append(f"{what} does not follow the row before it: it was edited, or spend "
                            "rows before it were deleted")
        if public is not None:
            if signature is None:
                problems.append(f"{what} is not signed, though the ledger holds the device's key")
            elif not signing.verify(public, bytes(link), bytes(signature)):
                problems.append(f"{what} has a signature the device's key did not make")
        prev = bytes(link)
    count, head = _head(db)
    if count != len(rows) or (rows and head != prev) or (not rows and head != GENESIS):
        problems.append(f"the ledger sealed {count} spend(s) and holds {len(rows)}; its last seal "
                        f"{'matches' if head == prev else 'does not match'} the last row: spend "
                        "rows were deleted or added by hand")
    return Verdict(len(rows), tuple(problems))
