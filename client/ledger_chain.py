"""The seal of the ledger's spends: a hash chain over the rows, each link signed with the
device's enrolled Ed25519 key (schema 7, :mod:`.ledger_schema`).

Each spend row i (in ``seq`` order) carries

    chain_i = SHA-256("fedsketch/ledger-chain/v1" ‖ chain_{i-1} ‖ the row's fixed fields)

(chain_0 is 32 zero bytes; the fields, :func:`row_digest`, are those a spend never changes: study,
source, ε, δ, n, kind, payload and spec hashes, time, parent, round, the study's ε, the pre-mask
input's hash and the promise's end, each length-prefixed or fixed-width, and from schema 9, on a
secure round's spend, "T" ‖ L(SHA-256 of its round terms); a spend without terms, every one
recorded before, links as it did) and
``signature_i`` = Ed25519(device key, chain_i), when the ledger holds an identity (a spend recorded
before enrollment is chained but unsigned). The settings ``chain_count`` and ``chain_head`` hold
how many rows were sealed and the last link, written in the same transaction as the row.
Schema 8 adds void rows (a spend given back, :mod:`.ledger_voids`) to the same chain, each at
its ``position`` among the links, with a link of their own domain (:func:`void_digest`).

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
from collections.abc import Callable
from dataclasses import dataclass

DOMAIN = b"fedsketch/ledger-chain/v1"
#: The domain of a void row's link (schema 8, :mod:`.ledger_voids`).
VOID_DOMAIN = b"fedsketch/ledger-void/v1"
GENESIS = bytes(32)
#: The spend columns a link covers, in order (none of them is ever updated).
SEALED = ("seq, study_id, study_name, source, epsilon, delta, n, kind, payload_sha256, "
          "spec_sha256, spent_at, parent, round, study_epsilon, premask, kept_until, round_terms")


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
     rnd, study_eps, premask, kept_until, terms) = row
    h = hashlib.sha256(DOMAIN)
    h.update(prev)
    for part in (field(study_id), field(name), field(source), struct.pack("<ddd", eps, delta, n),
                 field(kind), field(payload_sha), field(spec_sha), struct.pack("<d", spent_at),
                 field(parent or ""), b"\1" if parent is not None else b"\0", struct.pack("<q", rnd),
                 _optional(study_eps), field(b"" if premask is None else hashlib.sha256(premask).digest()),
                 _optional(kept_until)):
        h.update(part)
    if terms is not None:  # schema 9 (module docstring): an older row's link is unchanged
        h.update(b"T" + field(hashlib.sha256(bytes(terms)).digest()))
    return h.digest()


#: The void columns a link covers (after ``seq``, which is not covered).
VOID_SEALED = "seq, study_id, spend_chain, reason, voided_at, certificate_sha256, position"


def void_digest(prev: bytes, row: tuple) -> bytes:
    """chain_i for a void row of :data:`VOID_SEALED` after the link ``prev``: it covers the link
    of the spend it gives back, so it cannot be moved to another spend."""
    _, study_id, spend_chain, reason, voided_at, cert_sha, position = row
    h = hashlib.sha256(VOID_DOMAIN)
    h.update(prev)
    for part in (field(study_id), field(bytes(spend_chain)), field(reason),
                 struct.pack("<dq", voided_at, position), field(cert_sha)):
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
    _seal(db, "spends", SEALED, row_digest, seq)


def seal_void(db: sqlite3.Connection, seq: int) -> None:
    """Chain and sign the void row ``seq`` after the current head (its ``position`` is the count
    of links before it), inside the caller's write transaction, and move the head to it."""
    _seal(db, "voids", VOID_SEALED, void_digest, seq)


def _seal(db: sqlite3.Connection, table: str, columns: str,
          digest: Callable[[bytes, tuple], bytes], seq: int) -> None:
    """Row ``seq`` of ``table``: its link (``digest`` of the head and its sealed ``columns``),
    signed with the device's key when the ledger holds one; the head moves to it."""
    from fedsketch.common.net import signing

    count, head = _head(db)
    row = db.execute(f"SELECT {columns} FROM {table} WHERE seq = ?", (seq,)).fetchone()
    link = digest(head, row)
    key = _key(db)
    db.execute(f"UPDATE {table} SET chain = ?, chain_signature = ? WHERE seq = ?",
               (link, None if key is None else signing.sign(key, link), seq))
    db.executemany("INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)",
                   [("chain_count", str(count + 1)), ("chain_head", link.hex())])


def sign_unsigned(db: sqlite3.Connection) -> None:
    """Sign the sealed rows that were recorded before the ledger held a key (at enrollment)."""
    from fedsketch.common.net import signing

    key = _key(db)
    for table in ("spends", "voids"):
        rows = db.execute(f"SELECT seq, chain FROM {table} WHERE chain IS NOT NULL AND "
                          "chain_signature IS NULL").fetchall()
        if key is not None and rows:
            db.executemany(f"UPDATE {table} SET chain_signature = ? WHERE seq = ?",
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
    voids: int = 0
    legacy: tuple[str, ...] = ()

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
    rows = _links(db)
    links = {f[1]: f[-2] for kind, f in rows if kind == "spend"}  # study → its spend's link
    for kind, (*fields, link, signature) in rows:
        what = (f"the spend of study {fields[1]!r} (row {fields[0]})" if kind == "spend" else
                f"the void of study {fields[1]!r}'s spend (void row {fields[0]})")
        if link is None:
            problems.append(f"{what} is not sealed: it was written by hand, not by fedsketch")
            continue
        digest = row_digest if kind == "spend" else void_digest
        if digest(prev, tuple(fields)) != bytes(link):
            problems.append(f"{what} does not follow the row before it: it was edited, or spend "
                            "rows before it were deleted")
        if kind == "void" and (links.get(fields[1]) is None
                               or bytes(links[fields[1]]) != bytes(fields[2])):
            problems.append(f"{what} names a spend the ledger does not hold as sealed")
        if public is not None:
            if signature is None:
                problems.append(f"{what} is not signed, though the ledger holds the device's key")
            elif not signing.verify(public, bytes(link), bytes(signature)):
                problems.append(f"{what} has a signature the device's key did not make")
        prev = bytes(link)
    problems += unsound_voids(db)
    count, head = _head(db)
    if count != len(rows) or (rows and head != prev) or (not rows and head != GENESIS):
        what = "spend(s)" if not any(kind == "void" for kind, _ in rows) else "spend and void rows"
        problems.append(f"the ledger sealed {count} {what} and holds {len(rows)}; its last seal "
                        f"{'matches' if head == prev else 'does not match'} the last row: spend "
                        "rows were deleted or added by hand")
    return Verdict(sum(kind == "spend" for kind, _ in rows), tuple(problems),
                   sum(kind == "void" for kind, _ in rows), tuple(legacy_voids(db)))


def _links(db: sqlite3.Connection) -> list[tuple[str, tuple]]:
    """Every sealed row in chain order: ("spend", its :data:`SEALED` fields, link, signature) in
    ``seq`` order, with ("void", :data:`VOID_SEALED` …) rows put at their ``position``."""
    spends = db.execute(f"SELECT {SEALED}, chain, chain_signature FROM spends ORDER BY seq").fetchall()
    voids = db.execute(f"SELECT {VOID_SEALED}, chain, chain_signature FROM voids "
                       "ORDER BY position, seq").fetchall()
    out: list[tuple[str, tuple]] = []
    taken, v = 0, 0  # spends and voids placed so far
    for i in range(len(spends) + len(voids)):
        if v < len(voids) and (voids[v][6] <= i or taken == len(spends)):
            out.append(("void", voids[v]))
            v += 1
        else:
            out.append(("spend", spends[taken]))
            taken += 1
    return out


#: The kind of a secure round's spend (``SECURE_KIND`` of :mod:`.secure_steps`).
MASKED = "secagg_masked"


def unsound_voids(db: sqlite3.Connection) -> list[str]:
    """The voids that neither rule of docs/secure-aggregation.md could have written. Rule A's,
    without a certificate: of a plain spend, or of a spend whose bytes the coordinator
    acknowledged (a receipt that is not a refusal): such a release left the device. Rule B's,
    with one: a certificate that is not the one sealed, or that does not suffice
    (:func:`certificate_problem`). Either way the spend stands."""
    rows = db.execute("SELECT v.study_id, s.kind, s.acked_at, s.receipt, v.certificate, "
                      "v.certificate_sha256, s.round_terms FROM voids v JOIN spends s ON "
                      "s.study_id = v.study_id ORDER BY v.position").fetchall()
    identity = db.execute("SELECT device_id, private_key FROM identity").fetchone()
    out = []
    for sid, kind, acked, receipt, certificate, sealed, terms in rows:
        if kind != MASKED:
            out.append(f"the void of study {sid!r}'s spend gives back a plain release: its spend "
                       "stands")
        elif certificate is None:
            if acked is not None and not str(receipt).startswith("refused:"):
                out.append(f"the void of study {sid!r}'s spend gives back a release that was "
                           "sent: its spend stands")
        elif (why := certificate_problem(bytes(certificate), sealed, sid, identity,
                                         None if terms is None else bytes(terms))) is not None:
            out.append(f"the void of study {sid!r}'s spend rests on {why}: its spend stands")
    return out


def legacy_voids(db: sqlite3.Connection) -> list[str]:
    """The studies whose spend was given back by a certificate of abort while the spend had no
    round terms recorded (a void an earlier release wrote, before ledger schema 9): their
    certificates were checked against the t, C and holders they name themselves."""
    return [r[0] for r in db.execute("SELECT v.study_id FROM voids v JOIN spends s ON s.study_id "
                                     "= v.study_id WHERE v.certificate IS NOT NULL AND "
                                     "s.round_terms IS NULL ORDER BY v.position")]


def certificate_problem(certificate: bytes, sealed: str | None, study_id: str,
                        identity: tuple[str, bytes] | None, terms: bytes | None) -> str | None:
    """What is wrong with the certificate of abort a void rests on (None: nothing): its SHA-256
    must be the one the void row seals (``sealed``; None: a void about to be written), it must
    be of the void's round and of this device (``identity``: its id and private key), with this
    device's own key among the holders, of the round ``terms`` its spend recorded before the
    masked input left (R, t, C, the holders and their keys: a certificate made up afterwards
    with fewer holders or another t does not match), and hold need(H, t, C) valid statements of
    distinct holders (:mod:`fedsketch.common.secagg.abort`). A spend without terms (recorded
    before ledger schema 9) admits only a version-1 certificate, which an earlier release
    wrote; it is checked against itself (:func:`legacy_voids` names them)."""
    from fedsketch.common.net import signing
    from fedsketch.common.secagg.abort import Certificate, RoundTerms, terms_mismatch

    if sealed is not None and hashlib.sha256(certificate).hexdigest() != sealed:
        return "a certificate of abort that is not the one sealed in its void row"
    try:
        cert = Certificate.from_bytes(certificate)
    except ValueError as exc:
        return f"an unreadable certificate ({exc})"
    if cert.study_id != study_id:
        return f"a certificate of abort of another round ({cert.study_id!r})"
    if identity is not None and (cert.device_id != identity[0] or cert.holders.get(identity[0])
                                 != signing.public_key(bytes(identity[1]))):
        return f"a certificate of abort made out to another device ({cert.device_id!r})"
    if terms is None and cert.bundle_sha256 is not None:
        return ("a certificate of abort for a spend that recorded no round terms (the device "
                "records them before its masked input leaves it)")
    if terms is not None:
        try:
            recorded = RoundTerms.from_bytes(terms)
        except ValueError as exc:
            return f"round terms its spend cannot read ({exc})"
        if (why := terms_mismatch(cert, recorded)) is not None:
            return f"a certificate of abort of other round terms: {why}"
    if not cert.sufficient:
        return (f"a certificate of abort with {len(cert.signers)} valid statements of distinct "
                f"holders of the device's shares, fewer than the {cert.need} needed (or none of "
                "the device's own)")
    return None
