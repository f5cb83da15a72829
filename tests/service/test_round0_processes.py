"""A ``--scale auto`` study as real processes: ``fedsketch coordinator serve`` and ``fedsketch
device run --once``, a device SIGKILLed between its round-0 ledger commit and its send. The
re-send is byte-identical, round 0 is spent once, the sketch round carries σ, and the
operator's status and result say how σ was chosen."""

from __future__ import annotations

import json
import signal

import pytest
import test_round_processes as processes
from test_refine_processes import rounds_of, stored
from test_round_processes import cli_here, device, wait_done

from fedsketch.client.ledger import Ledger

pytestmark = pytest.mark.slow

coordinator = processes.coordinator
device_files = processes.device_files


def test_round0_as_processes_resends_after_a_kill_and_chooses_sigma(coordinator, tmp_path,
                                                                     device_files):
    c = coordinator
    base = ("create-study", "--name", "auto", "--d", "3", "--k", "3", "--bounds", "-12:12",
            "--scale", "auto", "--epsilon", "8", "--m", "60", "--r", "60", "--min-devices", "3",
            "--replicates", "2", "--rounds", "0")
    refused = c.op(*base, "--auto-fraction", "1", check=False, here=True)
    assert refused.returncode == 1 and "round 0's share of ε must be in (0, 1)" in refused.stderr
    refused = c.op(*base, "--scale-range", "5:1", check=False, here=True)
    assert refused.returncode == 1 and "--scale-range needs 0 < LO < HI" in refused.stderr
    made = c.op(*base, here=True)
    assert "round 0 0.8, the sketch 7.2" in made.stderr
    study = made.stdout.strip()
    tokens = c.op("tokens", "--count", "3", here=True).stdout.split()
    ledgers = [tmp_path / f"l{i}" for i in range(3)]
    for i in (0, 1):  # join round 0's roster
        device(c, device_files[i], ledgers[i], tokens[i])
    res = device(c, device_files[2], ledgers[2], tokens[2],
                 env={"FEDSKETCH_FAULT": "kill-after-commit"}, check=False)
    assert res.returncode == -signal.SIGKILL  # filled the roster, committed round 0, died
    book = Ledger(ledgers[2])
    committed = book.find(study)
    assert committed is not None and committed.acked_at is None
    book.close()
    for i in range(3):
        device(c, device_files[i], ledgers[i])  # 2 re-sends its stored bytes, 0 and 1 send
    assert stored(c, study)[Ledger(ledgers[2]).identity().device_id] == committed.payload
    for _ in range(2):  # the sketch round, once round 0 is decoded
        for i in range(3):
            device(c, device_files[i], ledgers[i])
        if rounds_of(c, study) and rounds_of(c, study)[0].contributions == 3:
            break
    result = wait_done(c, study, here=True)
    cal = result["calibration"]
    assert 0.1 < cal["sigma"] < 10 and cal["explanation"].startswith(f"σ = {cal['sigma']:.4g}")
    # the range searched follows the box ±12: h/60 : 5h/3
    assert (cal["sigma_lo"], cal["sigma_hi"]) == (pytest.approx(0.2), pytest.approx(20.0))
    (sketch,) = rounds_of(c, study)
    assert json.loads(sketch.spec_json)["sigma"] == cal["sigma"]
    status = json.loads(c.op("status", study, "--json", here=True).stdout)
    assert status["calibration"] == cal and status["epsilon"] == pytest.approx(8.0)
    assert [(r["round"], r["study_id"], r["state"]) for r in status["rounds"]] == [
        (0, sketch.study_id, "DONE")]
    for path in ledgers:
        book = Ledger(path)
        spends = book.spends()
        device_id = book.identity().device_id
        book.close()
        assert sorted((s.study_id, s.parent) for s in spends) == sorted(
            [(study, None), (sketch.study_id, study)])
        for s in spends:
            assert s.acked_at is not None and stored(c, s.study_id)[device_id] == s.payload
        budget = json.loads(cli_here("device", "budget", "--ledger", str(path), "--json").stdout)
        assert budget["studies"][study]["epsilon"] == pytest.approx(8.0)
        assert budget["studies"][study]["rounds"] == {"0": pytest.approx(0.8),
                                                      "sketch": pytest.approx(7.2)}
    assert c.terminate() == 0
