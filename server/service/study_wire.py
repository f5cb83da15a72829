"""A study and its result as the wire shows them: the ``Study`` message of a store row and the
``Result`` message of a published result, shared by the Device and Operator services (:mod:`.api`)
and the operator's view (:mod:`.operator_view`)."""

from __future__ import annotations

import json

from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.study.study import StudySpec
from fedsketch.server.service.secure_round import SecAggRound
from fedsketch.server.store.base import ACCEPTING, STATES, StudyRow

#: ``StudyState`` of each store state: the proto spells each state's name in capitals.
STUDY_STATES = {state: pb.StudyState.Value(state.upper()) for state in STATES}


def plain_stage(row: StudyRow) -> int:
    """The open stage of a plain study: REGISTER until its roster is full, then PLAIN_INPUT until
    a close is requested."""
    if row.state not in ACCEPTING or row.closing is not None:
        return pb.FINISHED
    return pb.PLAIN_INPUT if row.roster_full else pb.REGISTER


def study_message(row: StudyRow, secure_round: SecAggRound | None = None) -> pb.Study:
    """The wire form of a study row (its stage from the secure-aggregation round, if any)."""
    if secure_round is None or row.state not in ACCEPTING:
        stage = plain_stage(row)
    else:
        stage = secure_round.stage
    return pb.Study(study_id=row.study_id, spec_json=row.spec_json, spec_sha256=row.spec_sha256,
                    state=STUDY_STATES[row.state], stage=stage,
                    contributions=row.contributions, records=row.records, detail=row.detail,
                    registered=row.registered)


def result_message(study_id: str, spec: StudySpec, res: dict) -> pb.Result:
    """The wire form of a study's published result (``StudyResult.to_dict()``, or a refined
    one's) under its spec: centroids row-major in data units, the identifiability verdict (empty
    for a result published before the check existed) and the refinement rounds that ended with
    new centres, with --scale auto round 0's choice of σ (``calibration``, as JSON), and the
    verdict on the published centroids (``verdict``, as JSON; :mod:`fedsketch.common.study.verdict`),
    and with --bounds auto the box its box round read (``box``, as JSON)."""
    verdict = res.get("identifiability", {})
    return pb.Result(study_id=study_id, k=spec.k, d=spec.sketch.frequencies.d,
                     centroids=[v for row in res["centroids"] for v in row],
                     weights=res["weights"], residual=res["residual"],
                     devices=res["devices"], records=res["records"],
                     status=verdict.get("status", ""), status_reason=verdict.get("reason", ""),
                     z=verdict.get("z", []), threshold=verdict.get("threshold", 0.0),
                     rounds=res.get("refined_rounds", 0),
                     calibration_json=json.dumps(res["calibration"]) if "calibration" in res else "",
                     verdict_json=json.dumps(res["verdict"]) if "verdict" in res else "",
                     box_json=json.dumps(res["box"]) if "box" in res else "")
