"""What only the PostgreSQL store has (the contract itself runs on both backends in
test_store.py): its schema marker and refusals of foreign or newer databases, exact float
columns, several stores (as several coordinator processes) on one database making each
check-and-write once, passwords from the environment or a password file and never in an error,
and a clear error without psycopg."""

from __future__ import annotations

import sys
import threading

import psycopg
import pytest
from test_store import enroll, refusal

from fedsketch.server.store import open_store
from fedsketch.server.store.postgres import PostgresStore, redact
from fedsketch.server.store.schema import (
    ABORT_STATEMENTS_V9,
    APPLICATION_ID,
    SCHEMA_VERSION,
    postgres_sql,
)


def raw(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(sql)
        return cursor.fetchall() if cursor.description else []


def test_a_new_database_is_marked_and_versioned_and_keeps_floats_exactly(postgres_url):
    store = open_store(postgres_url)
    assert isinstance(store, PostgresStore)
    enroll(store, 1)
    deadline = 1_790_000_000.123456  # float4 would keep ~7 digits of it
    store.create_study("s", "{}", "0" * 64, deadline, 1)
    store.close()
    assert raw(postgres_url, "SELECT application_id, schema_version FROM fedsketch_store") == [
        (APPLICATION_ID, SCHEMA_VERSION)]
    types = dict(raw(postgres_url, "SELECT table_name || '.' || column_name, data_type "
                                   "FROM information_schema.columns"))
    assert types["studies.deadline"] == types["audit.at"] == "double precision"
    assert types["contributions.payload"] == types["devices.public_key"] == "bytea"
    store = open_store(postgres_url)  # reopened: nothing migrated or created again
    try:
        assert store.get_study("s").deadline == deadline
        assert [e[2] for e in store.audit_log()] == ["add_tokens", "enroll", "create_study"]
    finally:
        store.close()


def test_a_foreign_or_newer_database_is_refused_untouched(postgres_url):
    raw(postgres_url, "CREATE TABLE notes (x integer)")
    err = refusal(open_store, postgres_url)
    assert err.code == "failed_precondition" and "not a fedsketch store" in str(err)
    assert raw(postgres_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'") == [("notes",)]
    raw(postgres_url, "DROP TABLE notes")
    open_store(postgres_url).close()
    raw(postgres_url, f"UPDATE fedsketch_store SET schema_version = {SCHEMA_VERSION + 1}")
    err = refusal(open_store, postgres_url)
    assert "newer fedsketch" in str(err) and f"schema version {SCHEMA_VERSION + 1}" in str(err)


def test_a_schema_9_database_keeps_its_abort_statements_through_the_rebuild(postgres_url):
    """Store schema 9 -> 10 on PostgreSQL: abort_statements is rebuilt under another name and
    renamed (a primary key changes, and PostgreSQL keeps the old key's index name); a kept
    statement stays, with its certified_at and an empty round instance, and a second
    coordinator name is then kept beside it."""
    store = open_store(postgres_url)
    device = enroll(store, 1)
    store.create_study("s", "{}", "0" * 64, None, 1)
    store.set_state("s", "failed", "test", expect=("open",))
    store.close()
    raw(postgres_url, "DROP TABLE abort_statements")
    raw(postgres_url, postgres_sql(ABORT_STATEMENTS_V9))
    raw(postgres_url, f"INSERT INTO abort_statements VALUES ('s', '{device}', 'a.example', "
                      "'\\x76', 5.0, 6.0)")
    raw(postgres_url, "UPDATE fedsketch_store SET schema_version = 9")
    store = open_store(postgres_url)
    try:
        assert raw(postgres_url, "SELECT schema_version FROM fedsketch_store") == [(SCHEMA_VERSION,)]
        (old,) = store.abort_statements("s")
        assert (old.audience, old.signature, old.round_sha256) == ("a.example", b"v", b"")
        assert store.add_abort_statement("s", device, "b.example", b"w" * 64, b"r" * 32)
        assert not store.add_abort_statement("s", device, "a.example", b"z" * 64, b"r" * 32)
        assert len(store.abort_statements("s")) == 2
        assert raw(postgres_url, "SELECT certified_at FROM abort_statements WHERE audience = "
                                 "'a.example'") == [(6.0,)]
    finally:
        store.close()


def test_the_sql_is_translated_in_one_place():
    assert postgres_sql("SELECT a FROM t WHERE instr(d, ?) > 0 AND b = ?") == (
        "SELECT a FROM t WHERE strpos(d, %s) > 0 AND b = %s")
    assert postgres_sql("CREATE TABLE t (seq INTEGER PRIMARY KEY AUTOINCREMENT, x REAL, y BLOB, z TEXT)") == (
        'CREATE TABLE t (seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, x DOUBLE PRECISION, '
        'y BYTEA, z TEXT COLLATE "C")')
    assert postgres_sql("UPDATE t SET x = 'REAL TEXT'") == "UPDATE t SET x = 'REAL TEXT'"  # DDL only
    with pytest.raises(ValueError, match="literal %"):
        postgres_sql("SELECT '100%'")


def race(stores: list, calls: int, fn) -> list:
    """``fn(store, i)`` for i < calls, spread over the stores, all released at once; the results
    (or exceptions) in order of i."""
    barrier = threading.Barrier(calls)
    out: list = [None] * calls

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = fn(stores[i % len(stores)], i)
        except Exception as exc:  # compared below
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_stores_sharing_a_database_make_each_check_and_write_once(postgres_url):
    """Two stores (two pools, as two coordinator processes) on one database: a roster of 5 raced
    by 12 devices takes exactly 5, a study moved by 12 racing compare-and-sets moves once, and
    racing results are stored once."""
    stores = [open_store(postgres_url), open_store(postgres_url)]
    try:
        devices = [enroll(stores[0], i) for i in range(12)]
        stores[0].create_study("s", "{}", "0" * 64, None, 2, roster=5)
        added = race(stores, 12, lambda s, i: s.register("s", devices[i]))
        assert sum(isinstance(r, tuple) and r[0] for r in added) == 5
        assert all(isinstance(r, tuple) or r.code == "failed_precondition" for r in added)
        assert stores[1].get_study("s").registered == 5 == len(stores[0].roster_entries("s", 100))

        moved = race(stores, 12, lambda s, i: s.set_state("s", "decoding", f"by {i}",
                                                          expect=("open", "collecting")))
        assert sum(not isinstance(r, Exception) for r in moved) == 1
        assert [e[2] for e in stores[0].audit_log(100)].count("set_state") == 1
        published = race(stores, 6, lambda s, i: s.put_result("s", f'{{"by": {i}}}'))
        assert sum(r is None for r in published) == 1
        assert {r.code for r in published if r is not None} == {"conflict"}
        assert stores[1].get_study("s").state == "done"
    finally:
        for s in stores:
            s.close()


PASSWORD = "s3cret-pw"


@pytest.fixture
def password_url(postgres_server, postgres_url):
    """``postgres_url`` as a role that must give its password (scram-sha-256), without it."""
    role = "fedsketch_pw"
    hba = postgres_server.data / "pg_hba.conf"
    rules = hba.read_text()
    if role not in rules:
        hba.write_text(f"local all {role} scram-sha-256\n{rules}")
        postgres_server.execute(f"DROP ROLE IF EXISTS {role}")
        postgres_server.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'")
        postgres_server.execute("SELECT pg_reload_conf()")
    database = postgres_url.split("/")[3].split("?")[0]
    postgres_server.execute(f"ALTER DATABASE {database} OWNER TO {role}")
    return postgres_url.replace("postgres@", f"{role}@")


def test_the_password_comes_from_the_environment_or_a_password_file_and_is_never_shown(
        password_url, monkeypatch, tmp_path):
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))
    err = refusal(open_store, password_url)
    assert err.code == "failed_precondition" and "password" in str(err)
    wrong = password_url.replace("fedsketch_pw@", "fedsketch_pw:wrong-Pw-42@")
    err = refusal(open_store, wrong)
    assert "password authentication failed" in str(err) and "wrong-Pw-42" not in str(err)
    assert "fedsketch_pw:***@" in str(err)

    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    open_store(password_url).close()
    monkeypatch.delenv("PGPASSWORD")
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:fedsketch_pw:{PASSWORD}\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    store = open_store(password_url)
    try:
        enroll(store, 1)
    finally:
        store.close()


def test_redact_hides_every_spelling_of_a_password():
    assert redact("postgresql://me:pa:ss@db:5432/x?sslmode=require") == "postgresql://me:***@db:5432/x?sslmode=require"
    assert redact("postgresql://db/x?user=me&password=pa%20ss&sslmode=require") == (
        "postgresql://db/x?user=me&password=***&sslmode=require")
    assert redact("host=db password=secret dbname=x") == "host=db password=*** dbname=x"
    assert redact("postgresql://me@db/x") == "postgresql://me@db/x"


def test_without_psycopg_a_postgresql_url_is_refused_saying_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now raises ImportError
    monkeypatch.delitem(sys.modules, "fedsketch.server.store.postgres")
    with pytest.raises(ValueError, match=r"psycopg .*pip install 'fedsketch\[postgres\]'"):
        open_store("postgresql://me:secret@db.example/fedsketch")
