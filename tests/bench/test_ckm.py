"""``ckm-lloyd``: what each of its three releases spends (they must add up to ε under both
relations), that CKM's centroids really seed the over-seeded run, the final step's rule for cells
at noise level, and its utility against scikit-learn KMeans on a real dataset (ggplot2's diamonds,
shipped by the bench extra's pydataset) next to CKM alone."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from fedsketch.common.data.synthetic import gmm
from fedsketch.server.bench import ckm as ckm_module
from fedsketch.server.bench.ckm import (
    CKM_LLOYD_FINAL_SHARE,
    CKM_LLOYD_START_SHARE,
    CKM_SCALE_FRACTION,
    ckm,
    ckm_lloyd,
    final_step,
)
from fedsketch.server.bench.kmeans import overseeded
from fedsketch.server.bench.kmeans.dplloyd import shifted_data
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n
from fedsketch.server.bench.task import Task

#: Seeded outcomes depend on floating-point summation order: re-run under each OpenBLAS kernel.
pytestmark = pytest.mark.blas

#: The module, not the function of the same name that the package exports.
dplloyd_module = importlib.import_module("fedsketch.server.bench.kmeans.dplloyd")
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _mixture_task(eps: float, neighbouring: str = "replace_one", seed: int = 0) -> Task:
    x = gmm(20_000, 3, 3, 2.5, 0)[0].astype(np.float64)
    return Task(x, 3, eps, lo=np.full(3, -12.0), hi=np.full(3, 12.0), neighbouring=neighbouring,
                rng=np.random.default_rng(seed))


@pytest.mark.parametrize("neighbouring", ["replace_one", "add_remove"])
def test_the_three_releases_spend_exactly_epsilon(monkeypatch, neighbouring):
    """The start's sketch (with, under add/remove, the noisy count that planned its size), the
    over-seeded run and the final step: 0.2ε, 0.6ε, 0.2ε, each checked where it is spent (the
    CKM run's ε, the run's budget trace, the final step's count/sum shares times the relation
    factor)."""
    spent: dict[str, float] = {}
    real_run, real_step = ckm_module.ckm_run, ckm_module.noisy_lloyd_step

    def spy_run(task, feature):
        spent["start"] = task.epsilon
        return real_run(task, feature)

    def spy_step(x, centres, h, eps_count, eps_dims):
        spent["final"] = (eps_count + float(np.sum(eps_dims))) * (2 if neighbouring == "replace_one" else 1)
        return real_step(x, centres, h, eps_count, eps_dims)

    monkeypatch.setattr(ckm_module, "ckm_run", spy_run)
    monkeypatch.setattr(ckm_module, "noisy_lloyd_step", spy_step)
    out = ckm_lloyd(_mixture_task(2.0, neighbouring))
    notes = json.loads(out.notes)
    spent["over"] = notes["budget_trace"]["total"]
    spent["count"] = notes["start"]["count_epsilon"]  # the planning count: add/remove only
    assert (spent["count"] > 0) == (neighbouring == "add_remove")
    assert spent["start"] + spent["count"] == pytest.approx(2.0 * CKM_LLOYD_START_SHARE, rel=1e-12)
    rest = 2.0 * (1 - CKM_LLOYD_START_SHARE)
    assert spent["final"] == pytest.approx(rest * CKM_LLOYD_FINAL_SHARE, rel=1e-9)
    assert spent["over"] == pytest.approx(rest * (1 - CKM_LLOYD_FINAL_SHARE), rel=1e-9)
    assert math.fsum(spent.values()) == pytest.approx(2.0, rel=1e-9)
    assert (out.epsilon, out.delta, out.kind) == (2.0, 0.0, "pure")
    assert notes["start"]["epsilon"] == spent["start"] and notes["final_step"]["epsilon"] == spent["final"]


def test_ckm_centroids_seed_the_overseeded_run(monkeypatch):
    """The first k of the 5k starting centres are CKM's centroids, shifted by the box centre and
    clipped to the box; the rest are the sphere packing's."""
    seen = {}
    real = dplloyd_module.private_lloyd

    def spy(data, init, trace, between=None):
        seen["init"] = init.copy()
        return real(data, init, trace, between)

    monkeypatch.setattr(dplloyd_module, "private_lloyd", spy)
    task = _mixture_task(1.0)
    seeds = np.array([[1.0, 2.0, 3.0], [-4.0, 0.5, 0.0], [0.0, 0.0, 50.0]])
    overseeded(task, seeds=seeds)
    assert seen["init"].shape == (15, 3)
    np.testing.assert_array_equal(seen["init"][:3], np.clip(seeds, -12.0, 12.0))
    assert not np.any(np.all(np.isin(seen["init"][3:], seeds), axis=1))
    with pytest.raises(ValueError, match="seeds must be"):
        overseeded(task, seeds=np.zeros((16, 3)))


def test_ckm_lloyd_seeds_its_run_with_the_start_it_paid_for(monkeypatch):
    """End to end, in a box not centred at 0: the start is one CKM run of the "complex" map
    whose calibration takes CKM_SCALE_FRACTION of ε_s and whose sketch takes the rest, and its
    centroids, shifted by the box centre, are the seeds of the over-seeded run."""
    seen: dict = {}
    real_cal, real_release, real_over = (ckm_module.calibrate_scale, ckm_module.release_sketch,
                                         ckm_module.overseeded)
    real_run = ckm_module.ckm_run

    def cal(chunks, box, epsilon, **kw):
        seen["cal"] = epsilon
        return real_cal(chunks, box, epsilon, **kw)

    def release(spec, chunks, box):
        seen["sketch"] = (spec.privacy.epsilon, spec.feature)
        return real_release(spec, chunks, box)

    def run(task, feature):
        out = real_run(task, feature)
        seen["start"] = out[0]
        return out

    def over(task, seeds=None):
        seen["seeds"] = seeds
        return real_over(task, seeds=seeds)

    for name, spy in (("calibrate_scale", cal), ("release_sketch", release), ("ckm_run", run),
                      ("overseeded", over)):
        monkeypatch.setattr(ckm_module, name, spy)
    x = gmm(20_000, 3, 3, 2.5, 0)[0].astype(np.float64) + 5.0
    task = Task(x, 3, 2.0, lo=np.full(3, -7.0), hi=np.full(3, 17.0), rng=np.random.default_rng(0))
    ckm_lloyd(task)
    eps_start = 2.0 * CKM_LLOYD_START_SHARE
    assert seen["cal"] == pytest.approx(eps_start * CKM_SCALE_FRACTION, rel=1e-12)
    assert seen["sketch"][0] == pytest.approx(eps_start * (1 - CKM_SCALE_FRACTION), rel=1e-12)
    assert seen["sketch"][1] == "complex"
    np.testing.assert_array_equal(seen["seeds"], seen["start"] - 5.0)


def test_final_step_keeps_cells_at_noise_level_and_moves_the_others():
    """At ε = 10⁻⁶ every count is at noise level (N_j ≪ b): a cell moves only when its noise
    exceeds OVERSEED_KEEP_SCALES = 3 scales, with probability e^{−3}/2 ≈ 2.5 % (120 cells:
    3 expected, more than 12 has probability 10⁻⁵; a rule at 0 scales would move half of them);
    a kept centre stays bit for bit. At ε = 10⁶ no count is at noise level, and the step lands on
    the exact cluster means (noise ~10⁻⁸ data units)."""
    task = _mixture_task(1.0)
    data = shifted_data(task)
    centres = data.x[:3] + 0.5
    moved_cells = 0
    for _ in range(40):
        out, kept, _ = final_step(data, centres, 1e-6, "replace_one")
        still = np.all(out == centres, axis=1)
        assert int(still.sum()) == kept
        moved_cells += 3 - kept
    assert moved_cells <= 12
    moved, kept, _ = final_step(data, centres, 1e6, "replace_one")
    assert kept == 0
    labels = np.argmin(((data.x[:, None, :] - centres[None]) ** 2).sum(axis=2), axis=1)
    means = np.array([data.x[labels == j].mean(axis=0) for j in range(3)])
    np.testing.assert_allclose(moved, means, atol=1e-4)


def test_non_private_pipeline_is_kind_none_and_near_the_reference():
    out = ckm_lloyd(_mixture_task(math.inf))
    assert (out.epsilon, out.kind) == (math.inf, "none")
    x = _mixture_task(math.inf).x
    ref = sse_per_n(split(x), sklearn_kmeans_centroids(x, 3, 0, n_init=10))
    assert sse_per_n(split(x), out.output) / ref < 1.01


@pytest.mark.slow
def test_refinement_beats_ckm_alone_on_real_data():
    """ggplot2's diamonds (53,940 rows, d = 7, k = 5, standardized, box ±6 sd), add/remove,
    ε = 2. Measured (benchmarks/RESULTS.md §6, and 10 triples of seeds): CKM alone 1.36–1.61 per
    run (medians of 3 from 1.30) at m = 10kd, 1.143 once at the planned m (common/study/sizing.py),
    non-private ckm-lloyd 1.0000. ckm-lloyd's noise comes from OS
    bits, so the bound covers its tail: 900 runs (OpenBLAS SkylakeX) gave median 1.024, p90
    1.046, p99 1.077, max 1.285; a median of 3 exceeded 1.06 once in a CI run. A median of 5
    exceeds 1.08 only if 3 runs do (about 10·0.008³ ≈ 5·10⁻⁶). A refinement that did nothing
    (or a final step that wrecked the centres) fails the first bound."""
    spec = importlib.util.spec_from_file_location("realdata", BENCHMARKS / "realdata.py")
    realdata = importlib.util.module_from_spec(spec)
    sys.modules["realdata"] = realdata  # its dataclass looks its module up
    spec.loader.exec_module(realdata)
    data = realdata.load("diamonds")
    lo, hi = data.box
    ref = sse_per_n(split(data.x), sklearn_kmeans_centroids(data.x, data.k, 0, n_init=10))

    def median(method, eps, runs=3):
        return float(np.median([
            sse_per_n(split(data.x), method(Task(data.x, data.k, eps, lo=lo, hi=hi, neighbouring="add_remove",
                                                 rng=np.random.default_rng(s))).output) / ref
            for s in range(runs)]))

    refined, alone = median(ckm_lloyd, 2.0, runs=5), median(ckm("complex"), 2.0)
    assert refined < 1.08
    # CKM alone was 1.36-1.61 with m = 10kd; with m planned from public quantities (sizing) a
    # fresh-clone run measured 1.143, so the bound is that refinement beats it, not a level
    assert alone > refined
    assert median(ckm_lloyd, math.inf, runs=1) < 1.02  # seeded: no OS noise at ε = ∞


def test_ckm_without_noise_says_it_gives_no_privacy():
    """CKM at ε = ∞ is a non-private reference (kind "none", ε = ∞), not a pure-DP release."""
    out = ckm("complex")(_mixture_task(math.inf))
    assert (out.kind, out.epsilon) == ("none", math.inf)
    assert out.notes.startswith("non-private")
