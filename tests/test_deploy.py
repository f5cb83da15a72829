"""``deploy/``: the systemd units' commands, fed the example environment files (paths moved into
a temporary folder), start a real coordinator and a real device that completes a study."""

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

from fedsketch.common.synthetic import gmm
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
    for name in ("coordinator.env", "device.env"):
        assert all(key.startswith("FEDSKETCH_") for key in env_file(name))


def test_units_with_example_configs_run_a_study(tmp_path):
    subprocess.run([FEDSKETCH, "certs", "init", "--out", str(tmp_path / "certs"), "--host",
                    "localhost"], check=True, capture_output=True)
    coord_env = env_file("coordinator.env")
    coord_env.update(FEDSKETCH_DB=str(tmp_path / "c.db"), FEDSKETCH_LISTEN="127.0.0.1:0",
                     FEDSKETCH_CERT=str(tmp_path / "certs/server.pem"),
                     FEDSKETCH_KEY=str(tmp_path / "certs/server.key"),
                     FEDSKETCH_OPERATOR_TOKEN_FILE=str(tmp_path / "op.token"))
    port_file = tmp_path / "port"
    server = subprocess.Popen([*argv("fedsketch-coordinator.service"), "--port-file",
                               str(port_file)], env={**os.environ, **coord_env},
                              stderr=subprocess.PIPE, text=True)
    try:
        while not port_file.exists() or not port_file.read_text().strip():
            assert server.poll() is None, server.stderr.read()
            time.sleep(0.05)
        target = f"localhost:{port_file.read_text().strip()}"
        op = ["--coordinator", target, "--ca", str(tmp_path / "certs/ca.pem"), "--token-file",
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
        dev_env.update(FEDSKETCH_COORDINATOR=target, FEDSKETCH_CA=str(tmp_path / "certs/ca.pem"),
                       FEDSKETCH_DATA=str(tmp_path / "records.npy"),
                       FEDSKETCH_LEDGER=str(tmp_path / "ledger"), FEDSKETCH_ENROLL_TOKEN=token,
                       FEDSKETCH_POLL="0.2")
        device = subprocess.Popen(argv("fedsketch-device.service"), env={**os.environ, **dev_env},
                                  stderr=subprocess.PIPE, text=True)
        stop = time.monotonic() + 60
        store = open_store(tmp_path / "c.db")
        try:
            while store.get_study(study).state != "done":
                assert time.monotonic() < stop, "the study did not complete"
                time.sleep(0.2)
        finally:
            store.close()
        device.send_signal(signal.SIGTERM)  # what systemd's KillSignal sends
        assert device.wait(timeout=30) == 0
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
