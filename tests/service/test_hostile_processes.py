"""The aggregate check with real processes: a ``fedsketch coordinator serve`` process, three
honest ``fedsketch device run`` daemons and one hostile device (the simulator's
:class:`~fedsketch.server.sim.hostile.HostileAgent`, in the test's process, over TLS) in a
secure study. An inflated or random input fails the study without publishing, and the
operator's ``status`` and ``result`` say why; with an honest fourth device the study publishes."""

from __future__ import annotations

import json
import subprocess
import time

import numpy as np
import pytest
from test_round_processes import FEDSKETCH, coordinator  # noqa: F401 (the fixture)
from test_secagg_round import secure_spec

from fedsketch.client.agent import Agent
from fedsketch.client.ledger import Ledger
from fedsketch.client.localdata import LocalData
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.net.tls import secure_channel
from fedsketch.server.bench.metrics import split
from fedsketch.server.sim.hostile import HostileAgent


@pytest.mark.parametrize("kind", ["inflate", "random", None])
def test_a_hostile_secure_input_fails_the_study_with_real_processes(coordinator, tmp_path, kind):  # noqa: F811
    c = coordinator
    x, _, _ = gmm(12_000, 3, 3, 3.0, seed=5)
    parts = np.array_split(x, 4)
    study = c.create(secure_spec(4, epsilon=5.0, timeout=30.0))
    tokens = c.op("tokens", "--count", "4").stdout.split()
    daemons = []
    for i in range(3):
        np.save(path := tmp_path / f"x{i}.npy", parts[i])
        daemons.append(subprocess.Popen(
            [FEDSKETCH, "device", "run", "--coordinator", c.target, "--ca",
             str(c.certs / "ca.pem"), "--data", str(path), "--ledger",
             str(tmp_path / f"d{i}.ledger"), "--budget", "10", "--token", tokens[i],
             "--label", f"d{i}", "--poll", "0.1", "--max-poll", "0.5"],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / f"d{i}.log").open("w")))
    channel = secure_channel(c.target, c.certs / "ca.pem")
    ledger = Ledger.create(tmp_path / "h.ledger", 10.0)
    data = LocalData(lambda: split(parts[3]), 3)
    agent = (Agent(channel, ledger, lambda: data) if kind is None
             else HostileAgent(channel, ledger, lambda: data, kind=kind))
    agent.ensure_enrolled(c.target, tokens[3], "h")
    try:
        stop = time.monotonic() + 300
        while (state := c.state(study)) not in ("DONE", "FAILED"):  # in-process: no CLI per pass
            assert time.monotonic() < stop, (state, [p.poll() for p in daemons])
            agent.step()
            time.sleep(0.1)
    finally:
        for p in daemons:
            p.terminate()
        for p in daemons:
            p.wait(timeout=60)
        channel.close()
        ledger.close()
    result = c.op("result", study, check=False)
    if kind is None:
        assert state == "DONE" and result.returncode == 0
        return
    assert state == "FAILED" and result.returncode == 1
    status = json.loads(c.op("status", study, "--json").stdout)
    assert status["state"] == "FAILED"
    for said in (status["detail"], result.stderr):
        assert "the aggregate is out of range: the secure sum of 4 devices" in said, said
