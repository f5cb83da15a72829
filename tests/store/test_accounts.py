"""The coordinator's account of each device's declared budget (server/store/accounts.py), on
both backends: a release past the declared total is refused in the transaction that would store
it, secure rounds count from their REGISTER while they run and for good once the device masked,
and on PostgreSQL two coordinators storing two releases of one device at once store one."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time

import pytest
from test_store import back_to_schema_7, file_schema, migrated_from

from fedsketch.server.store import open_store
from fedsketch.server.store.accounts import REFUSED
from fedsketch.server.store.base import ContributionRow, StoreError
from fedsketch.server.store.schema import SCHEMA_VERSION

REGISTER, MASKED_INPUT = 6, 4


def device(store, i: int, budget=(1.0, 0.0)) -> str:
    store.add_tokens([f"tok-{i}"])
    return store.enroll(f"tok-{i}", hashlib.sha256(b"k%d" % i).digest(), f"d{i}", budget)


def plain(store, study: str, dev: str, roster: int = 1) -> None:
    store.create_study(study, "{}", "0" * 64, None, 1, roster=roster)
    store.register(study, dev)


def release(study: str, dev: str, eps: float | None, delta: float | None = 0.0) -> ContributionRow:
    data = study.encode() * 16
    return ContributionRow(study, dev, 5.0, "int64_pairs", data, hashlib.sha256(data).hexdigest(),
                           b"sig", time.time(), eps, None if eps is None else delta)


def test_a_release_past_the_declared_total_is_refused_and_nothing_is_stored(store):
    dev = device(store, 1)
    for study in ("a", "b", "c"):
        plain(store, study, dev)
    assert store.add_contribution(release("a", dev, 0.6))
    with pytest.raises(StoreError) as info:
        store.add_contribution(release("b", dev, 0.6))
    assert info.value.code == "failed_precondition" and info.value.message.startswith(REFUSED)
    assert "declared a total ε = 1 at enrollment" in info.value.message
    assert store.contributions("b") == []
    store.create_study("d", "{}", "0" * 64, None, 1)
    with pytest.raises(StoreError, match=REFUSED):  # refused early, at its registration
        store.register("d", dev, (0.6, 0.0))
    assert store.get_study("d").registered == 0
    assert not store.add_contribution(release("a", dev, 0.6))  # a re-send is still acknowledged
    assert store.add_contribution(release("c", dev, 0.4))  # exactly the total: allowed
    account = store.account(dev)
    assert account.budget == (1.0, 0.0) and account.charged == (pytest.approx(1.0), 0.0)
    assert [c.study_id for c in account.charges] == ["a", "c"]


def test_delta_is_held_too_and_an_undeclared_device_is_held_to_nothing(store):
    dev, old = device(store, 1, (10.0, 1e-6)), device(store, 2, None)
    for study in ("a", "b"):
        plain(store, study, dev, roster=2)
        store.register(study, old)
    assert store.add_contribution(release("a", dev, 1.0, 6e-7))
    with pytest.raises(StoreError, match="declared a total δ = 1e-06"):
        store.add_contribution(release("b", dev, 1.0, 6e-7))
    assert store.add_contribution(release("a", old, 100.0))
    assert store.add_contribution(release("b", old, 100.0))
    assert store.account(old).budget is None


def test_the_slack_is_relative_to_the_declared_total(store):
    """The float slack scales with the total: a device that declared δ = 0 gets no release with
    a δ > 0 stored, and one that declared δ = 10⁻¹⁰ no second release of 10⁻¹⁰ (an absolute
    slack of 10⁻⁹ let both through)."""
    pure, tiny = device(store, 1, (10.0, 0.0)), device(store, 2, (10.0, 1e-10))
    for study in ("a", "b"):
        plain(store, study, pure)
        plain(store, study + "2", tiny)
    with pytest.raises(StoreError, match="declared a total δ = 0"):
        store.add_contribution(release("a", pure, 1.0, 5e-10))
    assert store.add_contribution(release("a2", tiny, 1.0, 1e-10))
    with pytest.raises(StoreError, match="declared a total δ = 1e-10"):
        store.add_contribution(release("b2", tiny, 1.0, 1e-10))


def test_a_secure_round_counts_while_it_runs_and_once_the_device_masked(store):
    dev = device(store, 1)
    for study in ("s1", "s2", "s3", "p"):
        store.create_study(study, "{}", "0" * 64, None, 1)
    assert store.add_stage_message("s1", REGISTER, dev, b'{"n":5}', (0.5, 0.0))
    with pytest.raises(StoreError, match=REFUSED):  # s1 runs: 0.5 + 0.6 > 1
        store.add_stage_message("s2", REGISTER, dev, b'{"n":5}', (0.6, 0.0))
    store.end_secure_round("s1", "aborted before masking")  # never masked: costs nothing
    assert store.account(dev).charges == ()
    assert store.add_stage_message("s2", REGISTER, dev, b'{"n":5}', (0.6, 0.0))
    assert store.add_stage_message("s2", MASKED_INPUT, dev, b"masked")
    store.end_secure_round("s2", "aborted after masking")  # masked: it stays counted
    assert [(c.study_id, c.secure) for c in store.account(dev).charges] == [("s2", True)]
    with pytest.raises(StoreError, match=REFUSED):
        store.add_stage_message("s3", REGISTER, dev, b'{"n":5}', (0.5, 0.0))
    store.register("p", dev)
    with pytest.raises(StoreError, match=REFUSED):  # plain and secure add up
        store.add_contribution(release("p", dev, 0.5))
    # rule B: a statement alone changes nothing; the certificate handed to the device does
    assert store.add_abort_statement("s2", dev, "localhost", b"s" * 64)
    assert [c.study_id for c in store.account(dev).charges] == ["s2"]
    store.certify_abort("s2", dev)
    assert store.account(dev).charges == ()
    assert store.add_stage_message("s3", REGISTER, dev, b'{"n":5}', (0.5, 0.0))


def test_a_running_round_stops_counting_a_device_it_dropped_or_that_declined(store):
    """Review finding 2, on both backends: while a round runs, a device is counted from its
    REGISTER only as long as it sent every closed stage's message up to MASKED_INPUT and
    reported no refusal since it registered; a refusal reported before it registered does not
    hide a later registration; once masked it counts for good (``running`` False)."""
    a, b, c, d = (device(store, i) for i in range(4))
    store.create_study("s", "{}", "0" * 64, None, 4)
    store.add_refusal("s", d, "budget")  # reported before it registered: it still counts
    for dev in (a, b, c, d):
        store.add_stage_message("s", REGISTER, dev, b'{"n":5}', (0.5, 0.0))
    store.open_stage("s", 2, time.time())  # ADVERTISE_KEYS open: the whole roster is in
    assert all([(x.secure, x.running) for x in store.account(dev).charges] == [(True, True)]
               for dev in (a, b, c, d))
    store.add_refusal("s", c, "other")  # c declines after registering
    assert store.account(c).charges == ()
    for dev in (a, d):
        store.add_stage_message("s", 2, dev, b"advert")
    store.open_stage("s", 3, time.time())  # SHARE_KEYS open: b sent no advert, it is out
    assert store.account(b).charges == () and len(store.account(a).charges) == 1
    assert len(store.account(d).charges) == 1
    store.add_stage_message("s", 3, a, b"shares")
    store.open_stage("s", MASKED_INPUT, time.time())  # d sent no shares: out
    assert store.account(d).charges == () and len(store.account(a).charges) == 1
    store.add_stage_message("s", MASKED_INPUT, a, b"masked")
    store.open_stage("s", 8, time.time())  # CONSISTENCY: a masked, it is spent
    assert [(x.secure, x.running) for x in store.account(a).charges] == [(True, False)]
    with pytest.raises(StoreError, match="stored releases of 1 studies from it worth ε = 0.5;"):
        store.create_study("t", "{}", "0" * 64, None, 1)
        store.add_stage_message("t", REGISTER, a, b'{"n":5}', (0.6, 0.0))


def test_a_schema_7_store_is_migrated_to_count_declared_budgets(tmp_path):
    path = tmp_path / "store.db"
    s, old = migrated_from(path, back_to_schema_7)
    try:
        assert s.account(old).budget is None and s.account(old).charges == ()
        new = device(s, 9)
        s.register("s", new)
        assert s.add_contribution(release("s", new, 0.75))
        assert s.account(new).charged == (0.75, 0.0)
        assert "store schema 7 -> 8: devices declare their total budget" in " ".join(
            e[3] for e in s.audit_log())
    finally:
        s.close()
    assert file_schema(path) == SCHEMA_VERSION == 10
    raw = sqlite3.connect(path)
    assert {"budget_epsilon", "budget_delta"} <= {r[1] for r in raw.execute("PRAGMA table_info(devices)")}
    raw.close()


def test_two_coordinators_storing_one_device_at_once_store_what_fits(postgres_url):
    """Two PostgreSQL stores (each its own connections, as two --shared coordinators) store the
    releases of one device (declared 1.0) to two studies (0.6 each) at the same moment, 20
    times: each time one is stored and the other refused, never both."""
    stores = [open_store(postgres_url), open_store(postgres_url)]
    try:
        for i in range(20):
            dev = device(stores[0], i)
            pair = (f"a{i}", f"b{i}")
            for study in pair:
                plain(stores[0], study, dev)
            start, outcomes = threading.Barrier(2), []

            def store(s, study, dev=dev, start=start, outcomes=outcomes):
                start.wait()
                try:
                    outcomes.append(s.add_contribution(release(study, dev, 0.6)))
                except StoreError as exc:
                    outcomes.append(exc.message.split(":")[0])

            threads = [threading.Thread(target=store, args=pair_of)
                       for pair_of in zip(stores, pair, strict=True)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            assert sorted(map(str, outcomes)) == ["True", REFUSED], outcomes
            assert stores[0].account(dev).charged[0] == pytest.approx(0.6)
    finally:
        for s in stores:
            s.close()
