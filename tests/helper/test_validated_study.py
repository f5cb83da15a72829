"""A secure study validated by a helper, end to end: a real coordinator (gRPC over TLS on
loopback, its SQLite store, started with the helper's token), the helper as a real process with
its own TLS identity, and in-process device agents. A valid study publishes exactly the sum of
the devices' inputs plus noise shares (x + e, which each device's ledger keeps); a hostile
device (``random``, ``inflate``) is excluded and counted, and the study still publishes."""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace

import numpy as np
import pytest
from conftest import META
from helperproc import Helper

from fedsketch.client.agent import Agent
from fedsketch.client.ledger import Ledger
from fedsketch.client.localdata import LocalData
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.net.tls import secure_channel, server_tls
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.study import StudySpec
from fedsketch.common.study.validated import validity_delta
from fedsketch.server.bench.metrics import split
from fedsketch.server.helper.link import Validated
from fedsketch.server.service import validated_round
from fedsketch.server.service.api import build_server
from fedsketch.server.sim.hostile import HostileAgent
from fedsketch.server.store import open_store

DEVICES = 5
#: Stage timeout (s): generous, as tests/service/test_secagg_round.py's; a stage here closes
#: when every roster device has sent, so only a device held back waits for it.
STAGE_TIMEOUT = 10.0


@pytest.fixture(scope="module")
def helper(tmp_path_factory):
    h = Helper(tmp_path_factory.mktemp("helper"))
    yield h
    h.stop()


@pytest.fixture
def coordinator(tmp_path, certs, helper):
    store = open_store(tmp_path / "coordinator.db")
    token = (helper.folder / "helper.token").read_text().strip()
    server, coord, port = build_server(
        store, hashlib.sha256(META[0][1].removeprefix("Bearer ").encode()).hexdigest(),
        "127.0.0.1:0", server_tls(certs.server_cert, certs.server_key), helper_token=token)
    yield f"localhost:{port}", coord, store
    server.stop(grace=None).wait()
    coord.stop()
    store.close()


def validated_spec(helper: Helper, feature: str = "quantized") -> StudySpec:
    sketch = SketchSpec(FrequencySpec(d=3, m=40, scale=1.5, seed=2), feature, 4,
                        PrivacySpec(5.0))  # δ = (1 + e^ε)·L·2^−39 ≪ the ledgers' 1e-6
    sa = SecAggSpec.assuming(Assumptions(DEVICES, 1, 0), 100_000, None, STAGE_TIMEOUT)
    sa = replace(sa, validation="helper", helper=helper.target, helper_ca=helper.ca.read_text())
    return StudySpec.create("validated", sketch, 3, [-10.0] * 3, [10.0] * 3,
                            min_devices=DEVICES, replicates=1, secure_aggregation=sa)


def run(tmp_path, certs, target, coord, spec, hostile: str | None):
    """Enroll DEVICES agents (the last one ``hostile``), drive the study to its end; (study,
    agents, the total the coordinator decoded)."""
    operator = pb_grpc.OperatorStub(secure_channel(target, certs.ca_cert))
    study = operator.CreateStudy(pb.CreateStudyRequest(spec_json=spec.to_json()), metadata=META)
    x, _, _ = gmm(3000, 3, 3, 3.0, seed=6)
    agents = []
    for i, part in enumerate(np.split(x, [300, 800, 1400, 2100])):  # each n its own circuit
        data = LocalData(lambda part=part: split(part), 3)
        kind = hostile if i == DEVICES - 1 else None
        ledger = Ledger.create(tmp_path / f"d{i}.ledger", 1000.0, 1e-6)
        args = (secure_channel(target, certs.ca_cert), ledger, lambda data=data: data)
        agent = HostileAgent(*args, kind=kind) if kind else Agent(*args)
        token = operator.IssueTokens(pb.IssueTokensRequest(count=1), metadata=META).tokens[0]
        agent.ensure_enrolled(target, token, f"d{i}")
        agents.append(agent)
    seen = {}
    stop = time.monotonic() + 120  # generous: the whole round takes seconds on a quiet machine
    while True:
        s = operator.ShowStudy(pb.StudyRef(study_id=study.study_id), metadata=META)
        if s.state in (pb.DONE, pb.FAILED):
            break
        assert time.monotonic() < stop, "the validated round did not finish"
        rnd = coord.rounds.get(study.study_id)
        if rnd is not None and "finish" not in seen:
            seen["finish"] = rnd._finish
            rnd._finish = lambda total, n, r: (seen.update(total=total.copy(), devices=n),
                                               seen["finish"](total, n, r))
        for agent in agents:
            agent.step()
        time.sleep(0.05)
    return s, agents, seen, coord.rounds[study.study_id]


def premask(agent, study_id: str) -> np.ndarray:
    """x + e as the device's ledger recorded it with its spend."""
    return np.frombuffer(agent.ledger.find(study_id).premask, dtype="<i8")


def test_a_valid_study_publishes_exactly_the_sum_of_its_inputs(tmp_path, certs, helper,
                                                              coordinator):
    target, coord, _ = coordinator
    s, agents, seen, rnd = run(tmp_path, certs, target, coord, validated_spec(helper), None)
    assert s.state == pb.DONE, s.detail
    assert rnd.validation == {"valid": sorted(rnd.validation["valid"]), "excluded": []}
    assert len(rnd.validation["valid"]) == DEVICES and seen["devices"] == DEVICES
    assert seen["total"].tolist() == sum(premask(a, s.study_id) for a in agents).tolist()
    deltas = {a.ledger.find(s.study_id).delta for a in agents}
    assert deltas == {validity_delta(validated_spec(helper))}


@pytest.mark.parametrize("kind", ["random", "inflate"])
def test_a_hostile_report_is_excluded_and_the_rest_published(tmp_path, certs, helper,
                                                             coordinator, kind):
    target, coord, _ = coordinator
    s, agents, seen, rnd = run(tmp_path, certs, target, coord, validated_spec(helper), kind)
    assert s.state == pb.DONE, s.detail
    hostile_id = agents[-1].ledger.identity().device_id
    assert rnd.validation["excluded"] == [hostile_id]
    assert seen["devices"] == DEVICES - 1
    assert seen["total"].tolist() == sum(premask(a, s.study_id) for a in agents[:-1]).tolist()
    operator = pb_grpc.OperatorStub(secure_channel(target, certs.ca_cert))
    audit = operator.Audit(pb.AuditRequest(study_id=s.study_id), metadata=META).entries
    assert any(f"validated sum: {DEVICES - 1} reports valid, 1 excluded ({hostile_id})"
               in e.detail for e in audit), [e.detail for e in audit]


def test_a_device_without_a_delta_budget_declines_before_reading_its_data(tmp_path, certs, helper,
                                                                           coordinator):
    target, _, _ = coordinator
    operator = pb_grpc.OperatorStub(secure_channel(target, certs.ca_cert))
    study = operator.CreateStudy(pb.CreateStudyRequest(spec_json=validated_spec(helper).to_json()),
                                 metadata=META)
    reads = []

    def data():
        reads.append(1)
        return LocalData(lambda: split(np.zeros((10, 3))), 3)

    agent = Agent(secure_channel(target, certs.ca_cert),
                  Ledger.create(tmp_path / "pure.ledger", 1000.0), data)  # δ budget 0
    token = operator.IssueTokens(pb.IssueTokensRequest(count=1), metadata=META).tokens[0]
    agent.ensure_enrolled(target, token, "pure")
    out = agent.step()
    assert "a pure-ε budget" in out.refused[study.study_id]
    assert agent.ledger.find(study.study_id) is None and not reads


def test_any_error_in_the_validation_fails_the_study_and_spares_the_watcher(tmp_path, certs, helper,
                                                                           coordinator, monkeypatch):
    """Whatever the helper's answers make the validation raise (here a KeyError, as an unsent
    nonce once did) fails the study with its reason, publishes nothing, and leaves the
    coordinator's deadline watcher running."""
    def broken(*args, **kwargs):
        raise KeyError(b"a nonce nobody sent")

    monkeypatch.setattr(validated_round, "validate", broken)
    target, coord, _ = coordinator
    s, _, seen, _ = run(tmp_path, certs, target, coord, validated_spec(helper), None)
    assert s.state == pb.FAILED and "KeyError" in s.detail, s.detail
    assert "nothing is published" in s.detail and "total" not in seen
    assert coord._watcher.is_alive()


def test_the_round_publishes_nothing_below_l_minus_d_whatever_validate_returns(
        tmp_path, certs, helper, coordinator, monkeypatch):
    """The round checks the floor itself: a validation that (wrongly) came back with one valid
    report fails the study without publishing that report's x + e."""
    real = validated_round.validate

    def one_report(stub, meta, study_id, reports, seed, need):
        out = real(stub, meta, study_id, reports, seed, need)
        return Validated(out.accepted[:1], out.excluded + out.accepted[1:], out.total)

    monkeypatch.setattr(validated_round, "validate", one_report)
    target, coord, _ = coordinator
    s, _, seen, _ = run(tmp_path, certs, target, coord, validated_spec(helper), None)
    assert s.state == pb.FAILED and f"fewer than the study's L - D = {DEVICES - 1}" in s.detail, \
        s.detail
    assert "total" not in seen
