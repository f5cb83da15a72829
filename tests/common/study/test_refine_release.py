"""A refinement round's release (fedsketch.common.study.refine): its noise has the exact discrete-Laplace
law of the round's ε split, its sensitivity is what the split is calibrated for, and its specs
parse strictly."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from conftest import study_spec

from fedsketch.common.dp.grid import STEPS
from fedsketch.common.sketch.box import Box
from fedsketch.common.study.refine import (
    CellsError,
    RefineSpec,
    RoundSpec,
    check_cells,
    decode_cells,
    noise_radii,
    release_cells,
    round_cells,
)
from fedsketch.common.study.study import StudySpec
from fedsketch.server.decode.overseed import OVERSEED
from fedsketch.server.decode.refine import first_centroids, next_centroids

#: Su's ρ and the relation factors, restated from MECHANISMS §6.2 and §0.3 (not imported: a
#: wrong constant in the code must fail here).
RHO, FACTOR = 0.225, {"replace_one": 2, "add_remove": 1}


def dlap_variance(epsilon: float, sensitivity: float) -> float:
    """Var DLap(a) = 2a/(1 − a)², a = exp(−ε/Δ1)."""
    a = math.exp(-epsilon / sensitivity)
    return 2 * a / (1 - a) ** 2


def round_of(spec: StudySpec, centres: np.ndarray) -> RoundSpec:
    return RoundSpec("st-x", "0" * 64, 1, tuple(map(tuple, centres)), spec.min_devices, None,
                     radius=spec.refine.radius)


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
    counts, sums, _ = round_cells(Box(spec.lo, spec.hi), rnd, [x])
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
    coordinate (add/remove), however far it lies from its centre; replacing one changes two
    cells, twice that in L1 (the factor 2 the split divides by); a record beyond the box counts
    as its clipped self."""
    spec = study_spec(d=2, refine=RefineSpec((1.0,), radius=0.25))
    centres = np.array([[-5.0, -5.0], [5.0, 5.0]])
    rnd = round_of(spec, centres)
    base = np.array([[-4.0, -6.0], [6.0, 3.0]], dtype=np.float32)

    def stats(rows):
        counts, sums, _ = round_cells(Box(spec.lo, spec.hi), rnd, [np.asarray(rows, np.float32)])
        return np.concatenate([counts, sums.ravel() / STEPS])

    for far in ([1e6, -1e6], [9.0, -9.0], [-10.0, 10.0]):
        added = stats(np.vstack([base, [far]])) - stats(base)
        assert np.abs(added).sum() <= 1 + 2 + 1e-9 and added[:2].sum() == 1
    replaced = stats(np.vstack([base[:1], [[-9.9, -9.9]]])) - stats(base)
    assert np.abs(replaced[:2]).sum() == 2 and np.abs(replaced).sum() <= 2 * (1 + 2) + 1e-9


def test_a_round_sums_offsets_from_each_cells_centre_clipped_to_the_public_radius():
    """Box [−10, 10]², ρ = 0.25: r = 2.5 and a step of 2.5/STEPS. A record 1 right of and 0.5
    below its centre adds (0.4, −0.2)·STEPS; one 7 right adds STEPS (clipped to r), whatever
    the box centre; the coordinator then moves each centre by its cell's mean offset: to the
    cell's mean when every offset is within r, by r at most when the cell lies farther."""
    spec = study_spec(d=2, refine=RefineSpec((1000.0,), radius=0.25))
    centres = np.array([[-5.0, -5.0], [5.0, 5.0]])
    rnd = round_of(spec, centres)
    x = np.array([[-4.0, -5.5], [-6.0, -4.5], [9.0, 5.0], [9.5, 5.0]], dtype=np.float32)
    counts, sums, rows = round_cells(Box(spec.lo, spec.hi), rnd, [x])
    assert rows == 4 and counts.tolist() == [2, 2]
    assert sums.tolist() == [[0, 0], [2 * STEPS, 0]]  # (0.4 − 0.4, −0.2 + 0.2); two clipped
    one, single, _ = round_cells(Box(spec.lo, spec.hi), rnd, [x[:1]])
    assert one.tolist() == [1, 0]
    assert single.tolist() == [[round(0.4 * STEPS), round(-0.2 * STEPS)], [0, 0]]
    moved = next_centroids(spec, rnd, [(4.0, counts, sums)]).centroids
    assert moved[0] == pytest.approx([-5.0, -5.0]) and moved[1] == pytest.approx([7.5, 5.0])
    inside = np.array([[-4.0, -5.5], [-5.0, -5.0], [4.0, 6.0], [5.5, 4.5]], dtype=np.float32)
    counts, sums, _ = round_cells(Box(spec.lo, spec.hi), rnd, [inside])
    moved = next_centroids(spec, rnd, [(4.0, counts, sums)]).centroids
    assert moved == pytest.approx(np.array([[-4.5, -5.25], [4.75, 5.25]]), abs=1e-5)


def test_round_specs_parse_strictly_and_round_trip():
    spec = study_spec(refine=RefineSpec((0.5, 0.25), 60.0))
    back = StudySpec.from_json(spec.to_json())
    assert back == spec and back.total_epsilon == pytest.approx(50.75)
    assert '"format":"fedsketch.study/3"' in spec.to_json()
    assert '"refine"' not in study_spec().to_json()  # a study without rounds reads as before
    rnd = RoundSpec("st-a", "1" * 64, 2, ((1.0, 2.0, 3.0),), 1, 5.0, {"weights": [1.0]},
                    radius=0.3)
    assert RoundSpec.from_json(rnd.to_json()) == rnd and '"radius":0.3' in rnd.to_json()
    old = rnd.to_json().replace("fedsketch.round/2", "fedsketch.round/1")
    with pytest.raises(ValueError, match="earlier release"):
        RoundSpec.from_json(old)
    with pytest.raises(ValueError, match="radius is 0.3, the study's 0.5"):
        replace(rnd, round=1).check_parent(spec)
    assert RefineSpec.from_dict({"epsilon": [1.0]}).radius == 1.0  # written before the radius
    assert RefineSpec.from_dict(RefineSpec((1.0,), radius=0.2).to_dict()).radius == 0.2
    for radius in (0, -0.5, 2.5, math.nan, True, "0.5"):
        with pytest.raises(ValueError, match="radius"):
            RefineSpec((1.0,), radius=radius)
        with pytest.raises(ValueError, match="radius"):
            replace(rnd, radius=radius)
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


def test_the_first_rounds_spare_centres_are_packed_within_the_radius_of_the_box_centre():
    """T = 3 over [−10, 10]³, k = 3, ρ = 0.25: round 1 publishes the sketch's k centres, then
    (OVERSEED − 1)·k data-independent ones within ±2.5 of the box centre, spread over that
    region (not bunched); T = 1 publishes the sketch's alone."""
    spec = study_spec(refine=RefineSpec((0.1,) * 3, radius=0.25))
    start = np.array([[9.0, 9.0, 9.0], [-9.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    first = first_centroids(spec, start, 10_000.0, 4)
    assert first.shape == (OVERSEED * 3, 3) and np.array_equal(first[:3], start)
    spare = first[3:]
    assert np.abs(spare).max() <= 2.5 and np.abs(spare).max(axis=0).min() > 1.25
    assert np.array_equal(first_centroids(replace(spec, refine=RefineSpec((0.1,), radius=0.25)),
                                          start, 10_000.0, 4), start)
