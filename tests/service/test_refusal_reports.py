"""A device's refusal report over real gRPC on loopback: signed in its own domain, a known code
only, for the study's spec, kept once; the operator reads it (and only the operator) in
``StudyStatus``, with the roster, and the audit log."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from conftest import META, study_spec

from fedsketch.client.localdata import LocalData
from fedsketch.common.net import signing
from fedsketch.common.pb import fedsketch_pb2 as pb


def report(r, agent, study: pb.Study, code: int, signed_code: int | None = None,
           spec_sha256: str | None = None) -> pb.RefusalAck:
    ident = agent.ledger.identity()
    sha = study.spec_sha256 if spec_sha256 is None else spec_sha256
    digest = signing.refusal_digest(study.study_id, ident.device_id, sha,
                                    code if signed_code is None else signed_code)
    return r.device_stub().ReportRefusal(pb.RefusalReport(
        study_id=study.study_id, device_id=ident.device_id, spec_sha256=sha, reason=code,
        signature=signing.sign(ident.private_key, digest)))


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_a_report_is_kept_once_and_only_as_signed(coordinator_round):
    r = coordinator_round
    study = r.create(study_spec(min_devices=2))
    x = np.zeros((10, 3))
    a, b = r.agent("a", x), r.agent("b", x)
    for agent in (a, b):
        agent.ensure_enrolled(r.target, r.tokens(1)[0], agent.source)
    assert not report(r, a, study, pb.POLICY).duplicate
    assert report(r, a, study, pb.BUDGET).duplicate  # the first stands
    # a signature over another code, another spec, an unknown code: refused, nothing kept
    assert refused(lambda: report(r, b, study, pb.BUDGET, signed_code=pb.POLICY)).code() == \
        grpc.StatusCode.UNAUTHENTICATED
    assert refused(lambda: report(r, b, study, pb.BUDGET, spec_sha256="0" * 64)).code() == \
        grpc.StatusCode.FAILED_PRECONDITION
    for code in (pb.REFUSAL_REASON_UNSPECIFIED, 99):
        assert refused(lambda c=code: report(r, b, study, c)).code() == grpc.StatusCode.INVALID_ARGUMENT
    op = r.operator()
    status = op.StudyStatus(pb.StatusRequest(study_id=study.study_id), metadata=META)
    assert [(f.device_id, f.reason) for f in status.refusals] == [
        (a.ledger.identity().device_id, pb.POLICY)]
    assert status.refused == 1 and status.min_devices == 2 and status.epsilon == 50.0
    audit = op.Audit(pb.AuditRequest(study_id=study.study_id), metadata=META).entries
    assert [e.action for e in audit].count("refuse") == 1
    for call in (lambda: op.StudyStatus(pb.StatusRequest(study_id=study.study_id)),
                 lambda: op.Audit(pb.AuditRequest())):
        assert refused(call).code() == grpc.StatusCode.UNAUTHENTICATED
    assert refused(lambda: op.Audit(pb.AuditRequest(limit=10_001), metadata=META)).code() == \
        grpc.StatusCode.INVALID_ARGUMENT


def test_an_agent_reports_its_refusal_once_and_a_coordinator_refusal_not_at_all(coordinator_round):
    """A policy refusal is reported once over several passes; a device that joined a roster
    that was full (the coordinator's refusal) reports nothing."""
    r = coordinator_round
    study = r.create(study_spec(min_devices=1, epsilon=5.0))
    x = np.random.default_rng(0).normal(size=(50, 3))
    picky = r.agent("picky", x, budget=2.0)  # ε 5 > budget 2
    picky.ensure_enrolled(r.target, r.tokens(1)[0], "picky")
    for _ in range(3):
        assert study.study_id in picky.step().refused
    rows, total = r.store.refusals(study.study_id, 10)
    assert [f.reason for f in rows] == ["budget"] and total == 1
    sent = picky.bytes_sent
    picky.step()
    assert picky.bytes_sent == sent  # no second report
    first, late = r.agent("first", x), r.agent("late", x)
    for agent in (first, late):
        agent.ensure_enrolled(r.target, r.tokens(1)[0], agent.source)
    first.step()  # fills the roster of one and contributes
    assert r.store.refusals(study.study_id, 10)[1] == 1


def test_a_count_refusal_reads_no_record_past_the_cap_and_reports_the_code_alone(coordinator_round):
    """Under add/remove (n private) a device above the cap stops reading at the cap plus one
    record, so how long it takes does not grow with n, and reports TOO_MANY_RECORDS, no count."""
    r = coordinator_round
    study = r.create(study_spec(min_devices=1, max_device_records=100, neighbouring="add_remove"))
    read = []

    def chunks():
        for i in range(1000):  # 60,000 records in all
            read.append(i)
            yield np.zeros((60, 3))

    agent = r.agent("big", np.zeros((1, 3)))
    agent.data = lambda: LocalData(chunks, 3)
    assert "at most 100 records per device" in agent.step().refused[study.study_id]
    assert len(read) == 2  # 120 > 100 records: the third chunk is never read
    assert [f.reason for f in r.store.refusals(study.study_id, 10)[0]] == ["too_many_records"]
    assert not any("120" in e[3] or "60000" in e[3] for e in r.store.audit_log(1000))
