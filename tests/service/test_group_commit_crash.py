"""Group commit against SIGKILL: a real ``coordinator serve`` (TLS on loopback, SQLite file or
PostgreSQL database) takes signed Submits from many devices at once, so that several share each
commit, and is killed mid-stream while batches are in flight. After the kill every Submit that
was acknowledged is in the store with its bytes, the study's totals equal a recount of its rows
(nothing half-written, nothing counted twice), and after a restart every device's re-send is
either a duplicate (its bytes were already stored: all the acknowledged ones) or stored once."""

from __future__ import annotations

import hashlib
import time

import grpc
import numpy as np
import pytest
from test_round_processes import CoordinatorProcess

from fedsketch.common.net import signing
from fedsketch.common.net.tls import secure_channel
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.study import StudySpec, spec_sha256
from fedsketch.server.store import open_store

pytestmark = pytest.mark.slow

DEVICES = 96
M = 60
STUDY = "st-crash"
RECOUNT = ("SELECT COUNT(*), COALESCE(SUM(n), 0.0) FROM contributions WHERE study_id = ?")


def filled(where: str) -> list[pb.Contribution]:
    """A study whose roster holds DEVICES enrolled devices (one place more: it never closes), none
    contributed yet, written
    through the Store API; one signed Submit per device."""
    spec = StudySpec.create("crash", SketchSpec(FrequencySpec(d=3, m=M, scale=2.0), "complex", 1,
                                                PrivacySpec(1.0)), 3, [-15.0] * 3, [15.0] * 3,
                            min_devices=2, roster=DEVICES + 1, deadline=time.time() + 3600)
    text = spec.to_json()
    digest = spec_sha256(text)
    store = open_store(where)
    rng = np.random.default_rng(7)
    msgs = []
    try:
        store.create_study(STUDY, text, digest, spec.deadline, spec.min_devices, roster=spec.roster)
        store.add_tokens([f"tok-{i}" for i in range(DEVICES)])
        for i in range(DEVICES):
            key = signing.new_private_key()
            device = store.enroll(f"tok-{i}", signing.public_key(key), f"device {i}")
            store.register(STUDY, device)
            data = rng.integers(-10**4, 10**4, 2 * M).astype("<i8").tobytes()
            n = float(100 + i)
            sig = signing.sign(key, signing.contribution_digest(STUDY, device, n, digest, data))
            msgs.append(pb.Contribution(study_id=STUDY, device_id=device, spec_sha256=digest, n=n,
                                        int64_pairs=data, signature=sig))
    finally:
        store.close()
    return msgs


def check_store(where: str, msgs: list[pb.Contribution], acked: set[str]) -> int:
    """Every acknowledged Submit is stored with its bytes; the totals equal a recount; each
    stored contribution is audited once. Returns how many are stored."""
    by_device = {m.device_id: m for m in msgs}
    store = open_store(where)
    try:
        rows = store.contributions(STUDY)
        stored = {r.device_id: r for r in rows}
        assert len(stored) == len(rows)  # one per device
        for device in acked:
            row = stored[device]
            assert row.payload == by_device[device].int64_pairs
            assert row.payload_sha256 == hashlib.sha256(by_device[device].int64_pairs).hexdigest()
            assert row.n == by_device[device].n
        study = store.get_study(STUDY)
        [(count, records)] = store._query(RECOUNT, (STUDY,))
        assert (study.contributions, study.records) == (count, records) == (
            len(rows), sum(by_device[d].n for d in stored))
        audited = [a for a in store.audit_log(10 * DEVICES) if a[2] == "contribute"]
        assert sorted(a[1] for a in audited) == sorted(stored)
        return len(rows)
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_coordinator_killed_with_batches_in_flight_keeps_every_acked_submit_once(
        backend, request, tmp_path, cli_certs):
    coordinator = CoordinatorProcess(tmp_path, cli_certs, db_readers=False)
    if backend == "postgres":
        coordinator.db = request.getfixturevalue("postgres_url")
    where = str(coordinator.db)
    msgs = filled(where)
    coordinator.start()
    try:
        channel = secure_channel(coordinator.target, cli_certs / "ca.pem")
        submit = pb_grpc.DeviceStub(channel).Submit
        submit(msgs[0], timeout=60)  # warm: the channel, the coordinator's caches
        futures = [submit.future(m, timeout=60) for m in msgs[1:]]  # all at once: batches form
        acked = {msgs[0].device_id}
        stop = time.monotonic() + 120
        while len(acked) < DEVICES // 4:
            assert time.monotonic() < stop, "too few acknowledgements"
            acked |= {m.device_id for m, f in zip(msgs[1:], futures, strict=True)
                      if f.done() and f.exception() is None}
            time.sleep(0.001)
        coordinator.kill()
        for m, f in zip(msgs[1:], futures, strict=True):  # acks that arrived before the kill
            try:
                f.result(timeout=60)
                acked.add(m.device_id)
            except grpc.RpcError:
                pass
        channel.close()
    finally:
        if coordinator.proc.poll() is None:
            coordinator.kill()
    assert len(acked) < DEVICES, "the kill came after every Submit: nothing was in flight"
    before = check_store(where, msgs, acked)
    assert before >= len(acked)

    coordinator.start()  # every device sends again, as a device whose ack was lost does
    try:
        channel = secure_channel(coordinator.target, cli_certs / "ca.pem")
        submit = pb_grpc.DeviceStub(channel).Submit
        replies = [f.result(timeout=60) for f in [submit.future(m, timeout=60) for m in msgs]]
        channel.close()
    finally:
        coordinator.terminate()
    stored_before = {m.device_id for m, r in zip(msgs, replies, strict=True) if r.duplicate}
    assert acked <= stored_before and len(stored_before) == before
    assert all(r.receipt == hashlib.sha256(m.int64_pairs).hexdigest()
               for m, r in zip(msgs, replies, strict=True))
    assert check_store(where, msgs, {m.device_id for m in msgs}) == DEVICES
