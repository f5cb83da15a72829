"""A secure round that fails gives back the ε of every device whose masked input never left it
(rule A, docs/secure-aggregation.md "When a failed round gives ε back"), with real processes:
``fedsketch coordinator serve`` over TLS on loopback and four ``fedsketch device run`` daemons
(the fleet of test_secure_crash), a round that assumes no dropout, so one device missing at any
stage aborts it at that stage's timeout.

One device (the gate) drops out (SIGSTOP) or crashes (SIGKILL) once the store holds its message of
the stage before the target, and comes back once the study has failed. A round that fails before
MASKED_INPUT leaves no spend in any ledger and no charge at the coordinator. The gate crashed
between its spend's commit and its send (``kill-after-commit``) and restarted after the abort
gives its spend back: a sealed void row, the spend row kept, 0 ε net, the coordinator charging it
nothing; the three devices that sent their masked inputs keep their spends (rule B, the
certificate of abort that would void them, is not built) and their logs say why."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess

import pytest
from test_round_processes import FEDSKETCH
from test_secure_crash import DEVICES, Fleet, messages, query, wait_ended, wait_for

from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import wire as sw
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.study import StudySpec

pytestmark = pytest.mark.slow

#: Stage timeout (seconds): long beside a stage of four loopback devices polling every 0.4 s
#: (well under a second idle), short enough that an abort by timeout keeps each case brief.
TIMEOUT = 15.0
EPSILON = 1.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, cli_certs):
    f = Fleet(tmp_path_factory.mktemp("secure-void"), cli_certs)
    yield f
    f.stop()


def create(fleet: Fleet) -> str:
    sketch = SketchSpec(FrequencySpec(d=3, m=100, scale=1.5, seed=0), "complex", 1,
                        PrivacySpec(EPSILON))
    sa = SecAggSpec.assuming(Assumptions(DEVICES, 0, 0), 100_000, None, TIMEOUT)
    spec = StudySpec.create("void", sketch, 3, [-12.0] * 3, [12.0] * 3, min_devices=DEVICES,
                            replicates=1, secure_aggregation=sa)
    return fleet.c.create(spec)


def ledger_rows(fleet: Fleet, i: int, study: str) -> tuple[int, int, int]:
    """(spend rows, void rows, session rows) of ``study`` in device i's ledger."""
    with sqlite3.connect(fleet.ledgers[i], timeout=10) as c:
        return tuple(c.execute(f"SELECT COUNT(*) FROM {t} WHERE study_id = ?", (study,)).fetchone()[0]
                     for t in ("spends", "voids", "secure_sessions"))


def budget(fleet: Fleet, i: int) -> dict:
    out = subprocess.run([FEDSKETCH, "device", "budget", "--ledger", str(fleet.ledgers[i]),
                          "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def charged(fleet: Fleet, study: str) -> set[str]:
    """The devices the coordinator counts ``study`` against once it ended."""
    return {u for (u,) in query(fleet.c.db, "SELECT device_id FROM secure_charges WHERE "
                                "study_id = ?", study)}


def settled(fleet: Fleet, i: int, study: str) -> None:
    """Wait until device i's daemon has seen the study's end (its session row is gone)."""
    def gone():
        """device i's session of the study dropped"""
        return ledger_rows(fleet, i, study)[2] == 0
    wait_for(gone, timeout=60, step=0.1)


@pytest.mark.parametrize("how", ["dropout", "crash"])
@pytest.mark.parametrize("target", ["REGISTER", "ADVERTISE_KEYS", "SHARE_KEYS", "MASKED_INPUT"])
def test_a_device_out_before_masked_input_spends_nothing(fleet, target, how):
    """The gate stops (or dies) before its message of ``target``: the study fails, the gate's
    ledger holds no spend of it, and neither does the coordinator's account of it. At REGISTER
    the round fails there and nobody spends; later, the three others (enough for the threshold
    t = 3) go on to MASKED_INPUT, spend and send, and the round aborts there with 3 masked
    inputs of the 4 it needs: their spends stand (rule B is not built) and the coordinator
    charges exactly them."""
    gate, db = DEVICES - 1, fleet.c.db
    stage = pb.Stage.Value(target)
    index = sw.STAGES.index(stage)
    stop = signal.SIGSTOP if how == "dropout" else signal.SIGKILL
    if not index:
        fleet.daemons[gate].send_signal(stop)
    try:
        study = create(fleet)
        if index:
            def gate_sent_the_stage_before():
                """the gate's message of the stage before the target"""
                return fleet.ids[gate] in messages(db, study, sw.STAGES[index - 1])
            wait_for(gate_sent_the_stage_before)
            fleet.daemons[gate].send_signal(stop)
        assert wait_ended(db, study) == "failed"
    finally:
        if how == "dropout":
            fleet.daemons[gate].send_signal(signal.SIGCONT)
        else:
            fleet.daemons[gate].wait(timeout=30)
            fleet.daemons[gate] = fleet._daemon(gate)
    settled(fleet, gate, study)
    assert ledger_rows(fleet, gate, study)[0] == 0
    spenders = {fleet.ids[i] for i in range(DEVICES) if ledger_rows(fleet, i, study)[0]}
    detail = query(db, "SELECT detail FROM studies WHERE study_id = ?", study)[0][0]
    if stage == pb.REGISTER:
        assert spenders == charged(fleet, study) == set(), detail
    else:
        assert spenders == charged(fleet, study) == set(fleet.ids[:-1]), detail
        assert "aborted at MASKED_INPUT" in detail, detail


def test_a_device_that_spent_but_never_sent_gets_its_epsilon_back(fleet):
    """Device 0 dies between its spend's commit and its send; the study fails at MASKED_INPUT's
    timeout; restarted, device 0 gives the spend back (void, sealed; spend row kept; 0 ε net
    for the study; `--verify` holds), and the coordinator charges it nothing. The others sent
    their masked inputs: their spends stand, and the coordinator charges them."""
    fleet.restart_device(0, "kill-after-commit")
    study = create(fleet)
    assert fleet.daemons[0].wait(timeout=90) == -signal.SIGKILL  # at the fault point
    assert ledger_rows(fleet, 0, study)[:2] == (1, 0)
    assert wait_ended(fleet.c.db, study) == "failed"
    fleet.daemons[0] = fleet._daemon(0)
    settled(fleet, 0, study)
    assert ledger_rows(fleet, 0, study)[:2] == (1, 1)
    shown = budget(fleet, 0)
    assert shown["studies"][study]["epsilon"] == 0.0
    assert shown["sources"]["default"]["given_back_epsilon"] >= EPSILON
    (row,) = [r for r in shown["spends"] if r["study_id"] == study]
    assert row["state"].startswith("void: ε given back")
    verified = subprocess.run([FEDSKETCH, "device", "budget", "--ledger", str(fleet.ledgers[0]),
                               "--verify"], capture_output=True, text=True)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert charged(fleet, study) == set(fleet.ids[1:])
    for i in range(1, DEVICES):
        settled(fleet, i, study)
        assert ledger_rows(fleet, i, study)[:2] == (1, 0)
        assert budget(fleet, i)["studies"][study]["epsilon"] == EPSILON
    assert "is void and given back" in (fleet.folder / "device0.log").read_text()
    assert f"study {study}: the device is out of the secure round after its masked input was " \
        "sent; its spend of ε = 1 stands" in (fleet.folder / "device1.log").read_text()


def test_a_round_that_published_keeps_every_spend(fleet):
    study = create(fleet)
    assert wait_ended(fleet.c.db, study) == "done"
    for i in range(DEVICES):
        settled(fleet, i, study)
        assert ledger_rows(fleet, i, study)[:2] == (1, 0)
    assert charged(fleet, study) == set(fleet.ids)
    for i in range(DEVICES):  # no "stands" line: the spend bought the result
        assert f"study {study}: the device is out" not in (fleet.folder / f"device{i}.log").read_text()
