"""The federated round in one process: a real coordinator (TLS on loopback, SQLite) and real
device agents. Refusals carry a precise gRPC status and change nothing."""

from __future__ import annotations

import math

import grpc
import numpy as np
import pytest
from conftest import META, contribute_all, study_spec

from fedsketch.client import round_steps
from fedsketch.client.agent import Agent
from fedsketch.client.ledger import Ledger, LedgerError
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.net import signing
from fedsketch.common.net.tls import MAX_MESSAGE_BYTES, init_certs, secure_channel
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.sketch.spec import release_sketch
from fedsketch.common.study import wire
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n
from fedsketch.server.decode import pipeline
from fedsketch.server.errors import Code
from fedsketch.server.service.api import STUDY_STATES
from fedsketch.server.service.handlers import STATUS


@pytest.fixture(scope="module")
def data():
    x, _, _ = gmm(60_000, 3, 3, 3.0, seed=2)
    return x


def test_every_refusal_code_and_study_state_has_its_wire_form():
    assert set(STATUS) == set(Code)
    assert list(STUDY_STATES.values()) == [pb.OPEN, pb.COLLECTING, pb.DECODING, pb.DONE, pb.FAILED]


def test_four_devices_decode_close_to_kmeans(coordinator_round, data):
    study = coordinator_round.create(study_spec(min_devices=4))
    agents = [coordinator_round.agent(f"d{i}", part) for i, part in
              enumerate(np.array_split(data, 4))]
    contribute_all(agents, study.study_id)
    s = coordinator_round.wait(study.study_id)
    assert s.state == pb.DONE and s.contributions == 4 and s.records == 60_000
    res = coordinator_round.result(study.study_id)
    centroids = np.asarray(res.centroids).reshape(res.k, res.d)
    ref = sse_per_n(split(data), sklearn_kmeans_centroids(data, 3))
    assert sse_per_n(split(data), centroids) / ref < 1.1
    assert res.devices == 4 and math.isclose(sum(res.weights), 1.0)
    assert res.status == "identified" and len(res.z) == 3 and min(res.z) > res.threshold > 0
    # a second pass sends nothing: one release per study
    assert agents[0].step().submitted == [] and len(agents[0].ledger.spends()) == 1


def test_a_study_whose_centroids_are_noise_says_so(coordinator_round, data, monkeypatch):
    """Four devices of 40 records at ε = 0.2: the study completes, and its result says "not
    identifiable" with the reason, judged against four devices' noise draws (a spy on the
    variance the coordinator assumes)."""
    calls = []
    real = pipeline.noise_variance

    def spy(spec, records, draws=1.0):
        calls.append((records, draws))
        return real(spec, records, draws)

    monkeypatch.setattr(pipeline, "noise_variance", spy)
    study = coordinator_round.create(study_spec(min_devices=4, epsilon=0.2, name="tiny"))
    agents = [coordinator_round.agent(f"t{i}", data[i * 40:(i + 1) * 40]) for i in range(4)]
    contribute_all(agents, study.study_id)
    assert coordinator_round.wait(study.study_id).state == pb.DONE
    res = coordinator_round.result(study.study_id)
    assert res.status == "not identifiable"
    assert "cannot be told from noise" in res.status_reason and max(res.z) <= res.threshold
    assert calls == [(160, 4)]


@pytest.mark.parametrize("feature", ["complex", "quantized"])
@pytest.mark.parametrize("relation", ["replace_one", "add_remove"])
def test_every_value_on_the_wire_and_in_the_aggregate_is_an_integer(coordinator_round, data,
                                                                    monkeypatch, feature,
                                                                    relation):
    """What a device sends is integers on the public grid (payload and count), and the
    coordinator's aggregate is their exact integer sum over γ·α·N·√m (MECHANISMS §1.10)."""
    study = coordinator_round.create(study_spec(feature=feature, r=6, min_devices=2,
                                                neighbouring=relation))
    seen = {}
    real = pipeline.integer_sketch

    def spy(spec, total, records):
        seen.update(total=total.copy(), records=records)
        return real(spec, total, records)

    monkeypatch.setattr(pipeline, "integer_sketch", spy)
    releases = []

    def released(*args, **kwargs):
        releases.append(release_sketch(*args, **kwargs))
        return releases[-1]

    monkeypatch.setattr(round_steps, "release_sketch", released)
    agents = [coordinator_round.agent(f"{feature[0]}{relation[0]}{i}", part)
              for i, part in enumerate(np.array_split(data, 2))]
    contribute_all(agents, study.study_id)
    assert coordinator_round.wait(study.study_id).state == pb.DONE
    kind = {"complex": "int64_pairs", "quantized": "int32_pairs"}[feature]
    sent = [agent.ledger.spends()[0] for agent in agents]
    assert {s.kind for s in sent} == {kind} and all(s.n == int(s.n) for s in sent)
    # each device sent its release as privatize made it: the noisy count under add/remove
    made = {wire.encode(release, feature)[1]: release.n for release in releases}
    assert len(made) == 2 and {s.payload: s.n for s in sent} == made
    rows = coordinator_round.store.contributions(study.study_id)
    assert sorted(r.payload for r in rows) == sorted(s.payload for s in sent)  # bytes as sent
    total = sum(wire.decode(r.kind, r.payload, 60) for r in rows)
    assert seen["total"].dtype == np.int64 and np.array_equal(seen["total"], total)
    assert seen["records"] == sum(s.n for s in sent)


def _signed(agent, study: pb.Study, payload: bytes, kind: str = "int64_pairs",
            n: float | None = None, key: bytes | None = None) -> pb.Contribution:
    identity = agent.ledger.identity()
    n = float(sum(c.shape[0] for c in agent.data().chunks())) if n is None else n
    digest = signing.contribution_digest(study.study_id, identity.device_id, n, study.spec_sha256,
                                         payload)
    return pb.Contribution(study_id=study.study_id, device_id=identity.device_id,
                           spec_sha256=study.spec_sha256, n=n,
                           signature=signing.sign(key or identity.private_key, digest),
                           **{kind: payload})


def _ints(values) -> bytes:
    return np.asarray(values, dtype="<i8").tobytes()


BAD = {
    "wrong length": (lambda a, s: _signed(a, s, _ints(np.zeros(119))),
                     grpc.StatusCode.INVALID_ARGUMENT, "bytes"),
    "beyond the mechanism": (lambda a, s: _signed(a, s, _ints([10**12] + [0] * 119)),
                             grpc.StatusCode.INVALID_ARGUMENT, "largest value"),
    "most negative int64": (lambda a, s: _signed(a, s, _ints([-2**63] + [0] * 119)),
                            grpc.StatusCode.INVALID_ARGUMENT, "largest value"),
    "wrong kind": (lambda a, s: _signed(a, s, np.zeros(120, "<i4").tobytes(), "int32_pairs"),
                   grpc.StatusCode.INVALID_ARGUMENT, "travels as int64_pairs"),
    "fractional count": (lambda a, s: _signed(a, s, _ints(np.zeros(120)), n=10.5),
                         grpc.StatusCode.INVALID_ARGUMENT, "integer"),
    "tampered payload": (lambda a, s: _tampered(a, s),
                         grpc.StatusCode.UNAUTHENTICATED, "signature"),
    "missing signature": (lambda a, s: _unsigned(a, s),
                          grpc.StatusCode.UNAUTHENTICATED, "signature"),
    "another device's key": (lambda a, s: _signed(a, s, _ints(np.zeros(120)),
                                                  key=signing.new_private_key()),
                             grpc.StatusCode.UNAUTHENTICATED, "signature"),
    "unknown study": (lambda a, s: _signed(a, pb.Study(study_id="st-nope",
                                                       spec_sha256=s.spec_sha256),
                                           _ints(np.zeros(120))),
                      grpc.StatusCode.NOT_FOUND, "st-nope"),
    "spec hash mismatch": (lambda a, s: _signed(a, pb.Study(study_id=s.study_id,
                                                            spec_sha256="0" * 64),
                                                _ints(np.zeros(120))),
                           grpc.StatusCode.FAILED_PRECONDITION, "spec hash"),
}


def _tampered(agent, study):
    msg = _signed(agent, study, _ints(np.zeros(120)))
    msg.int64_pairs = _ints([1] + [0] * 119)
    return msg


def _unsigned(agent, study):
    msg = _signed(agent, study, _ints(np.zeros(120)))
    msg.ClearField("signature")
    return msg


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_contributions_are_refused_and_change_nothing(coordinator_round, data, case):
    make, code, words = BAD[case]
    study = coordinator_round.create(study_spec(min_devices=1))
    agent = coordinator_round.agent("bad", data[:1000])
    before = coordinator_round.store.audit_log(1000)
    with pytest.raises(grpc.RpcError) as err:
        agent.stub.Submit(make(agent, study), timeout=10)
    assert err.value.code() == code and words in err.value.details()
    assert coordinator_round.store.contributions(study.study_id) == []
    assert coordinator_round.store.audit_log(1000) == before
    # the same device can still contribute properly afterwards
    assert agent.step().submitted == [study.study_id]


def test_unenrolled_device_is_refused(coordinator_round, data):
    study = coordinator_round.create(study_spec(min_devices=5))
    agent = coordinator_round.agent("x", data[:1000])
    msg = _signed(agent, study, _ints(np.zeros(120)))
    msg.device_id = "dev-unknown"
    with pytest.raises(grpc.RpcError) as err:
        agent.stub.Submit(msg, timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "unenrolled" in err.value.details()


def test_identical_resend_is_idempotent_and_different_bytes_conflict(coordinator_round, data):
    study = coordinator_round.create(study_spec(min_devices=1))
    agent = coordinator_round.agent("dup", data[:5000])
    agent.step()
    spend = agent.ledger.find(study.study_id)
    msg = _signed(agent, study, spend.payload, spend.kind, spend.n)
    reply = agent.stub.Submit(msg, timeout=10)
    assert reply.duplicate and reply.receipt == spend.payload_sha256
    other = _signed(agent, study, _ints(np.zeros(120)), n=spend.n)
    with pytest.raises(grpc.RpcError) as err:
        agent.stub.Submit(other, timeout=10)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    rows = coordinator_round.store.contributions(study.study_id)
    assert len(rows) == 1 and rows[0].payload == spend.payload


def test_closed_study_refuses_but_reacknowledges_stored_bytes(coordinator_round, data):
    study = coordinator_round.create(study_spec(min_devices=1))
    agent = coordinator_round.agent("a", data[:3000])
    agent.step()
    assert coordinator_round.wait(study.study_id).state == pb.DONE
    spend = agent.ledger.find(study.study_id)
    assert agent.stub.Submit(_signed(agent, study, spend.payload, spend.kind, spend.n)).duplicate
    late = coordinator_round.agent("late", data[3000:6000])
    with pytest.raises(grpc.RpcError) as err:
        late.stub.Submit(_signed(late, study, _ints(np.zeros(120))), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "accepts no contributions" in err.value.details()


def test_oversized_message_is_refused(coordinator_round, data):
    study = coordinator_round.create(study_spec(min_devices=5))
    agent = coordinator_round.agent("big", data[:1000])
    msg = _signed(agent, study, b"\0" * (MAX_MESSAGE_BYTES + 16))
    raw = pb_grpc.DeviceStub(secure_channel(coordinator_round.target,
                                            coordinator_round.certs.ca_cert,
                                            options=[("grpc.max_send_message_length", -1)]))
    with pytest.raises(grpc.RpcError) as err:
        raw.Submit(msg, timeout=10)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert coordinator_round.store.contributions(study.study_id) == []


def test_enrollment_tokens_are_one_time(coordinator_round):
    stub = coordinator_round.device_stub()
    token = coordinator_round.tokens(1)[0]
    key = signing.public_key(signing.new_private_key())
    assert stub.Enroll(pb.EnrollRequest(token=token, public_key=key)).device_id
    for tok in (token, "never-issued"):
        with pytest.raises(grpc.RpcError) as err:
            stub.Enroll(pb.EnrollRequest(token=tok,
                                         public_key=signing.public_key(signing.new_private_key())))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as err:
        stub.Enroll(pb.EnrollRequest(token=coordinator_round.tokens(1)[0], public_key=b"short"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(("metadata", "code"), [
    ((), grpc.StatusCode.UNAUTHENTICATED),
    ((("authorization", "Bearer wrong"),), grpc.StatusCode.PERMISSION_DENIED),
])
def test_operator_calls_need_the_credential(coordinator_round, metadata, code):
    op = coordinator_round.operator()
    for call, request in ((op.IssueTokens, pb.IssueTokensRequest(count=1)),
                          (op.CreateStudy, pb.CreateStudyRequest(spec_json=study_spec().to_json())),
                          (op.ListStudies, pb.ListStudiesRequest()),
                          (op.ShowStudy, pb.StudyRef(study_id="st-0")),
                          (op.GetResult, pb.StudyRef(study_id="st-0"))):
        with pytest.raises(grpc.RpcError) as err:
            call(request, metadata=metadata, timeout=10)
        assert err.value.code() == code
    assert coordinator_round.store.list_studies() == []


def test_bad_study_spec_is_refused(coordinator_round):
    spec = study_spec().to_dict()
    spec["omega_sha256"] = "0" * 64
    import json

    with pytest.raises(grpc.RpcError) as err:
        coordinator_round.operator().CreateStudy(
            pb.CreateStudyRequest(spec_json=json.dumps(spec)), metadata=META)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "omega" in err.value.details()


def test_client_without_the_ca_is_refused(coordinator_round, tmp_path):
    stranger = init_certs(tmp_path / "other", ["localhost"])
    stub = pb_grpc.DeviceStub(secure_channel(coordinator_round.target, stranger.ca_cert))
    with pytest.raises(grpc.RpcError) as err:
        stub.ListStudies(pb.DeviceRead(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_budget_refusal_spends_nothing(coordinator_round, data):
    agent = coordinator_round.agent("poor", data[:2000], budget=1.0)
    studies = [coordinator_round.create(study_spec(epsilon=0.3, min_devices=1))
               for _ in range(10)]
    out = agent.step()
    assert len(out.submitted) == 3
    assert len(out.refused) == 7
    assert all("insufficient budget" in why for why in out.refused.values())
    spent, _ = agent.ledger.spent(agent.source)
    assert spent == pytest.approx(0.9) and spent <= 1.0
    stored = sum(len(coordinator_round.store.contributions(s.study_id)) for s in studies)
    assert stored == 3


def test_device_refuses_a_study_of_another_dimension(coordinator_round, data):
    coordinator_round.create(study_spec(d=4, min_devices=2))
    agent = coordinator_round.agent("d3", data[:2000])
    out = agent.step()
    assert list(out.refused.values()) == ["the study wants d = 4, the data has 3"]
    assert agent.ledger.spends() == []


def test_deadline_without_quorum_fails_and_operator_close_decodes(coordinator_round, data):
    import time

    failing = coordinator_round.create(study_spec(min_devices=3, deadline=time.time() + 0.5))
    closing = coordinator_round.create(study_spec(min_devices=1, roster=2, deadline=time.time() + 3600))
    agent = coordinator_round.agent("one", data[:20_000])
    agent.step()
    s = coordinator_round.wait(failing.study_id, timeout=10)
    assert s.state == pb.FAILED and "1 of 3 devices" in s.detail
    with pytest.raises(grpc.RpcError) as err:
        coordinator_round.result(failing.study_id)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    coordinator_round.operator().CloseStudy(pb.StudyRef(study_id=closing.study_id), metadata=META)
    assert coordinator_round.wait(closing.study_id).state == pb.DONE


def test_a_lost_enroll_reply_does_not_lock_the_device_out(coordinator_round, tmp_path):
    """Issue 12, finding 7: the coordinator commits the enrollment and the reply is lost. The
    device drew and stored its key before asking, so its retry (after a restart, too) sends the
    same key with the same token and gets the same device id; another key still cannot use the
    token."""
    token = coordinator_round.tokens(1)[0]
    path = tmp_path / "device.ledger"
    agent = Agent(coordinator_round.channel(), Ledger.create(path, 1.0), lambda: None)
    real = agent.stub.Enroll

    def lost(request, **kw):
        real(request, **kw)  # committed by the coordinator ...
        raise Lost()  # ... and the reply never arrives

    class Lost(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.UNAVAILABLE

    agent.stub.Enroll = lost
    with pytest.raises(grpc.RpcError):
        agent.ensure_enrolled(coordinator_round.target, token, "phone")
    assert agent.ledger.identity() is None
    agent.ledger.close()
    again = Agent(coordinator_round.channel(), Ledger(path), lambda: None)  # restarted
    identity = again.ensure_enrolled(coordinator_round.target, token, "phone")
    devices = [e for e in coordinator_round.store.audit_log(1000) if e[2] == "enroll"]
    assert [e[1] for e in devices] == [identity.device_id]
    assert coordinator_round.store.device_key(identity.device_id) == signing.public_key(
        identity.private_key)
    with pytest.raises(grpc.RpcError) as err:
        coordinator_round.device_stub().Enroll(pb.EnrollRequest(
            token=token, public_key=signing.public_key(signing.new_private_key())))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(LedgerError):
        again.ledger.enrollment_key()  # enrolled: the device keeps its key
