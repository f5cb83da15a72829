"""Rounds through real ``fedsketch coordinator serve --db postgresql://... --shared`` processes
(on the tests' own PostgreSQL server) with real ``fedsketch device run`` processes over TLS on
loopback: two coordinators serve one database, devices alternate between them (one through
``--coordinator IP:PORT,IP:PORT``, round robin), one is SIGKILLed mid-round and restarted while
the other serves, and each study is decoded and published once; a
coordinator without ``--shared`` is refused the database meanwhile, and a connection error never
prints the URL's password."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from test_round_processes import CoordinatorProcess, cli, create_study, device, wait_done
from test_round_processes import device_files as device_files  # a module-scoped fixture

from fedsketch.server.store import open_store

pytestmark = pytest.mark.slow


def test_serve_names_the_database_it_cannot_open_without_its_password(postgres_server, tmp_path):
    url = postgres_server.url("no_such_db").replace("postgres@", "postgres:Pw-x9@")
    res = cli("coordinator", "serve", "--db", url, "--listen", "127.0.0.1:0", "--insecure",
              "--token-file", str(tmp_path / "t"), check=False)
    assert res.returncode == 1 and 'database "no_such_db" does not exist' in res.stderr, res.stderr
    assert "Pw-x9" not in res.stderr and "postgres:***@" in res.stderr
    assert not (tmp_path / "t").exists()  # refused before anything was written


def test_two_shared_coordinators_on_one_database_decode_each_study_once(tmp_path, postgres_url,
                                                                       device_files, cli_certs):
    certs = cli_certs
    pair = [CoordinatorProcess(tmp_path / name, certs, "--shared") for name in ("a", "b")]
    for c in pair:
        c.folder.mkdir()
        c.db, c.token_file = postgres_url, pair[0].token_file  # one database, one operator token
        c.start()
    a, b = pair
    try:
        alone = cli("coordinator", "serve", "--db", postgres_url, "--listen", "127.0.0.1:0", "--insecure",
                    "--token-file", str(a.token_file), check=False)
        assert alone.returncode == 1 and "in use by another coordinator" in alone.stderr, alone.stderr
        studies = [create_study(a, 3), create_study(b, 3)]
        tokens = b.op("tokens", "--count", "3").stdout.split()
        for i in range(3):  # devices 0 and 2 join through a, 1 through b; 2 fills both rosters
            device(pair[i % 2], device_files[i], tmp_path / f"l{i}", tokens[i])
        b.kill()
        b.start()  # while a serves: same database, same port
        store = open_store(postgres_url)
        assert [store.get_study(s).registered for s in studies] == [3, 3]
        store.close()
        listed = SimpleNamespace(target=f"127.0.0.1:{a.port},127.0.0.1:{b.port}", certs=certs)
        device(listed, device_files[0], tmp_path / "l0")  # 0 through both, round robin
        device(a, device_files[1], tmp_path / "l1")  # 1 through the other one
        for study in studies:
            for c in pair:
                res = wait_done(c, study)
                assert res["devices"] == 3 and res["records"] == 30_000
    finally:
        for c in pair:
            if c.proc.poll() is None:
                c.terminate()
    logs = a.log.read_text() + b.log.read_text()
    for study in studies:
        assert len(re.findall(rf"study {study} decoded from 3 devices", logs)) == 1, logs
    store = open_store(postgres_url)
    try:
        audit = [e[3] for e in store.audit_log(1000) if e[2] in ("set_state", "put_result")]
        for study in studies:
            done = [d for d in audit if study in d and "-> done" in d]
            assert done == [f"study {study!r}: decoding -> done"]
            assert len([d for d in audit if study in d and "-> decoding" in d]) == 1, audit
    finally:
        store.close()
