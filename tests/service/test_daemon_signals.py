"""The device daemon as a real process when the coordinator is away and when it is told to stop:
it keeps trying to enroll with backoff until the coordinator comes up (a wrong token stays a
clean exit 1), and SIGINT in the middle of a long sketch ends it at once with nothing spent."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import test_round_processes as processes
from test_round_processes import FEDSKETCH, cli

from fedsketch.client.ledger import Ledger
from fedsketch.server.store import open_store

pytestmark = pytest.mark.slow

#: The real coordinator process and the three devices' files of the plain round's tests.
coordinator = processes.coordinator
device_files = processes.device_files


def daemon(c: processes.CoordinatorProcess, data: Path, ledger: Path, *extra: str) -> subprocess.Popen:
    """``fedsketch device run`` (no --once) against ``c``, polling every 0.2 s at most 1 s."""
    return subprocess.Popen(
        [FEDSKETCH, "device", "run", "--coordinator", c.target, "--ca", str(c.certs / "ca.pem"),
         "--data", str(data), "--ledger", str(ledger), "--budget", "10", "--poll", "0.2",
         "--max-poll", "1", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, what: str, seconds: float = 60) -> None:
    stop = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < stop, f"timed out waiting for {what}"
        time.sleep(0.1)


def identity(ledger: Path):
    if not ledger.exists():
        return None
    book = Ledger(ledger)
    try:
        return book.identity()
    finally:
        book.close()


def test_daemon_waits_for_an_unreachable_coordinator_to_enroll(coordinator, tmp_path,
                                                               device_files):
    """The coordinator is down when the device starts: the daemon stays up and tries again, and
    it enrolls once the coordinator is back on its address; --once still exits 1 at once."""
    token = coordinator.op("tokens").stdout.strip()
    coordinator.terminate()
    ledger = tmp_path / "ledger"
    once = cli("device", "run", "--coordinator", coordinator.target, "--ca",
               str(coordinator.certs / "ca.pem"), "--data", str(device_files[0]), "--ledger",
               str(tmp_path / "once"), "--budget", "10", "--token", token, "--once", check=False)
    assert once.returncode == 1 and "cannot enroll yet" in once.stderr
    proc = daemon(coordinator, device_files[0], ledger, "--token", token)
    try:
        time.sleep(3)
        assert proc.poll() is None, proc.stderr.read()  # still trying
        assert identity(ledger) is None
        coordinator.start()  # same port
        wait_for(lambda: identity(ledger) is not None, "the enrollment")
        store = open_store(coordinator.db)
        try:
            assert store.device_key(identity(ledger).device_id) is not None
        finally:
            store.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=20)
    assert status == 0
    log = proc.stderr.read()
    assert "cannot enroll yet: cannot reach the coordinator at localhost:" in log
    assert "connection refused" in log and "stopped" in log


def test_daemon_with_a_refused_token_exits_with_the_reason(coordinator, tmp_path, device_files):
    proc = daemon(coordinator, device_files[0], tmp_path / "ledger", "--token", "not-a-token")
    assert proc.wait(timeout=30) == 1
    assert "PERMISSION_DENIED" in proc.stderr.read()


def test_sigint_during_a_sketch_stops_at_once_and_spends_nothing(coordinator, tmp_path):
    """A study whose sketch takes half a minute or more here (2·10^6 records, m = r = 16000): SIGINT once
    the device has joined and is sketching ends the daemon within seconds, with no spend in the
    ledger and no contribution at the coordinator; the device is still on the roster."""
    data = tmp_path / "big.npy"
    np.save(data, np.random.default_rng(0).normal(size=(2_000_000, 3)).astype(np.float32))
    study = coordinator.op("create-study", "--name", "long", "--d", "3", "--k", "3", "--bounds",
                           "-6:6", "--rounds", "0", "--scale", "1.5", "--epsilon", "1", "--m",
                           "16000", "--r", "16000", "--min-devices", "1",
                           "--max-device-records", "2000000").stdout.strip()
    token = coordinator.op("tokens").stdout.strip()
    ledger = tmp_path / "ledger"
    proc = daemon(coordinator, data, ledger, "--token", token)
    try:
        def joined() -> bool:
            store = open_store(coordinator.db)
            try:
                return store.get_study(study).registered == 1
            finally:
                store.close()
        wait_for(joined, "the registration")
        time.sleep(1.0)  # into the sketch
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        status = proc.wait(timeout=30)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    assert status == 0 and "stopped" in proc.stderr.read()
    assert took < 10, took  # one chunk of 65,536 records at most, not the remaining sketch
    book = Ledger(ledger)
    try:
        assert book.spends() == []
        assert [r.study_id for r in book.joined()] == [study]  # it will send on its next start
    finally:
        book.close()
    store = open_store(coordinator.db)
    try:
        assert store.contributions(study) == []
    finally:
        store.close()
