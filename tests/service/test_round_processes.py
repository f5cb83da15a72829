"""The round as real processes: ``fedsketch coordinator serve`` and ``fedsketch device run`` over
TLS on loopback, killed with SIGKILL at the worst moments and restarted, stopped with SIGTERM,
and driven through the operator CLI."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from typer.testing import CliRunner

from fedsketch.cli import app
from fedsketch.client.ledger import Ledger
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.features import ENTRY_L1, GRID
from fedsketch.common.net.tls import secure_channel
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.server.store import open_store

FEDSKETCH = str(Path(sys.executable).with_name("fedsketch"))
pytestmark = pytest.mark.slow


def cli(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([FEDSKETCH, *args], capture_output=True, text=True, timeout=120,
                         env=None if env is None else {**os.environ, **env})
    if check:
        assert res.returncode == 0, res.stderr
    return res


def cli_here(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``fedsketch ARGS`` run in this process (typer's CliRunner: the same command code, its
    stdout, stderr and exit status), for a command whose own process is not what a test checks:
    a ``fedsketch`` process costs 0.5 to 0.9 CPU s to start (Python, numpy, grpc), this a few ms.
    An exception the command does not turn into an exit status is raised here."""
    res = CliRunner().invoke(app, list(args))
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    done = subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, res.stderr)
    if check:
        assert done.returncode == 0, done.stderr
    return done


class CoordinatorProcess:
    """``fedsketch coordinator serve`` on a free loopback port, with TLS; with ``db_readers``
    (the default here: the tests read its SQLite file while it serves) ``--db-readers``."""

    def __init__(self, folder: Path, certs: Path, *extra: str, db_readers: bool = True) -> None:
        self.folder, self.certs = folder, certs
        self.extra = (*extra, "--db-readers") if db_readers else extra
        self.log = folder / "serve.log"  # a file, not a pipe nobody reads: the log never blocks it
        self.db = folder / "coordinator.db"
        self.token_file = folder / "operator.token"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> None:
        port_file = self.folder / "port"
        port_file.unlink(missing_ok=True)
        listen = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [FEDSKETCH, "coordinator", "serve", "--db", str(self.db), "--listen", listen,
             "--cert", str(self.certs / "server.pem"), "--key", str(self.certs / "server.key"),
             "--token-file", str(self.token_file), "--port-file", str(port_file), *self.extra],
            stdout=subprocess.DEVNULL, stderr=self.log.open("a"), text=True)
        stop = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < stop, "coordinator did not start"
            time.sleep(0.05)
        self.port = int(port_file.read_text())

    @property
    def target(self) -> str:
        return f"localhost:{self.port}"

    def op(self, *args: str, check: bool = True, here: bool = False) -> subprocess.CompletedProcess:
        """``fedsketch coordinator ARGS`` against this coordinator, as its own process, or with
        ``here`` in this one (:func:`cli_here`)."""
        run = cli_here if here else cli
        return run("coordinator", args[0], "--coordinator", self.target, "--ca",
                   str(self.certs / "ca.pem"), "--token-file", str(self.token_file), *args[1:],
                   check=check)

    def create(self, spec) -> str:
        """Create the study ``spec`` (a StudySpec) over the operator's gRPC service, as
        ``create-study`` does without starting a process; its id."""
        with self._operator() as operator:
            return operator.CreateStudy(pb.CreateStudyRequest(spec_json=spec.to_json()), timeout=60,
                                        metadata=self._meta()).study_id

    def state(self, study: str) -> str:
        """The study's state by name ("OPEN" … "DONE", "FAILED", as ``status --json`` says it),
        from the operator's ShowStudy in this process: a test that polls it spawns no process."""
        with self._operator() as operator:
            return pb.StudyState.Name(operator.ShowStudy(
                pb.StudyRef(study_id=study), timeout=30, metadata=self._meta()).state)

    @contextlib.contextmanager
    def _operator(self) -> Iterator[pb_grpc.OperatorStub]:
        """The operator's stub over a TLS channel of its own, closed afterwards."""
        channel = secure_channel(self.target, self.certs / "ca.pem")
        try:
            yield pb_grpc.OperatorStub(channel)
        finally:
            channel.close()

    def _meta(self) -> tuple:
        return (("authorization", f"Bearer {self.token_file.read_text().strip()}"),)

    def has_result(self, study: str) -> bool:
        """Whether the operator's GetResult answers for ``study`` now (any refusal or a
        coordinator that is down: not yet), over a channel of its own."""
        try:
            with self._operator() as operator:
                operator.GetResult(pb.StudyRef(study_id=study), timeout=30, metadata=self._meta())
        except grpc.RpcError:
            return False
        return True

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


@pytest.fixture
def coordinator(tmp_path, cli_certs):
    c = CoordinatorProcess(tmp_path, cli_certs)
    c.start()
    yield c
    if c.proc.poll() is None:
        c.kill()


@pytest.fixture(scope="module")
def cli_coordinator(tmp_path_factory, cli_certs):
    """One coordinator for the file's tests that only drive the operator CLI against it (none
    kills or restarts it, and each reads only the studies it made): a start costs 0.7 CPU s."""
    c = CoordinatorProcess(tmp_path_factory.mktemp("cli-coordinator"), cli_certs)
    c.start()
    yield c
    if c.proc.poll() is None:
        c.kill()


@pytest.fixture(scope="module")
def device_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("devices")
    x, _, _ = gmm(30_000, 3, 3, 3.0, seed=4)
    paths = []
    for i, part in enumerate(np.array_split(x, 3)):
        paths.append(folder / f"x{i}.npy")
        np.save(paths[-1], part)
    return paths


def create_study(c: CoordinatorProcess, min_devices: int, here: bool = False) -> str:
    """A plain study (d = k = 3, m = 60) of quorum ``min_devices``, by ``create-study`` as its own
    process or, with ``here``, in this one; its id."""
    return c.op("create-study", "--name", "t", "--d", "3", "--k", "3", "--bounds", "-12:12", "--rounds", "0",
                "--scale", "1.5", "--epsilon", "5", "--m", "60", "--r", "60",
                "--min-devices", str(min_devices), "--replicates", "2", here=here).stdout.strip()


def device(c: CoordinatorProcess, data: Path, ledger: Path, token: str | None = None,
           env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    args = ["device", "run", "--coordinator", c.target, "--ca", str(c.certs / "ca.pem"),
            "--data", str(data), "--ledger", str(ledger), "--budget", "10", "--once"]
    return cli(*args, *(["--token", token] if token else []), env=env, check=check)


def wait_result(c: CoordinatorProcess, study: str, timeout: float = 120,
                here: bool = False) -> subprocess.CompletedProcess:
    """``coordinator result`` of the study, run once it has one (with ``here``: in this process).
    The wait asks the operator's GetResult in this process every 0.2 s and runs the CLI only once
    that answers: a ``result`` process per poll cost about 0.6 CPU s, taken from the decoding it
    waited for."""
    stop = time.monotonic() + timeout
    while time.monotonic() < stop:
        if c.has_result(study):
            res = c.op("result", study, check=False, here=here)
            if res.returncode == 0:
                return res
        time.sleep(0.2)
    raise TimeoutError(study)


def wait_done(c: CoordinatorProcess, study: str, timeout: float = 120, here: bool = False) -> dict:
    """The study's result as ``coordinator result`` prints it (JSON), once it has one."""
    return json.loads(wait_result(c, study, timeout, here).stdout)


def test_coordinator_killed_after_acks_keeps_them_and_completes(coordinator, tmp_path,
                                                               device_files):
    """Devices 0 and 1 join the roster of 3 (spending nothing), device 2 fills it and contributes
    at once, device 0 contributes on its next pass; the coordinator is SIGKILLed and restarted:
    the roster and both acknowledged contributions are there, and device 1 completes the study."""
    study = create_study(coordinator, 3, here=True)
    tokens = coordinator.op("tokens", "--count", "3", here=True).stdout.split()
    for i in range(3):
        device(coordinator, device_files[i], tmp_path / f"l{i}", tokens[i])
    device(coordinator, device_files[0], tmp_path / "l0")
    acked = {}
    for i in range(3):
        book = Ledger(tmp_path / f"l{i}")
        spend = book.find(study)
        assert (spend is None) == (i == 1)
        if spend is not None:
            assert spend.acked_at is not None
            acked[book.identity().device_id] = spend.payload
        book.close()
    coordinator.kill()
    coordinator.start()  # same database, same port
    store = open_store(coordinator.db)
    stored = {r.device_id: r.payload for r in store.contributions(study)}
    assert store.get_study(study).registered == 3
    store.close()
    assert stored == acked
    assert "3/3/3" in coordinator.op("list", here=True).stdout  # registered/quorum/roster
    device(coordinator, device_files[1], tmp_path / "l1")
    res = wait_done(coordinator, study, here=True)
    assert res["devices"] == 3 and res["records"] == 30_000
    assert coordinator.terminate() == 0


def test_device_killed_between_commit_and_send_resends_identical_bytes(coordinator, tmp_path,
                                                                       device_files):
    study = create_study(coordinator, 1, here=True)
    token = coordinator.op("tokens", here=True).stdout.strip()
    ledger = tmp_path / "ledger"
    res = device(coordinator, device_files[0], ledger, token,
                 env={"FEDSKETCH_FAULT": "kill-after-commit"}, check=False)
    assert res.returncode == -signal.SIGKILL
    book = Ledger(ledger)
    (spend,) = book.spends()
    assert spend.study_id == study and spend.acked_at is None
    book.close()
    store = open_store(coordinator.db)
    assert store.contributions(study) == []
    store.close()
    device(coordinator, device_files[0], ledger)  # restart: enrolled already, no token
    book = Ledger(ledger)
    (after,) = book.spends()
    assert after.payload == spend.payload and after.acked_at is not None
    assert after.receipt == spend.payload_sha256
    book.close()
    wait_done(coordinator, study, here=True)
    store = open_store(coordinator.db)
    (row,) = store.contributions(study)
    assert row.payload == spend.payload
    store.close()
    budget = json.loads(cli_here("device", "budget", "--ledger", str(ledger), "--json").stdout)
    assert len(budget["spends"]) == 1
    assert budget["sources"]["default"]["remaining_epsilon"] == pytest.approx(5.0)


def test_daemon_stops_cleanly_on_sigterm(coordinator, tmp_path, device_files):
    token = coordinator.op("tokens", here=True).stdout.strip()
    proc = subprocess.Popen(
        [FEDSKETCH, "device", "run", "--coordinator", coordinator.target, "--ca",
         str(coordinator.certs / "ca.pem"), "--data", str(device_files[1]), "--ledger",
         str(tmp_path / "ledger"), "--budget", "10", "--token", token, "--poll", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    assert proc.poll() is None  # still polling
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert "stopped" in proc.stderr.read()


def test_operator_cli_refusals(cli_coordinator, tmp_path):
    bad = tmp_path / "bad.token"
    bad.write_text("not-the-token\n")
    res = cli_here("coordinator", "tokens", "--coordinator", cli_coordinator.target, "--ca",
                   str(cli_coordinator.certs / "ca.pem"), "--token-file", str(bad), check=False)
    assert res.returncode == 1 and "PERMISSION_DENIED" in res.stderr
    res = cli("coordinator", "serve", "--db", str(tmp_path / "x.db"), check=False)
    assert res.returncode == 1 and "--insecure" in res.stderr
    assert not (tmp_path / "x.db").exists()


def test_create_study_states_the_secure_aggregation_assumptions(cli_coordinator):
    """The operator states the dropouts and colluders of a secure study; the CLI refuses a study
    without them, with no safe threshold, or with an unsafe one, and prints what it derived."""
    base = ("create-study", "--name", "s", "--d", "3", "--k", "3", "--bounds", "-12:12", "--rounds", "0",
            "--scale", "1.5", "--epsilon", "5", "--m", "60", "--min-devices", "10",
            "--secure-aggregation", "--max-records", "100000")
    listed = cli_coordinator.op("list", here=True).stdout
    for extra, message in (
            ((), "the assumptions --max-dropout and --max-colluders"),
            (("--max-dropout", "0.5", "--max-colluders", "0"), "no threshold fits"),
            (("--max-dropout", "0.2", "--max-colluders", "0.1", "--threshold", "5"),
             "threshold 5 is too low"),
            (("--max-dropout", "0.5", "--max-colluders", "0.5"), "less than one noise draw"),
            (("--max-dropout", "1", "--max-colluders", "0"), "[0, 1)")):
        refused = cli_coordinator.op(*base, *extra, check=False, here=True)
        assert refused.returncode == 1 and message in refused.stderr, (extra, refused.stderr)
        assert refused.stderr.startswith("error: ") and refused.stderr.count("\n") == 1
    plain = cli_coordinator.op(*base[:-3], "--max-dropout", "0.2", check=False, here=True)
    assert plain.returncode == 1
    assert "--max-dropout apply to --secure-aggregation only" in plain.stderr
    assert cli_coordinator.op("list", here=True).stdout == listed  # nothing was created
    made = cli_coordinator.op(*base, "--max-dropout", "0.2", "--max-colluders", "0.1", here=True)
    assert "L = 10, D = 2, C = 1, h_min = 7, t = 6" in made.stderr
    study = made.stdout.strip()
    assert study.startswith("st-") and study in cli_coordinator.op("list", here=True).stdout
    assert "h_min" in cli_here("coordinator", "create-study", "--help").stdout


def test_create_study_sets_the_roster_and_a_collection_window(cli_coordinator):
    """A plain study from the CLI collects for an hour once its quorum registered and ends a week
    after its creation unless told otherwise, takes --roster devices, and says so in `list`, and
    caps each device at 1,000,000 records unless --max-device-records says otherwise; a roster
    below the quorum, a cap below one record, or a window beside secure aggregation, is refused
    in one line."""
    base = ("create-study", "--name", "w", "--d", "3", "--k", "3", "--bounds", "-12:12",
            "--rounds", "0", "--scale", "1.5", "--epsilon", "5", "--m", "60", "--min-devices", "3")
    created = time.time()
    study = cli_coordinator.op(*base, "--roster", "5", here=True).stdout.strip()
    timed = cli_coordinator.op(*base, "--deadline", "60", "--collect-seconds", "30", here=True).stdout.strip()
    capped = cli_coordinator.op(*base, "--max-device-records", "2500", here=True).stdout.strip()
    db = sqlite3.connect(f"file:{cli_coordinator.db}?mode=ro", uri=True)
    spec, given, capped = (json.loads(db.execute("SELECT spec_json FROM studies WHERE study_id = ?",
                                                 (sid,)).fetchone()[0]) for sid in (study, timed, capped))
    db.close()
    assert (spec["roster"], spec["min_devices"], spec["collect_seconds"]) == (5, 3, 3600.0)
    assert spec["deadline"] == pytest.approx(created + 7 * 86400, abs=30)
    assert (given["deadline"] - created, given["collect_seconds"]) == (pytest.approx(60, abs=30), 30)
    assert (spec["max_device_records"], capped["max_device_records"]) == (1_000_000, 2500)
    listed = cli_coordinator.op("list", here=True).stdout.splitlines()
    assert any(study in line and "0/3/5" in line for line in listed)
    for extra, message in ((("--roster", "2"), "the roster takes min_devices = 3"),
                           (("--collect-seconds", "0"), "collect_seconds must be finite and > 0"),
                           (("--max-device-records", "0"), "max_device_records must be an integer"),
                           (("--secure-aggregation", "--max-records", "1000", "--max-dropout",
                             "0.2", "--max-colluders", "0", "--collect-seconds", "60"),
                            "no roster or collection window")):
        refused = cli_coordinator.op(*base, *extra, check=False, here=True)
        assert refused.returncode == 1 and message in refused.stderr, (extra, refused.stderr)
        assert refused.stderr.count("\n") == 1


def test_a_second_coordinator_on_a_busy_database_or_address_exits(coordinator, tmp_path):
    """One coordinator per SQLite file and per address: a second `serve` on the running one's
    database, or on its port, exits 1 with the reason at once and changes nothing (it never
    starts, so it cannot fail the first one's studies); the first one keeps serving."""
    study = create_study(coordinator, 2, here=True)
    token = tmp_path / "second.token"
    for db, listen, message in (
            (coordinator.db, "127.0.0.1:0", "in use by another coordinator"),
            (tmp_path / "other.db", f"127.0.0.1:{coordinator.port}", "cannot listen on")):
        res = subprocess.run([FEDSKETCH, "coordinator", "serve", "--db", str(db), "--listen",
                              listen, "--insecure", "--token-file", str(token)],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 1 and message in res.stderr, res.stderr
        assert res.stderr.splitlines()[-1].startswith("error: ")
        if db == coordinator.db:
            assert not token.exists()  # refused before it wrote anything
    assert coordinator.proc.poll() is None
    assert study in coordinator.op("list", here=True).stdout


def test_a_daemon_reads_named_columns_of_a_pandas_csv_from_its_environment(coordinator, tmp_path):
    """``FEDSKETCH_COLUMNS`` (the unit's EnvironmentFile) picks three numeric columns of a CSV that
    pandas wrote with its index and a text column, and the daemon contributes every record; a
    column the file lacks stops it before it enrolls."""
    x, _, _ = gmm(6000, 3, 3, 3.0, seed=5)
    path = tmp_path / "x.csv"
    with path.open("w") as fh:
        fh.write(",a,label,b,c\n")
        fh.writelines(f"{i},{r[0]!r},row {i},{r[1]!r},{r[2]!r}\n" for i, r in enumerate(x.tolist()))
    study = create_study(coordinator, 1, here=True)
    token = coordinator.op("tokens", "--count", "1", here=True).stdout.split()[0]
    bad = device(coordinator, path, tmp_path / "ledger", token, env={"FEDSKETCH_COLUMNS": "a,zz"},
                 check=False)
    assert bad.returncode == 1 and f"error: {path} has no column 'zz'" in bad.stderr
    assert not (tmp_path / "ledger").exists()
    run = device(coordinator, path, tmp_path / "ledger", token, env={"FEDSKETCH_COLUMNS": "a,b,c"})
    assert "submitted study" in run.stderr
    res = wait_done(coordinator, study, here=True)
    assert res["records"] == 6000 and np.asarray(res["centroids"]).shape == (3, 3)


def test_create_study_caps_a_device_at_four_times_its_expected_share(cli_coordinator):
    """Without --max-device-records the cap is 4 × the records expected per device
    (--expected-records, else a secure study's --max-records / --min-devices), stored in the
    spec; create-study says the largest count one device can declare, and what bounds its input:
    under secure aggregation the aggregate check alone, in a plain study the entry check, which
    lets its sketch's L1 mass reach 2m·γ/(r·κ) times its records' (m = 60 frequencies, the
    complex map at r = 1: 2·60·1024/1450, 85×)."""
    base = ("create-study", "--name", "c", "--d", "3", "--k", "3", "--bounds", "-12:12",
            "--rounds", "0", "--scale", "1.5", "--epsilon", "5", "--m", "60", "--min-devices",
            "10", "--json")
    secure = cli_coordinator.op(*base, "--secure-aggregation", "--max-records", "100000",
                                "--max-dropout", "0.2", "--max-colluders", "0.1", here=True)
    assert json.loads(secure.stdout)["spec"]["max_device_records"] == 40_000
    assert "one device may declare at most 40,000 records" in secure.stderr
    assert "its input only through the aggregate check" in secure.stderr
    plain = cli_coordinator.op(*base, "--expected-records", "2000", here=True)
    spec = json.loads(plain.stdout)["spec"]
    assert spec["max_device_records"] == 8_000
    assert "8,000 records (max_device_records): at that count, 30.8% of the average" in plain.stderr
    sketch = spec["sketch"]
    mass = 2 * 60 * GRID[sketch["feature"]] / (sketch["r"] * ENTRY_L1[sketch["feature"]])
    assert f"checked entry by entry against its count, which lets its L1 mass reach {mass:,.0f}x" \
        in plain.stderr, plain.stderr
    assert "carries at most" not in plain.stderr + secure.stderr
    given = cli_coordinator.op(*base, "--max-device-records", "500", here=True)
    assert json.loads(given.stdout)["spec"]["max_device_records"] == 500
