"""The coordinator store. The contract every backend keeps (enrollment, idempotent
contributions, compare-and-set, the lifecycle, results, concurrent writers) runs against each
backend (SQLite, and PostgreSQL on the tests' own server) through the ``store`` fixture of
``tests/conftest.py``; the tests that open a SQLite file themselves (schema, foreign and newer
files, durability across a real SIGKILL) stay SQLite-only, and ``test_postgres_store.py`` has
their PostgreSQL counterparts."""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fedsketch.server.errors import Code
from fedsketch.server.store import ContributionRow, SQLiteStore, Store, StoreError, open_store
from fedsketch.server.store.filelock import hold_exclusive
from fedsketch.server.store.schema import ABORT_STATEMENTS_V9
from fedsketch.server.store.sqlite import SCHEMA_VERSION


def key(i: int) -> bytes:
    return hashlib.sha256(b"key%d" % i).digest()


def payload(i: int) -> bytes:
    return hashlib.sha256(b"payload%d" % i).digest() * 64


def enroll(store: Store, i: int) -> str:
    store.add_tokens([f"tok-{i}"])
    return store.enroll(f"tok-{i}", key(i), f"device {i}")


def contribution(study: str, device: str, data: bytes, n: float = 10.0) -> ContributionRow:
    return ContributionRow(
        study, device, n, "int64_pairs", data, hashlib.sha256(data).hexdigest(), b"sig", time.time()
    )


def refusal(fn, *args) -> StoreError:
    with pytest.raises(StoreError) as info:
        fn(*args)
    return info.value


# schema (SQLite-only: these read and plant the file with sqlite3 directly)


def test_schema_wal_and_reopen(tmp_path):
    path = tmp_path / "store.db"
    s = open_store(path)
    dev = enroll(s, 1)
    s.create_study("s1", '{"k": 3}', "ab" * 32, 123.5, 4)
    s.close()

    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"devices", "tokens", "studies", "contributions", "results", "audit"} <= tables
    tokens = raw.execute("SELECT token_sha256 FROM tokens").fetchall()
    assert tokens == [(hashlib.sha256(b"tok-1").hexdigest(),)]  # only the digest, never the token
    raw.close()

    s = open_store(path)
    try:
        row = s.get_study("s1")
        assert (row.spec_json, row.deadline, row.min_devices, row.state) == ('{"k": 3}', 123.5, 4, "open")
        assert s.device_key(dev) == key(1)
    finally:
        s.close()


#: Schema 2's contributions table: two payload kinds.
V2_CONTRIBUTIONS = """CREATE TABLE contributions (
    study_id TEXT NOT NULL REFERENCES studies(study_id),
    device_id TEXT NOT NULL REFERENCES devices(device_id),
    n REAL NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('int32_pairs', 'int64_pairs')),
    payload BLOB NOT NULL, payload_sha256 TEXT NOT NULL, signature BLOB NOT NULL,
    received_at REAL NOT NULL, PRIMARY KEY (study_id, device_id))"""


def back_to_schema_9(raw: sqlite3.Connection) -> None:
    """Rewrite a current store file as schema 9 wrote it: ``abort_statements`` one per round and
    device, without the round instance (version-1 statements)."""
    raw.execute("DROP TABLE abort_statements")
    raw.execute(ABORT_STATEMENTS_V9)
    raw.execute("PRAGMA user_version = 9")


def back_to_schema_8(raw: sqlite3.Connection) -> None:
    """Rewrite a current store file as schema 8 wrote it: no ``abort_statements``."""
    raw.execute("DROP TABLE abort_statements")
    raw.execute("PRAGMA user_version = 8")


def back_to_schema_7(raw: sqlite3.Connection) -> None:
    """Rewrite a current store file as schema 7 wrote it: no declared budgets, no (ε, δ) on
    contributions and REGISTER messages, no ``secure_charges`` (nor schema 9's table)."""
    back_to_schema_8(raw)
    raw.execute("DROP TABLE secure_charges")
    raw.execute("DROP INDEX contributions_by_device")
    raw.execute("DROP INDEX stage_messages_by_device")
    for table, columns in (("devices", ("budget_epsilon", "budget_delta")),
                           ("contributions", ("epsilon", "delta")),
                           ("stage_messages", ("epsilon", "delta"))):
        for column in columns:
            raw.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    raw.execute("PRAGMA user_version = 7")


def back_to_schema_6(raw: sqlite3.Connection) -> None:
    """Rewrite a current store file as schema 6 wrote it: no ``stage_messages``, no
    ``secure_rounds`` (nor schema 8's columns)."""
    back_to_schema_7(raw)
    raw.execute("DROP TABLE stage_messages")
    raw.execute("DROP TABLE secure_rounds")
    raw.execute("PRAGMA user_version = 6")


def back_to_schema_5(raw: sqlite3.Connection) -> None:
    """Rewrite a current store file as schema 5 wrote it: no ``refusals`` (nor schema 7's tables)."""
    back_to_schema_6(raw)
    raw.execute("DROP TABLE refusals")
    raw.execute("PRAGMA user_version = 5")


def back_to_schema_4(raw: sqlite3.Connection) -> None:
    """Rewrite a current store file as schema 4 wrote it: no study totals, no ticket index, no
    ``refusals``."""
    back_to_schema_5(raw)
    raw.execute("DROP INDEX registrations_by_ticket")
    for column in ("contributed", "records", "registered"):
        raw.execute(f"ALTER TABLE studies DROP COLUMN {column}")
    raw.execute("PRAGMA user_version = 4")


def back_to_schema_3(raw: sqlite3.Connection) -> None:
    """Rewrite a current store file as schema 3 wrote it: no ``studies.roster`` or
    ``studies.filled_at``."""
    back_to_schema_4(raw)
    raw.execute("ALTER TABLE studies DROP COLUMN roster")
    raw.execute("ALTER TABLE studies DROP COLUMN filled_at")
    raw.execute("PRAGMA user_version = 3")


def migrated_from(path: Path, back_to: Callable[[sqlite3.Connection], None]) -> tuple[Store, str]:
    """A store file at ``path`` holding one enrolled device and a study "s", rewritten as an
    older schema wrote it (``back_to``) and opened again, which migrates it; the store and the
    device's id."""
    store = open_store(path)
    device = enroll(store, 1)
    store.create_study("s", "{}", "0" * 64, None, 1)
    store.close()
    raw = sqlite3.connect(path)
    back_to(raw)
    raw.commit()
    raw.close()
    return open_store(path), device


def file_schema(path: Path) -> int:
    """The schema version a store file says it holds (SQLite's user_version)."""
    raw = sqlite3.connect(path)
    try:
        return raw.execute("PRAGMA user_version").fetchone()[0]
    finally:
        raw.close()


def test_a_schema_3_store_is_migrated_with_filled_rosters_marked(tmp_path):
    """Schema 3 had rosters no larger than the quorum and no fill time: a study whose quorum had
    registered is filled at its last registration (it goes on taking input), one still
    registering is not, and fills when its quorum registers."""
    path = tmp_path / "store.db"
    s = open_store(path)
    a, b = enroll(s, 1), enroll(s, 2)
    s.create_study("full", "{}", "0" * 64, None, 2)
    s.create_study("half", "{}", "1" * 64, None, 2)
    s.register("full", a)
    s.register("full", b)
    s.register("half", a)
    s.close()
    raw = sqlite3.connect(path)
    last = raw.execute("SELECT MAX(registered_at) FROM registrations WHERE study_id = 'full'").fetchone()[0]
    back_to_schema_3(raw)
    raw.commit()
    raw.close()
    s = open_store(path)
    try:
        full, half = s.get_study("full"), s.get_study("half")
        assert (full.filled_at, full.capacity, full.roster_full) == (last, 2, True)
        assert (half.filled_at, half.roster_full) == (None, False)
        assert s.register("half", b)[1].roster_full
        assert s.add_contribution(contribution("full", a, payload(1)))
        assert "store schema 3 -> 4: rosters may be larger than the quorum" in [
            e[3] for e in s.audit_log()]
    finally:
        s.close()


def back_to_schema_2(raw: sqlite3.Connection) -> None:
    """Rewrite a current store file as schema 2 wrote it: no ``studies.parent``, and the
    contributions table's CHECK of two payload kinds."""
    back_to_schema_3(raw)
    raw.execute("DROP INDEX studies_by_parent")
    raw.execute("ALTER TABLE studies DROP COLUMN parent")
    raw.execute("ALTER TABLE contributions RENAME TO c3")
    raw.execute(V2_CONTRIBUTIONS)
    raw.execute("INSERT INTO contributions SELECT * FROM c3")
    raw.execute("DROP TABLE c3")
    raw.execute("CREATE INDEX contributions_by_time ON contributions(study_id, received_at)")
    raw.execute("PRAGMA user_version = 2")


def test_a_schema_2_store_is_migrated_to_take_refinement_rounds(tmp_path):
    """Schema 2 had no round studies: opening it adds ``studies.parent`` and lets a contribution
    be a round's cells, keeping every study and contribution as it was."""
    path = tmp_path / "store.db"
    s = open_store(path)
    a = enroll(s, 1)
    s.create_study("s", "{}", "0" * 64, None, 1)
    s.register("s", a)
    s.add_contribution(contribution("s", a, payload(1)))
    s.close()
    raw = sqlite3.connect(path)
    back_to_schema_2(raw)
    raw.commit()
    with pytest.raises(sqlite3.IntegrityError):  # the old CHECK refuses a round's cells
        raw.execute("INSERT INTO contributions VALUES ('s', ?, 1, 'int64_cells', x'00', '', x'', 0)",
                    (a,))
    raw.close()
    s = open_store(path)
    try:
        assert s.contributions("s")[0].payload == payload(1)
        assert s.get_study("s").parent is None
        r = s.create_study("r", "{}", "1" * 64, None, 1, parent="s")
        assert r.parent == "s" and [row.study_id for row in s.rounds("s")] == ["r"]
        s.register("r", a)
        cells = ContributionRow("r", a, 3.0, "int64_cells", b"\0" * 16, "x", b"sig", time.time())
        assert s.add_contribution(cells)
        assert "migrate" in [e[2] for e in s.audit_log()]
    finally:
        s.close()
    assert file_schema(path) == SCHEMA_VERSION


def test_a_schema_1_store_is_migrated_with_contributors_in_the_rosters(tmp_path):
    """Schema 1 had no rosters: opening it creates them, every device that had contributed to a
    study joins its roster, so an open study goes on where it was (and a new device can still
    fill it)."""
    path = tmp_path / "store.db"
    s = open_store(path)
    a, b = enroll(s, 1), enroll(s, 2)
    s.create_study("s", "{}", "0" * 64, None, 2)
    s.register("s", a)
    s.register("s", b)
    s.add_contribution(contribution("s", a, payload(1)))
    s.close()
    raw = sqlite3.connect(path)  # back to schema 1: no rosters
    back_to_schema_2(raw)
    raw.execute("DROP TABLE registrations")
    raw.execute("ALTER TABLE studies DROP COLUMN close_requested")
    raw.execute("PRAGMA user_version = 1")
    raw.commit()
    raw.close()
    s = open_store(path)
    try:
        row = s.get_study("s")
        assert (row.registered, row.contributions, row.state) == (1, 1, "collecting")
        assert s.register("s", a) == (False, row)
        assert s.register("s", b)[1].roster_full
        assert s.add_contribution(contribution("s", b, payload(2)))
        assert "migrate" in [e[2] for e in s.audit_log()]
    finally:
        s.close()
    assert file_schema(path) == SCHEMA_VERSION


def test_future_schema_refused(tmp_path):
    path = tmp_path / "store.db"
    open_store(path).close()
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    err = refusal(open_store, path)
    assert err.code == "failed_precondition"
    assert "newer" in str(err)


def test_foreign_sqlite_file_refused_untouched(tmp_path):
    path = tmp_path / "other.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE t (x)")
    raw.close()
    err = refusal(open_store, path)
    assert err.code == "failed_precondition"
    assert "not a fedsketch store" in str(err)
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    raw.close()


def test_non_sqlite_file_refused(tmp_path):
    path = tmp_path / "notes.txt"
    data = b"these are not the pages you are looking for\n" * 20
    path.write_bytes(data)
    err = refusal(open_store, path)
    assert err.code == "failed_precondition"
    assert str(path) in str(err) and "not a database" in str(err)
    assert path.read_bytes() == data


def test_open_store_picks_the_backend_from_a_path_or_url(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for where in (tmp_path / "a.db", str(tmp_path / "a.db"), "sqlite:///a.db", f"sqlite:///{tmp_path}/a.db",
                  "a:b.db"):  # no "://": a file name with a colon
        s = open_store(where)
        assert isinstance(s, SQLiteStore)
        s.close()
    assert sorted(p.name for p in tmp_path.glob("*.db")) == ["a.db", "a:b.db"]
    for url, words in (("mysql://me:secret@db.example/fedsketch", "unsupported store URL scheme 'mysql'"),
                       ("sqlite://host/a.db", "bad SQLite"), ("sqlite://", "bad SQLite")):
        with pytest.raises(ValueError, match=words):
            open_store(url)


# enrollment


def test_enroll_token_once(store):
    store.add_tokens(["alpha", "beta"])
    dev = store.enroll("alpha", key(1), "phone")
    assert dev.startswith("dev-") and len(dev) == 20
    assert store.device_key(dev) == key(1)
    assert store.device_key("dev-0000000000000000") is None
    assert store.audit_log()[-1][1:3] == (dev, "enroll")

    assert refusal(store.enroll, "alpha", key(2), "again").code == "permission_denied"
    assert refusal(store.enroll, "gamma", key(2), "unknown").code == "permission_denied"
    enrolled = len(store.audit_log(1000))
    assert store.enroll("alpha", key(1), "reply lost") == dev  # the same key asks again
    assert len(store.audit_log(1000)) == enrolled  # nothing new was written
    store.add_tokens(["alpha"])  # re-adding a used token does not revive it
    assert refusal(store.enroll, "alpha", key(2), "revived").code == "permission_denied"

    assert refusal(store.enroll, "beta", key(1), "same key").code == "conflict"
    with pytest.raises(ValueError):
        store.enroll("beta", key(2)[:31], "short key")
    assert store.enroll("beta", key(2), "second") != dev  # failed attempts left the token unused


# contributions


def test_a_roster_fills_once_and_only_its_devices_contribute_when_it_is_full(store):
    a, b, c = enroll(store, 1), enroll(store, 2), enroll(store, 3)
    store.create_study("s", "{}", "0" * 64, None, 2)
    err = refusal(store.add_contribution, contribution("s", a, payload(1)))
    assert err.code == "permission_denied" and "roster" in str(err)
    added, row = store.register("s", a)
    assert added and (row.registered, row.roster_full) == (1, False)
    assert store.register("s", a) == (False, row)  # idempotent
    err = refusal(store.add_contribution, contribution("s", a, payload(1)))
    assert err.code == "failed_precondition" and "1 of 2" in str(err)
    assert store.register("s", b)[1].roster_full
    err = refusal(store.register, "s", c)
    assert err.code == "failed_precondition" and "full" in str(err)
    assert refusal(store.add_contribution, contribution("s", c, payload(3))).code == "permission_denied"
    assert refusal(store.register, "s", "dev-unknown").code == "not_found"
    assert refusal(store.register, "nope", a).code == "not_found"
    assert store.contributions("s") == [] and store.get_study("s").registered == 2
    assert [e[2] for e in store.audit_log()].count("register") == 2
    store.set_state("s", "failed")
    assert store.register("s", a)[0] is False  # a member is told so even once it closed
    store.create_study("t", "{}", "0" * 64, None, 1)
    store.set_state("t", "failed")
    assert refusal(store.register, "t", a).code == "failed_precondition"


def test_tickets_are_given_to_roster_devices_only_while_input_is_open(store):
    a, b, c = enroll(store, 1), enroll(store, 2), enroll(store, 3)
    store.create_study("s", "{}", "0" * 64, None, 2)
    store.register("s", a)
    assert store.ticket("s", a, 60.0) == 0.0  # the roster is not full
    store.register("s", b)
    assert store.ticket("s", a, 60.0) == 60.0 and store.ticket("s", c, 60.0) == 0.0
    now = time.time()
    assert store.outstanding("s", now) == 1 and store.outstanding("s", now + 61.0) == 0
    row = store.request_close("s", "deadline reached")
    assert row.closing == "deadline reached" and "closing" in row.detail
    assert store.request_close("s", "operator").closing == "deadline reached"  # kept
    assert store.ticket("s", b, 60.0) == 0.0  # none after a close was requested
    assert store.add_contribution(contribution("s", a, payload(1)))  # a ticket holder still sends
    assert store.outstanding("s", time.time()) == 0
    assert store.ticket("s", a, 60.0) == 0.0  # contributed already
    store.set_state("s", "failed")
    assert refusal(store.request_close, "s", "again").code == "failed_precondition"


def test_contribution_idempotency_and_counts(store):
    a, b = enroll(store, 1), enroll(store, 2)
    store.create_study("s", "{}", "0" * 64, None, 2)
    assert store.get_study("s").state == "open"
    store.register("s", a)
    store.register("s", b)

    first = contribution("s", a, payload(1), n=100.0)
    assert store.add_contribution(first) is True
    assert store.get_study("s").state == "collecting"
    assert store.add_contribution(contribution("s", a, payload(1), n=100.0)) is False
    assert store.contributions("s") == [first]

    assert refusal(store.add_contribution, contribution("s", a, payload(9), n=100.0)).code == "conflict"
    assert refusal(store.add_contribution, contribution("s", a, payload(1), n=99.0)).code == "conflict"
    assert store.contributions("s") == [first]

    assert store.add_contribution(contribution("s", b, payload(2), n=50.5)) is True
    row = store.get_study("s")
    assert (row.contributions, row.records) == (2, 150.5)
    assert [c.device_id for c in store.contributions("s")] == [a, b]
    assert [e[2] for e in store.audit_log()].count("contribute") == 2

    assert refusal(store.add_contribution, contribution("nope", a, payload(1))).code == "not_found"
    assert refusal(store.add_contribution, contribution("s", "dev-unknown", payload(3))).code == "not_found"


@pytest.mark.parametrize("state", ["decoding", "done", "failed"])
def test_closed_study_refuses_contributions(store, state):
    dev = enroll(store, 1)
    store.create_study("s", "{}", "0" * 64, None, 1)
    store.set_state("s", state)
    err = refusal(store.add_contribution, contribution("s", dev, payload(1)))
    assert err.code == "failed_precondition" and state in str(err)
    assert store.contributions("s") == []


# states and results


def test_set_state_compare_and_set(store):
    store.create_study("s", "{}", "0" * 64, None, 1)
    assert refusal(store.create_study, "s", "{}", "0" * 64, None, 1).code == "conflict"
    row = store.set_state("s", "decoding", "started", expect=("open", "collecting"))
    assert (row.state, row.detail) == ("decoding", "started")
    err = refusal(store.set_state, "s", "decoding", "again", ("open", "collecting"))
    assert err.code == "failed_precondition"
    assert (store.get_study("s").state, store.get_study("s").detail) == ("decoding", "started")
    assert store.set_state("s", "failed", "no quorum").state == "failed"  # no expect: unconditional
    assert refusal(store.set_state, "missing", "done").code == "not_found"
    with pytest.raises(ValueError):
        store.set_state("s", "finished")


def test_results_and_listing(store):
    store.create_study("s1", "{}", "0" * 64, None, 1)
    store.create_study("s2", "{}", "0" * 64, None, 1)
    store.set_state("s2", "decoding")
    assert store.get_result("s2") is None
    store.put_result("s2", '{"centroids": []}')
    assert store.get_result("s2") == '{"centroids": []}'
    assert store.get_study("s2").state == "done"
    assert refusal(store.put_result, "s2", "{}").code == "conflict"
    assert refusal(store.put_result, "missing", "{}").code == "not_found"
    assert [r.study_id for r in store.list_studies()] == ["s1", "s2"]
    assert [r.study_id for r in store.list_studies(("done",))] == ["s2"]
    assert refusal(store.get_study, "missing").code == "not_found"

    store.audit("operator", "note", "hello")
    log = store.audit_log(limit=2)
    assert [e[1:] for e in log] == [
        ("coordinator", "put_result", "study 's2': decoding -> done"),
        ("operator", "note", "hello"),
    ]


def test_only_a_decoding_study_gets_a_result(store):
    store.create_study("s", "{}", "0" * 64, None, 1)
    err = refusal(store.put_result, "s", "{}")
    assert err.code == "failed_precondition" and "'open'" in str(err)
    assert (store.get_result("s"), store.get_study("s").state) == (None, "open")


def test_refusal_codes_are_a_closed_set():
    assert StoreError(Code.CONFLICT, "x").code == "conflict" == StoreError("conflict", "x").code
    with pytest.raises(ValueError, match="unknown refusal code"):
        StoreError("teapot", "x")


# durability and concurrency

CHILD = """
import hashlib, sys, time
from fedsketch.server.store import ContributionRow, open_store
store = open_store(sys.argv[1])
for i in range(100000):
    store.add_tokens([f"tok-{i}"])
    dev = store.enroll(f"tok-{i}", hashlib.sha256(b"key%d" % i).digest(), "d")
    store.create_study(f"s{i}", "{}", "0" * 64, None, 1)
    store.register(f"s{i}", dev)
    data = hashlib.sha256(b"payload%d" % i).digest() * 64
    sha = hashlib.sha256(data).hexdigest()
    row = ContributionRow(f"s{i}", dev, float(i), "int32_pairs", data, sha, b"s", time.time())
    assert store.add_contribution(row)
    print(f"acked {i} {dev}", flush=True)
time.sleep(60)
"""


def test_acked_contributions_survive_sigkill(tmp_path):  # SQLite-only: kills a writer of the file
    path = tmp_path / "store.db"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(30, proc.kill)
    watchdog.start()
    try:
        lines = []
        while len(lines) < 40:
            line = proc.stdout.readline()
            assert line, f"child ended early: {proc.stderr.read()}"
            lines.append(line)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        lines += proc.stdout.read().splitlines()  # acks printed before the kill landed
    finally:
        watchdog.cancel()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    acked = {int(i): dev for _, i, dev in (line.split() for line in lines)}
    assert sorted(acked) == list(range(len(acked)))

    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    raw.close()
    store = open_store(path)
    try:
        stored = {c.device_id: c for row in store.list_studies()
                  for c in store.contributions(row.study_id)}
        for i, dev in acked.items():
            assert stored[dev].payload == payload(i)
            assert stored[dev].payload_sha256 == hashlib.sha256(payload(i)).hexdigest()
            assert stored[dev].n == float(i)
            assert store.get_study(f"s{i}").state == "collecting"
        assert len(stored) - len(acked) in (0, 1)  # at most one committed write was still unacknowledged
    finally:
        store.close()


def test_concurrent_contributions_all_land(store):
    devices = [enroll(store, i) for i in range(8)]
    store.create_study("s", "{}", "0" * 64, None, 8)
    for device in devices:
        store.register("s", device)
    barrier = threading.Barrier(8)
    results: dict[int, bool | Exception] = {}

    def send(i: int) -> None:
        barrier.wait()
        try:
            results[i] = store.add_contribution(contribution("s", devices[i], payload(i), n=float(i + 1)))
        except Exception as exc:  # reported by the assertion below
            results[i] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: True for i in range(8)}
    row = store.get_study("s")
    assert (row.contributions, row.records, row.state) == (8, 36.0, "collecting")
    stored = {c.device_id: c.payload for c in store.contributions("s")}
    assert stored == {d: payload(i) for i, d in enumerate(devices)}


def test_a_coordinator_holds_its_file_alone_and_creates_it_owner_only(tmp_path):
    """One holder of a store file at a time (another coordinator would fail the first one's
    running secure study), released when its descriptor closes, as when its process dies. The
    file and its WAL are created 0600."""
    path = tmp_path / "store.db"
    held = hold_exclusive(str(path))
    err = refusal(hold_exclusive, str(path))
    assert err.code == "failed_precondition" and "in use by another coordinator" in str(err)
    os.close(held)
    os.close(hold_exclusive(str(path)))
    store = open_store(path)
    store.create_study("s", "{}", "0" * 64, None, 1)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(f"{path}-wal").st_mode) == 0o600
    store.close()


def test_a_schema_8_store_is_migrated_to_keep_abort_statements(tmp_path):
    """Schema 8 → 9: the table of abort statements (rule B) is created, empty, and works; a
    statement is kept only for a study that failed, once per device."""
    path = tmp_path / "store.db"
    s, device = migrated_from(path, back_to_schema_8)
    assert file_schema(path) == SCHEMA_VERSION == 10
    assert s.abort_statements("s") == []
    with pytest.raises(StoreError, match="only a failed secure round is aborted"):
        s.add_abort_statement("s", device, "localhost", b"x" * 64, b"r" * 32)
    s.set_state("s", "failed", "test", expect=("open",))
    assert s.add_abort_statement("s", device, "localhost", b"x" * 64, b"r" * 32)
    assert not s.add_abort_statement("s", device, "localhost", b"y" * 64, b"r" * 32)  # first kept
    assert [(r.device_id, r.signature, r.round_sha256) for r in s.abort_statements("s")] == [
        (device, b"x" * 64, b"r" * 32)]
    s.close()


def test_a_schema_9_store_keeps_its_statements_and_takes_one_per_coordinator_name(tmp_path):
    """Schema 9 → 10 (review finding 5): the table is rebuilt keyed per device and coordinator
    name, with the round instance R; a statement kept before (version 1: R empty) stays with its
    certified_at, so the round it certified stays out of the device's account; a statement
    for a second name of the coordinator is kept beside the first, not displaced by it."""
    path = tmp_path / "store.db"

    def back(raw: sqlite3.Connection) -> None:
        back_to_schema_9(raw)
        raw.execute("UPDATE studies SET state = 'failed' WHERE study_id = 's'")
        device = raw.execute("SELECT device_id FROM devices").fetchone()[0]
        raw.execute("INSERT INTO abort_statements VALUES ('s', ?, 'a.example', ?, 5.0, 6.0)",
                    (device, b"v" * 64))

    s, device = migrated_from(path, back)
    try:
        assert file_schema(path) == SCHEMA_VERSION == 10
        (old,) = s.abort_statements("s")
        assert (old.audience, old.signature, old.round_sha256) == ("a.example", b"v" * 64, b"")
        assert s.add_abort_statement("s", device, "b.example", b"w" * 64, b"r" * 32)
        assert not s.add_abort_statement("s", device, "a.example", b"z" * 64, b"r" * 32)
        assert {(r.audience, r.signature) for r in s.abort_statements("s")} == {
            ("a.example", b"v" * 64), ("b.example", b"w" * 64)}
        raw = sqlite3.connect(path)
        assert raw.execute("SELECT certified_at FROM abort_statements WHERE audience = "
                           "'a.example'").fetchone() == (6.0,)
        raw.close()
        assert "store schema 9 -> 10: abort statements name the round's instance" in " ".join(
            e[3] for e in s.audit_log())
    finally:
        s.close()
