"""Two-sided accounting with real processes: a device declares its total budget when it enrolls,
and the coordinator refuses a release that would take what it stored from the device past it.

Budget 1.0; the device spends 0.6 on one study (stored at the coordinator). Then its ledger is
rolled back, by deleting the spend rows or by putting back an older copy of the file: the
ledger shows 1.0 left and the device asks to join a second study of 0.6, which the coordinator
refuses (``declared_budget_exceeded``) at its registration: it spends and stores nothing (a
contribution is checked again, tests/store/test_accounts.py); ``device budget --verify`` reports
the deletion from the seal alone, and the restored copy once it asks the coordinator."""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from test_round_processes import FEDSKETCH, CoordinatorProcess, cli_here
from test_round_processes import device_files as device_files  # a module-scoped fixture
from test_secagg_round import drive, secure_spec
from test_secagg_round import parts as parts  # a module-scoped fixture

from fedsketch.client.ledger import Ledger
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.server.store import open_store

pytestmark = pytest.mark.slow


def create(c: CoordinatorProcess, name: str, epsilon: float) -> str:
    """``coordinator create-study`` (in this process: :func:`cli_here`); the study's id."""
    return c.op("create-study", "--name", name, "--d", "3", "--k", "3", "--bounds", "-12:12",
                "--rounds", "0", "--scale", "1.5", "--epsilon", str(epsilon), "--m", "60",
                "--min-devices", "1", "--replicates", "2", here=True).stdout.strip()


def run(c: CoordinatorProcess, data: Path, ledger: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([FEDSKETCH, "device", "run", "--coordinator", c.target, "--ca",
                           str(c.certs / "ca.pem"), "--data", str(data), "--ledger", str(ledger),
                           "--budget", "1.0", "--once", *extra], capture_output=True, text=True,
                          timeout=120)


def verify(c: CoordinatorProcess | None, ledger: Path) -> subprocess.CompletedProcess:
    """``device budget --verify`` (in this process: :func:`cli_here`), with ``c`` against its
    account of the device."""
    args = [] if c is None else ["--coordinator", c.target, "--ca", str(c.certs / "ca.pem")]
    return cli_here("device", "budget", "--ledger", str(ledger), "--verify", *args, check=False)


@pytest.mark.parametrize("rollback", ["delete spend rows", "restore an older copy"])
def test_a_rolled_back_ledger_is_reported_and_cannot_spend_past_the_declared_budget(
        tmp_path, cli_certs, device_files, rollback):
    c = CoordinatorProcess(tmp_path, cli_certs)
    c.start()
    try:
        ledger, older = tmp_path / "ledger", tmp_path / "ledger.older"
        token = c.op("tokens", here=True).stdout.strip()
        enrolled = run(c, device_files[0], ledger, "--token", token)  # no study yet: enrolls only
        assert enrolled.returncode == 0, enrolled.stderr
        shutil.copy(ledger, older)  # closed: its WAL was checkpointed into the file
        first = create(c, "first", 0.6)
        assert run(c, device_files[0], ledger).returncode == 0
        book = Ledger(ledger)
        device_id, spend = book.identity().device_id, book.find(first)
        assert book.declared() == (1.0, 0.0)
        book.close()
        assert spend is not None and spend.acked_at is not None and spend.epsilon == 0.6
        assert verify(c, ledger).returncode == 0
        if rollback == "delete spend rows":
            with sqlite3.connect(ledger) as db:
                db.execute("DELETE FROM spends")
            db.close()
            local = verify(None, ledger)
            assert local.returncode == 1 and "sealed 1 spend(s) and holds 0" in local.stderr, local.stderr
        else:
            shutil.copy(older, ledger)
            assert verify(None, ledger).returncode == 0  # consistent in itself: the seal cannot tell
        remote = verify(c, ledger)
        assert remote.returncode == 1, remote.stdout + remote.stderr
        assert f"releases of 1 studies that the ledger does not record ({first}; ε = 0.6)" in remote.stderr
        assert "Traceback" not in remote.stderr
        budget = json.loads(cli_here("device", "budget", "--ledger", str(ledger), "--json").stdout)
        assert budget["sources"]["default"]["remaining_epsilon"] == pytest.approx(1.0)  # the lie
        second = create(c, "second", 0.6)
        refused = run(c, device_files[0], ledger)
        assert "declared_budget_exceeded" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
        book = Ledger(ledger)
        assert book.find(second) is None and book.reservations() == []  # nothing spent or held
        book.close()
        store = open_store(c.db)
        try:
            assert [r.device_id for r in store.contributions(first)] == [device_id]
            assert store.contributions(second) == []
            account = store.account(device_id)
        finally:
            store.close()
        assert account.budget == (1.0, 0.0) and account.charged == (pytest.approx(0.6), 0.0)
        assert c.terminate() == 0
    finally:
        if c.proc.poll() is None:
            c.kill()


def test_a_secure_round_counts_against_the_declared_budget_and_refuses_a_rolled_back_device(
        coordinator_round, parts, caplog):
    """Secure aggregation (in-process coordinator, real gRPC): four devices (device 0 declaring 8.0, the
    others 20.0) finish a round of ε = 5, which the coordinator then counts for each (from the
    REGISTER, kept once the round ended since each masked). Device 0's spend rows are deleted, so
    its ledger shows 8.0 left; in a second round of ε = 5 its REGISTER is refused
    (declared_budget_exceeded, in its log), it spends nothing, and the other three finish without
    it."""
    r = coordinator_round
    # stage timeout 20 s: generous for four in-process devices; round 2's REGISTER waits it out
    spec = secure_spec(4, epsilon=5.0, threshold=3, dropouts=1, timeout=20.0)
    agents = [r.agent(f"s{i}", parts[i], budget=8.0 if i == 0 else 20.0) for i in range(4)]
    ids = [a.ledger.identity().device_id for a in agents]
    first = r.create(spec).study_id
    assert drive(r, first, agents).state == pb.DONE
    for dev in ids:
        charges = r.coordinator.store.account(dev).charges
        assert [(c.study_id, c.epsilon, c.secure) for c in charges] == [(first, 5.0, True)]
    agents[0].ledger._conn.execute("DELETE FROM spends")
    assert agents[0].ledger.remaining("default").epsilon == 8.0
    second = r.create(spec).study_id
    with caplog.at_level(logging.INFO, logger="fedsketch.device"):
        s = drive(r, second, agents)
    assert s.state == pb.DONE and r.result(second).devices == 3, s.detail
    assert agents[0].ledger.find(second) is None and agents[1].ledger.find(second) is not None
    assert "declared_budget_exceeded" in caplog.text
    assert r.coordinator.store.account(ids[0]).charged == (5.0, 0.0)
    assert r.coordinator.store.account(ids[1]).charged == (10.0, 0.0)
