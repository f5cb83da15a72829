"""``fedsketch device budget --verify``: the ledger's spends checked against their seal
(:mod:`.ledger_chain`), and, with ``--coordinator``, against what the coordinator has counted
against the budget the device declared at enrollment (its ``GetAccount``, a signed read).

The seal finds a row deleted, edited or added by hand; it cannot find a whole older copy of the
file put back, nor a history re-sealed with the key the file holds. The coordinator's account
finds both: a study whose release the coordinator stored and the ledger does not record means
the ledger lost that spend. A secure round counts at the coordinator from the device's
registration while it runs (the device spends at its masked input), so a running round the
device has not masked for yet (``Charge.running``) is shown as such, not as a loss; one that
ended, or to which the device sent its masked input, is a spend the ledger must record.
"""

from __future__ import annotations

import math
from pathlib import Path

from fedsketch.client.ledger import Ledger
from fedsketch.client.ledger_records import LedgerError
from fedsketch.common.net.device_reads import signed_read
from fedsketch.common.net.link import Link
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc

#: Seconds to wait for the coordinator's account.
TIMEOUT = 30.0


def verify(book: Ledger, coordinator: str | None = None, ca: Path | None = None,
           insecure: bool = False) -> tuple[list[str], list[str]]:
    """(what holds, what does not), each a list of sentences; gRPC errors propagate."""
    verdict = book.verify_chain()
    holds, problems = [], list(verdict.problems)
    if verdict.ok:
        voided = f" and {verdict.voids} voids (spends given back)" if verdict.voids else ""
        holds.append(f"{verdict.rows} spends{voided} verified: the chain and every signature hold")
    if verdict.legacy:
        holds.append(f"{len(verdict.legacy)} voids ({', '.join(verdict.legacy)}) rest on "
                     "certificates of abort an earlier release wrote, for spends that recorded no "
                     "round terms (before ledger schema 9): they were checked against the t, C "
                     "and holders the certificates name themselves")
    declared = book.declared()
    if declared is not None:
        holds.append(f"declared to the coordinator at enrollment: ε = {declared[0]:g}, "
                     f"δ = {declared[1]:g} in all")
    if coordinator is None:
        return holds, problems
    identity = book.identity()
    if identity is None:
        raise LedgerError(f"{book.path} holds no enrolled identity: there is no account to compare")
    channel = Link(coordinator, ca, insecure).channel()
    try:
        account = pb_grpc.DeviceStub(channel).GetAccount(signed_read(
            identity.private_key, identity.device_id, coordinator, "GetAccount"), timeout=TIMEOUT)
    finally:
        channel.close()
    recorded = {s.study_id: s for s in book.spends()}
    lost = [c for c in account.charges if c.study_id not in recorded and not c.running]
    running = [c for c in account.charges if c.study_id not in recorded and c.running]
    if lost:
        problems.append(
            f"the coordinator stored this device's releases of {len(lost)} studies that the ledger "
            f"does not record ({', '.join(c.study_id for c in lost)}; ε = "
            f"{math.fsum(c.epsilon for c in lost):g}): spend rows were deleted or an older copy of "
            "the ledger was restored; the coordinator still counts them")
    voids = book.voids()
    given = [c for c in account.charges if c.study_id in voids and not c.running]
    if given:
        problems.append(
            f"the coordinator counts releases of {len(given)} studies that the ledger gave back "
            f"({', '.join(c.study_id for c in given)}): the device voided a spend whose release "
            "the coordinator holds")
    if running:
        ids = ", ".join(c.study_id for c in running)
        holds.append(f"{len(running)} secure rounds the device registered in count at the "
                     f"coordinator before the device spends on them ({ids})")
    if account.budget_epsilon == 0:
        holds.append("the coordinator holds this device to no declared budget (it enrolled "
                     "before devices declared one)")
    else:
        holds.append(f"the coordinator counts ε = {account.charged_epsilon:g} (δ = "
                     f"{account.charged_delta:g}) against the declared ε = {account.budget_epsilon:g} "
                     f"(δ = {account.budget_delta:g}) over {len(account.charges)} studies")
    return holds, problems
