"""A ``--bounds auto`` study as real processes: ``fedsketch coordinator serve`` and ``fedsketch
device run --once``, a device SIGKILLed between its box-round ledger commit and its send, and
the coordinator SIGKILLed once the boxed study is open. The re-send is byte-identical, the box
round is spent once and read once (one boxed study), the boxed study carries the box read
from the devices' noisy histograms, the study ends DONE with a box that holds the bulk of the
records, and every ledger is charged the spec's ε exactly once, the box's share included."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
import test_round_processes as processes
from test_refine_processes import rounds_of, stored
from test_round_processes import cli_here, device, wait_done

from fedsketch.client.ledger import Ledger

pytestmark = pytest.mark.slow

coordinator = processes.coordinator
device_files = processes.device_files


def test_box_round_as_processes_resends_after_a_kill_and_charges_once(coordinator, tmp_path,
                                                                      device_files):
    c = coordinator
    base = ("create-study", "--name", "auto box", "--d", "3", "--k", "3", "--bounds", "auto",
            "--scale", "auto", "--epsilon", "8", "--m", "60", "--r", "60", "--min-devices", "3",
            "--replicates", "2", "--rounds", "1")
    refused = c.op(*base, "--box-fraction", "1", check=False, here=True)
    assert refused.returncode == 1 and "box round's share of ε must be in (0, 1)" in refused.stderr
    made = c.op(*base, here=True)
    assert "the box round 1.6, round 0 0.64, the sketch" in made.stderr
    study = made.stdout.strip()
    spec = json.loads(c.op("status", study, "--json", here=True).stdout)
    tokens = c.op("tokens", "--count", "3", here=True).stdout.split()
    ledgers = [tmp_path / f"l{i}" for i in range(3)]
    for i in (0, 1):  # join the box round's roster
        device(c, device_files[i], ledgers[i], tokens[i])
    res = device(c, device_files[2], ledgers[2], tokens[2],
                 env={"FEDSKETCH_FAULT": "kill-after-commit"}, check=False)
    assert res.returncode == -signal.SIGKILL  # filled the roster, committed its box release, died
    book = Ledger(ledgers[2])
    committed = book.find(study)
    assert committed is not None and committed.acked_at is None
    assert committed.epsilon == pytest.approx(1.6)  # charged before anything left the device
    book.close()
    restarted = False
    for _ in range(12):  # the box round, the boxed study's round 0, sketch round and round 1
        for i in range(3):
            device(c, device_files[i], ledgers[i])
        if not restarted and rounds_of(c, study):  # the box read, the boxed study open
            c.kill()  # SIGKILL: the restarted coordinator reads the box round back, once
            c.start()
            restarted = True
        if c.has_result(study):
            break
    assert restarted
    assert stored(c, study)[Ledger(ledgers[2]).identity().device_id] == committed.payload
    result = wait_done(c, study, here=True)
    box = result["box"]
    assert box["epsilon"] == pytest.approx(1.6) and box["explanation"].startswith("a private box")
    lo, hi = np.array(box["lo"]), np.array(box["hi"])
    x = np.concatenate([np.load(p) for p in device_files])
    outside = np.mean((x < lo) | (x > hi), axis=0)
    assert np.all(outside <= 0.02), outside  # the bulk of every column is inside
    q = np.quantile(x, [0.005, 0.995], axis=0)
    assert np.all(hi - lo <= 3 * (q[1] - q[0])), (lo, hi, q)  # and the box is not the grid's span
    (boxed,) = rounds_of(c, study)
    inner = json.loads(boxed.spec_json)
    assert (inner["lo"], inner["hi"]) == (box["lo"], box["hi"]) and inner["outcome"] == box
    assert len(rounds_of(c, boxed.study_id)) == 2  # its sketch round and refinement round 1
    assert result["calibration"]["sigma_hi"] < 100  # σ's range followed the box, not ±2^40
    status = json.loads(c.op("status", study, "--json", here=True).stdout)
    assert status["state"] == "DONE" and status["epsilon"] == pytest.approx(8.0)
    assert status["box"] == box and [(r["round"], r["study_id"], r["state"])
                                     for r in status["rounds"]] == [(-1, boxed.study_id, "DONE")]
    assert f"box round: {box['explanation']}" in c.op("status", study, here=True).stdout
    assert spec["epsilon"] == pytest.approx(8.0)
    for path in ledgers:
        book = Ledger(path)
        spends = book.spends()
        device_id = book.identity().device_id
        book.close()
        assert len(spends) == 4 and {s.parent for s in spends} == {None, study}
        for s in spends:
            assert s.acked_at is not None and stored(c, s.study_id)[device_id] == s.payload
        budget = json.loads(cli_here("device", "budget", "--ledger", str(path), "--json").stdout)
        assert budget["studies"][study]["epsilon"] == pytest.approx(8.0)
        assert budget["studies"][study]["rounds"]["0"] == pytest.approx(1.6)  # the box round
        assert set(budget["studies"][study]["rounds"]) == {"0", "-1", "sketch", "1"}
    assert c.terminate() == 0


def test_secure_box_round_as_daemons_spends_once_across_a_restart(tmp_path, cli_certs):
    """The same study under secure aggregation, with four ``fedsketch device run`` daemons: one
    is SIGKILLed between committing its box-round spend and sending its masked input, and
    started again on its ledger; the box round (its histograms masked, each device's noise
    share added), the boxed study's round 0, its sketch round and refinement round all end, the
    study is DONE with a box that holds the bulk of the records, and every ledger is charged the
    spec's ε once, the box's share under the study in ``device budget``."""
    from test_secure_crash import Fleet

    fleet = Fleet(tmp_path, cli_certs)
    try:
        fleet.restart_device(0, "kill-after-commit")
        study = fleet.c.op(
            "create-study", "--name", "secure auto box", "--d", "3", "--k", "3", "--bounds", "auto",
            "--scale", "auto", "--epsilon", "8", "--m", "60", "--r", "60", "--min-devices", "4",
            "--replicates", "2", "--rounds", "1", "--secure-aggregation", "--max-records", "100000",
            "--max-dropout", "0", "--max-colluders", "0", "--stage-timeout", "120", here=True).stdout.strip()
        assert fleet.daemons[0].wait(timeout=120) == -signal.SIGKILL  # spent, not sent
        book = Ledger(fleet.ledgers[0])
        committed = book.find(study)
        book.close()
        assert committed is not None and committed.epsilon == pytest.approx(1.6)
        fleet.daemons[0] = fleet._daemon(0)
        result = wait_done(fleet.c, study, timeout=600, here=True)
        box = result["box"]
        assert box["epsilon"] == pytest.approx(1.6) and box["draws"] == pytest.approx(1.0)
        lo, hi = np.array(box["lo"]), np.array(box["hi"])
        x = np.concatenate([np.load(tmp_path / f"x{i}.npy") for i in range(4)])
        assert np.all(np.mean((x < lo) | (x > hi), axis=0) <= 0.02)
        q = np.quantile(x, [0.005, 0.995], axis=0)
        assert np.all(hi - lo <= 3 * (q[1] - q[0])), (lo, hi, q)
        for path in fleet.ledgers:
            budget = json.loads(cli_here("device", "budget", "--ledger", str(path), "--json").stdout)
            assert budget["studies"][study]["epsilon"] == pytest.approx(8.0)
            assert budget["studies"][study]["rounds"]["0"] == pytest.approx(1.6)
            assert set(budget["studies"][study]["rounds"]) == {"0", "-1", "sketch", "1"}
    finally:
        fleet.stop()
