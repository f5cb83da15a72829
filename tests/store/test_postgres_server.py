"""The tests' own PostgreSQL server (``tests/pgtest.py``): each test's database is empty and its
own, and no postgres outlives the process that started it, even one killed with SIGKILL."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

TESTS = Path(__file__).resolve().parents[1]

START = """
from pgtest import TestServer
server = TestServer()
print(server.proc.pid, server.folder, flush=True)
import time
time.sleep(120)
"""


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_each_test_gets_an_empty_database_of_its_own(postgres_server, postgres_url):
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)
        conn.execute("CREATE TABLE mine (x integer)")
        mine = conn.execute("SELECT current_database()").fetchone()[0]
    other = postgres_server.fresh_database()
    try:
        assert other != mine
        with psycopg.connect(postgres_server.url(other)) as conn:
            assert conn.execute("SELECT to_regclass('mine')").fetchone() == (None,)
    finally:
        postgres_server.drop_database(other)


def test_the_server_stops_when_the_process_that_started_it_is_killed():
    starter = subprocess.Popen([sys.executable, "-W", "ignore", "-c", START], cwd=TESTS,
                               stdout=subprocess.PIPE, text=True)
    pid, folder = None, None
    try:
        pid, folder = starter.stdout.readline().split()
        pid = int(pid)
        assert running(pid)
        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=30)
        stop = time.monotonic() + 20
        while running(pid) and time.monotonic() < stop:
            time.sleep(0.05)
        assert not running(pid), "postgres outlived the process that started it"
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
        if pid is not None and running(pid):
            os.kill(pid, signal.SIGQUIT)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)  # SIGKILL left it: nothing ran to remove it


def test_the_next_run_removes_the_folders_killed_runs_left(tmp_path, monkeypatch):
    from pgtest import STALE_SECONDS, remove_stale

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for name, pid in (("fedsketch-pg-stopped", None), ("fedsketch-pg-crashed", 2**22 + 7),
                      ("fedsketch-pg-running", os.getpid())):
        (tmp_path / name / "data").mkdir(parents=True)
        if pid is not None:
            (tmp_path / name / "data" / "postmaster.pid").write_text(f"{pid}\n/data\n")
    (tmp_path / "other").mkdir()
    remove_stale(now=time.time())  # too young to judge
    assert len(list(tmp_path.iterdir())) == 4
    remove_stale(now=time.time() + 2 * STALE_SECONDS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fedsketch-pg-running", "other"]
