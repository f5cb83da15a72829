"""Refinement rounds of a secure-aggregation study (fedsketch.common.study.secure_rounds): each round's
cells go through secure aggregation, the unmasked sum is the devices' exact cells plus shares of
one discrete-Laplace draw; a coordinator restart during a round resumes it
(``test_secure_resume.py``)."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
from conftest import META, study_spec

from fedsketch.common.data.synthetic import gmm
from fedsketch.common.dp.grid import STEPS
from fedsketch.common.dp.lloyd import exact_cell_stats
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions
from fedsketch.common.sketch.box import Box
from fedsketch.common.study.refine import RefineSpec, RoundSpec
from fedsketch.common.study.secure_rounds import SecureRound
from fedsketch.server.bench.metrics import split

#: Su's ρ, restated (MECHANISMS §6.2).
RHO = 0.225


@pytest.fixture(scope="module")
def parts():
    x, _, _ = gmm(24_000, 3, 3, 3.0, seed=8)
    return np.array_split(x, 4)


def secure_refined(round_eps: float, rounds: int = 2, devices: int = 4, dropouts: int = 0,
                   max_records: int = 100_000, sketch_eps: float = 50.0):
    sa = SecAggSpec.assuming(Assumptions(devices, dropouts, 0), max_records, None, 5.0)
    return study_spec(epsilon=sketch_eps, min_devices=devices, secure_aggregation=sa,
                      refine=RefineSpec((round_eps,) * rounds))


def run_to_end(r, study, agents, timeout: float = 120.0) -> pb.Study:
    """Step the agents through the sketch's stages and then every round's."""
    stop = time.monotonic() + timeout
    while time.monotonic() < stop:
        s = r.operator().ShowStudy(pb.StudyRef(study_id=study.study_id), metadata=META)
        if s.state in (pb.DONE, pb.FAILED):
            return s
        for a in agents:
            a.step()
        time.sleep(0.02)
    raise TimeoutError(study.study_id)


def sketch_all_four(r, study, agents, timeout: float = 60.0) -> None:
    """Step the agents through the sketch's secure round only: none of them sees round 1."""
    stop = time.monotonic() + timeout
    while r.store.get_study(study.study_id).state in ("open", "collecting"):
        assert time.monotonic() < stop
        for a in agents:
            a.step()
            if r.store.get_study(study.study_id).state not in ("open", "collecting"):
                return
        time.sleep(0.02)


def test_each_round_unmasks_the_devices_exact_cells(coordinator_round, parts):
    """ε = 2,000 per round: the counts' noise is 0 but for a probability e^{−200}, and the sums'
    has a standard deviation of about 5,600 steps (0.05 of a record's largest coordinate). The
    round's summed counts are exactly those of the four devices' records clipped into the box,
    for the centres the round published, and its sums are within 15 such deviations; every
    device spent on the sketch and both rounds once, as masked inputs, and no plain
    contribution was stored."""
    r = coordinator_round
    spec = secure_refined(2000.0)
    study = r.create(spec)
    agents = [r.agent(f"s{i}", part, budget=5000.0) for i, part in enumerate(parts)]
    assert run_to_end(r, study, agents).state == pb.DONE
    box = Box(spec.lo, spec.hi)
    h = box.hi / 2 - box.lo / 2
    rounds = r.store.rounds(study.study_id)
    assert [row.state for row in rounds] == ["done", "done"]
    for row in rounds:
        rnd = RoundSpec.from_json(row.spec_json)
        assert rnd.deadline is None and rnd.secure_aggregation["threshold"] == 3
        counts = np.zeros(rnd.shape[0], np.int64)
        sums = np.zeros(rnd.shape, np.int64)
        for part in parts:
            c, t, _ = exact_cell_stats(box.centred(split(part)), np.array(rnd.centroids) -
                                       box.center, h)
            counts += c
            sums += t
        result = json.loads(r.store.get_result(row.study_id))
        assert result["counts"] == counts.tolist() and result["devices"] == 4
        assert r.store.contributions(row.study_id) == []
        if rnd.round == 2:  # the last step's centres are the cell means of the unmasked sums
            means = sums * h / STEPS / np.maximum(counts, 1)[:, None]
            slack = 15 * 5600 * h / STEPS / np.maximum(counts, 1)[:, None]
            assert np.all(np.abs(np.array(result["centroids"]) - box.center - means) <= slack)
    for a in agents:
        assert sorted((s.round, s.kind) for s in a.ledger.spends()) == [
            (0, "secagg_masked"), (1, "secagg_masked"), (2, "secagg_masked")]
    assert json.loads(r.store.get_result(study.study_id))["refined_rounds"] == 2


def test_the_shares_of_h_min_devices_add_up_to_one_draw_of_the_rounds_noise():
    """h_min = 3 (L = 4, one dropout): three devices' shares, summed, have the variance of one
    DLap draw of ε_count (counts) and ε_dim/STEPS (sums), Su's split of ε_t/2 (replace-one):
    within 12 % on 8,000 count and 24,000 sum draws (a factor √2 on a scale doubles it)."""
    spec = secure_refined(0.6, dropouts=1)
    centres = tuple((float(i % 9), 0.0, 0.0) for i in range(200))
    rnd = RoundSpec("st-x", "0" * 64, 1, centres, 4, None, None, None)
    secure = SecureRound(spec, rnd)
    assert spec.assumptions.min_honest == 3 and secure.dim == 800
    draws = np.array([sum(secure.noise_shares() for _ in range(3)) for _ in range(40)])
    d, c = 3, np.cbrt(4 * 3 * RHO**2)
    per = 0.6 / 2
    for values, eps, delta1 in ((draws[:, :200], c * per / (d + c), 1.0),
                                (draws[:, 200:], per / (d + c), float(STEPS))):
        a = math.exp(-eps / delta1)
        assert np.var(values) / (2 * a / (1 - a) ** 2) == pytest.approx(1.0, abs=0.12)


def test_secure_rounds_are_sized_at_creation():
    """A max_records whose summed cells (2^20 steps each) overflow a 62-bit masked word is
    refused when the study is made, with the reason, though the sketch alone would fit; so is an
    ε whose noise shares the exact sampler could not draw in reasonable time."""
    with pytest.raises(ValueError, match="lower max_records"):
        secure_refined(1.0, max_records=2**41)
    with pytest.raises(ValueError, match="exceeds 1024"):
        secure_refined(1e5)
    assert secure_refined(1.0, max_records=10**6).refine.rounds == 2


def test_a_secure_round_with_dropouts_completes(coordinator_round, parts):
    """L = 4 assuming one dropout: one device goes silent after the sketch; both rounds finish
    with the other three (L − D), and the silent device spent on the sketch only."""
    r = coordinator_round
    study = r.create(secure_refined(1.0, dropouts=1))
    agents = [r.agent(f"u{i}", part) for i, part in enumerate(parts)]
    sketch_all_four(r, study, agents)
    assert run_to_end(r, study, agents[:3], timeout=180).state == pb.DONE
    rounds = r.store.rounds(study.study_id)
    assert [row.state for row in rounds] == ["done", "done"]
    assert json.loads(r.store.get_result(rounds[0].study_id))["devices"] == 3
    assert [s.round for s in agents[3].ledger.spends()] == [0]
