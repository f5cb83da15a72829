"""Group commit (``server/store/group_commit.py``, ``server/store/contributing.py``): Submits
queued while a commit is in flight share the next transaction, and each keeps the outcome it
would have had alone, in arrival order: a duplicate, a conflict, a device off the roster, a
declared budget, a closed or closing study refuse exactly that Submit and leave the others of
its batch stored. On each backend (SQLite, and PostgreSQL on the tests' own server)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from conftest import study_spec
from test_store import contribution, enroll, payload

from fedsketch.common.net import signing
from fedsketch.common.study import wire
from fedsketch.server.service.coordinator import Coordinator
from fedsketch.server.service.messages import Submission
from fedsketch.server.store import SQLiteStore, StoreError
from fedsketch.server.store.group_commit import GroupCommit


def queued(store, row) -> bool:
    return any(w.item is row for q in list(store._group._queues.values()) for w in list(q))


def test_queued_submits_share_one_commit_and_keep_their_own_outcomes(store):
    a, b, c, d, e, f = (enroll(store, i) for i in range(1, 7))
    store.add_tokens(["tok-budget"])
    g = store.enroll("tok-budget", b"k" * 32, "budget", budget=(1.5, 0.0))

    def costly(row, epsilon):
        return row.__class__(row.study_id, row.device_id, row.n, row.kind, row.payload,
                             row.payload_sha256, row.signature, row.received_at, epsilon, 0.0)

    for study, roster in (("s", (a, b, d, e)), ("t", (g,)), ("u", (g,)), ("x", (e,)), ("w", (f,))):
        store.create_study(study, "{}", "0" * 64, None, 1, roster=len(roster))
        for device in roster:
            store.register(study, device)
    assert store.add_contribution(costly(contribution("t", g, payload(40)), 1.0))
    store.set_state("x", "failed")
    store.request_close("w", "operator")

    first = contribution("s", e, payload(5), n=5.0)
    rows = [
        contribution("s", a, payload(1), n=1.0),  # stored
        contribution("s", a, payload(1), n=1.0),  # the same bytes again, in the same batch
        contribution("s", b, payload(2), n=2.0),  # stored
        contribution("s", b, payload(3), n=2.0),  # other bytes of the same device
        contribution("s", c, payload(4)),  # not on the roster
        costly(contribution("u", g, payload(41)), 1.0),  # 1 + 1 > the declared 1.5
        contribution("x", e, payload(6)),  # a failed study
        contribution("w", f, payload(7)),  # a closing study, no ticket
        contribution("s", d, payload(8), n=8.0),  # stored, after all the refusals
    ]
    expected = [True, False, True, "conflict", "permission_denied", "failed_precondition",
                "failed_precondition", "failed_precondition", True]

    batches: list[int] = []
    gate = threading.Event()
    commit = store._group._commit

    def gated(key, items):
        if not batches:
            batches.append(len(items))
            assert gate.wait(60)
        else:
            batches.append(len(items))
        return commit(key, items)

    store._group._commit = gated
    outcomes: dict[int, object] = {}
    counts: dict[int, int | None] = {}  # the study's contributions after each, as contribute says

    def send(i: int, row) -> None:
        try:
            outcomes[i], after = store.contribute(row)
            counts[i] = None if after is None else after.contributions
        except StoreError as exc:
            outcomes[i] = exc.code

    opener = threading.Thread(target=send, args=(-1, first))
    opener.start()
    stop = time.monotonic() + 30
    while not batches:  # the first commit is in flight (held at the gate)
        assert time.monotonic() < stop
        time.sleep(0.005)
    threads = []
    for i, row in enumerate(rows):
        threads.append(threading.Thread(target=send, args=(i, row)))
        threads[-1].start()
        while not (queued(store, row) or i in outcomes):  # in arrival order
            assert time.monotonic() < stop
            time.sleep(0.002)
    gate.set()
    for t in (opener, *threads):
        t.join(60)
    assert outcomes == {-1: True, **dict(enumerate(expected))}
    assert counts == {-1: 1, 0: 2, 1: None, 2: 3, 8: 4}  # each stored one sees the ones before it
    assert batches[0] == 1
    # every Submit of study s queued behind the gate went into one commit (on SQLite the other
    # studies' too: one writer); on PostgreSQL the other studies commit apart, keyed by study
    assert max(batches) >= (len(rows) if store._batch_key("x") == store._batch_key("s") else 6)

    stored = {(r.device_id, r.payload) for r in store.contributions("s")}
    assert stored == {(e, payload(5)), (a, payload(1)), (b, payload(2)), (d, payload(8))}
    row = store.get_study("s")
    assert (row.contributions, row.records, row.state) == (4, 16.0, "collecting")
    assert [r.study_id for r in store.contributions("u")] == []
    assert store.contributions("x") == [] and store.contributions("w") == []
    assert [x[2] for x in store.audit_log(1000)].count("contribute") == 5  # with the earlier spend


def test_a_failed_commit_fails_every_submit_of_its_batch_and_the_next_batch_goes_on():
    """The transaction of a batch fails (a fault of the disk or server): every caller of the
    batch gets the error, none is told 'stored', and the callers queued after it commit."""
    calls: list[list[int]] = []
    gate = threading.Event()

    def commit(key, items):
        calls.append(list(items))
        if len(calls) == 1:
            assert gate.wait(30)
        if len(calls) == 2:
            raise OSError("disk full")
        return [i * 10 for i in items]

    group = GroupCommit(commit)
    results: dict[int, object] = {}

    def send(i: int) -> None:
        try:
            results[i] = group.submit("k", i)
        except OSError as exc:
            results[i] = str(exc)

    threads = [threading.Thread(target=send, args=(0,))]
    threads[0].start()
    stop = time.monotonic() + 30
    while not calls:
        assert time.monotonic() < stop
        time.sleep(0.002)
    for i in (1, 2, 3):
        threads.append(threading.Thread(target=send, args=(i,)))
        threads[-1].start()
        while len(group._queues.get("k", [])) < i:
            assert time.monotonic() < stop
            time.sleep(0.002)
    gate.set()
    for t in threads:
        t.join(30)
    assert calls == [[0], [1, 2, 3]]
    assert results == {0: 0, 1: "disk full", 2: "disk full", 3: "disk full"}
    assert group.submit("k", 4) == 40 and calls[-1] == [4]  # the key is free again
    assert group._queues == {} and group._busy == set()


@pytest.mark.parametrize("limit", [1, 3])
def test_a_batch_takes_at_most_its_limit_in_arrival_order(limit):
    calls: list[list[int]] = []
    gate = threading.Event()

    def commit(key, items):
        calls.append(list(items))
        if len(calls) == 1:
            assert gate.wait(30)
        return list(items)

    group = GroupCommit(commit, limit=limit)
    threads = [threading.Thread(target=group.submit, args=("k", i)) for i in range(8)]
    threads[0].start()
    stop = time.monotonic() + 30
    while not calls:
        assert time.monotonic() < stop
        time.sleep(0.002)
    for i, t in enumerate(threads[1:], 1):
        t.start()
        while len(group._queues.get("k", [])) < i:
            assert time.monotonic() < stop
            time.sleep(0.002)
    gate.set()
    for t in threads:
        t.join(30)
    assert calls[0] == [0]
    assert [x for c in calls for x in c] == list(range(8))
    assert all(len(c) <= limit for c in calls) and len(calls) == 1 + -(-7 // limit)


def test_a_submit_reads_nothing_from_the_store_before_its_write(tmp_path):
    """A SQLite store has one connection: a read waits while a commit is in flight. So that the
    Submits behind a commit do their signature and payload checks meanwhile, a started
    coordinator holds the enrolled keys (read once at start, or kept at enrollment) and the spec
    hashes: a Submit's first statement is its batch's BEGIN, and the study after it comes from
    that transaction (no read after it either)."""
    store = SQLiteStore(tmp_path / "store.db")
    spec = study_spec(min_devices=2, roster=4, deadline=time.time() + 3600)
    keys = [signing.new_private_key() for _ in range(3)]
    devices = []
    for i, key in enumerate(keys[:2]):  # enrolled before the coordinator starts
        store.add_tokens([f"tok-{i}"])
        devices.append(store.enroll(f"tok-{i}", signing.public_key(key), f"device {i}"))
    coordinator = Coordinator(store)
    coordinator.start()
    try:
        store.add_tokens(["tok-2"])  # enrolled through the coordinator
        devices.append(coordinator.enroll("tok-2", signing.public_key(keys[2]), "device 2"))
        study = coordinator.create(spec.to_json())
        for device in devices:
            store.register(study.study_id, device)
        coordinator.spec_hash(study.study_id)  # as a Register through the coordinator reads it
        statements: list[tuple[str, str]] = []
        store._conn.set_trace_callback(lambda s: statements.append((threading.current_thread().name, s)))
        m = spec.sketch.frequencies.m
        for i, (key, device) in enumerate(zip(keys, devices, strict=True)):
            data = np.full(2 * m, i, dtype="<i8").tobytes()
            digest = signing.contribution_digest(study.study_id, device, 100.0, study.spec_sha256, data)
            sub = Submission(study.study_id, device, 100.0, study.spec_sha256, wire.KINDS["complex"],
                             data, signing.sign(key, digest))
            mine = threading.current_thread().name
            start = len(statements)
            assert coordinator.submit(sub)[0] is False
            ran = [s for name, s in statements[start:] if name == mine]
            assert ran[0] == "BEGIN IMMEDIATE" and ran[-1] == "COMMIT", ran
    finally:
        store._conn.set_trace_callback(None)
        coordinator.stop()
        store.close()
