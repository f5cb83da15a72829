"""The aggregate check with real processes: a ``fedsketch coordinator serve`` process, three
honest ``fedsketch device run`` daemons and one hostile device (the simulator's
:class:`~fedsketch.server.sim.hostile.HostileAgent`, in the test's process, over TLS) in a
secure study. An inflated or random input fails the study without publishing, and the
operator's ``status`` and ``result`` say why; with an honest fourth device the study publishes.
The coordinator and the three daemons serve the three studies in turn, as a fleet does."""

from __future__ import annotations

import json
import subprocess
import time

import numpy as np
import pytest
from test_round_processes import FEDSKETCH, CoordinatorProcess
from test_secagg_round import secure_spec

from fedsketch.client.agent import Agent
from fedsketch.client.ledger import Ledger
from fedsketch.client.localdata import LocalData
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.net.tls import secure_channel
from fedsketch.server.bench.metrics import split
from fedsketch.server.sim.hostile import HostileAgent


@pytest.fixture(scope="module")
def honest(tmp_path_factory, cli_certs):
    """One coordinator process and the three honest daemons, shared by the module's studies
    (each study needs four devices: these and the test's own fourth); each daemon holds ε = 20,
    enough for the three studies of ε = 5. Yields the coordinator, the folder and the fourth
    device's records."""
    folder = tmp_path_factory.mktemp("hostile")
    c = CoordinatorProcess(folder, cli_certs)
    c.start()
    x, _, _ = gmm(12_000, 3, 3, 3.0, seed=5)
    parts = np.array_split(x, 4)
    tokens = c.op("tokens", "--count", "3", here=True).stdout.split()
    daemons = []
    for i in range(3):
        np.save(path := folder / f"x{i}.npy", parts[i])
        daemons.append(subprocess.Popen(
            [FEDSKETCH, "device", "run", "--coordinator", c.target, "--ca",
             str(c.certs / "ca.pem"), "--data", str(path), "--ledger",
             str(folder / f"d{i}.ledger"), "--budget", "20", "--token", tokens[i],
             "--label", f"d{i}", "--poll", "0.1", "--max-poll", "0.5"],
            stdout=subprocess.DEVNULL, stderr=(folder / f"d{i}.log").open("w")))
    try:
        yield c, folder, parts[3]
        assert [p.poll() for p in daemons] == [None] * 3  # every study ran beside all three
    finally:
        for p in daemons:
            p.terminate()
        for p in daemons:
            p.wait(timeout=60)
        if c.proc.poll() is None:
            c.kill()


@pytest.mark.parametrize("kind", ["inflate", "random", None])
def test_a_hostile_secure_input_fails_the_study_with_real_processes(honest, kind):
    c, folder, part = honest
    study = c.create(secure_spec(4, epsilon=5.0, timeout=30.0))
    channel = secure_channel(c.target, c.certs / "ca.pem")
    ledger = Ledger.create(folder / f"h-{kind}.ledger", 10.0)
    data = LocalData(lambda: split(part), 3)
    agent = (Agent(channel, ledger, lambda: data) if kind is None
             else HostileAgent(channel, ledger, lambda: data, kind=kind))
    agent.ensure_enrolled(c.target, c.op("tokens", here=True).stdout.strip(), "h")
    try:
        stop = time.monotonic() + 300
        while (state := c.state(study)) not in ("DONE", "FAILED"):  # in-process: no CLI per pass
            assert time.monotonic() < stop, state
            agent.step()
            time.sleep(0.1)
    finally:
        channel.close()
        ledger.close()
    result = c.op("result", study, check=False, here=True)
    if kind is None:
        assert state == "DONE" and result.returncode == 0
        return
    assert state == "FAILED" and result.returncode == 1
    status = json.loads(c.op("status", study, "--json", here=True).stdout)
    assert status["state"] == "FAILED"
    for said in (status["detail"], result.stderr):
        assert "the aggregate is out of range: the secure sum of 4 devices" in said, said
