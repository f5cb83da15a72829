"""The guards of a validated secure study against a coordinator or helper that deviates, and
against faults: a device answers only REGISTER and MASKED_INPUT (the helper's share never goes
to the coordinator), the coordinator publishes nothing over fewer than L − D valid reports or on
a helper reply naming a report it never sent, a helper that cannot be reached is a retry of that
study only, the watcher's ticks survive one round's fault, and the coordinator charges the δ a
device records.

The device is a real :class:`Agent` with a real ledger, uploading to a real helper process over
TLS; the coordinator it talks to is played by replacing the agent's two stage calls (fetch and
send), since the point is a coordinator that does what the real one never does. The hostile
helper is the real helper service with two methods overridden, served over gRPC on loopback."""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace

import grpc
import numpy as np
import pytest
from helperproc import Helper

from fedsketch.client.agent import Agent
from fedsketch.client.ledger import Identity, Ledger
from fedsketch.client.localdata import LocalData, Retry
from fedsketch.client.secure_session import Session
from fedsketch.client.study_pass import Outcome
from fedsketch.common.net import signing
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.secagg import wire as sw
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.study import StudySpec, spec_sha256
from fedsketch.common.study.validated import validity_delta
from fedsketch.common.validity import xof
from fedsketch.common.validity.sharing import proven
from fedsketch.server.bench.metrics import split
from fedsketch.server.helper import service as hs
from fedsketch.server.helper.link import Report, validate
from fedsketch.server.helper.store import HelperStore
from fedsketch.server.service.accounting import release_cost
from fedsketch.server.service.rounds import tick_each

DEVICES = 5
EPSILON = 2.0


@pytest.fixture(scope="module")
def helper(tmp_path_factory):
    h = Helper(tmp_path_factory.mktemp("helper"))
    yield h
    h.stop()


def spec_for(target: str, ca: str, devices: int = DEVICES) -> StudySpec:
    sketch = SketchSpec(FrequencySpec(d=3, m=40, scale=1.5, seed=2), "quantized", 4,
                        PrivacySpec(EPSILON))
    sa = SecAggSpec.assuming(Assumptions(devices, 1, 0), 100_000, None, 10.0)
    sa = replace(sa, validation="helper", helper=target, helper_ca=ca)
    return StudySpec.create("validated", sketch, 3, [-10.0] * 3, [10.0] * 3,
                            min_devices=devices, replicates=1, secure_aggregation=sa)


class Device:
    """One real agent whose coordinator is played here: ``sent`` holds every (stage, body) the
    device sent, and ADVERTISE_KEYS offers a well-formed round setup with the device's own key."""

    def __init__(self, tmp_path, spec: StudySpec, study_id: str = "S-v"):
        self.spec, self.study_id = spec, study_id
        self.ledger = Ledger.create(tmp_path / "dev.ledger", 1000.0, 1e-6)
        key = signing.new_private_key()
        self.identity = Identity("dev-0", key, "coord:1")
        self.ledger.set_identity(self.identity)
        records = np.random.default_rng(1).uniform(-9, 9, size=(400, 3))
        self.agent = Agent(grpc.insecure_channel("127.0.0.1:1"), self.ledger,
                           lambda: LocalData(lambda: split(records), 3))
        self.agent._coordinator = self.identity.coordinator
        self.sent: list[tuple[int, bytes]] = []
        self.agent._stage_send = lambda identity, s, stage, body: self.sent.append((stage, body))
        roster = tuple(f"dev-{i}" for i in range(DEVICES))
        keys = {u: signing.public_key(key if u == "dev-0" else signing.new_private_key())
                for u in roster}
        advert = sw.dump(sw.params_to_json(spec.round_params(study_id, roster), keys, 2000.0))
        self.agent._stage_fetch = lambda identity, s, stage: (
            advert if stage == pb.ADVERTISE_KEYS else b"{}")

    def step(self, stage: int):
        sj = self.spec.to_json()
        study = pb.Study(study_id=self.study_id, spec_json=sj, spec_sha256=spec_sha256(sj),
                         stage=stage, state=pb.COLLECTING)
        return self.agent._secure_step(self.identity, study, Outcome())


@pytest.mark.parametrize("after_report", [False, True])
@pytest.mark.parametrize("stage", [pb.ADVERTISE_KEYS, pb.CONSISTENCY, pb.UNMASK])
def test_a_device_answers_no_stage_a_validated_round_does_not_have(tmp_path, helper, stage,
                                                                    after_report):
    """A coordinator announcing a SecAgg+ stage for a validated study (before or after the
    report) gets nothing: the device leaves the round, its helper share stays off the wire to
    the coordinator, and its spend stands only if its report went out."""
    device = Device(tmp_path, spec_for(helper.target, helper.ca.read_text()))
    assert device.step(pb.REGISTER) is None  # prepares
    assert device.step(pb.REGISTER) is None  # registers
    if after_report:
        assert device.step(pb.MASKED_INPUT) is None
    reason = device.step(stage)
    assert reason is not None and pb.Stage.Name(stage) in reason and "leaves the round" in reason
    assert [s for s, _ in device.sent] == [pb.REGISTER] + [pb.MASKED_INPUT] * after_report
    for later in (pb.MASKED_INPUT, pb.UNMASK, pb.CONSISTENCY):  # and nothing after it either
        device.step(later)
    assert [s for s, _ in device.sent] == [pb.REGISTER] + [pb.MASKED_INPUT] * after_report
    session = device.agent._sessions[device.study_id]
    assert session.left and session.helper_upload is None and pb.UNMASK not in session.replies
    assert (device.ledger.find(device.study_id) is not None) == after_report


def test_the_helper_share_is_kept_apart_and_erased_once_uploaded(tmp_path, helper):
    device = Device(tmp_path, spec_for(helper.target, helper.ca.read_text()))
    device.step(pb.REGISTER)
    device.step(pb.REGISTER)
    assert device.step(pb.MASKED_INPUT) is None
    session = device.agent._sessions[device.study_id]
    assert pb.UNMASK not in session.replies and session.helper_upload is None
    assert device.ledger.find(device.study_id).delta == validity_delta(device.spec)


def test_an_unreachable_helper_is_a_retry_of_that_study_naming_the_helper(tmp_path):
    """The helper down (nothing listens at its address): the report step is a Retry naming
    the helper, the spend and the session stay (its helper share kept across a restart), and
    nothing goes to the coordinator meanwhile."""
    down = Helper(tmp_path / "helper")
    target, ca = down.target, down.ca.read_text()
    device = Device(tmp_path, spec_for(target, ca))
    device.step(pb.REGISTER)
    device.step(pb.REGISTER)
    down.stop()
    reason = device.step(pb.MASKED_INPUT)
    assert isinstance(reason, Retry) and f"the helper at {target} cannot be reached" in reason
    assert device.ledger.find(device.study_id) is not None
    session = device.agent._sessions[device.study_id]
    assert not session.left and pb.MASKED_INPUT not in session.done
    assert [s for s, _ in device.sent] == [pb.REGISTER]  # the coordinator's share waits too
    stored = device.ledger.sessions()[device.study_id]  # a restarted daemon uploads the same bytes
    kept = Session.load(device.study_id, stored, device.identity)
    assert kept.helper_upload == session.helper_upload and kept.helper_upload is not None
    assert pb.UNMASK not in kept.replies


class ShrinkingHelper(hs.HelperService):
    """Spoils its Prepare message for every report but the first, then aggregates over that one
    report whatever the minimum asked; with ``extra``, names a report nobody sent."""

    extra = False

    def Prepare(self, request, context):
        reply = super().Prepare(request, context)
        for share in reply.shares[1:]:
            share.own_part = b"\0" * 16
        if self.extra:
            reply.shares.add().CopyFrom(reply.shares[0])
            reply.shares[-1].nonce = b"\1" * len(reply.shares[0].nonce)
        return reply

    def Aggregate(self, request, context):
        request.min_reports = 1
        first = request.leader[0].nonce
        for share in request.leader:
            share.present = share.nonce == first
        return super().Aggregate(request, context)


@pytest.fixture
def shrinking(tmp_path, monkeypatch):
    monkeypatch.setattr(hs, "HelperService", ShrinkingHelper)
    server, port = hs.build_helper(HelperStore(str(tmp_path / "h.db")),
                                   hashlib.sha256(b"tok").hexdigest(), "127.0.0.1:0", None)
    yield pb_grpc.HelperStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    server.stop(None)
    ShrinkingHelper.extra = False


def uploaded_reports(stub, count: int = 6) -> list[Report]:
    circuit = (80, 5000, 0)
    proof, rng, reports = proven(*circuit), np.random.default_rng(0), []
    for _ in range(count):
        nonce = xof.seed()
        leader, h = proof.shard(rng.integers(-4000, 4000, 80), nonce)
        stub.Upload(pb.HelperUpload(study_id="S", nonce=nonce, seed=h.seed, blind=h.blind,
                                    peer_part=h.peer_part))
        reports.append(Report(nonce, leader, circuit))
    return reports


def test_a_helper_that_shrinks_the_valid_set_below_l_minus_d_publishes_nothing(shrinking):
    reports = uploaded_reports(shrinking)
    with pytest.raises(RuntimeError, match="1 valid reports, fewer than the study's L - D = 5"):
        validate(shrinking, (("authorization", "Bearer tok"),), "S", reports, xof.seed(), 5)


def test_a_helper_reply_naming_an_unsent_report_fails_the_validation(shrinking):
    ShrinkingHelper.extra = True
    reports = uploaded_reports(shrinking)
    with pytest.raises(RuntimeError, match="names a report the coordinator did not send"):
        validate(shrinking, (("authorization", "Bearer tok"),), "S", reports, xof.seed(), 1)


def test_one_round_whose_tick_raises_stops_no_other_rounds_tick():
    ticked = []

    class Broken:
        study_id = "S-broken"

        def tick(self, now):
            raise KeyError(b"unsent nonce")

    class Fine:
        study_id = "S-fine"

        def tick(self, now):
            ticked.append(now)

    tick_each([Broken(), Fine()], 7.0)
    assert ticked == [7.0]


def test_the_coordinator_charges_the_delta_a_device_records():
    """δ = (1 + e^ε)·L·2^−39 (total variation L·2^−39 costs that in δ), on both sides."""
    spec = spec_for("h:1", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n", 20)
    expected = (1 + math.exp(EPSILON)) * 20 * 2.0 ** -39
    assert validity_delta(spec) == pytest.approx(expected, rel=1e-12)
    assert release_cost(spec) == (EPSILON, pytest.approx(expected, rel=1e-12))
