"""A study's totals (contributions, records Σn, registered) are kept in its row, in the
transaction that changes them: they equal a recount of the rows after any mix of writes, a
restart, a migration from schema 4 and a SIGKILL (on each backend, but the migration), and the
Submit and poll paths read them without counting rows (the statements the store runs are traced
on its own SQLite connection)."""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import study_spec
from test_store import back_to_schema_4, contribution, enroll, payload, refusal

from fedsketch.common.net import signing
from fedsketch.common.study import wire
from fedsketch.server.service.coordinator import Coordinator
from fedsketch.server.service.messages import Submission
from fedsketch.server.store import SQLiteStore, open_store
from fedsketch.server.store.schema import OUTSTANDING_SQL

RECOUNT = """SELECT s.study_id,
    (SELECT COUNT(*) FROM contributions AS c WHERE c.study_id = s.study_id),
    (SELECT COALESCE(SUM(c.n), 0.0) FROM contributions AS c WHERE c.study_id = s.study_id),
    (SELECT COUNT(*) FROM registrations AS r WHERE r.study_id = s.study_id)
FROM studies AS s ORDER BY s.study_id"""


def recounted(where) -> list[tuple]:
    """(study, contributions, records, registered) of every study, counted from the rows by a
    store of its own on ``where`` (a path or URL)."""
    store = open_store(where)
    try:
        return store._query(RECOUNT)
    finally:
        store.close()


def totals(store) -> list[tuple]:
    return sorted((r.study_id, r.contributions, r.records, r.registered) for r in store.list_studies())


def test_totals_equal_a_recount_after_every_kind_of_write_and_a_restart(store_url):
    path = store_url
    store = open_store(path)
    devs = [enroll(store, i) for i in range(6)]
    store.create_study("s", "{}", "0" * 64, None, 2, roster=5)
    store.create_study("t", "{}", "1" * 64, None, 1)
    for d in devs[:5]:
        store.register("s", d)
    store.register("t", devs[0])
    assert store.register("s", devs[0]) == (False, store.get_study("s"))  # again: not counted twice
    assert refusal(store.register, "s", devs[5]).code == "failed_precondition"  # full roster
    assert store.leave("s", devs[4])[0] and not store.leave("s", devs[4])[0]  # a second leave: no-op
    assert store.add_contribution(contribution("s", devs[0], payload(0), n=7.0))
    assert store.add_contribution(contribution("s", devs[1], payload(1), n=-2.0))  # a noisy count
    assert not store.add_contribution(contribution("s", devs[0], payload(0), n=7.0))  # identical re-send
    assert refusal(store.add_contribution, contribution("s", devs[0], payload(9), n=7.0)).code == "conflict"
    assert refusal(store.add_contribution, contribution("s", devs[5], payload(5))).code == "permission_denied"
    assert refusal(store.leave, "s", devs[1]).code == "failed_precondition"  # it contributed
    assert store.ticket("s", devs[2], 60.0) == 60.0
    assert refusal(store.leave, "s", devs[2]).code == "aborted"  # it holds a ticket
    assert store.add_contribution(contribution("t", devs[0], payload(3), n=1000.0))
    store.set_state("t", "decoding")
    assert refusal(store.add_contribution, contribution("t", devs[1], payload(4))).code in (
        "permission_denied", "failed_precondition")
    expected = [("s", 2, 5.0, 4), ("t", 1, 1000.0, 1)]
    assert totals(store) == recounted(path) == expected
    store.close()

    store = open_store(path)  # a restart reads them back as written
    try:
        assert totals(store) == recounted(path) == expected
        assert store.register("s", devs[5])[1].registered == 5  # the freed place is taken
        assert store.add_contribution(contribution("s", devs[5], payload(5), n=0.5))
        assert totals(store) == recounted(path) == [("s", 3, 5.5, 5), ("t", 1, 1000.0, 1)]
    finally:
        store.close()


def test_a_schema_4_store_is_migrated_with_its_totals_counted_once(tmp_path):
    path = tmp_path / "store.db"
    store = open_store(path)
    a, b, c = enroll(store, 1), enroll(store, 2), enroll(store, 3)
    store.create_study("s", "{}", "0" * 64, None, 2, roster=3)
    store.create_study("empty", "{}", "1" * 64, None, 2)
    for d in (a, b, c):
        store.register("s", d)
    store.add_contribution(contribution("s", a, payload(1), n=10.0))
    store.add_contribution(contribution("s", b, payload(2), n=32.0))
    store.close()
    raw = sqlite3.connect(path)
    back_to_schema_4(raw)
    raw.commit()
    assert "contributed" not in [col[1] for col in raw.execute("PRAGMA table_info(studies)")]
    raw.close()

    store = open_store(path)
    try:
        assert totals(store) == recounted(path) == [("empty", 0, 0.0, 0), ("s", 2, 42.0, 3)]
        assert store.add_contribution(contribution("s", c, payload(3), n=1.0))
        assert totals(store) == recounted(path) == [("empty", 0, 0.0, 0), ("s", 3, 43.0, 3)]
        assert [e[3] for e in store.audit_log() if "studies keep their totals" in e[3]] == [
            "store schema 4 -> 5: studies keep their totals "
            "(contributions, records, registered)"]
    finally:
        store.close()


def traced(store: SQLiteStore, statements: list[str]) -> None:
    """Record every statement the store's connection runs."""
    store._conn.set_trace_callback(statements.append)


#: A statement that counts or sums rows (of contributions, or of a roster).
COUNTING = re.compile(r"\b(COUNT|SUM|TOTAL)\s*\(", re.IGNORECASE)


def test_submit_and_polls_read_the_totals_and_count_no_rows(tmp_path):
    """Through the coordinator's own Submit (signature, payload check, store) and its polls
    (ListStudies, GetStudy, the watcher's close check): no statement counts or sums rows, and no
    statement reads the contributions other than by one (study, device) key."""
    store = SQLiteStore(tmp_path / "store.db")
    coordinator = Coordinator(store)
    try:
        spec = study_spec(min_devices=2, roster=4, deadline=time.time() + 3600)
        study = coordinator.create(spec.to_json())
        keys = [signing.new_private_key() for _ in range(3)]
        devices = []
        for i, key in enumerate(keys):
            store.add_tokens([f"tok-{i}"])
            devices.append(store.enroll(f"tok-{i}", signing.public_key(key), f"device {i}"))
            store.register(study.study_id, devices[-1])
        m = spec.sketch.frequencies.m
        statements: list[str] = []
        traced(store, statements)
        for i, (key, device) in enumerate(zip(keys, devices, strict=True)):
            data = np.full(2 * m, i, dtype="<i8").tobytes()
            digest = signing.contribution_digest(study.study_id, device, 100.0, study.spec_sha256, data)
            sub = Submission(study.study_id, device, 100.0, study.spec_sha256, wire.KINDS["complex"], data,
                             signing.sign(key, digest))
            assert coordinator.submit(sub)[0] is False
            assert coordinator.submit(sub)[0] is True  # an identical re-send: acknowledged again
            row = coordinator.study(study.study_id)
            assert (row.contributions, row.records, row.registered) == (i + 1, 100.0 * (i + 1), 3)
            assert [r.contributions for r in coordinator.studies(include_closed=True)] == [i + 1]
        assert coordinator.study(study.study_id).close_due(time.time(), spec.collect_seconds) is None
        assert statements, "the trace saw nothing"
        assert [s for s in statements if COUNTING.search(s)] == []
        reads = [s for s in statements if re.search(r"\bFROM\s+contributions\b", s)]
        assert reads and all(re.search(r"WHERE study_id = \S+ AND device_id = ", s) for s in reads)

        # the close check counts only the live tickets, through their index
        plan = store._conn.execute("EXPLAIN QUERY PLAN " + OUTSTANDING_SQL, (study.study_id, time.time()))
        assert "registrations_by_ticket" in " ".join(str(r) for r in plan.fetchall())
    finally:
        store._conn.set_trace_callback(None)
        coordinator.stop()
        store.close()


CHILD = """
import hashlib, sys, time
from fedsketch.server.store import ContributionRow, open_store
store = open_store(sys.argv[1])
store.create_study("s", "{}", "0" * 64, None, 1, roster=100000)
for i in range(100000):
    store.add_tokens([f"tok-{i}"])
    dev = store.enroll(f"tok-{i}", hashlib.sha256(b"key%d" % i).digest(), "d")
    store.register("s", dev)
    data = hashlib.sha256(b"payload%d" % i).digest() * 64
    row = ContributionRow("s", dev, float(i), "int32_pairs", data, hashlib.sha256(data).hexdigest(),
                          b"s", time.time())
    assert store.add_contribution(row)
    print(f"acked {i}", flush=True)
"""


def test_a_sigkill_cannot_split_a_contribution_from_its_totals(store_url):
    """A writer of one study killed mid-stream: the totals equal the recount of what it stored
    (at least every acknowledged contribution), since each is in its row's transaction."""
    path = store_url
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(30, proc.kill)
    watchdog.start()
    try:
        acked = 0
        while acked < 60:
            line = proc.stdout.readline()
            assert line, f"child ended early: {proc.stderr.read()}"
            acked += 1
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        acked += len(proc.stdout.read().splitlines())
    finally:
        watchdog.cancel()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    store = open_store(path)
    try:
        [(study, contributed, records, registered)] = recounted(path)
        assert totals(store) == [(study, contributed, records, registered)]
        assert contributed >= acked and registered in (contributed, contributed + 1)
        assert records == pytest.approx(sum(range(contributed)), abs=0)
    finally:
        store.close()
