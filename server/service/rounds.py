"""The coordinator's refinement rounds (:mod:`fedsketch.common.refine`): after a study's sketch is
decoded, one round study per declared round, each a plain study of its own, then the study's
refined result.

Lifecycle. The study stays ``decoding`` while its rounds run (its detail names the open round).
Its sketch decodes into the start C_0, which opens round 1 (a study whose ``parent`` is the
study; its spec carries C_0 and, for the result, the sketch's public outcome). A round collects
like any plain study, with a deadline ``round_seconds`` away, and closes as soon as its whole
roster has sent. A round that ends ``done`` holds the next centres and opens the next round; after
the last one, or once a round fails (its roster never filled, a device missed its deadline, or
its decoding failed), the study is published with the centres of the last round that ended with
new ones (the start if none did): a failed round costs the study its refinement, not its result.

Every step runs on the coordinator's one decoder thread and starts by reading the store, so a
step repeated after a restart (the study is still ``decoding``) does nothing twice: a round is
opened only if it does not exist yet, and the result is published once.
"""

from __future__ import annotations

import json
import logging
import secrets
import time

import numpy as np

from fedsketch.common.refine import RoundSpec, check_cells
from fedsketch.common.study import StudySpec, spec_sha256
from fedsketch.server.decode.pipeline import StudyResult
from fedsketch.server.decode.refine import first_centroids, next_centroids, refined_result
from fedsketch.server.store.base import DECODING_FAILED, Store

log = logging.getLogger("fedsketch.coordinator")

#: States in which a round has ended.
ENDED = ("done", "failed")


class Rounds:
    """Refinement rounds over a store. ``spec`` parses a study's spec (cached by the caller),
    ``settle`` makes a lifecycle transition from the coordinator's own threads."""

    def __init__(self, store: Store, spec, settle) -> None:
        self.store = store
        self.spec = spec
        self.settle = settle

    def started(self, study_id: str) -> bool:
        """Whether the study's rounds have begun (its sketch was decoded and round 1 opened)."""
        return bool(self.store.rounds(study_id))

    def begin(self, study_id: str, start: StudyResult) -> None:
        """Open round 1 from the decoded sketch ``start``."""
        self._open(study_id, 1, first_centroids(self.spec(study_id), start.centroids),
                   start.to_dict())

    def decode(self, round_id: str, rnd: RoundSpec) -> None:
        """Sum a closed round's releases into the next centres and publish them (or fail the
        round with why), then :meth:`advance` its study."""
        parent = self.spec(rnd.parent_id)
        try:
            releases = [(row.n, *check_cells(parent, rnd, row.kind, row.payload, row.n))
                        for row in self.store.contributions(round_id)]
            out = next_centroids(parent, rnd, releases)
            self.store.put_result(round_id, json.dumps(out.to_dict()))
            log.info("study %s: round %d decoded from %d devices, %d of %d centres kept",
                     rnd.parent_id, rnd.round, out.devices, int(out.kept.sum()), out.kept.size)
        except ValueError as exc:  # CellsError included
            log.warning("study %s: round %d failed: %s", rnd.parent_id, rnd.round, exc)
            self.settle(round_id, DECODING_FAILED, f"decoding failed: {exc}")
        self.advance(rnd.parent_id)

    def advance(self, study_id: str) -> None:
        """After a round ended: open the next one, or publish the study (module docstring). Does
        nothing while the last round still runs or once the study is published."""
        if self.store.get_study(study_id).state != "decoding":
            return
        rows = self.store.rounds(study_id)
        if not rows or rows[-1].state not in ENDED:
            return
        spec: StudySpec = self.spec(study_id)
        last: RoundSpec = self.spec(rows[-1].study_id)
        if rows[-1].state == "done" and last.round < spec.refine.rounds:
            result = json.loads(self.store.get_result(rows[-1].study_id))
            self._open(study_id, last.round + 1, np.array(result["centroids"]), None)
            return
        rounds = []
        for row in rows:
            text = self.store.get_result(row.study_id)
            rounds.append({"round": self.spec(row.study_id).round, "study_id": row.study_id,
                           "state": row.state, "detail": row.detail,
                           "result": None if text is None else json.loads(text)})
        start = self.spec(rows[0].study_id).start
        self.store.put_result(study_id, json.dumps(refined_result(start, rounds)))
        log.info("study %s published after %d refinement rounds", study_id, len(rows))

    def _open(self, study_id: str, number: int, centroids: np.ndarray, start: dict | None) -> None:
        """Create round ``number`` of the study with ``centroids`` (K, d) in data units."""
        spec: StudySpec = self.spec(study_id)
        row = self.store.get_study(study_id)
        rnd = RoundSpec(study_id, row.spec_sha256, number, tuple(map(tuple, centroids.tolist())),
                        spec.min_devices, time.time() + spec.refine.round_seconds, start)
        text = rnd.to_json()
        round_id = "st-" + secrets.token_hex(8)
        self.store.create_study(round_id, text, spec_sha256(text), rnd.deadline, rnd.min_devices,
                                parent=study_id)
        self.store.set_state(study_id, "decoding", f"refinement round {number} of "
                             f"{spec.refine.rounds}: collecting in study {round_id}",
                             expect=("decoding",))
        log.info("study %s: refinement round %d opened as %s", study_id, number, round_id)
