"""A round through a real ``fedsketch coordinator serve --db postgresql://...`` process (on the
tests' own PostgreSQL server) with real ``fedsketch device run`` processes over TLS on loopback,
killed with SIGKILL mid-round and restarted on the same database; a second coordinator on that
database is refused, and a connection error never prints the URL's password."""

from __future__ import annotations

import pytest
from test_round_processes import CoordinatorProcess, cli, create_study, device, wait_done
from test_round_processes import device_files as device_files  # a module-scoped fixture

from fedsketch.server.store import open_store

pytestmark = pytest.mark.slow


@pytest.fixture
def coordinator(tmp_path, postgres_url):
    certs = tmp_path / "certs"
    cli("certs", "init", "--out", str(certs), "--host", "localhost", "--host", "127.0.0.1")
    c = CoordinatorProcess(tmp_path, certs)
    c.db = postgres_url
    c.start()
    yield c
    if c.proc.poll() is None:
        c.kill()


def test_a_round_on_postgresql_survives_a_sigkill_and_keeps_the_database_to_itself(
        coordinator, tmp_path, device_files):
    study = create_study(coordinator, 3)
    tokens = coordinator.op("tokens", "--count", "3").stdout.split()
    for i in range(2):  # devices 0 and 1 join the roster of 3; nobody spends yet
        device(coordinator, device_files[i], tmp_path / f"l{i}", tokens[i])
    second = CoordinatorProcess(tmp_path / "second", coordinator.certs)
    second.folder.mkdir()
    second.db = coordinator.db
    res = cli("coordinator", "serve", "--db", coordinator.db, "--listen", "127.0.0.1:0", "--insecure",
              "--token-file", str(second.token_file), check=False)
    assert res.returncode == 1 and "in use by another coordinator" in res.stderr, res.stderr

    coordinator.kill()
    coordinator.start()  # same database: the roster is there, and the database free again
    store = open_store(coordinator.db)
    assert store.get_study(study).registered == 2
    store.close()
    device(coordinator, device_files[2], tmp_path / "l2", tokens[2])  # fills the roster, sends
    for i in range(2):
        device(coordinator, device_files[i], tmp_path / f"l{i}")
    res = wait_done(coordinator, study)
    assert res["devices"] == 3 and res["records"] == 30_000
    store = open_store(coordinator.db)
    try:
        assert len(store.contributions(study)) == 3 and store.get_study(study).state == "done"
        assert [e[2] for e in store.audit_log(1000)].count("put_result") == 1
    finally:
        store.close()
    assert coordinator.terminate() == 0


def test_serve_names_the_database_it_cannot_open_without_its_password(postgres_server, tmp_path):
    url = postgres_server.url("no_such_db").replace("postgres@", "postgres:Pw-x9@")
    res = cli("coordinator", "serve", "--db", url, "--listen", "127.0.0.1:0", "--insecure",
              "--token-file", str(tmp_path / "t"), check=False)
    assert res.returncode == 1 and 'database "no_such_db" does not exist' in res.stderr, res.stderr
    assert "Pw-x9" not in res.stderr and "postgres:***@" in res.stderr
    assert not (tmp_path / "t").exists()  # refused before anything was written
