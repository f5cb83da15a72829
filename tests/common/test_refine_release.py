"""A refinement round's release (fedsketch.common.refine): its noise has the exact discrete-Laplace
law of the round's ε split, its sensitivity is what the split is calibrated for, and its specs
parse strictly."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from conftest import study_spec

from fedsketch.common.box import Box
from fedsketch.common.dp.grid import STEPS
from fedsketch.common.lloyd import exact_cell_stats
from fedsketch.common.refine import (
    CellsError,
    RefineSpec,
    RoundSpec,
    check_cells,
    decode_cells,
    noise_radii,
    release_cells,
)
from fedsketch.common.study import StudySpec

#: Su's ρ and the relation factors, restated from MECHANISMS §6.2 and §0.3 (not imported: a
#: wrong constant in the code must fail here).
RHO, FACTOR = 0.225, {"replace_one": 2, "add_remove": 1}


def dlap_variance(epsilon: float, sensitivity: float) -> float:
    """Var DLap(a) = 2a/(1 − a)², a = exp(−ε/Δ1)."""
    a = math.exp(-epsilon / sensitivity)
    return 2 * a / (1 - a) ** 2


def round_of(spec: StudySpec, centres: np.ndarray) -> RoundSpec:
    return RoundSpec("st-x", "0" * 64, 1, tuple(map(tuple, centres)), spec.min_devices, None)


@pytest.mark.parametrize("relation", ["replace_one", "add_remove"])
def test_the_noise_is_dlap_of_sus_split_of_the_rounds_epsilon(relation):
    """240 cells × 60 releases: the variance of the count noise and of the sum noise (steps) is
    the DLap variance of ε_count = c·(ε/f)/(d + c) and ε_dim = (ε/f)/(d + c), c = ∛(4dρ²),
    within 12 % (the estimate's sd is ~3 %; a factor √2 on a scale doubles the variance)."""
    d, eps = 3, 0.8
    spec = study_spec(d=d, neighbouring=relation, refine=RefineSpec((eps,)))
    rng = np.random.default_rng(0)
    centres = rng.uniform(-9, 9, size=(240, d))
    x = rng.uniform(-9, 9, size=(500, d)).astype(np.float32)
    rnd = round_of(spec, centres)
    box = Box(spec.lo, spec.hi)
    counts, sums, _ = exact_cell_stats(box.centred([x]), centres - box.center,
                                       box.hi / 2 - box.lo / 2)
    noise_c, noise_s = [], []
    for _ in range(60):
        n, payload = release_cells(spec, rnd, [x])
        nc, ns = decode_cells(payload, 240, d)
        assert n == nc.sum()
        noise_c.append(nc - counts)
        noise_s.append(ns - sums)
    c = np.cbrt(4 * d * RHO**2)
    per = eps / FACTOR[relation]
    eps_count, eps_dim = c * per / (d + c), per / (d + c)
    assert np.var(noise_c) / dlap_variance(eps_count, 1.0) == pytest.approx(1.0, abs=0.12)
    assert np.var(noise_s) / dlap_variance(eps_dim, STEPS) == pytest.approx(1.0, abs=0.12)
    assert abs(np.mean(noise_c)) < 5 * math.sqrt(dlap_variance(eps_count, 1.0) / noise_c[0].size / 60)


def test_one_record_moves_the_exact_statistics_within_the_calibrated_sensitivity():
    """Adding a record changes one cell's count by 1 and its sums by at most STEPS per
    coordinate (add/remove); replacing one changes two cells, twice that in L1 (the factor 2
    the split divides by); a record beyond the box counts as its clipped self."""
    spec = study_spec(d=2, refine=RefineSpec((1.0,)))
    box = Box(spec.lo, spec.hi)
    h = box.hi / 2 - box.lo / 2
    centres = np.array([[-5.0, -5.0], [5.0, 5.0]])
    base = np.array([[-4.0, -6.0], [6.0, 3.0]], dtype=np.float32)

    def stats(rows):
        counts, sums, _ = exact_cell_stats(box.centred([np.asarray(rows, np.float32)]), centres, h)
        return np.concatenate([counts, sums.ravel() / STEPS])

    added = stats(np.vstack([base, [[1e6, -1e6]]])) - stats(base)
    assert np.abs(added).sum() <= 1 + 2 + 1e-9 and added[:2].sum() == 1
    replaced = stats(np.vstack([base[:1], [[-9.9, -9.9]]])) - stats(base)
    assert np.abs(replaced[:2]).sum() == 2 and np.abs(replaced).sum() <= 2 * (1 + 2) + 1e-9


def test_round_specs_parse_strictly_and_round_trip():
    spec = study_spec(refine=RefineSpec((0.5, 0.25), 60.0))
    back = StudySpec.from_json(spec.to_json())
    assert back == spec and back.total_epsilon == pytest.approx(50.75)
    assert '"format":"fedsketch.study/3"' in spec.to_json()
    assert '"refine"' not in study_spec().to_json()  # a study without rounds reads as before
    rnd = RoundSpec("st-a", "1" * 64, 2, ((1.0, 2.0, 3.0),), 1, 5.0, {"weights": [1.0]})
    assert RoundSpec.from_json(rnd.to_json()) == rnd
    for bad in ('{"format": "fedsketch.round/1"}', "[]", "nope",
                rnd.to_json().replace('"round":2', '"round":0'),
                rnd.to_json().replace("1.0,2.0,3.0", "1.0,NaN,3.0")):
        with pytest.raises(ValueError):
            RoundSpec.from_json(bad)
    for eps in ((), (0.0,), (math.inf,), (0.1,) * 21):
        with pytest.raises(ValueError):
            RefineSpec(eps)


def test_check_cells_refuses_what_the_mechanism_cannot_release():
    """Counts whose int64 sum wraps to n, a count below the noise's reach, and a cell whose sum
    needs more records than its count allows are refused; an honest release passes."""
    spec = study_spec(refine=RefineSpec((1.0,)))
    rnd = round_of(spec, np.zeros((5, 3)))
    x = np.random.default_rng(1).uniform(-9, 9, size=(40, 3)).astype(np.float32)
    n, payload = release_cells(spec, rnd, [x])
    counts, sums = check_cells(spec, rnd, "int64_cells", payload, n)
    assert counts.sum() == n

    def cells(c, t):
        return np.concatenate([np.array(c, "<i8"), np.array(t, "<i8").ravel()]).tobytes()

    wrap = [2**62] * 4 + [10]
    with pytest.raises(CellsError, match="not the sum"):
        check_cells(spec, rnd, "int64_cells", cells(wrap, np.zeros((5, 3))), 10.0)
    with pytest.raises(CellsError, match="is below"):
        check_cells(spec, rnd, "int64_cells", cells([10**6, -10**6, 0, 0, 10],
                                                     np.zeros((5, 3))), 10.0)
    heavy = np.zeros((5, 3))
    heavy[4, 0] = STEPS * 10_000  # 10,000 records' worth in a cell that claims 10
    with pytest.raises(CellsError, match="cell 4's sum"):
        check_cells(spec, rnd, "int64_cells", cells([0, 0, 0, 0, 10], heavy), 10.0)
    # a study capping devices at 50 records: no cell, and no total, may claim more (plus noise)
    capped = replace(spec, max_device_records=50)
    r_count = noise_radii(capped, rnd)[0] + 1
    check_cells(capped, rnd, "int64_cells", cells([50 + r_count, 0, 0, 0, 0], np.zeros((5, 3))),
                50.0 + r_count)
    over_total = [50 + r_count] * 4 + [r_count - 149]  # each cell within, the total 1 above
    for counts in ([51 + r_count, 0, 0, 0, 0], over_total, [10**12, 0, 0, 0, 0]):
        with pytest.raises(CellsError, match="max_device_records"):
            check_cells(capped, rnd, "int64_cells", cells(counts, np.zeros((5, 3))),
                        float(sum(counts)))
    heavy[4, 0] = STEPS * 51 + noise_radii(capped, rnd)[1] + 1  # 51 records' worth claimed by 60
    with pytest.raises(CellsError, match="cell 4's sum"):
        check_cells(capped, rnd, "int64_cells", cells([0, 0, 0, 0, 60], heavy), 60.0)
    heavy[4, 0] -= STEPS
    check_cells(capped, rnd, "int64_cells", cells([0, 0, 0, 0, 60], heavy), 60.0)
