"""Coordinators sharing one PostgreSQL database (``serve --shared``): a study's decoder steps run
under its claim, so two coordinators told at once to decode the same study (one closing it, one
resuming it at start-up) decode it once; the claim waits for its holder, in any process; a study
left decoding with its claim free (its coordinator died) is taken up by a live one, and one whose
claim is held is left to its holder; and coordinators that share a database take up secure
rounds, one a coordinator serving the database alone left running included; the first
contribution's move to collecting is logged by the coordinator that stored it."""

from __future__ import annotations

import hashlib
import logging
import threading
import time

import numpy as np
from conftest import study_spec

from fedsketch.common.net import signing
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import wire as sw
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions
from fedsketch.common.study import wire
from fedsketch.server.service import shared
from fedsketch.server.service.coordinator import Coordinator
from fedsketch.server.service.events import EventStore
from fedsketch.server.service.messages import Submission
from fedsketch.server.service.shared_round import SharedRound
from fedsketch.server.store import Store, open_store
from fedsketch.server.store.base import ContributionRow


def test_a_claim_waits_for_its_holder(store_url):
    """On PostgreSQL in another store (as another process would), on SQLite in another thread
    of the one process that serves the file; either sees it claimed meanwhile."""
    first = open_store(store_url)
    second = open_store(store_url) if store_url.startswith("postgresql") else first
    try:
        order: list[str] = []
        with first.claim("st-1"):
            assert second.claimed("st-1") and not second.claimed("st-2")
            waiter = threading.Thread(target=lambda: second.claim("st-1").__enter__() or order.append("got"))
            waiter.start()
            with second.claim("st-2"):  # another study's claim is free
                order.append("other")
            time.sleep(0.3)
            order.append("released")
        waiter.join(timeout=10)
        assert order == ["other", "released", "got"]
    finally:
        second.close()  # a PostgreSQL store's pooled connection still holds st-1: this ends it
        if second is not first:
            first.close()


def collecting_study(coordinator: Coordinator, store: Store, name: str = "a") -> str:
    """A study holding one device's contribution, of a roster of two (so it does not close)."""
    spec = study_spec(min_devices=1, roster=2, deadline=time.time() + 3600, name=name)
    study = coordinator.create(spec.to_json()).study_id
    key = signing.new_private_key()
    store.add_tokens([f"tok-{name}"])
    device = store.enroll(f"tok-{name}", signing.public_key(key), "device")
    store.register(study, device)
    data = np.arange(2 * spec.sketch.frequencies.m, dtype="<i8").tobytes()
    spec_sha = coordinator.study(study).spec_sha256
    digest = signing.contribution_digest(study, device, 100.0, spec_sha, data)
    coordinator.submit(Submission(study, device, 100.0, spec_sha, wire.KINDS["complex"], data,
                                  signing.sign(key, digest)))
    return study


def test_two_coordinators_decoding_one_study_at_once_decode_it_once(postgres_url, caplog):
    stores = [open_store(postgres_url), open_store(postgres_url)]
    pair = [Coordinator(s) for s in stores]
    try:
        study = collecting_study(pair[0], stores[1])
        stores[0].set_state(study, "decoding", expect=("collecting",))  # queued nowhere
        barrier = threading.Barrier(2)

        def decode(c: Coordinator) -> None:
            barrier.wait()
            c._decode(study)

        caplog.set_level(logging.INFO, logger="fedsketch.coordinator")
        threads = [threading.Thread(target=decode, args=(c,)) for c in pair]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        messages = [r.getMessage() for r in caplog.records]
        assert [m for m in messages if study in m] == [f"study {study} decoded from 1 devices"]
        assert stores[1].get_study(study).state == "done"
    finally:
        for c in pair:
            c.stop()
        for s in stores:
            s.close()


def test_a_shared_coordinator_takes_up_a_study_left_decoding_unless_it_is_claimed(
        postgres_url, monkeypatch, caplog):
    monkeypatch.setattr(shared, "SWEEP_SECONDS", 0.2)
    store, peer = open_store(postgres_url), open_store(postgres_url)
    store.hold(shared=True)
    coordinator = Coordinator(store)
    caplog.set_level(logging.INFO, logger="fedsketch.coordinator")
    try:
        coordinator.start()
        held, left = collecting_study(coordinator, store, "a"), collecting_study(coordinator, store, "b")
        with peer.claim(held):  # a live peer decodes it: this decoder passes it by, not waiting
            for study in (held, left):  # the study whose coordinator died is queued second
                store.set_state(study, "decoding", expect=("collecting",))
            stop = time.monotonic() + 20
            while store.get_study(left).state == "decoding" and time.monotonic() < stop:
                time.sleep(0.05)
            assert [store.get_study(s).state for s in (held, left)] == ["decoding", "done"]
        while store.get_study(held).state == "decoding" and time.monotonic() < stop:
            time.sleep(0.05)  # the peer let it go without decoding it (it died): taken up too
        assert store.get_study(held).state == "done"
        for study in (held, left):
            assert [r.getMessage() for r in caplog.records if study in r.getMessage()] == [
                f"study {study} decoded from 1 devices"]
    finally:
        coordinator.stop()
        peer.close()
        store.close()


def test_coordinators_sharing_a_database_take_up_secure_rounds(postgres_url):
    """A round a coordinator serving the database alone left running (one device registered) is
    taken up at start-up as a shared round, caught up with the store on its first call, and a new
    secure study is taken too."""
    secure = study_spec(m=60, r=60, min_devices=3, secure_aggregation=SecAggSpec.assuming(
        Assumptions(3, 0, 0), 5000, None, 600.0, None))
    alone = open_store(postgres_url)
    lone = Coordinator(alone)  # not started: no watcher
    running = lone.create(secure.to_json()).study_id
    alone.add_tokens(["t"])
    device = alone.enroll("t", signing.public_key(signing.new_private_key()), "d")
    assert lone.rounds[running].receive(device, pb.REGISTER, sw.register_body(500)) is False
    alone.close()
    store = open_store(postgres_url)
    store.hold(shared=True)
    coordinator = Coordinator(store)
    try:
        coordinator.start()
        taken = coordinator.round_of(running)
        assert isinstance(taken, SharedRound)
        taken.tick(time.time())  # its first call: caught up, not due
        first = store.stage_messages(running)[0].received_at
        assert list(taken._inbox[pb.REGISTER]) == [device] and taken.deadline == first + 600.0
        assert taken.receive(device, pb.REGISTER, sw.register_body(500)) is True  # a re-send
        assert isinstance(coordinator.round_of(coordinator.create(secure.to_json()).study_id),
                          SharedRound)
    finally:
        coordinator.stop()
        store.close()


def test_the_first_contribution_is_logged_by_the_coordinator_that_stored_it(postgres_url, caplog):
    """Study created through one shared coordinator's store, first contribution stored through
    the other's: the other logs the study's move to collecting, at once, and the first logs no
    second one for its own contribution after."""
    stores = [open_store(postgres_url) for _ in range(2)]
    try:
        for s in stores:
            s.hold(shared=True)
        a, b = (EventStore(s) for s in stores)
        a.create_study("s", "{}", "0" * 64, None, 2)
        a.add_tokens(["t0", "t1"])
        devices = [a.enroll(f"t{i}", signing.public_key(signing.new_private_key()), "d")
                   for i in range(2)]
        for d in devices:
            a.register("s", d)

        def collecting() -> int:
            return sum(r.getMessage() == "state" and r.fields == {
                "study": "s", "state": "collecting", "detail": ""} for r in caplog.records)
        caplog.set_level(logging.INFO, logger="fedsketch.events")
        for store, device, logged in ((b, devices[0], 1), (a, devices[1], 1)):
            payload = bytes(16)
            assert store.add_contribution(ContributionRow(
                "s", device, 10.0, "int64_pairs", payload, hashlib.sha256(payload).hexdigest(),
                b"sig", time.time()))
            assert collecting() == logged
    finally:
        for s in stores:
            s.close()
