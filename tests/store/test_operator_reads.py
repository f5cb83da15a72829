"""What the store keeps for the operator's view: the refusals devices report (one per study and
device, the first kept, audited), a roster with labels and contribution times, the audit log of
one study and its rounds, and the schema-4 → 5 migration that adds the refusals."""

from __future__ import annotations

import pytest
from test_store import back_to_schema_5, contribution, enroll, file_schema, migrated_from, payload

from fedsketch.server.errors import Code
from fedsketch.server.store import StoreError
from fedsketch.server.store.sqlite import SCHEMA_VERSION


def test_a_refusal_is_kept_once_with_its_reason_and_audited(store):
    a, b = enroll(store, 1), enroll(store, 2)
    store.create_study("s", "{}", "0" * 64, None, 2)
    assert store.add_refusal("s", a, "budget")
    assert not store.add_refusal("s", a, "policy")  # the first report stands
    assert store.add_refusal("s", b, "too_many_records")
    rows, total = store.refusals("s", 10)
    assert [(r.device_id, r.label, r.reason) for r in rows] == [
        (a, "device 1", "budget"), (b, "device 2", "too_many_records")]
    assert total == 2 and len(store.refusals("s", 1)[0]) == 1 and store.refusals("s", 1)[1] == 2
    assert [(e[1], e[2]) for e in store.audit_log() if e[2] == "refuse"] == [(a, "refuse"),
                                                                            (b, "refuse")]


def test_a_refusal_of_an_unknown_study_device_or_reason_is_refused_and_writes_nothing(store):
    a = enroll(store, 1)
    store.create_study("s", "{}", "0" * 64, None, 1)
    with pytest.raises(StoreError) as info:
        store.add_refusal("nope", a, "budget")
    assert info.value.code == Code.NOT_FOUND
    with pytest.raises(StoreError) as info:
        store.add_refusal("s", "dev-unknown", "budget")
    assert info.value.code == Code.NOT_FOUND
    with pytest.raises(ValueError, match="unknown refusal reason"):
        store.add_refusal("s", a, "bored")
    assert store.refusals("s", 10) == ([], 0)


def test_the_roster_lists_labels_and_contribution_times_in_order(store):
    a, b = enroll(store, 1), enroll(store, 2)
    store.create_study("s", "{}", "0" * 64, None, 2)
    store.register("s", a)
    store.register("s", b)
    row = contribution("s", b, payload(1))
    store.add_contribution(row)
    entries = store.roster_entries("s", 10)
    assert [(e.device_id, e.label, e.contributed_at) for e in entries] == [
        (a, "device 1", None), (b, "device 2", row.received_at)]
    assert entries[0].registered_at <= entries[1].registered_at
    assert [e.device_id for e in store.roster_entries("s", 1)] == [a]


def test_the_audit_log_of_a_study_holds_its_rows_and_its_rounds(store):
    a = enroll(store, 1)
    store.create_study("st-aaaa", "{}", "0" * 64, None, 1)
    store.create_study("st-bbbb", "{}", "1" * 64, None, 1)
    store.create_study("st-cccc", "{}", "2" * 64, None, 1, parent="st-aaaa")
    store.register("st-aaaa", a)
    store.register("st-bbbb", a)
    store.register("st-cccc", a)
    mine = store.audit_log(100, ("st-aaaa", "st-cccc"))
    assert [e[2] for e in mine] == ["create_study", "create_study", "register", "register"]
    assert all("st-bbbb" not in e[3] for e in mine)
    assert [e[2] for e in store.audit_log(1, ("st-aaaa",))] == ["register"]


def test_a_schema_5_store_is_migrated_to_keep_refusals(tmp_path):
    path = tmp_path / "store.db"
    s, a = migrated_from(path, back_to_schema_5)
    try:
        assert s.add_refusal("s", a, "policy")
        assert "store schema 5 -> 6: devices may report why they declined a study" in [
            e[3] for e in s.audit_log()]
    finally:
        s.close()
    assert file_schema(path) == SCHEMA_VERSION
