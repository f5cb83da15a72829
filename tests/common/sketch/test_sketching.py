"""The feature sum: exactness against a float64 reference, masks, quantization, streaming."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pytest
from scipy import stats

from fedsketch.common.features import GRID, quadrant_signs
from fedsketch.common.sketch.frequencies import FrequencySpec, draw_frequencies
from fedsketch.common.sketch.sketching import BLOCK_ROWS, draw_masks, feature_sum


@pytest.fixture(scope="module")
def setup():
    freqs = draw_frequencies(FrequencySpec(d=5, m=300, scale=1.0, seed=2))
    x = np.random.default_rng(0).normal(0, 2, (3000, 5)).astype(np.float32)
    return freqs, x


def test_full_complex_sketch_matches_float64_reference(setup):
    freqs, x = setup
    fs = feature_sum([x], freqs, "complex")
    assert fs.re.dtype == np.int64 and fs.grid == 1024
    n = x.shape[0]
    t = x.astype(np.float64) @ freqs.omega + freqs.xi
    ref = np.exp(1j * t).sum(axis=0)
    # The encoded sum is Σ round(1024·cos t), Σ round(1024·sin t): float32 phases (error per
    # term ≲ |t|·2^-24) move a rounding by one step for a few records at most.
    np.testing.assert_allclose(fs.re, np.rint(1024 * np.cos(t)).sum(axis=0), atol=0.01 * n)
    np.testing.assert_allclose(fs.im, np.rint(1024 * np.sin(t)).sum(axis=0), atol=0.01 * n)
    # Normalized, the rounding costs at most 1/(2γ) per record and part: 1/(2048·√m).
    np.testing.assert_allclose(fs.clean_sketch(), ref / (n * math.sqrt(300)),
                               atol=1 / (2048 * math.sqrt(300)))


def test_quantized_sum_is_integer_and_matches_signs(setup):
    freqs, x = setup
    fs = feature_sum([x], freqs, "quantized")
    assert fs.re.dtype == np.int64 and fs.im.dtype == np.int64
    t = x.astype(np.float64) @ freqs.omega + freqs.xi
    ref_re = np.sign(np.cos(t)).sum(axis=0)
    ref_im = np.sign(np.sin(t)).sum(axis=0)
    # float32 phases can flip a sign only within ~1e-5 rad of a quadrant boundary.
    assert np.abs(fs.re - ref_re).max() <= 4 and np.abs(fs.im - ref_im).max() <= 4
    assert np.all(np.abs(fs.re) <= x.shape[0])


def test_quadrant_rule():
    eps = 1e-3
    t = np.array([0, math.pi / 2 - eps, math.pi / 2 + eps, math.pi + eps, 3 * math.pi / 2 + eps,
                  2 * math.pi + eps, -eps, -math.pi / 2 - eps], dtype=np.float32)
    re, im = quadrant_signs(t)
    assert re.tolist() == [1, 1, -1, -1, 1, 1, 1, -1]
    assert im.tolist() == [1, 1, 1, -1, -1, 1, -1, -1]


@pytest.mark.parametrize("r", [1, 3, 40, 299])
def test_masks_pick_exactly_r_entries_uniformly(r):
    """With x = 0 and no dither every phase is 0, so S counts how often each entry is picked."""
    m, n = 300, 30000
    freqs = draw_frequencies(FrequencySpec(d=2, m=m, scale=1.0, dither=False))
    fs = feature_sum([np.zeros((n, 2), np.float32)], freqs, "complex", r)
    assert np.all(fs.re % 1024 == 0)  # each pick adds round(1024·cos 0) = 1024 grid steps
    counts = fs.re // 1024
    assert counts.sum() == n * r
    assert not fs.im.any()
    chi2 = ((counts - n * r / m) ** 2 / (n * r / m)).sum()
    assert stats.chi2.sf(chi2, m - 1) > 1e-4


def test_mask_subsets_are_uniform_and_distinct():
    rng = np.random.default_rng(1)
    for m, r in [(5, 2), (6, 5)]:  # Floyd and argpartition paths
        idx = draw_masks(rng, 60000, m, r)
        assert all(len(set(row)) == r for row in idx[:1000].tolist())
        keys = [tuple(sorted(row)) for row in idx.tolist()]
        subsets = list(combinations(range(m), r))
        observed = np.array([keys.count(s) for s in subsets]) if len(subsets) <= 10 else None
        if observed is not None:
            assert stats.chisquare(observed).pvalue > 1e-4


def test_subsampled_sketch_is_unbiased(setup):
    """E[S/α] over masks equals the full sum: averaged over 40 mask draws, r = 30 of 300."""
    freqs, x = setup
    full = feature_sum([x], freqs, "complex").clean_sketch()
    runs = [feature_sum([x], freqs, "complex", 30, mask_seed=s).clean_sketch() for s in range(40)]
    mean = np.mean(runs, axis=0)
    sd = np.std(runs, axis=0).max() / math.sqrt(40)
    assert np.abs(mean - full).max() < 5 * sd


def test_chunking_and_threads_do_not_change_the_sum(setup):
    freqs, x = setup
    one = feature_sum([x], freqs, "complex", workers=1)
    many = feature_sum([x[i:i + 97] for i in range(0, len(x), 97)], freqs, "complex", workers=2)
    np.testing.assert_allclose(many.re, one.re, rtol=1e-9, atol=1e-9)
    q1 = feature_sum([x], freqs, "quantized", 5, mask_seed=3, workers=1)
    q2 = feature_sum([x], freqs, "quantized", 5, mask_seed=3, workers=2)
    np.testing.assert_array_equal(q1.re, q2.re)


def test_bad_arguments(setup):
    freqs, x = setup
    with pytest.raises(ValueError, match="r must be in 1..m"):
        feature_sum([x], freqs, "complex", 0)
    with pytest.raises(ValueError, match="r must be in 1..m"):
        feature_sum([x], freqs, "complex", 301)
    with pytest.raises(ValueError, match="unknown feature map"):
        feature_sum([x], freqs, "cosine")
    with pytest.raises(ValueError, match="dimension 3"):
        feature_sum([x[:, :3]], freqs, "complex")
    empty = feature_sum([], freqs, "complex")  # n = 0: a device under add/remove still releases
    assert empty.n == 0 and not empty.re.any() and not empty.im.any()


def test_a_block_sums_exactly_in_float32():
    """The r = m path sums each block of BLOCK_ROWS encoded records in float32: exact only while
    BLOCK_ROWS·γ ≤ 2^24. 40,000 records whose entry 0 encodes to the odd 1023 (phase 0.04 rad)
    sum to 1023·n exactly (a float32 sum of them past 2^24 would drop odd steps)."""
    assert BLOCK_ROWS * GRID["complex"] <= 2**24
    freqs = draw_frequencies(FrequencySpec(d=1, m=4, scale=1.0, dither=False))
    n = 40_000
    x = np.full((n, 1), 0.04 / freqs.omega[0, 0], dtype=np.float32)
    fs = feature_sum([x], freqs, "complex", workers=1)
    assert round(1024 * math.cos(float(np.float32(x[0, 0]) * np.float32(freqs.omega[0, 0])))) == 1023
    assert fs.re[0] == 1023 * n
