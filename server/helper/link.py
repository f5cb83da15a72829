"""The coordinator's side of a validated secure study: its link to the helper, and the
verification and sum over the reports both aggregators find valid (:mod:`.service` has the
helper's side and the protocol).

:func:`validate` runs the four steps for one study: it commits to its query seed and closes
the helper's collection, reveals the seed with the reports it holds (each with its circuit),
computes its own verifier messages, decides every report on both messages, asks the helper for
its share over the reports the helper accepted, and checks that the helper accepted the same
reports. The published sum is Σ_{valid} x_i = decode(Σ leader shares) + the helper's share, mod
p, read back as signed integers (|Σ x| < p/2, which the study's creation checks).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import grpc
import numpy as np

from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.validity import wire
from fedsketch.common.validity.field import add, from_field
from fedsketch.common.validity.sharing import LeaderShare, proven, verify_key
from fedsketch.server.helper.service import HELPER_MESSAGE_BYTES

#: Seconds a call to the helper may take (Aggregate verifies every report: 25 ms each).
HELPER_TIMEOUT = 600.0


@dataclass(frozen=True)
class Report:
    """One device's report as the coordinator holds it: its leader share, and its circuit
    (entries n, bound B, L1 bound B₁ or 0)."""

    nonce: bytes
    share: LeaderShare
    circuit: tuple[int, int, int]


@dataclass(frozen=True)
class Validated:
    """The outcome: the nonces of the valid reports, those excluded, and the sum of the valid
    inputs (int64, n entries)."""

    accepted: list[bytes]
    excluded: list[bytes]
    total: np.ndarray


def helper_stub(target: str, ca_pem: bytes, token: str):
    """(Helper stub, call metadata): TLS trusting only the CA certificate ``ca_pem`` (the one
    the study's spec names)."""
    options = [("grpc.max_receive_message_length", HELPER_MESSAGE_BYTES),
               ("grpc.max_send_message_length", HELPER_MESSAGE_BYTES)]
    channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=ca_pem),
                                  options=options)
    return pb_grpc.HelperStub(channel), (("authorization", f"Bearer {token}"),)


def validate(stub: pb_grpc.HelperStub, meta, study_id: str, reports: list[Report],
             leader_seed: bytes, min_reports: int) -> Validated:
    """Verify every report with the helper and sum the valid ones (module docstring).
    ``leader_seed`` is the coordinator's 16-byte query seed (OS random, kept by the caller so a
    restart reveals the seed it committed to); ``min_reports`` is the study's L − D. The
    coordinator enforces that floor itself, before it asks the helper for its share and again
    on the answer: a helper that spoils all reports but one cannot have one device's x + e
    published. RuntimeError if fewer than ``min_reports`` reports are valid, if the helper's
    replies name a report the coordinator did not send (or one twice), or if it accepted other
    reports than the coordinator did; a gRPC error (FAILED_PRECONDITION: fewer valid reports
    than the helper's minimum) propagates."""
    commitment = hashlib.sha256(leader_seed).digest()
    closed = stub.CloseCollection(pb.HelperClose(study_id=study_id, seed_commitment=commitment),
                                  metadata=meta, timeout=HELPER_TIMEOUT)
    key = verify_key(leader_seed, closed.helper_seed)
    by_nonce = {r.nonce: r for r in reports}
    prepared = stub.Prepare(pb.HelperPrepare(
        study_id=study_id, leader_seed=leader_seed,
        reports=[pb.ReportCircuit(nonce=r.nonce, entries=r.circuit[0], bound=r.circuit[1],
                                  l1_bound=r.circuit[2]) for r in reports]),
        metadata=meta, timeout=HELPER_TIMEOUT)
    named = [bytes(theirs.nonce) for theirs in prepared.shares]
    if not set(named) <= set(by_nonce) or len(set(named)) != len(named):
        raise RuntimeError("the helper's Prepare reply names a report the coordinator did not "
                           "send, or one twice")
    mine, accepted = {}, []
    for theirs in prepared.shares:
        report = by_nonce[bytes(theirs.nonce)]
        proof = proven(*report.circuit)
        try:
            mine[report.nonce] = ours = proof.prepare(report.share, key, report.nonce)
            helper = wire.from_pb(theirs, 3 * proof.flp.verifier_len)
        except (ValueError, RuntimeError):
            continue
        if helper is not None and proof.decide(ours, helper):
            accepted.append(report.nonce)
    _enough(len(accepted), min_reports, "the coordinator found")
    answer = stub.Aggregate(pb.HelperAggregate(
        study_id=study_id, min_reports=min_reports,
        leader=[wire.to_pb(n, mine.get(n)) for n in by_nonce]), metadata=meta,
        timeout=HELPER_TIMEOUT)
    theirs_accepted = [bytes(n) for n in answer.accepted]
    if set(theirs_accepted) != set(accepted) or len(theirs_accepted) != len(accepted):
        only_helper = sorted(n.hex()[:8] for n in set(theirs_accepted) - set(accepted))
        only_ours = sorted(n.hex()[:8] for n in set(accepted) - set(theirs_accepted))
        raise RuntimeError(f"the helper accepted {len(theirs_accepted)} reports and the "
                           f"coordinator {len(accepted)}: not the same set (only the helper: "
                           f"{only_helper}, only the coordinator: {only_ours})")
    _enough(len(theirs_accepted), min_reports, "the helper's answer holds")
    total = wire.from_words(answer.share, by_nonce[accepted[0]].circuit[0] if accepted else None)
    for nonce in accepted:
        report = by_nonce[nonce]
        total = add(total, proven(*report.circuit).circuit.decode(report.share.input, num_shares=2))
    excluded = [n for n in by_nonce if n not in set(accepted)]
    return Validated(accepted, excluded, from_field(total))


def _enough(valid: int, min_reports: int, who: str) -> None:
    """RuntimeError unless ``valid`` ≥ ``min_reports`` (the study's L − D)."""
    if valid < min_reports:
        raise RuntimeError(f"{who} {valid} valid reports, fewer than the study's L - D = "
                           f"{min_reports}")
