"""What the operator sees of a study and of the coordinator's history: the replies of
``Operator/StudyStatus`` and ``Operator/Audit`` (``coordinator status`` and ``coordinator audit``).

A status holds the study as devices see it, its quorum and roster size, when its quorum
registered (its collection window runs from then), its deadline, the ε one device spends on it
in all, the devices on its roster (label, registered and contributed times), the refusals
devices reported (a reason code each: :data:`~fedsketch.server.store.base.REFUSAL_REASONS`), and
its refinement rounds in round order. Lists are cut at a limit so that a reply stays far below
the transport's 4 MiB for any roster (:data:`MAX_STATUS_LIMIT` entries of about 100 bytes).
"""

from __future__ import annotations

from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.study.refine import RoundSpec
from fedsketch.server.errors import Code, Refusal
from fedsketch.server.service.coordinator import Coordinator
from fedsketch.server.service.study_wire import study_message
from fedsketch.server.store.base import REFUSAL_REASONS

#: ``RefusalReason`` of each stored reason, and back.
REFUSAL_CODES = {reason: pb.RefusalReason.Value(reason.upper()) for reason in REFUSAL_REASONS}
REASONS = {code: reason for reason, code in REFUSAL_CODES.items()}
#: Roster devices and refusals a status lists by default, and at most.
STATUS_LIMIT, MAX_STATUS_LIMIT = 1000, 20_000
#: Audit rows a reply holds by default, and at most.
AUDIT_LIMIT, MAX_AUDIT_LIMIT = 100, 10_000


def _limit(asked: int, default: int, most: int) -> int:
    """``asked`` (0: ``default``); INVALID_ARGUMENT outside 0..``most``."""
    if not 0 <= asked <= most:
        raise Refusal(Code.INVALID_ARGUMENT, f"limit must be in 1..{most} (0: {default}), got {asked}")
    return asked or default


def status_reply(c: Coordinator, study_id: str, limit: int) -> pb.StatusReply:
    """The operator's view of one study (module docstring); not_found for an unknown one."""
    limit = _limit(limit, STATUS_LIMIT, MAX_STATUS_LIMIT)
    row = c.study(study_id)
    spec = c.spec(study_id)
    if isinstance(spec, RoundSpec):  # a round collects until its deadline, with no window
        epsilon, collect = spec.epsilon(c.spec(spec.parent_id)), None
        parent, number = spec.parent_id, spec.round
    else:
        # a study, or the sketch round (number 0) of one with a round 0
        epsilon, collect, parent, number = spec.total_epsilon, spec.collect_seconds, row.parent or "", 0
    rounds = sorted(c.store.rounds(study_id), key=lambda r: getattr(c.spec(r.study_id), "round", 0))
    refusals, refused = c.store.refusals(study_id, limit)
    return pb.StatusReply(
        study=study_message(row, c.round_of(study_id)), created_at=row.created_at,
        min_devices=row.min_devices, roster_size=row.capacity, filled_at=row.filled_at or 0.0,
        deadline=row.deadline or 0.0, collect_seconds=collect or 0.0, epsilon=epsilon,
        parent_id=parent, round=number,
        roster=[pb.RosterEntry(device_id=e.device_id, label=e.label, registered_at=e.registered_at,
                               contributed_at=e.contributed_at or 0.0)
                for e in c.store.roster_entries(study_id, limit)],
        refusals=[pb.RefusalEntry(device_id=f.device_id, label=f.label,
                                  reason=REFUSAL_CODES[f.reason], reported_at=f.reported_at)
                  for f in refusals],
        refused=refused, rounds=[study_message(r, c.round_of(r.study_id)) for r in rounds])


def audit_reply(c: Coordinator, limit: int, study_id: str) -> pb.AuditReply:
    """The newest audit rows, oldest first: all, or those naming ``study_id`` or one of its
    refinement rounds (not_found for an unknown study)."""
    limit = _limit(limit, AUDIT_LIMIT, MAX_AUDIT_LIMIT)
    ids: tuple[str, ...] = ()
    if study_id:
        c.study(study_id)
        ids = (study_id, *(r.study_id for r in c.store.rounds(study_id)))
    return pb.AuditReply(entries=[pb.AuditEntry(at=at, actor=actor, action=action, detail=detail)
                                  for at, actor, action, detail in c.store.audit_log(limit, ids)])
