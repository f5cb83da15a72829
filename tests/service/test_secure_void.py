"""A secure round that fails gives back the ε of every device whose masked input nobody can
unmask (docs/secure-aggregation.md "When a failed round gives ε back"), with real processes:
``fedsketch coordinator serve`` over TLS on loopback and four ``fedsketch device run`` daemons
(the fleet of test_secure_crash), a round that assumes no dropout or colluder (t = 3 of H = 4
holders, so a certificate of abort needs need(4, 3, 0) = 2 statements), so one device missing at
any stage aborts it at that stage's timeout.

Rule A: one device (the gate) drops out (SIGSTOP) or crashes (SIGKILL) once the store holds its
message of the stage before the target, and comes back once the study has failed. A round that
fails before MASKED_INPUT leaves no spend in any ledger and no charge at the coordinator. The gate
crashed between its spend's commit and its send (``kill-after-commit``) and restarted after the
abort gives its spend back: a sealed void row, the spend row kept, 0 ε net, the coordinator
charging it nothing.

Rule B: the devices whose masked input left them sign the abort and get a certificate of abort
from the holders of their shares: aborts at MASKED_INPUT, at CONSISTENCY and at UNMASK before t
shares of anyone leave 0 ε net in every ledger that can get one, `--verify` clean against the
coordinator's account (which dropped the same charges); a device that sent its UNMASK shares, or
whose holders do not sign in time (their daemons stopped), keeps its spend and says so."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess

import pytest
from test_round_processes import cli_here
from test_secure_crash import DEVICES, Fleet, messages, query, wait_ended, wait_for

from fedsketch.client.secure_session import Session
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import wire as sw
from fedsketch.common.secagg.params import graph_seed, ring_order
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.study import StudySpec
from fedsketch.server.store import accounts

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
    """``device budget --json`` of device i's ledger (in this process: :func:`cli_here`)."""
    return json.loads(cli_here("device", "budget", "--ledger", str(fleet.ledgers[i]), "--json").stdout)


def charged(fleet: Fleet, study: str) -> set[str]:
    """The devices the coordinator counts ``study`` against once it ended."""
    return {u for (u,) in query(fleet.c.db, "SELECT device_id FROM secure_charges WHERE "
                                "study_id = ?", study)}


def counted(fleet: Fleet, study: str) -> set[str]:
    """The devices whose account at the coordinator counts ``study`` (its own query,
    :func:`fedsketch.server.store.accounts.account`, on the coordinator's store)."""
    with sqlite3.connect(fleet.c.db, timeout=10) as c:
        return {u for u in fleet.ids if any(ch.study_id == study
                                            for ch in accounts.account(c, u).charges)}


def verified(fleet: Fleet, i: int) -> subprocess.CompletedProcess:
    """``device budget --verify`` of device i's ledger, against the coordinator's account (in
    this process: :func:`cli_here`)."""
    return cli_here("device", "budget", "--ledger", str(fleet.ledgers[i]), "--verify", "--coordinator",
                fleet.c.target, "--ca", str(fleet.c.certs / "ca.pem"), check=False)


def given_back(fleet: Fleet, i: int, study: str) -> None:
    """Device i's spend of ``study`` is void (spend row kept, one void row, 0 ε net) and its
    ledger verifies, also against the coordinator's account."""
    assert ledger_rows(fleet, i, study)[:2] == (1, 1)
    shown = budget(fleet, i)
    assert shown["studies"][study]["epsilon"] == 0.0
    (row,) = [r for r in shown["spends"] if r["study_id"] == study]
    assert row["state"].startswith("void: ε given back"), row
    checked = verified(fleet, i)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def stands(fleet: Fleet, i: int, study: str) -> None:
    """Device i keeps its spend of ``study`` (ε = EPSILON), verifies, and its log says why."""
    assert ledger_rows(fleet, i, study)[:2] == (1, 0)
    assert budget(fleet, i)["studies"][study]["epsilon"] == EPSILON
    checked = verified(fleet, i)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"study {study}: the device is out of the secure round after its masked input was " \
        "sent; its spend of ε = 1 stands (no certificate of abort)" in \
        (fleet.folder / f"device{i}.log").read_text()


def settled(fleet: Fleet, i: int, study: str, timeout: float = 60.0) -> None:
    """Wait until device i's daemon has seen the study's end: its session row is gone, or is the
    tombstone of a round whose abort it signed (rule B keeps it for good)."""
    def gone():
        """device i's session of the study dropped (or settled as a tombstone)"""
        with sqlite3.connect(fleet.ledgers[i], timeout=10) as c:
            rows = c.execute("SELECT state FROM secure_sessions WHERE study_id = ?", (study,)).fetchall()
        return not rows or Session.is_tombstone(rows[0][0])
    wait_for(gone, timeout=timeout, step=0.1)


@pytest.mark.parametrize("how", ["dropout", "crash"])
@pytest.mark.parametrize("target", ["REGISTER", "ADVERTISE_KEYS", "SHARE_KEYS", "MASKED_INPUT"])
def test_a_device_out_before_masked_input_spends_nothing(fleet, target, how):
    """The gate stops (or dies) before its message of ``target``: the study fails, the gate's
    ledger holds no spend of it, and neither does the coordinator's account of it. At REGISTER
    the round fails there and nobody spends; later, the three others (enough for the threshold
    t = 3) go on to MASKED_INPUT, spend and send, and the round aborts there with 3 masked
    inputs of the 4 it needs: they spent and the coordinator kept their charges, then each got a
    certificate of abort (rule B), gave its spend back, and the coordinator counts it no more."""
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
        assert spenders == charged(fleet, study) == counted(fleet, study) == set(), detail
    else:
        assert spenders == charged(fleet, study) == set(fleet.ids[:-1]), detail
        assert "aborted at MASKED_INPUT" in detail, detail
        for i in range(DEVICES - 1):  # rule B: the three masked inputs can never be unmasked
            settled(fleet, i, study)
            given_back(fleet, i, study)
        assert counted(fleet, study) == set()


def test_a_device_that_spent_but_never_sent_gets_its_epsilon_back(fleet):
    """Device 0 dies between its spend's commit and its send; the study fails at MASKED_INPUT's
    timeout; restarted, device 0 gives the spend back (void, sealed; spend row kept; 0 ε net
    for the study; `--verify` holds), and the coordinator charges it nothing. The others sent
    their masked inputs, and get their ε back from a certificate of abort (rule B)."""
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
    cli_here("device", "budget", "--ledger", str(fleet.ledgers[0]), "--verify")
    assert charged(fleet, study) == set(fleet.ids[1:])
    for i in range(1, DEVICES):
        settled(fleet, i, study)
        given_back(fleet, i, study)
    assert counted(fleet, study) == set()
    assert "the masked input never left the device" in (fleet.folder / "device0.log").read_text()
    assert f"study {study}: certificate of abort from" in (fleet.folder / "device1.log").read_text()


def test_a_round_that_published_keeps_every_spend(fleet):
    study = create(fleet)
    assert wait_ended(fleet.c.db, study) == "done"
    for i in range(DEVICES):
        settled(fleet, i, study)
        assert ledger_rows(fleet, i, study)[:2] == (1, 0)
    assert charged(fleet, study) == set(fleet.ids)
    for i in range(DEVICES):  # no "stands" line: the spend bought the result
        assert f"study {study}: the device is out" not in (fleet.folder / f"device{i}.log").read_text()


def committee(fleet: Fleet, study: str) -> int:
    """The index of the round's one signing-committee member (p = 2D' + C + 1 = 1 with no
    dropout or colluder assumed): without its CONSISTENCY signature the round aborts there."""
    return fleet.ids.index(ring_order(sorted(fleet.ids), graph_seed(study))[0])


def stop_after(fleet: Fleet, study: str, stage: int, devices: list[int]) -> None:
    """SIGSTOP each of ``devices`` once the store holds its message of ``stage``."""
    for i in devices:
        def sent(i=i):
            """device i's message of the stage"""
            return fleet.ids[i] in messages(fleet.c.db, study, stage)
        wait_for(sent)
        fleet.daemons[i].send_signal(signal.SIGSTOP)


def fail_with(fleet: Fleet, study: str, stopped: list[int], stage: str) -> None:
    """Wait until the study failed (at ``stage``), then let the stopped daemons go on."""
    try:
        assert wait_ended(fleet.c.db, study) == "failed"
    finally:
        for i in stopped:
            fleet.daemons[i].send_signal(signal.SIGCONT)
    detail = query(fleet.c.db, "SELECT detail FROM studies WHERE study_id = ?", study)[0][0]
    assert f"aborted at {stage}" in detail, detail


def test_an_abort_at_consistency_gives_every_epsilon_back(fleet):
    """The committee member stops after its masked input: all four sent theirs, the round
    aborts at CONSISTENCY, every device (the stopped one once it goes on) signs the abort and
    gets a certificate: 0 ε net everywhere, and the coordinator counts the round against
    nobody, though it kept all four charges when the round ended."""
    study = create(fleet)
    c = committee(fleet, study)
    stop_after(fleet, study, pb.MASKED_INPUT, [c])
    fail_with(fleet, study, [c], "CONSISTENCY")
    for i in range(DEVICES):
        settled(fleet, i, study)
        given_back(fleet, i, study)
    assert charged(fleet, study) == set(fleet.ids)
    assert counted(fleet, study) == set()


def test_an_abort_at_unmask_before_t_shares(fleet):
    """Two devices stop after their CONSISTENCY signature: the other two send their UNMASK
    shares, 2 of each seed, fewer than t = 3, and the round aborts at UNMASK. The two that sent
    shares sign nothing and keep their spends (logged); the two stopped ones sign and hold a
    certificate from 2 holders of their shares (themselves), need(4, 3, 0) = 2: given back."""
    study = create(fleet)
    stopped = [2, 3]
    stop_after(fleet, study, pb.CONSISTENCY, stopped)
    fail_with(fleet, study, stopped, "UNMASK")
    for i in range(DEVICES):
        settled(fleet, i, study)
    for i in stopped:
        given_back(fleet, i, study)
    for i in (0, 1):
        stands(fleet, i, study)
        assert f"study {study}: the device computed its UNMASK shares" in \
            (fleet.folder / f"device{i}.log").read_text()
    assert counted(fleet, study) == {fleet.ids[0], fleet.ids[1]}


def test_too_few_holders_sign_and_the_spend_stands(fleet):
    """Three devices, the committee member among them, stop after their masked inputs; the
    round aborts at CONSISTENCY; the fourth signs alone, 1 of the 2 statements it needs, and
    once the coordinator's collection is final (two stage timeouts) its spend stands, logged.
    The three sign when they go on: each holds 4 statements, and gets its ε back."""
    study = create(fleet)
    c = committee(fleet, study)
    alone = next(i for i in range(DEVICES) if i != c)
    stopped = [i for i in range(DEVICES) if i != alone]
    stop_after(fleet, study, pb.MASKED_INPUT, stopped)
    try:
        assert wait_ended(fleet.c.db, study) == "failed"
        # the coordinator's collection is final two stage timeouts (30 s) after the first
        # statement, the lone device's: five times that as the bound
        settled(fleet, alone, study, timeout=10 * TIMEOUT)
    finally:
        for i in stopped:
            fleet.daemons[i].send_signal(signal.SIGCONT)
    stands(fleet, alone, study)
    assert f"study {study}: the certificate of abort holds 1 of the 2 holders' statements " \
        "needed, and the coordinator collects no more" in \
        (fleet.folder / f"device{alone}.log").read_text()
    for i in stopped:
        settled(fleet, i, study)
        given_back(fleet, i, study)
    assert counted(fleet, study) == {fleet.ids[alone]}
