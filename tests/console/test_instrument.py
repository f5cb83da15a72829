"""The metered store (:class:`fedsketch.server.console.instrument.MeteredStore`) over a real store
of each backend: it counts stored contributions, stage messages and refusals (re-sends not),
times each secure stage from the ``opened_at`` the store keeps, counts the devices that dropped at
each stage when it closes (the round's end closing the last), times decodings, and returns what
the store returns."""

from __future__ import annotations

import hashlib
import os

import pytest
from prometheus_client import CollectorRegistry

from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import wire as sw
from fedsketch.server.console.instrument import MeteredStore
from fedsketch.server.console.metrics import Metrics
from fedsketch.server.errors import Refusal
from fedsketch.server.store.base import ACCEPTING, ContributionRow


def enroll(store, i: int) -> str:
    token = f"token-{i}"
    store.add_tokens([token])
    return store.enroll(token, os.urandom(32), f"device {i}")


@pytest.fixture
def metered(store):
    registry = CollectorRegistry()
    return MeteredStore(store, Metrics(registry)), registry


def value(registry, name: str, **labels) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_secure_stages_are_timed_and_their_dropouts_counted(metered):
    s, registry = metered
    a, b, c = (enroll(s, i) for i in range(3))
    register, advertise, share = sw.STAGES[:3]
    names = [pb.Stage.Name(x) for x in (register, advertise, share)]
    s.create_study("s", "{}", "0" * 64, None, 2)
    for device in (a, b, c):
        assert s.add_stage_message("s", register, device, b'{"n":5}')
    assert not s.add_stage_message("s", register, a, b'{"n":5}')  # a re-send: not counted
    s.open_stage("s", advertise, 1000.0)
    for device in (a, b):  # c drops
        s.add_stage_message("s", advertise, device, b"key")
    s.open_stage("s", share, 1002.5)
    s.add_stage_message("s", share, a, b"shares")  # b drops
    row = s.end_secure_round("s", "too few shares")
    assert row.state == "failed"  # what the store returned
    assert [value(registry, "fedsketch_secure_messages_total", stage=n) for n in names] == [3, 2, 1]
    assert [value(registry, "fedsketch_secure_dropouts_total", stage=n) for n in names] == [0, 1, 1]
    assert [value(registry, "fedsketch_secure_stage_seconds_count", stage=n) for n in names] == [1, 1, 1]
    assert value(registry, "fedsketch_secure_stage_seconds_sum", stage=names[1]) == pytest.approx(2.5)


def test_contributions_refusals_and_decodings_are_counted_once(metered):
    s, registry = metered
    a, b = enroll(s, 1), enroll(s, 2)
    s.create_study("p", "{}", "0" * 64, None, 2)
    for device in (a, b):
        s.register("p", device)
    payload = b"\x00" * 16
    row = ContributionRow("p", a, 10.0, "int64_pairs", payload, hashlib.sha256(payload).hexdigest(),
                          b"sig", 1.0)
    assert s.add_contribution(row) and not s.add_contribution(row)
    assert value(registry, "fedsketch_contributions_total", kind="int64_pairs") == 1
    assert s.add_refusal("p", b, "budget") and not s.add_refusal("p", b, "budget")
    assert value(registry, "fedsketch_refusals_total", reason="budget") == 1
    assert s.set_state("p", "decoding", "closed", expect=ACCEPTING).state == "decoding"
    assert value(registry, "fedsketch_decode_seconds_count") == 0
    s.put_result("p", "{}")
    assert value(registry, "fedsketch_decode_seconds_count") == 1
    with pytest.raises(Refusal):  # a refusal is an answer, timed but no store error
        s.get_study("nope")
    assert value(registry, "fedsketch_store_seconds_count", operation="get_study") >= 1
    assert value(registry, "fedsketch_store_errors_total", operation="get_study") == 0
    assert s.get_study("p").state == "done"
