"""A store written by an earlier release: a refinement round in the previous round format
(fedsketch.round/1) neither stops the coordinator from starting nor stays open; a finished one
keeps its state."""

from __future__ import annotations

import json

from conftest import study_spec

from fedsketch.common.study.refine import RefineSpec, RoundSpec
from fedsketch.common.study.study import spec_sha256
from fedsketch.server.service.coordinator import Coordinator
from fedsketch.server.store import open_store


def old_round(parent_text: str, number: int) -> str:
    """Round ``number``'s spec as the previous release wrote it: format /1, no radius."""
    rnd = RoundSpec("st-parent", spec_sha256(parent_text), number, ((0.0, 0.0, 0.0),) * 3, 4, None)
    old = json.loads(rnd.to_json())
    old["format"] = "fedsketch.round/1"
    old.pop("radius")
    return json.dumps(old, sort_keys=True, separators=(",", ":"))


def test_rounds_of_an_earlier_release_are_failed_not_fatal(tmp_path):
    store = open_store(tmp_path / "c.db")
    text = study_spec(refine=RefineSpec((1.0, 1.0), 900.0), min_devices=4).to_json()
    store.create_study("st-parent", text, spec_sha256(text), None, 4)
    store.create_study("st-other", text, spec_sha256(text), None, 4)  # a running study of today's
    for number, study in ((1, "st-done"), (2, "st-open")):
        old = old_round(text, number)
        store.create_study(study, old, spec_sha256(old), None, 4, parent="st-parent")
    store.set_state("st-done", "failed", "closed without quorum")  # finished before the upgrade
    coordinator = Coordinator(store)
    try:
        coordinator.start()
        open_round = store.get_study("st-open")
        assert open_round.state == "failed"
        assert "does not read the study's spec, written by an earlier release" in open_round.detail
        assert "fedsketch.round/2" in open_round.detail
        done = store.get_study("st-done")
        assert (done.state, done.detail) == ("failed", "closed without quorum")
        assert store.get_study("st-other").state == "open"
    finally:
        coordinator.stop()
        store.close()
