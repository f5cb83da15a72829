"""``--scale auto`` as a federated study's round 0, end to end in one process: a real coordinator
(TLS on loopback, SQLite) and real device agents release their calibration sketches, the
coordinator fits σ and opens the sketch round with it, and the study goes on as any."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace

import numpy as np
import pytest
from conftest import META, contribute_all, study_spec
from test_refine_rounds import drive
from test_secure_refine import run_to_end

import fedsketch.client.agent as agent_module
from fedsketch.client.agent import Agent
from fedsketch.client.ledger import DEFAULT_SOURCE, Ledger
from fedsketch.client.secure_steps import SECURE_KIND
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.dp.calibration import dlap_param, l1_sensitivity
from fedsketch.common.dp.plan import noise_plan
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions
from fedsketch.common.sketch.box import Box
from fedsketch.common.sketch.frequencies import draw_frequencies
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.scale import calibrate_scale, default_range
from fedsketch.common.study.calibration_round import SketchRound, check_calibration, split_auto
from fedsketch.common.study.refine import RefineSpec
from fedsketch.common.study.secure_calibration import SecureCalibration
from fedsketch.common.study.study import StudySpec
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n
from fedsketch.server.cli.operator_view import status_document


@pytest.fixture(scope="module")
def data():
    x, _, _ = gmm(60_000, 3, 3, 3.0, seed=2)
    return x


def auto_spec(epsilon: float = 20.0, **rules) -> StudySpec:
    """A study over [−10, 10]^3 whose round 0 takes a tenth of ``epsilon``."""
    plan, rest = split_auto(epsilon, default_range(Box(np.full(3, -10.0), np.full(3, 10.0))))
    base = study_spec(epsilon=rest, **rules)
    freqs = replace(base.sketch.frequencies, scale=plan.placeholder)
    return StudySpec.create(base.name, replace(base.sketch, frequencies=freqs), base.k, base.lo,
                            base.hi, **{**rules, "replicates": 2, "calibration": plan})


class Crash(Exception):
    """A device killed between its ledger commit and its first send."""


def test_round0_fits_sigma_then_the_sketch_round_uses_it_and_each_device_spends_once(
        coordinator_round, data, monkeypatch):
    """Four devices: round 0, the sketch round at the fitted σ, one refinement round. σ is a
    reliable fit inside the range (not a boundary), the sketch round's hashed spec carries it
    and its Ω hash, status and result explain it, every device spends round 0 once (one of
    them crashes after committing it and re-sends the same bytes after its restart), and the
    result is Lloyd-accurate."""
    r = coordinator_round
    spec = auto_spec(min_devices=4, refine=RefineSpec((1.0,)))
    study = r.create(spec)
    parts = np.array_split(data, 4)
    agents = [r.agent(f"d{i}", part) for i, part in enumerate(parts)]

    def crash() -> None:
        raise Crash

    monkeypatch.setattr(agent_module, "fault_point", crash)
    for a in agents[:3]:
        a.step()  # joins round 0's roster; the fourth fills it and crashes after its commit
    with pytest.raises(Crash):
        agents[3].step()
    committed = agents[3].ledger.find(study.study_id)
    assert committed is not None and committed.acked_at is None
    monkeypatch.undo()
    restarted = Agent(r.channel(), Ledger(agents[3].ledger.path), agents[3].data)
    restarted.ensure_enrolled(r.target, None, "restarted")
    assert restarted.step().resent == [study.study_id]
    stored = {c.device_id: c.payload for c in r.store.contributions(study.study_id)}
    assert stored[restarted.ledger.identity().device_id] == committed.payload
    agents[3] = restarted
    book = restarted.ledger  # budget 1000, study 2 + 18 + 1: round 0 spent, the rest kept aside
    assert book.refusal(DEFAULT_SOURCE, 1000 - 21.0 + 0.5, 0.0) is not None
    assert book.refusal(DEFAULT_SOURCE, 1000 - 21.0 - 0.5, 0.0) is None

    assert drive(r, agents, study.study_id).state == pb.DONE
    full = json.loads(r.store.get_result(study.study_id))
    cal = full["calibration"]
    assert cal["reliable"] and cal["choice"] in ("fit", "typical scale")
    clean = calibrate_scale(lambda: split(data), Box(spec.lo, spec.hi), math.inf, seed=1)
    assert cal["sigma"] == pytest.approx(clean.sigma, rel=0.1)  # the pooled, noiseless fit
    assert 0.1 < cal["sigma"] < 10.0 and cal["epsilon"] == pytest.approx(2.0)
    assert cal["explanation"].startswith(f"σ = {cal['sigma']:.4g}")
    sketch_row = r.store.get_study(full["sketch_round"])
    rnd = SketchRound.from_json(sketch_row.spec_json)
    assert sketch_row.parent == study.study_id and rnd.sigma == cal["sigma"]
    assert rnd.parent_sha256 == study.spec_sha256
    assert rnd.omega_sha256 == draw_frequencies(
        replace(spec.sketch.frequencies, scale=rnd.sigma)).sha256
    assert sketch_row.state == "done" and sketch_row.contributions == 4
    res = r.operator().GetResult(pb.StudyRef(study_id=study.study_id), metadata=META)
    assert json.loads(res.calibration_json) == cal  # `coordinator result` prints it
    doc = status_document(r.operator().StudyStatus(pb.StatusRequest(study_id=study.study_id),
                                                   metadata=META))
    assert doc["calibration"] == cal and [x["round"] for x in doc["rounds"]] == [0, 1]
    assert doc["rounds"][0]["name"].startswith(f"sketch round (σ = {cal['sigma']:.4g})")
    clipped = np.clip(data, -10.0, 10.0)
    ref = sse_per_n(split(clipped), sklearn_kmeans_centroids(clipped, 3))
    assert sse_per_n(split(clipped), np.asarray(full["centroids"])) / ref < 1.02
    for a in agents:
        spends = a.ledger.spends()
        zero = [s for s in spends if s.study_id == study.study_id]
        assert len(zero) == 1 and zero[0].epsilon == pytest.approx(2.0)
        assert "round 0 (σ calibration)" in zero[0].study_name
        sketch = [s for s in spends if s.study_id == full["sketch_round"]]
        assert [(s.parent, s.round) for s in sketch] == [(study.study_id, 0)]
        assert len(spends) == 3  # round 0, the sketch, refinement round 1
        assert sum(s.epsilon for s in spends) == pytest.approx(spec.total_epsilon, rel=1e-12)
    for c in r.store.contributions(study.study_id):  # each device's round 0, as released
        assert check_calibration(spec, c.kind, c.payload, c.n).shape == (2, 64)


def test_secure_round0_unmasks_one_draw_and_the_sketch_round_is_secure_too(coordinator_round,
                                                                          data):
    """Four devices under secure aggregation: round 0's unmasked sum gives σ (the pooled
    noiseless fit within 10 %), the sketch round is a secure study of its own at that σ, and
    each device spent round 0 and the sketch once each, as masked inputs."""
    r = coordinator_round
    sa = SecAggSpec.assuming(Assumptions(4, 0, 0), 100_000, None, 5.0)
    spec = auto_spec(min_devices=4, secure_aggregation=sa)
    study = r.create(spec)
    agents = [r.agent(f"s{i}", part) for i, part in enumerate(np.array_split(data, 4))]
    assert run_to_end(r, study, agents).state == pb.DONE
    full = json.loads(r.store.get_result(study.study_id))
    cal = full["calibration"]
    clean = calibrate_scale(lambda: split(data), Box(spec.lo, spec.hi), math.inf, seed=1)
    assert cal["reliable"] and cal["sigma"] == pytest.approx(clean.sigma, rel=0.1)
    rnd = SketchRound.from_json(r.store.get_study(full["sketch_round"]).spec_json)
    assert rnd.secure_aggregation is not None and rnd.deadline is None
    assert r.store.contributions(study.study_id) == []  # no plain release was stored
    for a in agents:
        spends = a.ledger.spends()
        assert sorted(s.study_id for s in spends) == sorted([study.study_id, full["sketch_round"]])
        assert all(s.kind == SECURE_KIND for s in spends)
        assert sum(s.epsilon for s in spends) == pytest.approx(spec.total_epsilon, rel=1e-12)


def test_round0_without_its_quorum_fails_the_study_before_the_sketch(coordinator_round, data):
    """One of the two devices round 0 needs registers before the operator closes it: the study
    fails, says why, and opens no sketch round; nobody spent anything."""
    r = coordinator_round
    study = r.create(auto_spec(min_devices=2))
    lone = r.agent("lone", data[:2000])
    assert lone.step().registered == [study.study_id]
    r.operator().CloseStudy(pb.StudyRef(study_id=study.study_id), metadata=META)
    s = r.wait(study.study_id)
    assert s.state == pb.FAILED and "round 0 (σ calibration) failed" in s.detail
    assert "1 of 2 devices registered" in s.detail
    assert r.store.rounds(study.study_id) == [] and lone.ledger.spends() == []


def test_a_secure_round0_that_aborts_fails_the_study_in_round_0s_words(coordinator_round, data):
    """Round 0 of a secure study (quorum 4) gets one device: REGISTER closes by its timeout and
    secure aggregation aborts; the study's detail says it is round 0 that failed, in the words
    of a plain round 0 without its quorum (one wording), and nobody spent anything."""
    r = coordinator_round
    sa = SecAggSpec.assuming(Assumptions(4, 0, 0), 100_000, None, 0.3)
    study = r.create(auto_spec(min_devices=4, secure_aggregation=sa))
    lone = r.agent("lone", data[:2000])
    lone.step()  # prepares its input
    lone.step()  # registers
    s = r.wait(study.study_id, timeout=30)
    assert s.state == pb.FAILED and s.detail.startswith(
        "round 0 (σ calibration) failed, nobody spent on the sketch: secure aggregation aborted at "
        "REGISTER"), s.detail
    assert r.store.rounds(study.study_id) == [] and lone.ledger.spends() == []


def test_a_device_that_missed_round_0_may_send_the_sketch(coordinator_round, data):
    """Round 0 (quorum 2, roster 3) is sent by a and b; c, on its roster, misses it (the operator
    closes round 0 first). The sketch round is sent by a and c: the study is done, and c spent
    the sketch alone."""
    r = coordinator_round
    study = r.create(auto_spec(min_devices=2, roster=3, collect_seconds=900.0))
    a, b, c = (r.agent(name, part) for name, part in zip("abc", np.array_split(data, 3), strict=True))
    c.step()  # c joins round 0's roster first, and is not stepped again before it closes
    contribute_all([a, b], study.study_id)
    r.operator().CloseStudy(pb.StudyRef(study_id=study.study_id), metadata=META)
    stop = time.monotonic() + 60
    while not r.store.rounds(study.study_id):  # the coordinator fits σ, opens the sketch round
        assert time.monotonic() < stop
        time.sleep(0.02)
    (sketch,) = r.store.rounds(study.study_id)
    contribute_all([a, c], sketch.study_id)
    r.operator().CloseStudy(pb.StudyRef(study_id=sketch.study_id), metadata=META)
    assert r.wait(study.study_id).state == pb.DONE
    assert [(s.study_id, s.parent) for s in c.ledger.spends()] == [(sketch.study_id, study.study_id)]
    assert {x.device_id for x in r.store.contributions(sketch.study_id)} == {
        a.ledger.identity().device_id, c.ledger.identity().device_id}


def test_a_device_that_missed_round_0_budgets_the_sketch_and_the_round_after_it(coordinator_round,
                                                                                data):
    """As above, with one refinement round (ε 1) after the sketch (ε 18). c, which missed round 0,
    is refused the sketch round while its budget covers the sketch but not the round after it,
    and spends nothing; once its owner raises the budget, c sends the sketch and its ledger
    keeps the round's ε aside from every other study (until the sketch round's deadline, then
    round 1's length and a day), still after the sketch round is done, until the study itself
    ended; c pays round 1 from it."""
    r = coordinator_round
    spec = auto_spec(min_devices=2, roster=3, collect_seconds=900.0, refine=RefineSpec((1.0,), 900.0))
    study, sketch_eps = r.create(spec), spec.sketch.privacy.epsilon
    a, b, c = (r.agent(name, part) for name, part in zip("abc", np.array_split(data, 3), strict=True))
    c.step()
    contribute_all([a, b], study.study_id)
    r.operator().CloseStudy(pb.StudyRef(study_id=study.study_id), metadata=META)
    stop = time.monotonic() + 60
    while not r.store.rounds(study.study_id):
        assert time.monotonic() < stop
        time.sleep(0.02)
    (sketch,) = r.store.rounds(study.study_id)
    c.ledger.lower(DEFAULT_SOURCE, sketch_eps + 0.5)  # the sketch fits, the round after it not
    refused = c.step().refused[sketch.study_id]  # the sketch and round 1 after it
    assert f"it asks ε = {sketch_eps + 1.0:g}" in refused and c.ledger.spends() == []
    c.ledger.raise_budget(DEFAULT_SOURCE, sketch_eps + 1.5, None, "the study's rounds too")
    contribute_all([a, c], sketch.study_id)
    ((kept_for, _, _, kept, until),) = c.ledger.promises()
    assert (kept_for, kept) == (study.study_id, pytest.approx(1.0, rel=1e-12))
    deadline = SketchRound.from_json(sketch.spec_json).deadline  # the sketch round's, then round 1
    assert until == pytest.approx(deadline + 900.0 + 86400.0, abs=1e-3)
    assert c.ledger.refusal(DEFAULT_SOURCE, 0.6, 0.0) is not None  # 1.5 left, 1.0 of it kept
    assert c.ledger.refusal(DEFAULT_SOURCE, 0.4, 0.0) is None
    r.operator().CloseStudy(pb.StudyRef(study_id=sketch.study_id), metadata=META)
    while len(r.store.rounds(study.study_id)) < 2:  # the sketch round is done, round 1 opens
        assert time.monotonic() < stop
        time.sleep(0.02)
    c.step()
    assert [p[0] for p in c.ledger.promises()] == [study.study_id]
    assert drive(r, [a, b, c], study.study_id).state == pb.DONE
    c.step()  # learns the end
    assert [s.round for s in c.ledger.spends()] == [0, 1] and c.ledger.promises() == []
    assert math.fsum(s.epsilon for s in c.ledger.spends()) == pytest.approx(sketch_eps + 1.0)


def test_round_0_asks_for_the_sketchs_delta_before_anything_is_spent(coordinator_round, data):
    """The sketch after round 0 has δ = 10⁻⁶: a device whose budget has no δ (pure ε) is refused
    round 0 for it, spending nothing, instead of paying round 0 and being refused the sketch."""
    r = coordinator_round
    spec = auto_spec(min_devices=2)
    sketch = replace(spec.sketch, privacy=replace(spec.sketch.privacy, delta=1e-6))
    study = r.create(StudySpec.create(spec.name, sketch, spec.k, spec.lo, spec.hi, min_devices=2,
                                      replicates=2, calibration=spec.calibration))
    pure = r.agent("pure", data[:2000])
    assert "δ = 1e-06" in pure.step().refused[study.study_id] and pure.ledger.spends() == []


def test_the_calibration_release_uses_the_central_mechanism_at_round_0s_epsilon():
    """Round 0's noise is the central calibration release's: DLap(exp(−ε_0/Δ1)) on the 2·m0
    integers, Δ1 the complex map's replace-one L1 sensitivity at r = m0 (γ per unit); under
    secure aggregation the devices' shares add up to that same term."""
    spec = auto_spec()
    term = noise_plan("complex", 64, 64, PrivacySpec(spec.calibration.epsilon, 0.0,
                                                      "replace_one"))[0]
    delta1 = l1_sensitivity("complex", 64, "replace_one")
    assert term.law == "discrete_laplace" and term.epsilon == spec.calibration.epsilon
    assert term.scale == dlap_param(spec.calibration.epsilon, delta1)
    sa = SecAggSpec.assuming(Assumptions(4, 0, 0), 100_000, None, 5.0)
    secure = SecureCalibration(auto_spec(min_devices=4, secure_aggregation=sa))
    assert secure.term == term and secure.noise_shares().shape == (128,)  # one DLap(a) in all
    assert spec.total_epsilon == pytest.approx(20.0, rel=1e-12)
