"""Secure aggregation survives a coordinator SIGKILL at every stage, with real processes:
``fedsketch coordinator serve`` over TLS on loopback and four ``fedsketch device run`` daemons
that keep running through the kill and the restart on the same database.

The stage a kill lands in is made certain by observing the store: one device (the gate) is
stopped with SIGSTOP as soon as the store holds its message of the stage before, so the round
waits at the target stage for it while the other three send theirs; the coordinator is killed
once the store shows that stage open with their three messages, restarted, and the gate
continued. For the decoding, the gate is continued before the kill, and the kill comes once the
store shows the study decoding with its unmasked sum and no result yet (the decoder takes about
a second at m = 1000). Each round must end done, with the stored sum equal to the sum of the
inputs before the masks that the devices' ledgers recorded with their spends, every device that
spent counted in it, the published centroids equal to an offline decode of that sum, and the
serve log showing each stage opened once (a resumed stage is not opened again). A device daemon
killed mid-round goes on from its ledger in the same way."""

from __future__ import annotations

import base64
import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from test_round_processes import FEDSKETCH, CoordinatorProcess

from fedsketch.client.study_pass import FAULT_ENV
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import wire as sw
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.study import StudySpec
from fedsketch.server.decode.pipeline import decode_sketch, integer_sketch

pytestmark = pytest.mark.slow

DEVICES = 4
#: Seconds between a daemon's passes (0.5 to 1.5 times this, with jitter): the gate's next pass
#: comes at least POLL/2 after the message the test waits for, and it polls the store every 10 ms.
POLL = 0.4


def query(db: Path, sql: str, *args) -> list[tuple]:
    """One read of the coordinator's store (WAL: a reader never blocks the coordinator)."""
    with sqlite3.connect(db, timeout=10) as c:
        return c.execute(sql, args).fetchall()


def wait_for(what, timeout: float = 60.0, step: float = 0.01):
    stop = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < stop, what.__doc__
        time.sleep(step)
    return found


class Fleet:
    """The coordinator process and the four device daemons, with their ledgers."""

    def __init__(self, folder: Path, certs: Path) -> None:
        self.c = CoordinatorProcess(folder, certs)
        self.c.start()
        self.ledgers = [folder / f"ledger{i}" for i in range(DEVICES)]
        x, _, _ = gmm(20_000, 3, 3, 3.0, seed=4)
        tokens = self.c.op("tokens", "--count", str(DEVICES), here=True).stdout.split()  # in this process
        self.daemons, self.commands, self.folder = [], [], folder
        for i, (part, token) in enumerate(zip(np.array_split(x, DEVICES), tokens, strict=True)):
            np.save(folder / f"x{i}.npy", part)
            self.commands.append(
                [FEDSKETCH, "device", "run", "--coordinator", self.c.target, "--ca",
                 str(certs / "ca.pem"), "--data", str(folder / f"x{i}.npy"), "--ledger",
                 str(self.ledgers[i]), "--budget", "100", "--token", token, "--poll", str(POLL),
                 "--max-poll", str(POLL)])
            self.daemons.append(self._daemon(i))
        self.ids = [wait_for(lambda p=p: self._identity(p)) for p in self.ledgers]

    def _daemon(self, i: int, fault: str | None = None) -> subprocess.Popen:
        """Start device i's daemon (again: the same command, ledger and data), with the fault
        point ``fault`` armed (:func:`fedsketch.client.study_pass.fault_point`)."""
        env = None if fault is None else {**os.environ, FAULT_ENV: fault}
        return subprocess.Popen(self.commands[i], stdout=subprocess.DEVNULL, env=env,
                                stderr=(self.folder / f"device{i}.log").open("a"))

    def restart_device(self, i: int, fault: str | None = None) -> None:
        """SIGKILL device i's daemon and start it again (``fault``: :meth:`_daemon`)."""
        self.daemons[i].kill()
        self.daemons[i].wait(timeout=30)
        self.daemons[i] = self._daemon(i, fault)

    @staticmethod
    def _identity(ledger: Path) -> str | None:
        """The device id once the daemon has enrolled."""
        if not ledger.exists():
            return None
        try:
            with sqlite3.connect(ledger, timeout=10) as c:
                rows = c.execute("SELECT device_id FROM identity").fetchall()
        except sqlite3.OperationalError:  # the daemon is still creating the ledger
            return None
        return rows[0][0] if rows else None

    def stop(self) -> None:
        for d in self.daemons:
            d.send_signal(signal.SIGCONT)
            d.send_signal(signal.SIGTERM)
        for d in self.daemons:
            d.wait(timeout=30)
        if self.c.proc.poll() is None:
            self.c.kill()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, cli_certs):
    f = Fleet(tmp_path_factory.mktemp("secure-crash"), cli_certs)
    yield f
    f.stop()


def create(fleet: Fleet, m: int) -> str:
    """A secure study of the four devices (no dropout or colluder assumed, stages that never time
    out here), created over the operator's gRPC service (as ``create-study`` does, without
    starting a process)."""
    sketch = SketchSpec(FrequencySpec(d=3, m=m, scale=1.5, seed=0), "complex", 1, PrivacySpec(1.0))
    sa = SecAggSpec.assuming(Assumptions(DEVICES, 0, 0), 100_000, None, 120.0)
    spec = StudySpec.create("crash", sketch, 3, [-12.0] * 3, [12.0] * 3, min_devices=DEVICES,
                            replicates=2, secure_aggregation=sa)
    return fleet.c.create(spec)



def premask_sum(fleet: Fleet, study: str) -> np.ndarray:
    """Σ over the fleet's ledgers of the inputs before the masks (x + e) kept for ``study``."""
    premasks = []
    for ledger in fleet.ledgers:
        with sqlite3.connect(ledger, timeout=10) as c:
            premasks += [np.frombuffer(p, "<i8") for (p,) in c.execute(
                "SELECT premask FROM spends WHERE study_id = ?", (study,))]
    return sum(premasks)


def wait_ended(db: Path, study: str) -> str:
    """The state (done or failed) ``study`` ends in, waiting up to 90 s."""
    def ended():
        """the study done or failed"""
        rows = query(db, "SELECT state, detail FROM studies WHERE study_id = ?", study)
        return rows if rows[0][0] in ("done", "failed") else None
    return wait_for(ended, timeout=90, step=0.1)[0][0]


def messages(db: Path, study: str, stage: int) -> set[str]:
    """The devices whose message of ``stage`` the store holds."""
    return {u for (u,) in query(db, "SELECT device_id FROM stage_messages WHERE study_id = ? "
                                "AND stage = ?", study, stage)}


def open_stage(db: Path, study: str) -> int:
    """The stage the store records open (REGISTER before any other opened)."""
    rows = query(db, "SELECT stage FROM secure_rounds WHERE study_id = ?", study)
    return rows[0][0] if rows else pb.REGISTER


def kill_in(fleet: Fleet, study: str, stage: int, secure: bool) -> None:
    """SIGKILL the coordinator while ``stage`` is open with the other devices' messages and the
    gate's missing (or, not ``secure``, once the round has unmasked and the study is decoding),
    check from the store that it was, and restart it (module docstring)."""
    db, gate, index = fleet.c.db, fleet.daemons[-1], sw.STAGES.index(stage)
    others = set(fleet.ids[:-1])
    if index:
        def gate_sent_the_stage_before():
            """the gate's message of the stage before the target"""
            return fleet.ids[-1] in messages(db, study, sw.STAGES[index - 1])
        wait_for(gate_sent_the_stage_before)
        gate.send_signal(signal.SIGSTOP)

    def target_open_with_three():
        """the target stage open with the other three devices' messages"""
        return open_stage(db, study) == stage and messages(db, study, stage) == others
    wait_for(target_open_with_three)
    if not secure:
        gate.send_signal(signal.SIGCONT)

        def decoding():
            """the study decoding its stored unmasked sum, no result yet"""
            return query(db, "SELECT s.state, r.total IS NOT NULL, (SELECT COUNT(*) FROM "
                         "results WHERE study_id = s.study_id) FROM studies AS s JOIN "
                         "secure_rounds AS r USING (study_id) WHERE study_id = ?",
                         study) == [("decoding", 1, 0)]
        wait_for(decoding, step=0.005)
    fleet.c.kill()
    if secure:  # the kill landed in the target stage
        assert open_stage(db, study) == stage and messages(db, study, stage) == others
        assert query(db, "SELECT state FROM studies WHERE study_id = ?", study) in (
            [("open",)], [("collecting",)])
    else:
        assert query(db, "SELECT COUNT(*) FROM results WHERE study_id = ?", study) == [(0,)]
    fleet.c.start()  # the same database and port


@pytest.mark.parametrize("target", [*(pb.Stage.Name(s) for s in sw.STAGES), "decoding"])
def test_a_coordinator_killed_at_each_stage_resumes_and_the_round_completes(fleet, target):
    """One study per target, on the shared fleet: killed there, it ends done, its stored sum is
    Σ of the spenders' recorded inputs before the masks, and it publishes the decode of that sum."""
    db, gate = fleet.c.db, fleet.daemons[-1]
    secure = target != "decoding"
    stage = pb.Stage.Value(target) if secure else pb.UNMASK
    index = sw.STAGES.index(stage)
    if not index:
        gate.send_signal(signal.SIGSTOP)  # before the study exists: it cannot have registered
    try:
        study = create(fleet, 200 if secure else 1000)
        kill_in(fleet, study, stage, secure)
    finally:
        gate.send_signal(signal.SIGCONT)

    def ended():
        """the study done or failed"""
        rows = query(db, "SELECT state, detail FROM studies WHERE study_id = ?", study)
        return rows if rows[0][0] in ("done", "failed") else None
    assert wait_for(ended, timeout=90, step=0.1)[0][0] == "done"
    spec = StudySpec.from_json(query(db, "SELECT spec_json FROM studies WHERE study_id = ?",
                                     study)[0][0])
    ((total, devices, records),) = query(db, "SELECT total, devices, records FROM secure_rounds "
                                         "WHERE study_id = ?", study)
    total = np.frombuffer(total, "<i8")
    premasks = []
    for ledger in fleet.ledgers:
        with sqlite3.connect(ledger, timeout=10) as c:
            premasks += [np.frombuffer(p, "<i8") for (p,) in c.execute(
                "SELECT premask FROM spends WHERE study_id = ?", (study,))]
    assert len(premasks) == devices == DEVICES and records == 20_000.0  # every spender counted
    assert np.array_equal(sum(premasks), total)
    result = json.loads(query(db, "SELECT result_json FROM results WHERE study_id = ?", study)[0][0])
    m = spec.sketch.frequencies.m
    offline = decode_sketch(spec, integer_sketch(spec, total.reshape(2, m), records), devices,
                            records, draws=devices / spec.assumptions.min_honest)
    assert result["devices"] == DEVICES
    log = fleet.c.log.read_text()  # each stage opened once, before or after the restart
    assert [log.count(f"event=stage study={study} stage={pb.Stage.Name(s)}")
            for s in sw.STAGES[1:]] == [1] * (len(sw.STAGES) - 1)
    np.testing.assert_allclose(result["centroids"], offline.centroids, rtol=1e-9, atol=1e-9)


def test_a_device_killed_mid_round_goes_on_from_its_ledger(fleet):
    """A device daemon SIGKILLed once the store holds its SHARE_KEYS message (its keys, mask seed
    and shares in its ledger only), and started again with the same command: the round, which
    assumes no dropout (its stages wait two minutes for all four), ends done with all four, the
    restarted device's masked input among them (it spent once), and the sum is Σ of the recorded
    inputs. Every stage after a restart, in process: ``test_device_restart_secure.py``."""
    db = fleet.c.db
    study = create(fleet, 200)

    def shared_keys():
        """the first device's SHARE_KEYS message in the store"""
        return fleet.ids[0] in messages(db, study, pb.SHARE_KEYS)
    wait_for(shared_keys)
    fleet.restart_device(0)
    assert wait_ended(db, study) == "done"
    ((total, devices),) = query(db, "SELECT total, devices FROM secure_rounds WHERE study_id = ?", study)
    assert devices == DEVICES  # the restarted device's masked input among them
    with sqlite3.connect(fleet.ledgers[0], timeout=10) as c:
        assert c.execute("SELECT COUNT(*) FROM spends WHERE study_id = ?", (study,)).fetchone() == (1,)
    assert np.array_equal(premask_sum(fleet, study), np.frombuffer(total, "<i8"))
    assert "went on with the secure round from the ledger" in (fleet.folder / "device0.log").read_text()


@pytest.mark.parametrize("fault", ["kill-after-mask", "kill-after-commit"])
def test_a_device_killed_between_masking_spending_and_sending_goes_on_with_the_same_bytes(fleet,
                                                                                        fault):
    """A device daemon SIGKILLed at MASKED_INPUT after its masked input is kept in its session
    but before the spend is committed (``kill-after-mask``: the window in which a restarted
    daemon used to log that it went on, then send nothing, so the round waited for its stage
    timeout and aborted after the others had spent), or after the spend but before the send
    (``kill-after-commit``), and started again: the round, which assumes no dropout, ends done
    with all four, the restarted device spent exactly once, on the bytes it had masked, and its
    log says it sent them."""
    db = fleet.c.db
    fleet.restart_device(0, fault)
    study = create(fleet, 200)
    assert fleet.daemons[0].wait(timeout=90) == -signal.SIGKILL  # at the fault point
    with sqlite3.connect(fleet.ledgers[0], timeout=10) as c:
        (state,) = c.execute("SELECT state FROM secure_sessions WHERE study_id = ?", (study,)).fetchone()
        spent = c.execute("SELECT payload FROM spends WHERE study_id = ?", (study,)).fetchall()
    masked = json.loads(state)["replies"][str(pb.MASKED_INPUT)]
    assert len(spent) == (0 if fault == "kill-after-mask" else 1)
    assert open_stage(db, study) == pb.MASKED_INPUT and fleet.ids[0] not in messages(
        db, study, pb.MASKED_INPUT)
    fleet.daemons[0] = fleet._daemon(0)
    assert wait_ended(db, study) == "done"
    ((total, devices),) = query(db, "SELECT total, devices FROM secure_rounds WHERE study_id = ?", study)
    assert devices == DEVICES
    with sqlite3.connect(fleet.ledgers[0], timeout=10) as c:
        ((payload,),) = c.execute("SELECT payload FROM spends WHERE study_id = ?", (study,)).fetchall()
    assert base64.b64encode(payload).decode() == masked  # the bytes masked before the kill
    assert np.array_equal(premask_sum(fleet, study), np.frombuffer(total, "<i8"))
    log = (fleet.folder / "device0.log").read_text()
    assert log.count(f"submitted study {study}") == 1
