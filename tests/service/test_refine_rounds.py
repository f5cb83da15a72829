"""Refinement rounds end to end in one process: a real coordinator (TLS on loopback, SQLite) and
real device agents run a study's sketch and then its rounds, each a plain study of its own."""

from __future__ import annotations

import json
import time

import grpc
import numpy as np
import pytest
from conftest import META, signed, study_spec

from fedsketch.client.policy import Policy
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.net import signing
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.study.refine import CELLS_KIND, RefineSpec, RoundSpec, decode_cells
from fedsketch.common.study.study import spec_sha256
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n
from fedsketch.server.decode.overseed import OVERSEED_MAX
from fedsketch.server.decode.refine import overseed_factor


@pytest.fixture(scope="module")
def data():
    x, _, _ = gmm(60_000, 3, 3, 3.0, seed=2)
    return x


def refined_spec(rounds: int = 2, round_eps: float = 1.0, round_seconds: float = 900.0, **kw):
    return study_spec(refine=RefineSpec((round_eps,) * rounds, round_seconds), min_devices=4, **kw)


def drive(r, agents, study_id: str, timeout: float = 120.0) -> pb.Study:
    """Step every agent until the study is done or failed."""
    stop = time.monotonic() + timeout
    while time.monotonic() < stop:
        for a in agents:
            a.step()
        s = r.operator().ShowStudy(pb.StudyRef(study_id=study_id), metadata=META)
        if s.state in (pb.DONE, pb.FAILED):
            return s
        time.sleep(0.05)
    raise TimeoutError(study_id)


def test_two_rounds_refine_the_sketch_and_every_device_spends_each_once(coordinator_round, data):
    """Four devices: the sketch, then two rounds; the result is Lloyd-accurate, each device's
    ledger holds the sketch and both rounds (once each, linked to the study, adding up to its
    total ε), every round release is integer cells, and a round's own result is not public."""
    r = coordinator_round
    spec = refined_spec(epsilon=2.0)
    study = r.create(spec)
    agents = [r.agent(f"d{i}", part) for i, part in enumerate(np.array_split(data, 4))]
    assert drive(r, agents, study.study_id).state == pb.DONE
    res = r.result(study.study_id)
    assert res.rounds == 2 and res.devices == 4
    clipped = np.clip(data, -10.0, 10.0)  # what the study's box lets the mechanism see
    ref = sse_per_n(split(clipped), sklearn_kmeans_centroids(clipped, 3))
    assert sse_per_n(split(clipped), np.asarray(res.centroids).reshape(3, 3)) / ref < 1.01
    rounds = r.store.rounds(study.study_id)
    assert [RoundSpec.from_json(row.spec_json).round for row in rounds] == [1, 2]
    assert all(row.state == "done" and row.contributions == 4 for row in rounds)
    for a in agents:
        spends = sorted(a.ledger.spends(), key=lambda s: s.round)
        assert [(s.round, s.parent) for s in spends] == [(0, None), (1, study.study_id),
                                                        (2, study.study_id)]
        assert sum(s.epsilon for s in spends) == pytest.approx(spec.total_epsilon, rel=1e-12)
        assert all(s.kind == CELLS_KIND for s in spends[1:])
        assert spends[0].spec_sha256 == study.spec_sha256
    shapes = [RoundSpec.from_json(row.spec_json).shape for row in rounds]
    # Round 1 over-seeded with f·k centres, f from the sketch round's public Σn and the rounds'
    # noise (60,000 records over 4 devices at ε = 2 hold far more than 100 noise scales a cell:
    # f = OVERSEED_MAX); then the last step on k.
    factor = overseed_factor(spec, float(len(data)), 4)
    assert factor == OVERSEED_MAX
    assert shapes == [(factor * 3, 3), (3, 3)]
    for row, shape in zip(rounds, shapes, strict=True):
        for c in r.store.contributions(row.study_id):
            counts, _ = decode_cells(c.payload, *shape)
            assert c.kind == CELLS_KIND and c.n == counts.sum()
        with pytest.raises(grpc.RpcError) as info:
            r.result(row.study_id)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    full = json.loads(r.store.get_result(study.study_id))
    assert full["refined_rounds"] == 2 and len(full["start_centroids"]) == 3
    # a device reads its study's result and the centres each round published; an outsider neither
    assert agents[0].stub.GetResult(signed(agents[0], "GetResult", study.study_id)) == res
    outsider = r.agent("outsider", data[:10])
    for row in rounds:
        assert agents[0].stub.GetStudy(signed(agents[0], "GetStudy", row.study_id)).spec_json == row.spec_json
        for method in ("GetStudy", "GetResult"):
            with pytest.raises(grpc.RpcError) as info:
                getattr(outsider.stub, method)(signed(outsider, method, row.study_id))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert full["identifiability"]["status"] == res.status == "identified"


def test_a_round_that_cannot_fill_its_roster_leaves_the_last_centres(coordinator_round, data):
    """Round 1's window is one second and only three of the four devices come back: it fails
    (nobody spent on it), and the study is published with the sketch's start."""
    r = coordinator_round
    study = r.create(refined_spec(rounds=2, round_seconds=1.0))
    agents = [r.agent(f"e{i}", part) for i, part in enumerate(np.array_split(data, 4))]
    stop = time.monotonic() + 60
    while r.store.get_study(study.study_id).state != "decoding":  # all four sent their sketch
        assert time.monotonic() < stop
        for a in agents:
            a.step()
            if r.store.get_study(study.study_id).state == "decoding":
                break  # no device may see round 1 before the three below
    assert drive(r, agents[:3], study.study_id).state == pb.DONE
    full = json.loads(r.store.get_result(study.study_id))
    assert full["refined_rounds"] == 0 and full["centroids"] == full["start_centroids"]
    assert [x["state"] for x in full["rounds"]] == ["failed"]
    assert "3 of 4 devices registered" in full["rounds"][0]["detail"]
    assert all(len(a.ledger.spends()) == 1 for a in agents)


def test_a_device_budgets_the_whole_study_before_it_joins(coordinator_round, data):
    """The sketch alone fits the budget but not with the rounds: the device does not join, and
    an owner's largest ε per study below the total refuses it too."""
    r = coordinator_round
    spec = refined_spec(epsilon=1.0, round_eps=1.0)  # total 3
    study = r.create(spec)
    poor = r.agent("poor", data[:100], budget=2.5)
    out = poor.step()
    assert "insufficient budget: it asks ε = 3" in str(out.refused[study.study_id])
    capped = r.agent("capped", data[:100])
    capped.ledger.set_policy(Policy(max_epsilon=2.0))
    assert "allows at most 2 per study" in capped.step().refused[study.study_id]
    assert poor.ledger.spends() == [] == capped.ledger.spends()


def plant_round(r, parent: pb.Study, **changes) -> str:
    """A round study written straight into the store (what a hostile coordinator could announce)."""
    fields = {"parent_id": parent.study_id, "parent_sha256": parent.spec_sha256, "round": 1,
              "centroids": ((0.0, 0.0, 0.0),), "min_devices": 4, "deadline": None} | changes
    text = RoundSpec(**fields).to_json()
    rid = "st-planted" + str(len(r.store.list_studies()))
    r.store.create_study(rid, text, spec_sha256(text), None, fields["min_devices"],
                         parent=parent.study_id)
    return rid


@pytest.mark.parametrize(("changes", "reason"), [
    ({"parent_sha256": "0" * 64}, "does not have the spec hash the round names"),
    ({"round": 3}, "declares 2 refinement rounds; this is round 3"),
    ({"centroids": ((0.0, 0.0, 11.0),)}, "leave the study's box"),
    ({"centroids": ((0.0, 0.0),)}, "d = 2"),
    ({"min_devices": 2}, "quorum of 2"),
])
def test_a_device_refuses_a_round_that_does_not_fit_its_study(coordinator_round, data, changes,
                                                              reason):
    r = coordinator_round
    parent = r.create(refined_spec())
    rid = plant_round(r, parent, **changes)
    a = r.agent("checker", data[:100])
    r.store.register(parent.study_id, a.ledger.identity().device_id)  # it sees the study's rounds
    assert reason in a.step().refused[rid]
    assert r.store.get_study(rid).registered == 0


def test_the_coordinator_refuses_cells_the_round_cannot_release(coordinator_round, data):
    """A round takes int64_cells of K(d + 1) entries whose counts add up to n, and nothing else."""
    r = coordinator_round
    parent = r.create(refined_spec())
    rid = plant_round(r, parent, min_devices=4)
    a = r.agent("hostile", data[:100])
    r.store.register(rid, a.ledger.identity().device_id)
    for i in range(3):
        r.store.register(rid, r.agent(f"filler{i}", data[:10]).ledger.identity().device_id)
    good = np.array([5, 1, 1, 1], dtype="<i8").tobytes()
    cases = [("int64_pairs", good, 5.0, "travels as int64_cells"),
             (CELLS_KIND, good[:16], 5.0, "needs 8·K·(d + 1) = 32"),
             (CELLS_KIND, good, 6.0, "not the sum of the cell counts"),
             (CELLS_KIND, np.array([5, 2**62, 0, 0], "<i8").tobytes(), 5.0, "exceeds")]
    identity = a.ledger.identity()
    spec_hash = r.store.get_study(rid).spec_sha256
    for kind, payload, n, reason in cases:
        digest = signing.contribution_digest(rid, identity.device_id, n, spec_hash, payload)
        msg = pb.Contribution(study_id=rid, device_id=identity.device_id, spec_sha256=spec_hash,
                              n=n, signature=signing.sign(identity.private_key, digest),
                              **{kind: payload})
        with pytest.raises(grpc.RpcError) as info:
            r.device_stub().Submit(msg)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason in info.value.details()
    assert r.store.contributions(rid) == []


def test_a_round_opened_twice_is_released_once(coordinator_round, data):
    """A hostile coordinator announces round 1 of a study under two study ids: a device that
    released for one refuses the other, whatever its id, so it never pays a round twice."""
    r = coordinator_round
    parent = r.create(study_spec(refine=RefineSpec((1.0, 1.0)), min_devices=1))
    a = r.agent("once", data[:500])
    r.store.register(parent.study_id, a.ledger.identity().device_id)  # it sees the study's rounds
    first = plant_round(r, parent, min_devices=1, centroids=((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)))
    assert first in a.step().submitted
    second = plant_round(r, parent, min_devices=1, centroids=((2.0, 0.0, 0.0), (1.0, 1.0, 1.0)))
    assert "already released round 1" in a.step().refused[second]
    assert [s.study_id for s in a.ledger.spends() if s.round == 1] == [first]
    assert r.store.get_study(second).registered == 0


def test_a_device_keeps_the_rounds_budget_until_its_study_ends(coordinator_round, data):
    """Budget 3.5, a study of ε 3 (sketch 1, two rounds of 1): once the sketch is paid, another
    study asking 1 is refused (2 of the 2.5 left are the rounds'), and both rounds get paid."""
    r = coordinator_round
    refined = r.create(study_spec(epsilon=1.0, min_devices=1, refine=RefineSpec((1.0, 1.0))))
    a = r.agent("keeper", data[:3000], budget=3.5)
    assert refined.study_id in a.step().submitted  # the sketch
    other = r.create(study_spec(epsilon=1.0, min_devices=1, name="other"))
    assert "insufficient budget" in str(a.step().refused[other.study_id])
    assert drive(r, [a], refined.study_id).state == pb.DONE
    assert sorted(s.round for s in a.ledger.spends()) == [0, 1, 2]
    assert all(s.study_id != other.study_id for s in a.ledger.spends())
