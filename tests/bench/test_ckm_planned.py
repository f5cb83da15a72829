"""``ckm`` and ``ckm-lloyd`` plan their sketch from public quantities
(:mod:`fedsketch.common.study.sizing`): a start whose sketch would show no centroid at all is
skipped and its ε goes to the Lloyd steps, one merely below the threshold is kept, a final step
that could only move centres to noise is skipped likewise, ε is spent exactly either way, and
the non-private start's decoder work is capped."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fedsketch.common.data.synthetic import gmm
from fedsketch.common.study.sizing import plan_sketch_size
from fedsketch.server.bench import ckm as ckm_module
from fedsketch.server.bench.ckm import (
    CKM_LLOYD_FINAL_SHARE,
    CKM_LLOYD_START_SHARE,
    CKM_SCALE_FRACTION,
    FINAL_NOISE_MAX,
    NONPRIVATE_START_WORK,
    START_SKIP_FRACTION,
    ckm_lloyd,
    final_step_noise,
)
from fedsketch.server.bench.task import Task

#: Seeded outcomes depend on floating-point summation order: re-run under each OpenBLAS kernel.
pytestmark = pytest.mark.blas


def _task(n: int, d: int, k: int, eps: float, neighbouring: str = "replace_one") -> Task:
    x = gmm(n, k, d, 2.5, 0)[0].astype(np.float64)
    return Task(x, k, eps, lo=np.full(d, -12.0), hi=np.full(d, 12.0), neighbouring=neighbouring,
                rng=np.random.default_rng(0))


@pytest.mark.parametrize("neighbouring", ["replace_one", "add_remove"])
def test_a_hopeless_start_is_skipped_and_its_epsilon_goes_to_lloyd(monkeypatch, neighbouring):
    """600 records in d = 40, k = 8, ε = 1: the start's sketch would be at z < 1 against T ≈ 15, so
    no CKM run happens, the over-seeded run and the final step (when it runs) share all of ε but
    the planning count, and the notes say why."""
    called = []
    monkeypatch.setattr(ckm_module, "ckm_run", lambda *a, **kw: called.append(a))
    out = ckm_lloyd(_task(600, 40, 8, 1.0, neighbouring))
    notes = json.loads(out.notes)
    assert called == []
    assert notes["start"]["method"] == "none" and "cannot carry 8 centroids" in notes["start"]["skipped"]
    count = notes["start"]["count_epsilon"]
    assert (count > 0) == (neighbouring == "add_remove")
    spent = count + notes["budget_trace"]["total"] + notes["final_step"]["epsilon"]
    assert spent == pytest.approx(1.0, rel=1e-9)
    assert out.epsilon == 1.0 and out.output.shape == (8, 40)


def test_a_start_the_sketch_can_carry_is_kept(monkeypatch):
    """20,000 records in d = 3, k = 3 at ε = 2: the start runs with 0.2ε and its planned m."""
    out = ckm_lloyd(_task(20_000, 3, 3, 2.0))
    start = json.loads(out.notes)["start"]
    assert start["method"] == "ckm" and start["epsilon"] == pytest.approx(2.0 * CKM_LLOYD_START_SHARE)
    assert start["m"] == 10 * 3 * 3


def test_a_start_below_the_threshold_but_above_a_third_of_it_is_kept():
    """2,000 records in d = 3, k = 3 at ε = 1: the start's sketch is predicted at z ≈ 6.9 against
    T ≈ 7.9, not identifiable but not blind (≥ START_SKIP_FRACTION·T): it still seeds the Lloyd
    steps, at the size of largest z (m = kd = 9)."""
    size = plan_sketch_size(2000, 3, 3, 1.0 * CKM_LLOYD_START_SHARE * (1 - CKM_SCALE_FRACTION))
    assert not size.useful and START_SKIP_FRACTION * size.threshold <= size.z < size.threshold
    start = json.loads(ckm_lloyd(_task(2000, 3, 3, 1.0)).notes)["start"]
    assert start["method"] == "ckm" and start["m"] == size.m == 9


def test_a_final_step_at_noise_is_skipped_and_a_useful_one_kept():
    """The final step's cell means: 600 records, d = 40, k = 8, ε_f = 0.25 → several box
    half-widths of noise per coordinate, skipped (its ε in the over-seeded run); 20,000 records in
    d = 3 → far below FINAL_NOISE_MAX, kept."""
    assert final_step_noise(600, 8, 40, 0.25, "replace_one") > FINAL_NOISE_MAX
    assert final_step_noise(20_000, 3, 3, 0.4, "replace_one") < 0.05 * FINAL_NOISE_MAX
    notes = json.loads(ckm_lloyd(_task(600, 40, 8, 1.0)).notes)
    assert notes["final_step"]["epsilon"] == 0.0 and notes["final_step"]["mean_noise"] > FINAL_NOISE_MAX
    assert notes["budget_trace"]["total"] == pytest.approx(1.0, rel=1e-9)
    kept = json.loads(ckm_lloyd(_task(20_000, 3, 3, 2.0)).notes)["final_step"]
    assert kept["epsilon"] == pytest.approx(2.0 * (1 - CKM_LLOYD_START_SHARE) * CKM_LLOYD_FINAL_SHARE)


def test_the_non_private_start_caps_its_decoder_work(monkeypatch):
    """At ε = ∞ the start only seeds Lloyd on the records: d = 21, k = 10 decodes m = 5kd = 1,050
    (m·d·k ≤ NONPRIVATE_START_WORK), not 10kd = 2,100."""
    seen = {}
    real = ckm_module.ckm_run

    def spy(task, feature, max_work=None):
        seen["max_work"] = max_work
        return real(task, feature, max_work)

    monkeypatch.setattr(ckm_module, "ckm_run", spy)
    out = ckm_lloyd(_task(400, 21, 10, math.inf))
    assert seen["max_work"] == NONPRIVATE_START_WORK
    assert json.loads(out.notes)["non_private"]["start"]["m"] == 1050
