"""``simulate --secure-aggregation --validation helper``: the simulator starts a helper process
(its own TLS identity, SQLite file and token) beside its coordinator; a hostile device that
proves an inflated or random input is excluded, the study publishes, and its relative SSE stays
within the honest runs' spread (issue 32, must-show 1, at a small size)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedsketch.server.sim.config import SimConfig
from fedsketch.server.sim.simulate import run_simulation

#: Six devices, D = 2 of them may drop out (so one excluded device leaves L − D), ε = 5 so that
#: the comparison is of the data, not of the noise; the stage timeout is generous, a stage
#: closes as soon as every device has sent.
SMALL = dict(devices=6, records=6000, k=3, d=2, m=200, rounds=0, epsilon=5.0,
             secure_aggregation=True, max_dropout=0.3, stage_timeout=300.0, validation="helper")


@pytest.fixture(scope="module")
def honest():
    return run_simulation(SimConfig(**SMALL))


def test_an_honest_validated_study_publishes_every_report(honest):
    assert honest["validation"] == {"valid": 6, "excluded": []}
    assert honest["hostile"] is None and honest["relative_sse"] < 1.5


@pytest.mark.parametrize("kind", ["inflate", "random"])
def test_a_hostile_prover_is_excluded_and_the_result_stays(honest, kind):
    report = run_simulation(SimConfig(**SMALL, hostile=f"1:{kind}"))
    assert report["validation"] == {"valid": 5, "excluded": [5]}
    defended = report["hostile"]
    assert defended["defence"] == "excluded" and list(defended["excluded"]) == ["5"]
    # At this size one run's relative SSE varies with its fresh noise: 13 honest runs of SMALL
    # (CKM alone, one and three replicates) scored 1.005-1.066, so two runs can differ by 0.06
    # (a fresh-clone run: honest 1.005, hostile 1.057). The bound is that spread's top and a
    # margin; an input let through (inflate: 95 % of the weight at one point; random words)
    # scores far above it. The "within 0.02" is measured at 20 devices (RESULTS.md).
    assert report["relative_sse"] is not None and honest["relative_sse"] <= 1.10
    assert report["relative_sse"] <= 1.10, (report["relative_sse"], honest["relative_sse"])


def test_device_daemons_as_processes_prove_and_are_counted():
    """`fedsketch device run` processes (with a δ budget) prove their inputs, upload to the
    helper process and are all counted."""
    report = run_simulation(SimConfig(**SMALL, processes=True))
    assert report["validation"] == {"valid": 6, "excluded": []}
    assert report["relative_sse"] is not None and report["devices"] == 6


def test_the_report_gives_each_stages_coordinator_cpu_and_the_bytes_each_way(honest):
    """The report's costs (what benchmarks/bench_validated_cost.py reads): the coordinator's CPU
    seconds in each stage it ran, the bytes the devices sent and the bytes routed to them. A
    validated round routes nothing to a device and its coordinator does its work at MASKED_INPUT
    (preparing every report's leader share), a SecAgg+ round of the same study routes keys,
    shares and the survivor list."""
    secagg = run_simulation(SimConfig(**{**SMALL, "validation": None}))
    stages = {"validated": ["REGISTER", "MASKED_INPUT"],
              "secagg": ["REGISTER", "ADVERTISE_KEYS", "SHARE_KEYS", "MASKED_INPUT", "CONSISTENCY",
                         "UNMASK"]}
    for name, report in (("validated", honest), ("secagg", secagg)):
        sa = report["secure_aggregation"]
        assert list(sa["stage_seconds"]) == stages[name]
        assert all(sa["stage_cpu_seconds"].get(s, 0.0) > 0.0 for s in stages[name]), sa
    cpu = honest["secure_aggregation"]["stage_cpu_seconds"]
    assert cpu["MASKED_INPUT"] > 2 * cpu["REGISTER"], cpu
    assert honest["bytes_received"] == 0 and secagg["bytes_received"] > 6 * 100
    # a validated device sends its leader share: its encoded input and proofs, field elements of
    # 4 bytes (107 kB here, measured), many times SecAgg+'s whole round (7.6 kB)
    assert honest["bytes_sent"] > 6 * 50_000 > 2 * secagg["bytes_sent"]


def test_the_simulate_table_shows_each_stage_and_the_bytes_routed():
    """`fedsketch simulate`'s table (not --json) has a row per stage the round ran with the
    coordinator's CPU, open and closing seconds, and the bytes routed to the devices (none in a
    validated study)."""
    out = subprocess.run(
        [str(Path(sys.executable).with_name("fedsketch")), "simulate", "--devices", "4",
         "--records", "4000", "--k", "2", "--d", "2", "--m", "50", "--rounds", "0",
         "--secure-aggregation", "--validation", "helper", "--stage-timeout", "300"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in out.stdout.splitlines() if line.count("│") == 3}
    assert rows["bytes routed to the devices"] == "0"
    stages = [name for name in rows if name.startswith("coordinator at ")]
    assert stages == ["coordinator at REGISTER: CPU s; open s; closing s",
                      "coordinator at MASKED_INPUT: CPU s; open s; closing s"], rows
    cpu, opened, closing = (float(v) for v in rows[stages[1]].split(";"))
    assert cpu > 0 and opened > 0 and closing > 0
