"""The operator's view over real processes: ``fedsketch coordinator serve --log-format json`` and
``fedsketch device run`` over TLS on loopback. Devices register, contribute, and one with too
little budget refuses and says so (a reason code); ``status``, ``audit`` and ``list`` show it all
in JSON, ``close`` of a study whose quorum never registered exits 4, and the serve log holds one
JSON line per event."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from test_round_processes import CoordinatorProcess, cli
from test_round_processes import device_files as device_files  # a module-scoped fixture

pytestmark = pytest.mark.slow


@pytest.fixture
def coordinator(tmp_path, cli_certs):
    c = CoordinatorProcess(tmp_path, cli_certs, "--log-format", "json")
    c.start()
    yield c
    if c.proc.poll() is None:
        c.kill()


def create(c: CoordinatorProcess, name: str, quorum: int, roster: int) -> str:
    return c.op("create-study", "--name", name, "--d", "3", "--k", "3", "--bounds", "-12:12",
                "--rounds", "0", "--scale", "1.5", "--epsilon", "5", "--m", "60", "--r", "60",
                "--min-devices", str(quorum), "--roster", str(roster),
                "--replicates", "2").stdout.strip()


def run_device(c: CoordinatorProcess, data, ledger, label: str, budget: float,
               token: str | None = None) -> None:
    cli("device", "run", "--coordinator", c.target, "--ca", str(c.certs / "ca.pem"), "--data",
        str(data), "--ledger", str(ledger), "--budget", str(budget), "--label", label, "--once",
        *(["--token", token] if token else []))


def test_status_audit_list_close_and_the_event_log_show_what_devices_did(coordinator, tmp_path,
                                                                           device_files):
    c = coordinator
    done, fails = create(c, "fills", 2, 3), create(c, "never", 5, 5)
    tokens = c.op("tokens", "--count", "3").stdout.split()
    ledgers = [tmp_path / f"l{i}" for i in range(3)]
    run_device(c, device_files[0], ledgers[0], "clinic-a", 10, tokens[0])  # joins both
    run_device(c, device_files[1], ledgers[1], "clinic-b", 10, tokens[1])  # fills, sends
    run_device(c, device_files[2], ledgers[2], "clinic-c", 1, tokens[2])   # ε 5 > budget 1
    run_device(c, device_files[0], ledgers[0], "clinic-a", 10)             # sends
    ids = {}
    for doc in (json.loads(c.op("status", s, "--json").stdout) for s in (done, fails)):
        ids[doc["study_id"]] = doc
    a, b = ids[done], ids[fails]
    assert (a["state"], a["stage"], a["registered"], a["quorum"], a["roster"],
            a["contributions"]) == ("COLLECTING", "PLAIN_INPUT", 2, 2, 3, 2)
    assert [(d["label"], d["contributed_at"] is not None) for d in a["devices"]] == [
        ("clinic-a", True), ("clinic-b", True)]
    assert a["devices"][0]["registered_at"] <= a["devices"][1]["registered_at"]
    assert a["epsilon"] == 5 and a["collect_seconds"] == 3600 and a["deadline"] > a["created_at"]
    assert a["window_ends_at"] == pytest.approx(a["filled_at"] + 3600)
    refused = [(f["label"], f["reason"]) for f in a["refusals"]]
    assert refused == [("clinic-c", "BUDGET")] and a["refused"] == 1
    assert (b["stage"], b["registered"], b["contributions"], b["filled_at"], b["window_ends_at"]) == (
        "REGISTER", 2, 0, None, None)
    assert [(f["label"], f["reason"]) for f in b["refusals"]] == [("clinic-c", "BUDGET")]
    text = c.op("status", done).stdout
    assert "BUDGET" in text and "clinic-c" in text and "2 registered of 2 needed" in text

    listed = {s["study_id"]: s for s in json.loads(c.op("list", "--json").stdout)}
    assert (listed[fails]["registered"], listed[fails]["quorum"], listed[fails]["roster"]) == (2, 5, 5)
    assert listed[done]["contributions"] == 2 and listed[done]["state"] == "COLLECTING"

    closed = c.op("close", fails, check=False)  # its quorum never registered
    assert closed.returncode == 4 and "FAILED" in closed.stdout, closed
    closed = c.op("close", done, "--wait", "120")
    assert "DONE" in closed.stdout
    assert c.op("close", done, check=False).returncode == 1  # already done: refused

    audit = json.loads(c.op("audit", "--study", fails, "--json").stdout)
    actions = Counter(e["action"] for e in audit)
    assert actions == {"create_study": 2, "register": 2, "refuse": 1, "request_close": 1,
                       "set_state": 1}, actions
    assert all(fails in e["detail"] for e in audit)
    assert len(json.loads(c.op("audit", "--limit", "3", "--json").stdout)) == 3

    assert c.terminate() == 0
    lines = [json.loads(line) for line in c.log.read_text().splitlines()]
    events = Counter((e["event"], e.get("study"), e.get("state") or e.get("reason"))
                     for e in lines if "event" in e)
    assert events == {
        ("create", done, None): 1, ("create", fails, None): 1,
        ("enroll", None, None): 3,
        ("register", done, None): 2, ("register", fails, None): 2,
        ("contribute", done, None): 2,
        ("refusal", done, "budget"): 1, ("refusal", fails, "budget"): 1,
        ("state", done, "collecting"): 1,
        ("closing", done, "closed by the operator"): 1,
        ("closing", fails, "closed by the operator"): 1,
        ("state", fails, "failed"): 1, ("state", done, "decoding"): 1, ("state", done, "done"): 1,
    }, events
    assert all({"ts", "level", "logger"} <= e.keys() for e in lines)
    assert not any("payload" in json.dumps(e) for e in lines)
