"""The coordinator's own threads (start-up, the decoder, a secure round's end) make lifecycle
transitions as compare-and-sets: a study that already moved is left alone and nothing raises
(on each store backend)."""

from __future__ import annotations

import logging

from conftest import study_spec

from fedsketch.server.service.coordinator import Coordinator
from fedsketch.server.store import open_store
from fedsketch.server.store.base import ABANDON, DECODE, DECODING_FAILED


def test_a_background_transition_on_a_study_that_moved_is_skipped_and_logged(store_url, caplog):
    store = open_store(store_url)
    coordinator = Coordinator(store)
    try:
        study = coordinator.create(study_spec().to_json()).study_id
        store.set_state(study, "failed", "closed by the operator", expect=("open",))
        caplog.set_level(logging.WARNING, "fedsketch.coordinator")
        assert not coordinator._settle(study, DECODE, "secure aggregate unmasked")
        assert not coordinator._settle(study, DECODING_FAILED, "decoding failed: boom")
        row = store.get_study(study)
        assert (row.state, row.detail) == ("failed", "closed by the operator")
        assert sum("no move to" in r.getMessage() for r in caplog.records) == 2
        other = coordinator.create(study_spec(k=2).to_json()).study_id
        assert coordinator._settle(other, ABANDON, "aborted")  # a study in the sources moves
        assert store.get_study(other).state == "failed"
    finally:
        coordinator.stop()
        store.close()
