"""Storage faults for real: a full file system (a small tmpfs, mounted as root) under the
coordinator's SQLite store and under a device's ledger, and a ``-shm`` file truncated and made
unwritable under a serving coordinator. Real ``coordinator serve`` and ``device run`` processes.

What must hold: the coordinator answers RESOURCE_EXHAUSTED naming the cause (not INTERNAL), logs
the cause and the file, stays up and keeps serving reads; a Submit acknowledged before the fault
is stored after it, and one refused during it succeeds, with the same bytes, once space returns.
A device whose ledger cannot be written says so in one ``error:`` line, records and sends nothing,
and takes part once space returns. A ``-shm`` file cannot kill the coordinator (SIGBUS): without
``--db-readers`` it never maps one."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_round_processes import FEDSKETCH, CoordinatorProcess, cli_here, device
from test_round_processes import device_files as device_files  # a module-scoped fixture

from fedsketch.client.ledger import Ledger
from fedsketch.server.store import open_store

pytestmark = pytest.mark.slow


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(name, size[, ",ro"])``: a fresh tmpfs of ``size`` (e.g. "8m") mounted at tmp_path/name,
    unmounted after the test; the test is skipped when mounting is not permitted (not root)."""
    mounted: list[Path] = []

    def mount(name: str, size: str, options: str = "") -> Path:
        folder = tmp_path / name
        folder.mkdir()
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700{options}",
                              "tmpfs", str(folder)], capture_output=True, text=True)
        if res.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (root only): {res.stderr.strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to the last byte with one file; its path."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for size in (1 << 16, 512, 1):  # then whatever is left, byte by byte
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


def create_study(c: CoordinatorProcess, min_devices: int) -> str:
    """``coordinator create-study`` of a small plain study (in this process: :func:`cli_here`);
    its id."""
    return c.op("create-study", "--name", "t", "--d", "3", "--k", "3", "--bounds", "-12:12",
                   "--rounds", "0", "--scale", "1.5", "--epsilon", "5", "--m", "60", "--r", "60",
                   "--min-devices", str(min_devices), "--replicates", "2", here=True).stdout.strip()


def wait_done(c: CoordinatorProcess, study: str, timeout: float = 120) -> dict:
    """``coordinator result`` of the study (JSON; in this process), once the operator's
    GetResult answers for it (asked every 0.2 s)."""
    stop = time.monotonic() + timeout
    while not c.has_result(study):
        assert time.monotonic() < stop, f"study {study} has no result after {timeout} s"
        time.sleep(0.2)
    return json.loads(c.op("result", study, here=True).stdout)


def one_error_line(stderr: str, *words: str) -> None:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and all(w in errors[0] for w in words), stderr


def stored(c: CoordinatorProcess, study: str) -> dict[str, bytes]:
    """The contributions the stopped coordinator's store holds, by device."""
    store = open_store(c.db)
    try:
        return {r.device_id: r.payload for r in store.contributions(study)}
    finally:
        store.close()


def device_id(ledger: Path) -> str:
    book = Ledger(ledger)
    try:
        return book.identity().device_id
    finally:
        book.close()


def test_a_full_store_answers_resource_exhausted_keeps_reads_and_loses_nothing(tmp_path, tmpfs, cli_certs,
                                                                              device_files):
    disk = tmpfs("store", "8m")
    c = CoordinatorProcess(tmp_path, cli_certs, db_readers=False)
    c.db = disk / "coordinator.db"
    c.start()
    try:
        study = create_study(c, 3)
        tokens = c.op("tokens", "--count", "3", here=True).stdout.split()
        ledgers = [tmp_path / f"l{i}" for i in range(3)]
        for i in range(3):  # 0 and 1 join the roster; 2 fills it and contributes at once
            device(c, device_files[i], ledgers[i], tokens[i])
        acked = Ledger(ledgers[2]).find(study)
        assert acked is not None and acked.acked_at is not None
        killed = device(c, device_files[0], ledgers[0], env={"FEDSKETCH_FAULT": "kill-after-commit"},
                        check=False)  # spent, and its Submit still to be sent
        assert killed.returncode == -signal.SIGKILL
        filler = fill(disk)
        refused = device(c, device_files[0], ledgers[0], check=False)  # re-sends the Submit
        assert refused.returncode == 1
        assert "RESOURCE_EXHAUSTED: the coordinator's store is full" in refused.stderr, refused.stderr
        assert "INTERNAL" not in refused.stderr and "Traceback" not in refused.stderr
        book = Ledger(ledgers[0])
        pending = book.find(study)  # spent before it was sent, not acknowledged
        book.close()
        assert pending is not None and pending.acked_at is None, refused.stderr + c.log.read_text()
        assert c.proc.poll() is None
        log = c.log.read_text()
        assert "store fault in Device/Submit" in log and str(c.db) in log and "full" in log, log
        assert "Traceback" not in log and "internal error" not in log
        assert any(study in line and "3/3/3" in line for line in c.op("list", here=True).stdout.splitlines())
        status = json.loads(c.op("status", study, "--json", here=True).stdout)
        assert status["contributions"] == 1, status
        tokens = c.op("tokens", check=False, here=True)  # an operator's write: the same words
        assert tokens.returncode == 1
        one_error_line(tokens.stderr, "RESOURCE_EXHAUSTED: the coordinator's store is full")
        filler.unlink()  # space returns: the same bytes are taken
        device(c, device_files[0], ledgers[0])
        device(c, device_files[1], ledgers[1])
        assert wait_done(c, study)["devices"] == 3
        assert c.terminate() == 0
    finally:
        if c.proc is not None and c.proc.poll() is None:
            c.kill()
    books = [Ledger(p) for p in ledgers]
    expected = {b.identity().device_id: b.find(study).payload for b in books}
    assert expected[device_id(ledgers[2])] == acked.payload
    assert expected[device_id(ledgers[0])] == pending.payload
    for b in books:
        b.close()
    assert stored(c, study) == expected


def test_a_truncated_unwritable_shm_file_cannot_kill_the_coordinator(tmp_path, cli_certs):
    """With ``--db-readers`` (WAL's index in the memory-mapped -shm) truncating the -shm file under
    the coordinator kills it with SIGBUS at its next access, which is the fault; by default it
    never maps one and goes on serving, reads and writes."""
    for readers in (True, False):
        folder = tmp_path / ("readers" if readers else "alone")
        folder.mkdir()
        c = CoordinatorProcess(folder, cli_certs, db_readers=readers)
        c.start()
        try:
            first = create_study(c, 2)
            shm = Path(f"{c.db}-shm")
            assert shm.exists() == readers
            with shm.open("w"):  # truncated to 0 bytes (created if missing), then unwritable
                pass
            os.chmod(shm, 0)
            second = c.op("create-study", "--name", "u", "--d", "3", "--k", "3", "--bounds",
                             "-12:12", "--rounds", "0", "--scale", "1.5", "--epsilon", "5", "--m",
                             "60", "--min-devices", "2", check=False, here=True)
            if readers:
                assert c.proc.wait(timeout=30) == -signal.SIGBUS
                continue
            assert second.returncode == 0, second.stdout + second.stderr
            listed = c.op("list", here=True).stdout
            assert first in listed and second.stdout.strip() in listed
            assert c.proc.poll() is None and c.terminate() == 0
        finally:
            if c.proc.poll() is None:
                c.kill()


def test_a_full_ledger_is_one_error_line_records_nothing_and_takes_part_later(tmp_path, tmpfs, cli_certs,
                                                                             device_files):
    disk = tmpfs("ledger", "4m")
    c = CoordinatorProcess(tmp_path, cli_certs, db_readers=False)
    c.start()
    try:
        study = create_study(c, 2)
        tokens = c.op("tokens", "--count", "2", here=True).stdout.split()
        ledger, other = disk / "ledger", tmp_path / "other"
        device(c, device_files[0], ledger, tokens[0])  # enrolled and in the roster
        device(c, device_files[1], other, tokens[1])  # fills the roster and contributes
        filler = fill(disk)
        run = device(c, device_files[0], ledger, check=False)
        assert run.returncode == 1
        one_error_line(run.stderr, str(ledger), "the disk under it is full")
        budget = cli_here("device", "budget", "--ledger", str(ledger), check=False)
        assert budget.returncode == 1
        one_error_line(budget.stderr, str(ledger), "the disk under it is full")
        filler.unlink()
        book = Ledger(ledger)
        assert book.find(study) is None  # nothing was recorded
        book.close()
        status = json.loads(c.op("status", study, "--json", here=True).stdout)
        assert status["contributions"] == 1, status  # nothing was sent
        device(c, device_files[0], ledger)
        assert wait_done(c, study)["devices"] == 2
        assert c.terminate() == 0
    finally:
        if c.proc.poll() is None:
            c.kill()
    assert set(stored(c, study)) == {device_id(ledger), device_id(other)}


def test_a_deadline_that_passes_while_the_store_is_full_closes_the_study_once_space_returns(
        tmp_path, tmpfs, cli_certs, device_files):
    """The watcher that closes studies at their deadline meets the full store, logs it, and
    closes the study once space returns (it used to die with the fault, leaving the study open
    for good)."""
    disk = tmpfs("store", "8m")
    c = CoordinatorProcess(tmp_path, cli_certs, db_readers=False)
    c.db = disk / "coordinator.db"
    c.start()
    try:
        study = c.op("create-study", "--name", "late", "--d", "3", "--k", "3", "--bounds",
                        "-12:12", "--rounds", "0", "--scale", "1.5", "--epsilon", "5", "--m", "60",
                        "--r", "60", "--min-devices", "2", "--roster", "3", "--replicates", "2",
                        "--deadline", "20", here=True).stdout.strip()
        tokens = c.op("tokens", "--count", "2", here=True).stdout.split()
        ledgers = [tmp_path / "l0", tmp_path / "l1"]
        device(c, device_files[0], ledgers[0], tokens[0])  # joins
        device(c, device_files[1], ledgers[1], tokens[1])  # fills the quorum, contributes
        device(c, device_files[0], ledgers[0])  # contributes
        filler = fill(disk)
        stop = time.monotonic() + 180  # the deadline is 20 s after creation
        while "watcher: the store failed" not in c.log.read_text():
            assert time.monotonic() < stop and c.proc.poll() is None, c.log.read_text()
            time.sleep(0.5)
        assert "UNAVAILABLE" not in c.log.read_text() and "Traceback" not in c.log.read_text()
        filler.unlink()
        assert wait_done(c, study)["devices"] == 2
        assert c.terminate() == 0
    finally:
        if c.proc.poll() is None:
            c.kill()


def test_a_store_on_a_read_only_file_system_is_one_error_line_at_start(tmp_path, tmpfs):
    """A file system cannot turn read-only under a coordinator that has its files open for
    writing (Linux refuses the remount: busy), so a read-only store is met at start: one
    ``error:`` line naming the file and the cause, exit status 1, nothing written."""
    disk = tmpfs("ro", "1m", ",ro")
    res = subprocess.run([FEDSKETCH, "coordinator", "serve", "--db", str(disk / "c.db"),
                          "--insecure", "--listen", "127.0.0.1:0", "--token-file",
                          str(tmp_path / "token")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    one_error_line(res.stderr, str(disk / "c.db"), "Read-only file system")
    assert not (tmp_path / "token").exists()
