"""The coordinator's side of a device's privacy budget: what it has counted against the total the
device declared at enrollment, and the check that refuses a release past it.

A device declares its total (ε, δ) when it enrolls (``devices.budget_epsilon``,
``budget_delta``; NULL: an older device, which is held to nothing). Each release the coordinator
stores carries its cost to the device, as the study's spec says (the service computes it:
:func:`fedsketch.server.service.accounting.release_cost`): a plain contribution its row's
``epsilon``/``delta``; a secure round its device's REGISTER row's. A device is *charged*

    Σ over its plain contributions of (ε, δ)
    + Σ over the secure rounds it registered in of (ε, δ), for each round that still runs
      with the device in it (it may yet spend: it sent every closed stage's message up to
      MASKED_INPUT and reported no refusal of the study since it registered; ``running``)
      or to which it sent a masked input (it spent; kept in ``secure_charges`` when the
      round ends and its stage messages are dropped)

less the failed secure rounds for which the coordinator handed the device a certificate of abort
that suffices for its masked input (rule B, :mod:`.abort_statements`: its ledger gives that spend
back with the same certificate)

(sequential composition over its releases: the device's ledger adds them up the same way, and a
secure round it left before masking (dropped by the round, or declined), or that ended before it
masked, costs it nothing: the device sets nothing aside for it either). A device the round
dropped though it sent its message (the aggregator rejected it) is still counted until the
round ends: the store does not know that rejection; that errs on the side of refusing. A new
release of cost (ε, δ) is refused when charged + ε exceeds the declared ε (or the same for δ),
by more than a share :data:`SLACK` of it (the two sides add floats in different orders). The check runs in the
transaction that stores the release, after the device's own lock (:meth:`SQLStore._also_lock`:
PostgreSQL's advisory lock of the device, so two processes of ``--shared`` coordinators storing
two releases of one device run one after the other; SQLite's writes are serialized anyway).

What it catches: a ledger rolled back (rows deleted, an older copy restored, a re-sealed forgery)
spends again what it had spent; the coordinator still counts the first spends and refuses the
release that would pass the declared total, with :data:`REFUSED` at the start of its reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedsketch.server.errors import Code
from fedsketch.server.store.base import StoreError
from fedsketch.server.store.schema import Connection

#: Relative tolerance of the comparison (float sums in different orders on the two sides).
SLACK = 1e-9
#: How a refusal's reason begins: the code a device logs.
REFUSED = "declared_budget_exceeded"
#: Stage numbers of the proto's ``Stage`` (the store does not import the proto).
REGISTER, MASKED_INPUT = 6, 4

#: Stages of a running round at which a device that registered is still in it, and the stage
#: messages it must have sent for that (a device that did not send a closed stage's message
#: was dropped by the round; from CONSISTENCY on, only those whose masked input arrived are in).
ADVERTISE_KEYS, SHARE_KEYS = 2, 3
_IN_ROUND = f"""(COALESCE(r.stage, {REGISTER}) IN ({REGISTER}, {ADVERTISE_KEYS}, {SHARE_KEYS}, {MASKED_INPUT})
       AND NOT EXISTS (SELECT 1 FROM refusals AS f WHERE f.study_id = m.study_id
                       AND f.device_id = m.device_id AND f.reported_at >= m.received_at)
       AND (COALESCE(r.stage, {REGISTER}) IN ({REGISTER}, {ADVERTISE_KEYS}) OR EXISTS (
            SELECT 1 FROM stage_messages AS a WHERE a.study_id = m.study_id
            AND a.device_id = m.device_id AND a.stage = {ADVERTISE_KEYS}))
       AND (COALESCE(r.stage, {REGISTER}) <> {MASKED_INPUT} OR EXISTS (
            SELECT 1 FROM stage_messages AS k WHERE k.study_id = m.study_id
            AND k.device_id = m.device_id AND k.stage = {SHARE_KEYS})))"""
_MASKED = f"""EXISTS (SELECT 1 FROM stage_messages AS x WHERE x.study_id = m.study_id
       AND x.device_id = m.device_id AND x.stage = {MASKED_INPUT})"""

#: The device's charges: (study, ε, δ, kind) with kind :data:`PLAIN`, :data:`SPENT` (a secure
#: round it sent a masked input to) or :data:`RUNNING` (a running secure round it is still in
#: and has not masked for yet: its ledger does not count it yet).
_CHARGES = f"""
SELECT study_id, epsilon, delta, 0 FROM contributions
WHERE device_id = ? AND epsilon IS NOT NULL AND study_id <> ?
UNION ALL
SELECT g.study_id, g.epsilon, g.delta, 1 FROM secure_charges AS g
WHERE g.device_id = ? AND g.study_id <> ? AND NOT EXISTS (
      SELECT 1 FROM abort_statements AS b WHERE b.study_id = g.study_id
      AND b.device_id = g.device_id AND b.certified_at IS NOT NULL)
UNION ALL
SELECT m.study_id, m.epsilon, m.delta, CASE WHEN {_MASKED} THEN 1 ELSE 2 END
FROM stage_messages AS m JOIN studies AS s ON s.study_id = m.study_id
  LEFT JOIN secure_rounds AS r ON r.study_id = m.study_id
WHERE m.device_id = ? AND m.stage = {REGISTER} AND m.epsilon IS NOT NULL AND m.study_id <> ?
  AND ({_MASKED} OR (s.state IN ('open', 'collecting') AND {_IN_ROUND}))
ORDER BY 1
"""
PLAIN, SPENT, RUNNING = 0, 1, 2

#: Run as a secure round ends (its stage messages are then dropped): the devices that sent a
#: masked input stay charged the round's cost.
KEEP_SECURE_CHARGES = f"""
INSERT INTO secure_charges (study_id, device_id, epsilon, delta)
SELECT m.study_id, m.device_id, m.epsilon, m.delta FROM stage_messages AS m
WHERE m.study_id = ? AND m.stage = {REGISTER} AND m.epsilon IS NOT NULL AND EXISTS (
      SELECT 1 FROM stage_messages AS x WHERE x.study_id = m.study_id
      AND x.device_id = m.device_id AND x.stage = {MASKED_INPUT})
"""


@dataclass(frozen=True)
class Charge:
    """One release counted against a device: its study, (ε, δ), whether it is a secure round,
    and whether that round still runs without the device's masked input (``running``: counted
    from the registration, before the device's ledger records a spend)."""

    study_id: str
    epsilon: float
    delta: float
    secure: bool
    running: bool = False


@dataclass(frozen=True)
class Account:
    """A device's declared total (None: none declared) and what is counted against it."""

    budget: tuple[float, float] | None
    charges: tuple[Charge, ...]

    @property
    def charged(self) -> tuple[float, float]:
        return (math.fsum(c.epsilon for c in self.charges), math.fsum(c.delta for c in self.charges))


def declared(c: Connection, device_id: str) -> tuple[float, float] | None:
    """The total the device declared (None: none); StoreError 'not_found' for an unknown one."""
    row = c.execute("SELECT budget_epsilon, budget_delta FROM devices WHERE device_id = ?",
                    (device_id,)).fetchone()
    if row is None:
        raise StoreError(Code.NOT_FOUND, f"no enrolled device {device_id!r}")
    return None if row[0] is None else (float(row[0]), float(row[1] or 0.0))


def account(c: Connection, device_id: str, other_than: str = "") -> Account:
    """The device's account, leaving out the release for study ``other_than``; StoreError
    'not_found' for an unknown device. It reads the device's rows through their indexes by
    device (schema 8): O(its releases), not of the store."""
    budget = declared(c, device_id)
    charges = tuple(Charge(s, float(e), float(d or 0.0), k != PLAIN, k == RUNNING)
                    for s, e, d, k in c.execute(_CHARGES, (device_id, other_than) * 3))
    return Account(budget, charges)


def check(c: Connection, device_id: str, study_id: str, cost: tuple[float, float] | None) -> None:
    """Refuse (StoreError 'failed_precondition', reason starting with :data:`REFUSED`) a release
    of ``cost`` for ``study_id`` that would take the device past its declared total."""
    if cost is None or declared(c, device_id) is None:  # an older device: nothing is read
        return
    acc = account(c, device_id, study_id)
    (eps, delta), (charged_eps, charged_delta) = cost, acc.charged
    for name, total, charged, asked in (("ε", acc.budget[0], charged_eps, eps),
                                        ("δ", acc.budget[1], charged_delta, delta)):
        if asked > 0 and math.fsum((charged, asked)) > total * (1.0 + SLACK):
            raise StoreError(Code.FAILED_PRECONDITION, refusal(acc, device_id, study_id, name,
                                                               total, asked))


def refusal(acc: Account, device_id: str, study_id: str, name: str, total: float,
            asked: float) -> str:
    """The words of a refusal: what is stored apart from the running secure rounds the device
    registered in (which its ledger counts only once it masks; it tries again once they end)."""
    field = "epsilon" if name == "ε" else "delta"
    stored = [c for c in acc.charges if not c.running]
    running = [c for c in acc.charges if c.running]
    parts = [f"the coordinator has stored releases of {len(stored)} studies from it worth "
             f"{name} = {math.fsum(getattr(c, field) for c in stored):g}"]
    if running:
        parts.append(f"it is registered in {len(running)} running secure rounds worth "
                     f"{name} = {math.fsum(getattr(c, field) for c in running):g} "
                     f"({', '.join(c.study_id for c in running)}), which its ledger counts once "
                     "it sends its masked input, or not at all if it leaves them")
    why = ("The device may try again once those rounds end; its ledger says otherwise than "
           "the stored releases only if spends were deleted or an older copy restored"
           if running else "Its ledger says otherwise only if spends were deleted or an older "
           "copy restored")
    return (f"{REFUSED}: device {device_id} declared a total {name} = {total:g} at enrollment; "
            f"{'; '.join(parts)}; study {study_id} asks {asked:g} more. {why} "
            "(`fedsketch device budget --verify`)")
