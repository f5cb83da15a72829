"""Secure aggregation as stages of a study over gRPC (TLS on loopback, real coordinator, real
device agents): the unmasked sum, dropouts, aborts, refusals, and creation-time sizing."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace

import grpc
import numpy as np
import pytest
from conftest import META, signed

from fedsketch.client import daemon, secure_steps
from fedsketch.client.agent import Agent
from fedsketch.client.ledger import Ledger
from fedsketch.client.localdata import LocalData
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.dp.calibration import l1_sensitivity
from fedsketch.common.dp.samplers import dlap_noise_share
from fedsketch.common.net import signing
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import wire as sw
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions
from fedsketch.common.sketch.box import Box
from fedsketch.common.sketch.frequencies import FrequencySpec, draw_frequencies
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.sketching import feature_sum
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.study import StudySpec, spec_sha256
from fedsketch.server.bench.metrics import split
from fedsketch.server.decode import pipeline
from fedsketch.server.sim.simulate import DROPOUT_STAGES


def test_the_stages_are_defined_once_and_keep_their_wire_values_and_names():
    assert sw.STAGES == (pb.REGISTER, pb.ADVERTISE_KEYS, pb.SHARE_KEYS, pb.MASKED_INPUT,
                         pb.CONSISTENCY, pb.UNMASK)
    assert [pb.Stage.Value(n) for n in ("UNMASK", "REGISTER", "CONSISTENCY")] == [5, 6, 8]
    assert DROPOUT_STAGES == ("advertise_keys", "share_keys", "masked_input", "consistency",
                              "unmask")


#: Stage timeout (s) of the tests' secure rounds: a bound for devices that answer, so wide that
#: only the devices a test holds back miss it. Measured: a stage of 8 in-process devices (m = 40)
#: stayed open at most 2.2 s with four busy loops beside it (load average 10 on 2 cores), each
#: device's pass being a few RPCs and ledger commits; 1.5 s failed under such load.
STAGE_TIMEOUT = 10.0


def secure_spec(devices: int, epsilon: float = 1000.0, threshold: int | None = None,
                dropouts: int = 0, colluders: int = 0, degree: int | None = None,
                timeout: float = STAGE_TIMEOUT, max_records: int = 100_000, r: int = 4) -> StudySpec:
    sketch = SketchSpec(FrequencySpec(d=3, m=40, scale=1.5, seed=2), "quantized", r,
                        PrivacySpec(epsilon))
    sa = SecAggSpec.assuming(Assumptions(devices, dropouts, colluders), max_records, degree,
                             timeout, threshold)
    return StudySpec.create("secure", sketch, 3, [-10.0] * 3, [10.0] * 3, min_devices=devices,
                            replicates=1, secure_aggregation=sa)


@pytest.fixture(scope="module")
def parts():
    x, _, _ = gmm(24_000, 3, 3, 3.0, seed=6)
    return np.array_split(x, 8)


def drive(coordinator_round, study_id, agents, silent=(), from_stage=pb.MASKED_INPUT,
          timeout=60.0):
    """Step the agents until the study closes; ``silent`` ones stop at ``from_stage``. A pass of
    every agent comes 0.05 s after one that saw the study's stage change, and the pause doubles
    up to 0.4 s while the stage stays: each device acts in its first two passes of a stage, so
    what stays is a stage waiting for its timeout (10 s here), which then costs 2.5 passes a
    second of every agent instead of 20 (about 1.7 CPU s of a 6-device wait)."""
    stop = time.monotonic() + timeout
    op = coordinator_round.operator()
    seen, pause = None, 0.05
    while True:
        s = op.ShowStudy(pb.StudyRef(study_id=study_id), metadata=META)
        if s.state in (pb.DONE, pb.FAILED):
            return s
        assert time.monotonic() < stop, "the round did not finish"
        pause = 0.05 if (s.state, s.stage) != seen else min(2 * pause, 0.4)
        seen = (s.state, s.stage)
        for i, agent in enumerate(agents):
            rank = sw.STAGES.index(s.stage) if s.stage in sw.STAGES else len(sw.STAGES)
            if i not in silent or rank < sw.STAGES.index(from_stage):
                agent.step()
        time.sleep(pause)


def spy_total(coordinator_round, study_id):
    """Capture the unmasked integer sum the coordinator decodes."""
    seen = {}
    rnd = coordinator_round.coordinator.rounds[study_id]
    finish = rnd._finish

    def capture(total, devices, records):
        seen.update(total=total.copy(), devices=devices, records=records)
        finish(total, devices, records)

    rnd._finish = capture
    return seen


def integer_sum(x: np.ndarray, spec: StudySpec) -> np.ndarray:
    """The clean encoded sum S of a device (r = m: no random mask), records clipped into the box."""
    box = Box(spec.lo, spec.hi)
    freqs = box.reduce(draw_frequencies(spec.sketch.frequencies))
    fs = feature_sum(box.centred(split(x)), freqs, spec.sketch.feature, spec.sketch.r)
    return np.stack([fs.re, fs.im])


@pytest.mark.parametrize("feature", ["quantized", "complex"])
def test_unmasked_sum_is_the_plain_integer_sum(coordinator_round, parts, feature):
    """Both maps' encoded sums go through secure aggregation exactly (MECHANISMS §1.10)."""
    epsilon = 25.0 * l1_sensitivity(feature, 40, "replace_one")  # a = e^{-25}: shares are 0
    sketch = SketchSpec(FrequencySpec(d=3, m=40, scale=1.5, seed=2), feature, 40,
                        PrivacySpec(epsilon))
    spec = StudySpec.create("exact", sketch, 3, [-10.0] * 3, [10.0] * 3, min_devices=6,
                            replicates=1,
                            secure_aggregation=SecAggSpec(4, 100_000, 0, 0, None, STAGE_TIMEOUT))
    study = coordinator_round.create(spec)
    seen = spy_total(coordinator_round, study.study_id)
    agents = [coordinator_round.agent(f"s{feature[0]}{i}", parts[i], budget=epsilon)
              for i in range(6)]
    s = drive(coordinator_round, study.study_id, agents)
    assert s.state == pb.DONE, s.detail
    expected = sum(integer_sum(parts[i], spec) for i in range(6))
    assert np.array_equal(seen["total"], expected.ravel())  # Re then Im, as the payload's words
    assert seen["devices"] == 6 and seen["records"] == sum(p.shape[0] for p in parts[:6])
    for agent in agents:
        (spend,) = agent.ledger.spends()
        assert spend.kind == "secagg_masked" and spend.acked_at is not None
    assert coordinator_round.store.contributions(study.study_id) == []  # no plain sketches


def test_an_off_centre_box_sums_the_features_of_the_records_themselves(coordinator_round, parts):
    """Secure aggregation over [490, 510]^3 (records shifted by 500, clipped): the unmasked sum
    equals Σ_i q(Ωᵀx_i + ξ) computed here in float64 without the Box class, but for records whose
    phase lies within 10⁻⁴ rad of a quadrant boundary (float32 may put them in the next one: 2
    steps each, counted here). A wrong centring moves about half of all the signs."""
    epsilon = 25.0 * l1_sensitivity("quantized", 40, "replace_one")  # a = e^{-25}: shares are 0
    sketch = SketchSpec(FrequencySpec(d=3, m=40, scale=1.5, seed=2), "quantized", 40,
                        PrivacySpec(epsilon))
    spec = StudySpec.create("off-centre", sketch, 3, [490.0] * 3, [510.0] * 3, min_devices=4,
                            replicates=1,
                            secure_aggregation=SecAggSpec(3, 100_000, 0, 0, None, STAGE_TIMEOUT))
    study = coordinator_round.create(spec)
    seen = spy_total(coordinator_round, study.study_id)
    agents = [coordinator_round.agent(f"oc{i}", parts[i] + 500.0, budget=epsilon) for i in range(4)]
    assert drive(coordinator_round, study.study_id, agents).state == pb.DONE
    freqs = draw_frequencies(spec.sketch.frequencies)
    x = np.clip(np.concatenate(parts[:4]), -10.0, 10.0) + 500.0
    t = x @ np.asarray(freqs.omega, np.float64) + np.asarray(freqs.xi, np.float64)
    expected = np.stack([np.sign(np.cos(t)).sum(axis=0), np.sign(np.sin(t)).sum(axis=0)])
    near = np.abs(t / (np.pi / 2) - np.rint(t / (np.pi / 2))) < 1e-4 / (np.pi / 2)
    assert np.all(np.abs(seen["total"].reshape(2, 40) - expected) <= 2 * near.sum(axis=0))


def test_dropouts_at_masked_input_complete_and_spend_only_for_submitters(coordinator_round,
                                                                         parts, monkeypatch):
    """8 devices assuming 2 dropouts and 1 colluder (h_min = 5), two silent: 6 submit. Each adds
    a share sized for h_min (not for the roster of 8 nor the 6 submitters), and the aggregate is
    the clean sum plus exactly the shares the submitters drew."""
    spec = secure_spec(8, epsilon=5.0, threshold=5, dropouts=2, colluders=1, degree=6,
                       r=40)  # r = m: no masks
    assert spec.assumptions.min_honest == 5
    study = coordinator_round.create(spec)
    seen = spy_total(coordinator_round, study.study_id)
    calls = []

    def spy(epsilon, delta1, h_min, dim):
        share = dlap_noise_share(epsilon, delta1, h_min, dim)
        calls.append(((epsilon, delta1, h_min, dim), share))
        return share

    monkeypatch.setattr(secure_steps, "dlap_noise_share", spy)
    judged = []
    real_variance = pipeline.noise_variance
    monkeypatch.setattr(pipeline, "noise_variance", lambda spec, records, draws=1.0: (
        judged.append(draws) or real_variance(spec, records, draws)))
    agents = [coordinator_round.agent(f"d{i}", parts[i]) for i in range(8)]
    s = drive(coordinator_round, study.study_id, agents, silent={1, 5})
    assert s.state == pb.DONE, s.detail
    res = coordinator_round.result(study.study_id)
    assert res.devices == 6
    # a device whose masked input is in the sum reads the result; one silent since MASKED_INPUT not
    assert agents[0].stub.GetResult(signed(agents[0], "GetResult", study.study_id)) == res
    with pytest.raises(grpc.RpcError) as err:
        agents[1].stub.GetResult(signed(agents[1], "GetResult", study.study_id))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert judged == [6 / 5] and res.status == "identified"  # six shares of 1/h_min of a draw
    for i, agent in enumerate(agents):
        assert len(agent.ledger.spends()) == (0 if i in {1, 5} else 1)
    delta1 = l1_sensitivity("quantized", spec.sketch.r, "replace_one")
    # every device drew its share as it prepared its input, before it registered: in the order
    # drive() steps them (0 to 7), the silent ones too; the sum holds the submitters' shares
    assert [args for args, _ in calls] == [(spec.sketch.privacy.epsilon, delta1, 5, 80)] * 8
    clean = sum(integer_sum(parts[i], spec) for i in range(8) if i not in {1, 5})
    noise = sum(share for i, (_, share) in enumerate(calls) if i not in {1, 5}).reshape(2, 40)
    assert noise.any() and np.array_equal(seen["total"].reshape(2, 40), clean + noise)


def test_a_device_sends_the_input_it_prepared_before_register_whatever_its_data_do_next(
        coordinator_round, parts, tmp_path, caplog):
    """A device reads its data once, before it registers (:mod:`fedsketch.client.secure_steps`):
    a data file replaced after REGISTER, or data that change under a feed that keeps no stamp,
    change nothing; each device sends the input of the records it counted and registered. Data
    that change between the count and the read that makes the input are refused for that pass
    (nothing sent) and prepared again on the next: that device registers its new count."""
    spec = secure_spec(6, threshold=4, dropouts=2)
    study = coordinator_round.create(spec)
    seen = spy_total(coordinator_round, study.study_id)
    agents = [coordinator_round.agent(f"ch{i}", parts[i]) for i in range(3)]
    npy = tmp_path / "file.npy"
    np.save(npy, parts[3])
    held = {"x": parts[4]}
    reads = iter([parts[5], *[parts[5][:-1]] * 10])  # counted, then one record fewer from then on
    for name, feed in (("file", lambda: daemon.local_data(npy)),
                       ("memory", lambda: LocalData(lambda: split(held["x"]), 3)),
                       ("moving", lambda: LocalData(lambda: split(next(reads)), 3))):
        book = Ledger.create(tmp_path / f"{name}.ledger", 1000.0)
        agent = Agent(coordinator_round.channel(), book, feed)
        agent.ensure_enrolled(coordinator_round.target, coordinator_round.tokens(1)[0], name)
        agents.append(agent)
    caplog.set_level(logging.INFO, logger="fedsketch.device")
    op = coordinator_round.operator()
    while op.ShowStudy(pb.StudyRef(study_id=study.study_id), metadata=META).stage == pb.REGISTER:
        for agent in agents:
            agent.step()
    assert "the data changed while the device read them" in caplog.text
    np.save(tmp_path / "other.npy", parts[3][:-1])
    (tmp_path / "other.npy").replace(npy)
    held["x"] = parts[4][:-1]
    assert drive(coordinator_round, study.study_id, agents).state == pb.DONE
    assert [len(a.ledger.spends()) for a in agents] == [1] * 6
    assert "changed while it was in use" not in caplog.text
    registered = sum(p.shape[0] for p in parts[:5]) + parts[5].shape[0] - 1
    assert seen["devices"] == 6 and seen["records"] == registered
    assert [a.ledger.spends()[0].n for a in agents[3:]] == [parts[3].shape[0], parts[4].shape[0],
                                                            parts[5].shape[0] - 1]


def test_too_few_submitters_abort_and_release_nothing(coordinator_round, parts):
    """Two silent devices where the study assumed one: 4 masked inputs, fewer than L − D = 5."""
    study = coordinator_round.create(secure_spec(6, threshold=4, dropouts=1))
    agents = [coordinator_round.agent(f"f{i}", parts[i]) for i in range(6)]
    s = drive(coordinator_round, study.study_id, agents, silent={0, 1})
    assert s.state == pb.FAILED and "only 4 masked inputs, fewer than the 5" in s.detail
    with pytest.raises(grpc.RpcError) as err:
        coordinator_round.result(study.study_id)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert [len(a.ledger.spends()) for a in agents] == [0, 0, 1, 1, 1, 1]
    assert coordinator_round.coordinator.rounds[study.study_id].held_messages() == 0


@pytest.mark.parametrize("members_silent", [1, 2])
def test_devices_silent_from_consistency_count_in_the_sum_or_deny_the_quorum(coordinator_round,
                                                                            parts, members_silent):
    """Six devices assuming one dropout: D' = 1, so the signing committee is p = 3 devices and
    the quorum q = 2. All send their masked input; then a non-member and one or two committee
    members go silent. With one member silent, two sign, the round unmasks all six inputs (a
    silent device's input stays in the sum) and decodes; with two, the coordinator has one
    committee signature, fails the round and releases nothing."""
    spec = secure_spec(6, threshold=4, dropouts=1)
    study = coordinator_round.create(spec)
    seen = spy_total(coordinator_round, study.study_id)
    agents = [coordinator_round.agent(f"c{members_silent}{i}", parts[i]) for i in range(6)]
    ids = [a.ledger.identity().device_id for a in agents]
    params = spec.round_params(study.study_id, tuple(ids))
    assert (params.committee_size, params.consistency_quorum) == (3, 2)
    members = [i for i, u in enumerate(ids) if u in params.committee]
    outside = [i for i, u in enumerate(ids) if u not in params.committee]
    silent = {*members[:members_silent], outside[0]}
    s = drive(coordinator_round, study.study_id, agents, silent=silent, from_stage=pb.CONSISTENCY)
    assert [len(a.ledger.spends()) for a in agents] == [1] * 6
    if members_silent == 1:
        assert s.state == pb.DONE, s.detail
        assert seen["devices"] == 6 and seen["records"] == sum(p.shape[0] for p in parts[:6])
    else:
        assert s.state == pb.FAILED and "CONSISTENCY" in s.detail
        assert "only 1 of the signing committee signed the survivor list" in s.detail
        assert not seen


def test_a_finished_round_refuses_late_messages_and_drops_its_state(coordinator_round, parts):
    """After the round, a signed message or fetch for any stage (FINISHED included) gets
    FAILED_PRECONDITION, and the round no longer holds messages, routing or masked inputs."""
    study = coordinator_round.create(secure_spec(4, threshold=3))
    agents = [coordinator_round.agent(f"late{i}", parts[i]) for i in range(4)]
    assert drive(coordinator_round, study.study_id, agents).state == pb.DONE
    ident = agents[0].ledger.identity()
    for stage in (pb.UNMASK, pb.FINISHED):
        body = b"{}"
        digest = sw.message_digest(study.study_id, ident.device_id, stage, body)
        msg = pb.SecAggMessage(study_id=study.study_id, device_id=ident.device_id, stage=stage,
                               body=body, signature=signing.sign(ident.private_key, digest))
        for call in (agents[0].stub.SecAggSend, agents[0].stub.SecAggFetch):
            with pytest.raises(grpc.RpcError) as err:
                call(msg, timeout=10)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "over" in err.value.details()
    rnd = coordinator_round.coordinator.rounds[study.study_id]
    assert rnd.finished and rnd.held_messages() == 0


def test_stage_refusals(coordinator_round, parts):
    study = coordinator_round.create(secure_spec(3, timeout=60))
    agent = coordinator_round.agent("r", parts[0])
    ident = agent.ledger.identity()

    def message(stage, body, key=None):
        digest = sw.message_digest(study.study_id, ident.device_id, stage, body)
        return pb.SecAggMessage(study_id=study.study_id, device_id=ident.device_id, stage=stage,
                                body=body, signature=signing.sign(key or ident.private_key,
                                                                  digest))

    cases = [
        (message(pb.REGISTER, b'{"n":5}', key=signing.new_private_key()),
         grpc.StatusCode.UNAUTHENTICATED),
        (message(pb.SHARE_KEYS, b"{}"), grpc.StatusCode.FAILED_PRECONDITION),
        (message(pb.REGISTER, b'{"n":0.5}'), grpc.StatusCode.INVALID_ARGUMENT),
        (message(pb.REGISTER, b'{"n":true}'), grpc.StatusCode.INVALID_ARGUMENT),
        (message(pb.REGISTER, b'{"n":'), grpc.StatusCode.INVALID_ARGUMENT),
        (message(pb.REGISTER, b"[" * 100_000), grpc.StatusCode.INVALID_ARGUMENT),
    ]
    for msg, code in cases:
        with pytest.raises(grpc.RpcError) as err:
            agent.stub.SecAggSend(msg, timeout=10)
        assert err.value.code() == code
    assert not agent.stub.SecAggSend(message(pb.REGISTER, b'{"n":3000}')).duplicate
    assert agent.stub.SecAggSend(message(pb.REGISTER, b'{"n":3000}')).duplicate
    with pytest.raises(grpc.RpcError) as err:
        agent.stub.SecAggSend(message(pb.REGISTER, b'{"n":2999}'))
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.RpcError) as err:  # plain contributions are refused
        agent.stub.Submit(pb.Contribution(study_id=study.study_id, device_id=ident.device_id),
                          timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_a_malformed_stage_message_is_refused_and_the_round_goes_on(coordinator_round, parts):
    """At every stage, a device in the roster sends bytes that do not parse: the coordinator
    answers INVALID_ARGUMENT and keeps nothing, the device then sends its real message, and the
    round finishes (bad bytes from one device used to abort everyone's round at the stage's
    close)."""
    study = coordinator_round.create(secure_spec(3, timeout=60))
    agents = [coordinator_round.agent(f"mal{i}", parts[i]) for i in range(3)]
    ident = agents[0].ledger.identity()
    bad = {pb.ADVERTISE_KEYS: [b'{"c_pk": 1}', b"[" * 100_000],  # deeper than the stack
           pb.SHARE_KEYS: [b"[]", b'{"dev": 5}'], pb.MASKED_INPUT: [b"\0" * 7],
           pb.CONSISTENCY: [b'{"signature": "%%"}', b'{"signature": ["AA=="]}'],
           pb.UNMASK: [b'{"dev": 5}', b'{"dev": ["b", ["AA=="]]}', b'{"dev": ["b", 5]}']}
    op, tried = coordinator_round.operator(), []
    while (s := op.ShowStudy(pb.StudyRef(study_id=study.study_id), metadata=META)).state not in (
            pb.DONE, pb.FAILED):
        if s.stage in bad and s.stage not in tried:
            for agent in agents[1:]:
                agent.step()
            for body in bad[s.stage]:
                digest = sw.message_digest(study.study_id, ident.device_id, s.stage, body)
                with pytest.raises(grpc.RpcError) as err:
                    agents[0].stub.SecAggSend(pb.SecAggMessage(
                        study_id=study.study_id, device_id=ident.device_id, stage=s.stage,
                        body=body, signature=signing.sign(ident.private_key, digest)),
                        timeout=10)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, body[:40]
                assert f"malformed {pb.Stage.Name(s.stage)} message" in err.value.details()
            tried.append(s.stage)
        for agent in agents:
            agent.step()
    assert s.state == pb.DONE, s.detail
    assert tried == list(bad)


def test_a_device_refuses_a_malformed_bundle_and_keeps_running(coordinator_round, parts,
                                                               monkeypatch, caplog):
    """A coordinator whose UNMASK bundle holds numbers where signatures belong: every device
    drops out with the reason (a ValueError, never an exception that would stop its daemon),
    reveals nothing, and the round fails at UNMASK."""
    honest = sw.signed_to_json
    monkeypatch.setattr(sw, "signed_to_json", lambda signed: honest(signed) | {
        "signatures": dict.fromkeys(signed.signatures, 5)})
    study = coordinator_round.create(secure_spec(3))
    agents = [coordinator_round.agent(f"mb{i}", parts[i]) for i in range(3)]
    caplog.set_level(logging.WARNING, logger="fedsketch.device")
    s = drive(coordinator_round, study.study_id, agents)
    assert s.state == pb.FAILED and "UNMASK" in s.detail
    assert "expected a base64 string" in caplog.text


@pytest.mark.parametrize(("change", "words"), [
    ({"max_records": 10**19}, "62"),
    ({"feature": "complex", "max_records": 2**52}, "62"),  # γ = 1024 steps per record
    ({"threshold": 4, "degree": 2}, "too high"),
    ({"threshold": 2}, "too low"),
    ({"dropouts": 2, "colluders": 2}, "less than one noise draw"),
])
def test_unusable_secure_studies_are_refused_at_creation(change, words):
    sa = {"threshold": 3, "max_records": 10**6, "dropouts": 0, "colluders": 0, "degree": None}
    feature = change.pop("feature", "quantized")
    sa.update(change)
    sketch = SketchSpec(FrequencySpec(d=3, m=40, scale=1.5), feature, 4, PrivacySpec(1.0))
    with pytest.raises(ValueError, match=words):
        StudySpec.create("x", sketch, 3, [-1.0] * 3, [1.0] * 3, min_devices=4,
                         secure_aggregation=SecAggSpec(**sa)).check_new()


def test_a_roster_below_l_minus_d_fails_at_register_before_anyone_spends(coordinator_round,
                                                                         parts):
    """5 devices assuming at most 1 dropout: 3 register, fewer than L − D = 4 (though as many
    as the threshold). The round fails when REGISTER times out, and nobody has spent."""
    study = coordinator_round.create(secure_spec(5, threshold=3, dropouts=1))
    agents = [coordinator_round.agent(f"few{i}", parts[i]) for i in range(3)]
    s = drive(coordinator_round, study.study_id, agents)
    assert s.state == pb.FAILED
    assert "3 devices registered; the study needs 4 to 5" in s.detail
    assert "nobody has spent anything" in s.detail
    assert all(a.ledger.spends() == [] for a in agents)


def test_devices_refuse_a_stored_study_whose_threshold_is_unsafe(coordinator_round, parts):
    """Secure studies written straight into the store, as by a coordinator that skips its own
    checks: t = 2 of 4 devices lets one split of a neighbourhood unmask a device, and a
    fractional dropout count is no count; a device refuses both, spends nothing and goes on."""
    spec = secure_spec(4, threshold=3)
    unsafe = replace(spec, secure_aggregation=replace(spec.secure_aggregation, threshold=2))
    text = unsafe.to_json()
    coordinator_round.store.create_study("st-unsafe", text, spec_sha256(text), None, 4)
    malformed = json.loads(text)
    malformed["secure_aggregation"]["dropouts"] = 0.5
    coordinator_round.store.create_study("st-malformed", json.dumps(malformed),
                                         spec_sha256(json.dumps(malformed)), None, 4)
    agent = coordinator_round.agent("unsafe", parts[0])
    refused = agent.step().refused
    assert "threshold 2 is too low" in refused["st-unsafe"]
    assert "dropouts must be an integer" in refused["st-malformed"]
    assert agent.ledger.spends() == []


def test_devices_refuse_round_parameters_the_spec_does_not_imply(coordinator_round, parts,
                                                                 monkeypatch, caplog):
    """A coordinator that advertises min_submitters 3 instead of L − D = 4 (parameters that
    are valid in themselves: 3 is the fewest the consistency round allows for 4): every device drops out at
    ADVERTISE_KEYS, before it could spend, and the round fails below the threshold."""
    honest = sw.params_to_json
    monkeypatch.setattr(sw, "params_to_json", lambda params, keys, records: honest(
        replace(params, min_submitters=3), keys, records))
    study = coordinator_round.create(secure_spec(4, threshold=3))
    agents = [coordinator_round.agent(f"lied{i}", parts[i]) for i in range(4)]
    caplog.set_level(logging.WARNING, logger="fedsketch.device")
    s = drive(coordinator_round, study.study_id, agents)
    assert s.state == pb.FAILED and "ADVERTISE_KEYS" in s.detail
    assert "differ from the study's in min_submitters" in caplog.text
    assert all(a.ledger.spends() == [] for a in agents)
