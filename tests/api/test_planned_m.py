"""m planned from public quantities in every front end that sketches one dataset
(:mod:`fedsketch.common.study.sizing`): ``CompressiveKMeans`` without m, ``fedsketch.sketch(k=)``
and ``fedsketch sketch --k``; a given m stays an override. The non-private digits fit
(scikit-learn's 1,797 × 64, k = 10) decodes at m = k·d = 640 instead of 10·k·d = 6,400, which took
231–262 s (benchmarks/RESULTS.md §13)."""

from __future__ import annotations

import json
import math
import time
import warnings

import numpy as np
import pytest
from typer.testing import CliRunner

from fedsketch import CompressiveKMeans, sketch
from fedsketch.cli import app
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.study.sizing import DEFAULT_MAX_WORK, PLAN_COUNT_SHARE, default_size


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    return gmm(6000, 4, 5, 2.5, np.random.default_rng(3))[0]


def test_the_estimator_plans_m_from_n_d_k_and_the_sketchs_epsilon(table):
    """6,000 records, d = 5, k = 4, ε = 1, σ auto (0.1 of ε): the plan at the sketch's 0.9."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = CompressiveKMeans(4, epsilon=1.0, bounds=(-12, 12), random_state=0).fit(table)
    want = default_size(6000, 5, 4, 0.9)
    assert est.sketch_size_ == want
    assert est.sketch_.spec.frequencies.m == want.m != 1000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        given = CompressiveKMeans(4, epsilon=1.0, bounds=(-12, 12), m=90, random_state=0).fit(table)
    assert given.sketch_size_ is None and given.sketch_.spec.frequencies.m == 90


def test_digits_non_private_fit_is_planned_within_the_work_bound():
    """The honest invariant is the decoder's work m·d·k (CL-OMPR's cost per evaluation): digits
    gets m = k·d = 640, not 6,400. The fit's CPU seconds are bounded too, generously (4.2–5.5 s
    measured at load 4 on 2 cores; 262 s at m = 6,400): CPU, not wall, so load does not count."""
    sk = pytest.importorskip("sklearn.datasets")
    x = sk.load_digits().data
    cpu = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = CompressiveKMeans(10, epsilon=math.inf, bounds=(0, 16), random_state=0).fit(x)
    spent = time.process_time() - cpu
    m = est.sketch_.spec.frequencies.m
    assert m == est.sketch_size_.m == 640 and m * 64 * 10 <= 1.03 * DEFAULT_MAX_WORK
    assert spent <= 30.0, f"a non-private digits fit took {spent:.1f} CPU seconds"
    assert est.cluster_centers_.shape == (10, 64) and np.all(np.isfinite(est.cluster_centers_))


def test_sketch_function_plans_for_k_and_charges_the_count_under_add_remove(table):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = sketch(table, epsilon=1.0, k=4, bounds=(-12, 12), scale=1.0)
        unplanned = sketch(table, epsilon=1.0, bounds=(-12, 12), scale=1.0)
        removed = sketch(table, epsilon=1.0, k=4, bounds=(-12, 12), scale=1.0, neighbouring="add_remove")
    assert s.spec.frequencies.m == default_size(6000, 5, 4, 1.0).m
    assert unplanned.spec.frequencies.m == 1000
    assert removed.spec.privacy.epsilon == pytest.approx(1 - PLAN_COUNT_SHARE)
    assert removed.epsilon_spent == pytest.approx(1.0)  # the noisy count is in the spend


def test_sketch_command_plans_m_for_k_and_says_so(tmp_path, table):
    np.save(tmp_path / "x.npy", table)
    run = CliRunner().invoke(app, ["sketch", str(tmp_path / "x.npy"), "--out", str(tmp_path / "s.npz"),
                                   "--k", "4", "--bounds", "-12:12", "--epsilon", "1", "--json", "--quiet"])
    assert run.exit_code == 0, run.output
    out = json.loads(run.stdout.strip().splitlines()[-1])
    want = default_size(6000, 5, 4, 0.9)
    assert out["m"] == out["plan"]["m"] == want.m and out["plan"]["useful"] == want.useful
    assert f"m = {want.m} planned for k = 4" in run.stderr
    run = CliRunner().invoke(app, ["sketch", str(tmp_path / "x.npy"), "--out", str(tmp_path / "g.npz"),
                                   "--k", "4", "--m", "77", "--bounds", "-12:12", "--json", "--quiet"])
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["m"] == 77 and out["plan"] is None


def test_sketch_function_plans_from_a_files_count(tmp_path, table):
    """A path: n from the file's layout, the same plan as the array's."""
    np.save(tmp_path / "x.npy", table)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = sketch(tmp_path / "x.npy", epsilon=1.0, k=4, bounds=(-12, 12), scale=1.0)
        chunks = sketch([table[:2000], table[2000:]], epsilon=1.0, k=4, bounds=(-12, 12), scale=1.0)
    assert s.spec.frequencies.m == chunks.spec.frequencies.m == default_size(6000, 5, 4, 1.0).m
    assert s.n == chunks.n == 6000
