"""What the store keeps of a secure-aggregation round so a restarted coordinator resumes it: the
stage messages (one per study, stage and device; an identical re-send is acknowledged, a
different one refused, never replaced), the open stage and when it opened, and the round's end
(the unmasked sum with the study's move to decoding, or its failure), plus the schema-6 → 7
migration. The contract runs against every backend (the ``store`` fixture of conftest.py)."""

from __future__ import annotations

from test_store import back_to_schema_6, enroll, file_schema, migrated_from, refusal

from fedsketch.server.errors import Code
from fedsketch.server.store.sqlite import SCHEMA_VERSION


def test_a_stage_message_is_kept_once_and_never_replaced(store):
    a, b = enroll(store, 1), enroll(store, 2)
    store.create_study("s", "{}", "0" * 64, None, 2)
    assert store.add_stage_message("s", 6, a, b'{"n":5}')
    assert not store.add_stage_message("s", 6, a, b'{"n":5}')  # a lost ack: re-acknowledged
    assert refusal(store.add_stage_message, "s", 6, a, b'{"n":6}').code == Code.CONFLICT
    assert store.add_stage_message("s", 6, b, b'{"n":7}')
    assert store.add_stage_message("s", 2, a, b"advert")  # another stage: its own row
    rows = store.stage_messages("s")
    assert [(m.stage, m.device_id, m.body) for m in rows] == [
        (6, a, b'{"n":5}'), (6, b, b'{"n":7}'), (2, a, b"advert")]
    assert rows[0].received_at <= rows[1].received_at <= rows[2].received_at
    assert refusal(store.add_stage_message, "x", 6, a, b"").code == Code.NOT_FOUND
    assert refusal(store.add_stage_message, "s", 6, "dev-unknown", b"").code == Code.NOT_FOUND
    assert store.stage_messages("x") == []


def test_a_round_catching_up_reads_only_the_messages_it_lacks(store):
    """Of stages 2 and 3, less the stage-2 message of a device the reader holds already."""
    a, b = enroll(store, 1), enroll(store, 2)
    store.create_study("s", "{}", "0" * 64, None, 2)
    for stage, device in ((6, a), (2, a), (2, b), (3, a)):
        store.add_stage_message("s", stage, device, b"m%d" % stage)
    assert [(m.stage, m.device_id) for m in store.stage_messages("s", (2, 3), (a,))] == [(2, b), (3, a)]
    assert [(m.stage, m.device_id) for m in store.stage_messages("s", (2,))] == [(2, a), (2, b)]
    assert store.stage_messages("s", (3,), (a, b)) == []


def test_the_open_stage_and_when_it_opened_are_kept_and_replaced(store):
    store.create_study("s", "{}", "0" * 64, None, 2)
    assert store.secure_round("s") is None
    store.open_stage("s", 2, 100.5)
    store.open_stage("s", 3, 200.25)
    row = store.secure_round("s")
    assert (row.stage, row.opened_at, row.ended, row.total) == (3, 200.25, False, None)
    assert refusal(store.open_stage, "x", 2, 1.0).code == Code.NOT_FOUND


def test_an_unmasked_round_keeps_its_sum_moves_to_decoding_and_drops_its_messages(store):
    a = enroll(store, 1)
    store.create_study("s", "{}", "0" * 64, None, 2)
    store.add_stage_message("s", 6, a, b'{"n":5}')
    store.open_stage("s", 5, 300.0)
    total = (-(2**40)).to_bytes(8, "little", signed=True) + (7).to_bytes(8, "little")
    row = store.end_secure_round("s", "secure aggregate unmasked", total, 3, 1234.0,
                                 {a: True, "dev-gone": False})
    assert (row.state, row.detail) == ("decoding", "secure aggregate unmasked")
    kept = store.secure_round("s")
    assert (kept.stage, kept.ended, kept.total, kept.devices, kept.records, kept.members) == (
        5, True, total, 3, 1234.0, {a: True, "dev-gone": False})
    assert store.stage_messages("s") == []
    assert any(e[2] == "end_secure_round" and "open -> decoding" in e[3] for e in store.audit_log())
    # over: no second end, no message, no stage; an identical re-send of a dropped message is
    # refused like any message of a closed study
    assert refusal(store.end_secure_round, "s", "again").code == Code.FAILED_PRECONDITION
    assert refusal(store.add_stage_message, "s", 6, a, b'{"n":5}').code == Code.FAILED_PRECONDITION
    assert refusal(store.open_stage, "s", 2, 1.0).code == Code.FAILED_PRECONDITION
    assert store.secure_round("s") == kept and store.get_study("s").state == "decoding"


def test_an_aborted_round_fails_its_study_even_before_any_stage_opened(store):
    a = enroll(store, 1)
    store.create_study("s", "{}", "0" * 64, None, 2)
    store.add_stage_message("s", 6, a, b'{"n":5}')
    row = store.end_secure_round("s", "secure aggregation aborted at REGISTER: too few")
    assert (row.state, row.detail) == ("failed", "secure aggregation aborted at REGISTER: too few")
    kept = store.secure_round("s")
    assert (kept.stage, kept.ended, kept.total, kept.members) == (0, True, None, None)
    assert store.stage_messages("s") == []


def test_a_schema_6_store_is_migrated_to_keep_secure_rounds(tmp_path):
    path = tmp_path / "store.db"
    s, a = migrated_from(path, back_to_schema_6)
    try:
        assert s.add_stage_message("s", 6, a, b'{"n":5}')
        assert "store schema 6 -> 7: secure-aggregation rounds are kept and resume after a " \
               "restart" in [e[3] for e in s.audit_log()]
    finally:
        s.close()
    assert file_schema(path) == SCHEMA_VERSION == 10
