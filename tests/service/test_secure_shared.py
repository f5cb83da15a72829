"""Secure aggregation on three ``fedsketch coordinator serve --shared`` processes over one
PostgreSQL database (the tests' own server), with four ``fedsketch device run`` daemons that list
all three (round robin, TLS on loopback), so a device's calls, stage messages and fetches go to
every process in turn.

One coordinator is SIGKILLed in the middle of a stage and not restarted: one device (the gate)
is stopped with SIGSTOP once the store holds its SHARE_KEYS message, the kill comes once the
store shows MASKED_INPUT open with the other three devices' masked inputs, and the gate is
continued. The round must end done on the two left, with the stored sum equal to the sum of the
inputs before the masks that the devices' ledgers recorded with their spends, the published
centroids equal to an offline decode of that sum, every process's log showing stage messages it
stored (the killed one: the one that had stored the most), and each stage opened once in all
three logs together. A second study, with a secure refinement round, then runs on the two left
and ends done, each of its rounds' stored sums equal to its spenders' recorded inputs."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys

import numpy as np
import pytest
from test_round_processes import FEDSKETCH, CoordinatorProcess
from test_secure_crash import Fleet, wait_for

from fedsketch.client.study_pass import RPC_TIMEOUT
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import wire as sw
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.refine import RefineSpec
from fedsketch.common.study.study import StudySpec
from fedsketch.server.decode.pipeline import decode_sketch, integer_sketch
from fedsketch.server.store import open_store

pytestmark = pytest.mark.slow

DEVICES = 4
RECORDS = 20_000
#: Seconds between a daemon's passes (0.5 to 1.5 times this, with jitter).
POLL = 0.3


def create(c: CoordinatorProcess, rounds: int) -> str:
    """A secure study of the four devices (no dropout or colluder assumed; stages that never
    time out here), with ``rounds`` refinement rounds, created over the operator's gRPC service
    of ``c``."""
    sketch = SketchSpec(FrequencySpec(d=3, m=200, scale=1.5, seed=0), "complex", 1, PrivacySpec(5.0))
    sa = SecAggSpec.assuming(Assumptions(DEVICES, 0, 0), 100_000, None, 120.0)
    spec = StudySpec.create("shared", sketch, 3, [-12.0] * 3, [12.0] * 3, min_devices=DEVICES,
                            replicates=2, secure_aggregation=sa,
                            refine=RefineSpec((5.0,) * rounds) if rounds else None)
    return c.create(spec)


def premasks(ledgers, study: str) -> list[np.ndarray]:
    """The inputs before the masks (x + e) that the devices recorded with their spends on ``study``."""
    found = []
    for ledger in ledgers:
        with sqlite3.connect(ledger, timeout=10) as c:
            found += [np.frombuffer(p, "<i8") for (p,) in c.execute(
                "SELECT premask FROM spends WHERE study_id = ?", (study,))]
    return found


def took(c: CoordinatorProcess, study: str) -> int:
    """How many stage messages of ``study`` coordinator ``c`` stored, by its log."""
    return len(re.findall(f"event=message study={study} ", c.log.read_text()))


def test_three_shared_coordinators_serve_one_secure_round_and_survive_a_kill(tmp_path, postgres_url,
                                                                           cli_certs):
    certs = cli_certs
    trio = [CoordinatorProcess(tmp_path / name, certs, "--shared") for name in "abc"]
    daemons: list[subprocess.Popen] = []
    store = open_store(postgres_url)
    try:
        for c in trio:
            c.folder.mkdir()
            c.db, c.token_file = postgres_url, trio[0].token_file
            c.start()
        targets = ",".join(f"127.0.0.1:{c.port}" for c in trio)
        tokens = trio[0].op("tokens", "--count", str(DEVICES)).stdout.split()
        x, _, _ = gmm(RECORDS, 3, 3, 3.0, seed=4)
        ledgers = [tmp_path / f"ledger{i}" for i in range(DEVICES)]
        for i, (part, token) in enumerate(zip(np.array_split(x, DEVICES), tokens, strict=True)):
            np.save(tmp_path / f"x{i}.npy", part)
            daemons.append(subprocess.Popen(
                [FEDSKETCH, "device", "run", "--coordinator", targets, "--ca", str(certs / "ca.pem"),
                 "--data", str(tmp_path / f"x{i}.npy"), "--ledger", str(ledgers[i]), "--budget", "100",
                 "--token", token, "--poll", str(POLL), "--max-poll", str(POLL)],
                stdout=subprocess.DEVNULL, stderr=(tmp_path / f"device{i}.log").open("w")))
        ids = [wait_for(lambda p=p: Fleet._identity(p)) for p in ledgers]
        gate = daemons[-1]

        study = create(trio[1], rounds=0)

        def sent(stage: int) -> set[str]:
            return {m.device_id for m in store.stage_messages(study) if m.stage == stage}

        def gate_shared_its_keys():
            """the gate's SHARE_KEYS message stored"""
            return ids[-1] in sent(pb.SHARE_KEYS)
        wait_for(gate_shared_its_keys)
        gate.send_signal(signal.SIGSTOP)

        def masked_input_open_with_three():
            """MASKED_INPUT open with the other three devices' masked inputs"""
            row = store.secure_round(study)
            return row is not None and row.stage == pb.MASKED_INPUT and sent(pb.MASKED_INPUT) == set(ids[:-1])
        wait_for(masked_input_open_with_three)
        victim = max(trio, key=lambda c: took(c, study))  # a device's calls may keep to one phase
        assert took(victim, study)
        victim.kill()  # not restarted
        gate.send_signal(signal.SIGCONT)

        def ended():
            """the study done or failed"""
            return store.get_study(study).state in ("done", "failed")
        wait_for(ended, timeout=90, step=0.1)
        assert store.get_study(study).state == "done", store.get_study(study).detail
        kept = store.secure_round(study)
        total = np.frombuffer(kept.total, "<i8")
        assert (kept.devices, kept.records) == (DEVICES, RECORDS)
        spent = premasks(ledgers, study)
        assert len(spent) == DEVICES and np.array_equal(sum(spent), total)
        spec = StudySpec.from_json(store.get_study(study).spec_json)
        m = spec.sketch.frequencies.m
        offline = decode_sketch(spec, integer_sketch(spec, total.reshape(2, m), kept.records), DEVICES,
                                kept.records, draws=DEVICES / spec.assumptions.min_honest)
        result = json.loads(store.get_result(study))
        np.testing.assert_allclose(result["centroids"], offline.centroids, rtol=1e-9, atol=1e-9)
        stored = [took(c, study) for c in trio]
        assert all(stored) and sum(stored) == DEVICES * len(sw.STAGES), stored  # re-sends log nothing
        logs = [c.log.read_text() for c in trio]
        assert [sum(log.count(f"event=stage study={study} stage={pb.Stage.Name(s)}") for log in logs)
                for s in sw.STAGES[1:]] == [1] * (len(sw.STAGES) - 1)

        refined = create(next(c for c in trio if c is not victim), rounds=1)  # on the two left

        def refined_ended():
            """the refined study done or failed"""
            return store.get_study(refined).state in ("done", "failed")
        wait_for(refined_ended, timeout=90, step=0.1)
        assert store.get_study(refined).state == "done", store.get_study(refined).detail
        assert json.loads(store.get_result(refined))["refined_rounds"] == 1
        (round_1,) = store.rounds(refined)
        for sid in (refined, round_1.study_id):
            kept = store.secure_round(sid)
            spent = premasks(ledgers, sid)
            assert kept.devices == len(spent) == DEVICES
            assert np.array_equal(sum(spent), np.frombuffer(kept.total, "<i8"))
    finally:
        for d in daemons:
            d.send_signal(signal.SIGCONT)
            d.send_signal(signal.SIGTERM)
        hung = []
        for d in daemons:  # a daemon sends a spend it recorded before it exits: one RPC's timeout
            try:
                d.wait(timeout=RPC_TIMEOUT + 30)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait()
                hung.append(d.args)
        if hung and sys.exc_info()[0] is None:  # a failure of the test itself is reported as it is
            raise AssertionError(f"daemons still running {RPC_TIMEOUT + 30:g} s after SIGTERM: {hung}")
        for c in trio:
            if c.proc is not None and c.proc.poll() is None:
                c.terminate()
        store.close()
