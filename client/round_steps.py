"""The device's checks of a study's rounds, and what it releases in each.

A study's rounds are studies of their own that name it by id and spec hash: its refinement
rounds (:mod:`fedsketch.common.study.refine`) and, after a calibration round 0 (``--scale auto``,
:mod:`fedsketch.common.study.calibration_round`), its sketch round, whose spec carries the σ round 0
chose. Round 0 itself is the study's own release. Before it registers for a round the device
reads the study from the coordinator, checks its hash and that the round fits it, and budgets
the round's ε from what the study's earlier spend keeps aside; the ledger refuses a second
release of the same round of a study under any round study id.
"""

from __future__ import annotations

from dataclasses import replace

import grpc

from fedsketch.client.declines import Declined
from fedsketch.client.study_pass import RPC_TIMEOUT, Admitted, later_rounds
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.sketch.box import Box, Tally
from fedsketch.common.sketch.frequencies import draw_frequencies
from fedsketch.common.sketch.spec import release_sketch
from fedsketch.common.study import wire
from fedsketch.common.study.box_plan import release_box
from fedsketch.common.study.boxed_round import BOXED_LEDGER_ROUND, BoxedRound, is_boxed_round
from fedsketch.common.study.calibration_round import SketchRound, release_calibration
from fedsketch.common.study.refine import CELLS_KIND, RoundSpec, release_cells
from fedsketch.common.study.study import StudySpec, spec_sha256


def release(admitted: Admitted, tally: Tally) -> tuple[int, str, bytes]:
    """(n as released, payload kind, payload bytes) of the device's one release for ``admitted``:
    a refinement round's cells, a calibration round 0's sketch, or the study's sketch (in its
    sketch round, at that round's σ). Noise is drawn here, once, from OS bits."""
    spec, rnd, chunks = admitted.spec, admitted.round, admitted.data.chunks()
    if isinstance(rnd, RoundSpec):
        n, payload = release_cells(spec, rnd, chunks, tally)
        return n, CELLS_KIND, payload
    if spec.box is not None:  # a box round: histograms of the raw records, nothing clipped
        return release_box(spec, chunks, tally)
    if spec.calibration is not None:
        return release_calibration(spec, chunks, admitted.box, tally)
    sketch = release_sketch(spec.sketch, chunks, admitted.box, tally=tally)
    return (sketch.n, *wire.encode(sketch, spec.sketch.feature))


class RoundChecks:
    """Steps 1–2 of :class:`fedsketch.client.agent.Agent` for a study's rounds (a mixin: the agent
    provides ``stub``, ``ledger``, ``_read`` and ``_admit``)."""

    def _parent(self, parent_id: str, parent_sha256: str,
                boxed: bool = True) -> tuple[StudySpec, str | None] | str:
        """(the spec of the study a round names, read from the coordinator, and for a boxed
        study the study of its box round, or None), or why it is refused: unknown, not of the
        hash the round names, unreadable, or under a threshold unsafe for its stated
        assumptions. A boxed study is read as the study it collects, its own study checked
        the same way (``boxed``: whether the round may name a boxed study)."""
        try:
            parent = self.stub.GetStudy(self._read(self.ledger.identity(), "GetStudy", parent_id),
                                        timeout=RPC_TIMEOUT)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.PERMISSION_DENIED:
                raise
            return Declined(f"the round's study {parent_id} is unknown to the coordinator, or "
                            "this device is not on its roster", pb.SPEC_MISMATCH)
        if parent.spec_sha256 != parent_sha256 or spec_sha256(parent.spec_json) != parent_sha256:
            return Declined("the round's study does not have the spec hash the round names", pb.SPEC_MISMATCH)
        if boxed and is_boxed_round(parent.spec_json):
            return self._boxed(parent.spec_json)
        try:
            spec = StudySpec.from_json(parent.spec_json)
            if spec.secure_aggregation is not None:
                spec.check_trust()  # as for the study itself
        except ValueError as exc:
            return Declined(f"the round's study: {exc}", pb.SPEC_MISMATCH)
        return spec, None

    def _boxed(self, spec_json: str) -> tuple[StudySpec, str] | str:
        """(the study a boxed study collects, the study of its box round), checked: it names
        that study by id and spec hash, the study declares a box round, and the box, σ's range
        and the Ω hash recompute (:meth:`BoxedRound.study`); or why it is refused."""
        try:
            rnd = BoxedRound.from_json(spec_json)
        except ValueError as exc:
            return Declined(f"unreadable boxed study spec: {exc}", pb.SPEC_MISMATCH)
        if isinstance(found := self._parent(rnd.parent_id, rnd.parent_sha256, boxed=False), str):
            return found
        try:
            spec = rnd.study(found[0])
            Box(spec.lo, spec.hi).reduce(draw_frequencies(spec.sketch.frequencies))
        except ValueError as exc:
            return Declined(f"the boxed study does not fit its study: {exc}", pb.SPEC_MISMATCH)
        return spec, rnd.parent_id

    def _check_boxed_round(self, study: pb.Study) -> Admitted | str:
        """Steps 1–2 for the boxed study after a box round (:meth:`_boxed`); the ledger books
        its release as a round of the box round's study, once."""
        if isinstance(found := self._boxed(study.spec_json), str):
            return found
        spec, root = found
        if (reason := self.ledger.round_refusal(root, BOXED_LEDGER_ROUND)) is not None:
            return Declined(reason, pb.OTHER)
        return self._admit(study.study_id, spec, later_rounds(spec, None), None, root)

    def _check_round(self, study: pb.Study) -> Admitted | str:
        """Steps 1–2 for a refinement round: the round names its study by id and spec hash, the
        study declares the round, its centres lie in the study's box with its d, and the
        owner's policy allows the study (its whole ε); the budget must cover the round's ε."""
        try:
            rnd = RoundSpec.from_json(study.spec_json)
        except ValueError as exc:
            return Declined(f"unreadable round spec: {exc}", pb.SPEC_MISMATCH)
        if isinstance(found := self._parent(rnd.parent_id, rnd.parent_sha256), str):
            return found
        spec, root = found
        try:
            rnd.check_parent(spec)
        except ValueError as exc:
            return Declined(f"the round does not fit its study: {exc}", pb.SPEC_MISMATCH)
        if (reason := self.ledger.round_refusal(root or rnd.parent_id, rnd.round)) is not None:
            return Declined(reason, pb.OTHER)
        return self._admit(study.study_id, spec, later_rounds(spec, rnd), rnd, root)

    def _check_sketch_round(self, study: pb.Study) -> Admitted | str:
        """Steps 1–2 for the sketch round after a calibration round 0: the round names its study
        by id and spec hash, the study declares round 0, σ lies in its search range, the Ω‖ξ
        hash recomputes for σ and the box fits Ω, the owner's policy allows the study (its whole
        ε), and the budget covers the sketch's (ε, δ). A device that missed round 0 may send."""
        try:
            rnd = SketchRound.from_json(study.spec_json)
        except ValueError as exc:
            return Declined(f"unreadable sketch round spec: {exc}", pb.SPEC_MISMATCH)
        if isinstance(found := self._parent(rnd.parent_id, rnd.parent_sha256), str):
            return found
        parent, root = found
        try:
            spec = rnd.study(parent)
            freqs = draw_frequencies(spec.sketch.frequencies)
            if freqs.sha256 != spec.omega_sha256:
                raise ValueError("the frequencies Ω, ξ do not match the round's hash on this platform")
            Box(spec.lo, spec.hi).reduce(freqs)
        except ValueError as exc:
            return Declined(f"the sketch round does not fit its study: {exc}", pb.SPEC_MISMATCH)
        if (reason := self.ledger.round_refusal(root or rnd.parent_id, 0)) is not None:
            return Declined(reason, pb.OTHER)
        admitted = self._admit(study.study_id, parent, later_rounds(parent, rnd), rnd, root)
        return admitted if isinstance(admitted, str) else replace(admitted, spec=spec)
