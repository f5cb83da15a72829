"""``deploy/``: the systemd units' commands, fed the example environment files (paths moved into
a temporary folder), start a real coordinator and a real device that completes a study; and two
instances of the shared unit on the tests' PostgreSQL server, the device listing both."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedsketch.common.data.synthetic import gmm
from fedsketch.server.store import open_store

ROOT = Path(__file__).resolve().parent.parent
FEDSKETCH = str(Path(sys.executable).with_name("fedsketch"))
pytestmark = pytest.mark.slow


def unit(name: str) -> dict[str, str]:
    """The [Service] keys of a unit file."""
    out = {}
    for line in (ROOT / "deploy" / name).read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def env_file(name: str) -> dict[str, str]:
    lines = (ROOT / "deploy" / name).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def argv(unit_name: str) -> list[str]:
    """ExecStart with this venv's ``fedsketch`` in place of the installed one."""
    exec_start = shlex.split(unit(unit_name)["ExecStart"])
    assert exec_start[0].endswith("/fedsketch")
    return [FEDSKETCH, *exec_start[1:]]


def test_units_read_the_example_environment_files():
    assert unit("fedsketch-coordinator.service")["EnvironmentFile"].endswith("coordinator.env")
    assert unit("fedsketch-device.service")["EnvironmentFile"].endswith("device.env")
    assert unit("fedsketch-coordinator-shared@.service")["EnvironmentFile"].endswith("coordinator-shared.env")
    for name in ("coordinator.env", "device.env", "coordinator-shared.env"):
        assert all(key.startswith(("FEDSKETCH_", "PG")) for key in env_file(name))


def serve(unit_name: str, env: dict[str, str], port_file: Path) -> tuple[subprocess.Popen, int]:
    """The unit's ExecStart (instance ``%i``: port 0) with ``env``; the process and its port."""
    args = [a.replace("%i", "0") for a in argv(unit_name)]
    server = subprocess.Popen([*args, "--port-file", str(port_file)], env={**os.environ, **env},
                              stderr=subprocess.PIPE, text=True)
    while not port_file.exists() or not port_file.read_text().strip():
        assert server.poll() is None, server.stderr.read()
        time.sleep(0.05)
    return server, int(port_file.read_text())


def run_study(tmp_path: Path, op_target: str, device_target: str, store_at: str | Path) -> None:
    """An operator creates a study through ``op_target``; the device unit, fed device.env with
    ``device_target``, completes it (checked in the store at ``store_at``) and stops on SIGTERM."""
    op = ["--coordinator", op_target, "--ca", str(tmp_path / "certs/ca.pem"), "--token-file",
          str(tmp_path / "op.token")]
    token = subprocess.run([FEDSKETCH, "coordinator", "tokens", *op], check=True,
                           capture_output=True, text=True).stdout.strip()
    study = subprocess.run(
        [FEDSKETCH, "coordinator", "create-study", *op, "--name", "deploy", "--d", "2",
         "--k", "2", "--bounds", "-10:10", "--scale", "1", "--epsilon", "0.5", "--m", "40",
         "--r", "40", "--replicates", "1"],
        check=True, capture_output=True, text=True).stdout.strip()
    x, _, _ = gmm(5000, 2, 2, 3.0, seed=0)
    np.save(tmp_path / "records.npy", x)
    dev_env = env_file("device.env")
    dev_env.update(FEDSKETCH_COORDINATOR=device_target, FEDSKETCH_CA=str(tmp_path / "certs/ca.pem"),
                   FEDSKETCH_DATA=str(tmp_path / "records.npy"),
                   FEDSKETCH_LEDGER=str(tmp_path / "ledger"), FEDSKETCH_ENROLL_TOKEN=token,
                   FEDSKETCH_POLL="0.2")
    device = subprocess.Popen(argv("fedsketch-device.service"), env={**os.environ, **dev_env},
                              stderr=subprocess.PIPE, text=True)
    stop = time.monotonic() + 60
    store = open_store(store_at)
    try:
        while store.get_study(study).state != "done":
            assert time.monotonic() < stop, "the study did not complete"
            time.sleep(0.2)
    finally:
        store.close()
    device.send_signal(signal.SIGTERM)  # what systemd's KillSignal sends
    assert device.wait(timeout=30) == 0, device.stderr.read()


def coordinator_env(tmp_path: Path, name: str) -> dict[str, str]:
    """An example coordinator environment file with its paths moved into ``tmp_path``."""
    env = env_file(name)
    env.update(FEDSKETCH_CERT=str(tmp_path / "certs/server.pem"),
               FEDSKETCH_KEY=str(tmp_path / "certs/server.key"),
               FEDSKETCH_OPERATOR_TOKEN_FILE=str(tmp_path / "op.token"))
    return env


def test_units_with_example_configs_run_a_study(tmp_path):
    subprocess.run([FEDSKETCH, "certs", "init", "--out", str(tmp_path / "certs"), "--host",
                    "localhost"], check=True, capture_output=True)
    coord_env = coordinator_env(tmp_path, "coordinator.env")
    coord_env.update(FEDSKETCH_DB=str(tmp_path / "c.db"), FEDSKETCH_LISTEN="127.0.0.1:0")
    server, port = serve("fedsketch-coordinator.service", coord_env, tmp_path / "port")
    try:
        run_study(tmp_path, f"localhost:{port}", f"localhost:{port}", tmp_path / "c.db")
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0


def test_shared_units_serve_one_postgresql_database_round_robin(tmp_path, postgres_url):
    """Two instances of the shared unit on one database; the device lists both addresses."""
    subprocess.run([FEDSKETCH, "certs", "init", "--out", str(tmp_path / "certs"), "--host",
                    "127.0.0.1"], check=True, capture_output=True)
    env = coordinator_env(tmp_path, "coordinator-shared.env")
    assert env.pop("PGPASSFILE") and env.pop("PGSSLMODE") == "verify-full"  # the test server: a socket
    env.update(FEDSKETCH_DB=postgres_url)
    servers = []
    try:
        for i in range(2):  # one at a time: the first writes the shared operator token
            servers.append(serve("fedsketch-coordinator-shared@.service", env, tmp_path / f"port{i}"))
        ports = [port for _, port in servers]
        run_study(tmp_path, f"127.0.0.1:{ports[0]}", ",".join(f"127.0.0.1:{p}" for p in ports),
                  postgres_url)
    finally:
        for server, _ in servers:
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=30) == 0
