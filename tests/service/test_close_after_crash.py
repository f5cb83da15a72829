"""A coordinator killed between storing a study's last roster contribution and closing the study
(the store holds every contribution, the study is still ``collecting`` and no close was
requested; the device, never acknowledged, re-sends to a live coordinator, which acknowledges a
duplicate and closes nothing) leaves the study to the deadline watcher of whichever coordinator
serves the store next: it closes the study at once, not a collection window or a deadline later.
On each backend: a restarted coordinator on SQLite, a peer on PostgreSQL."""

from __future__ import annotations

import hashlib
import time

import numpy as np
from conftest import study_spec

from fedsketch.common.net import signing
from fedsketch.common.study import wire
from fedsketch.server.service.coordinator import Coordinator
from fedsketch.server.service.messages import Submission
from fedsketch.server.store import ContributionRow, open_store


def test_a_study_whose_roster_all_sent_closes_though_its_closer_died(store_url):
    spec = study_spec(min_devices=2, deadline=time.time() + 3600, collect_seconds=3600.0)
    store = open_store(store_url)
    first = Coordinator(store)  # not started: it stores, and "dies" before it closes
    study = first.create(spec.to_json()).study_id
    spec_sha = first.study(study).spec_sha256
    data = np.arange(2 * spec.sketch.frequencies.m, dtype="<i8").tobytes()
    sent = []
    for i in range(2):
        key = signing.new_private_key()
        store.add_tokens([f"tok-{i}"])
        device = store.enroll(f"tok-{i}", signing.public_key(key), f"d{i}")
        store.register(study, device)
        signature = signing.sign(key, signing.contribution_digest(study, device, 100.0, spec_sha, data))
        sent.append(Submission(study, device, 100.0, spec_sha, wire.KINDS["complex"], data, signature))
    first.submit(sent[0])  # through the coordinator: one of two, nothing to close
    last = sent[1]  # the store's write of the submission, then the kill: no close requested
    receipt = hashlib.sha256(last.payload).hexdigest()
    assert store.add_contribution(ContributionRow(study, last.device_id, last.n, last.kind, last.payload,
                                                  receipt, last.signature, time.time()))
    row = store.get_study(study)
    assert (row.state, row.contributions, row.closing) == ("collecting", 2, None)
    first.stop()
    store.close()

    store = open_store(store_url)
    if store_url.startswith("postgresql"):
        store.hold(shared=True)
    successor = Coordinator(store)
    try:
        successor.start()
        assert successor.submit(last) == (True, receipt)  # the re-send: a duplicate
        stop = time.monotonic() + 30
        while store.get_study(study).state != "done" and time.monotonic() < stop:
            time.sleep(0.05)
        row = store.get_study(study)
        assert row.state == "done", row
        moves = [e[3] for e in store.audit_log(100) if e[2] == "set_state"]
        assert moves == [f"study {study!r}: collecting -> decoding every roster device contributed"], moves
    finally:
        successor.stop()
        store.close()
