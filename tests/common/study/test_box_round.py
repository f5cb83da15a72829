"""The private box read across devices (:mod:`fedsketch.common.study.box_round`): each device's
release carries the stated noise (plainly a whole stage draw; under secure aggregation a share,
h_min of which add up to one draw, with the private box's variance test and ε audit), the
coordinator's reading accounts for the noise of a sum, and the box it reads is close to the
data's central 99 % as the central box is."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import dlap_variance_check, histogram_audit

from fedsketch.common.sketch.private_box import COARSE_BINS, sensitivity
from fedsketch.common.study.box_round import device_release, draws, federated_box, stage_epsilon


def natural_units(n: int, seed: int) -> np.ndarray:
    """A temperature in kelvin, a distance in miles (heavy right tail touching 0), a signed
    quantity of order 10⁻³ (the private box's own test records)."""
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.normal(300, 20, n), rng.exponential(1000, n), rng.normal(0, 1e-3, n)])


def devices_of(x: np.ndarray, count: int) -> list:
    return [(lambda p=p: iter([p])) for p in np.array_split(x, count)]


@pytest.mark.parametrize(("d", "relation"), [(1, "replace_one"), (3, "replace_one"), (3, "add_remove")])
def test_a_plain_device_release_is_one_stage_draw(d, relation):
    """A plain device adds DLap at the stage's ε = ε_box/2 and Δ1 = sensitivity(d) (the whole
    box ε, or Δ1 of one column, moves the variance 4× or more)."""
    eps_box = 1.4
    assert stage_epsilon(eps_box) == 0.7
    noise = device_release(np.zeros((d, 200_000 // d), dtype=np.int64), eps_box, relation)
    dlap_variance_check(noise, 0.7, sensitivity(d, relation))


def test_the_shares_of_h_min_secure_devices_sum_to_one_stage_draw():
    """h_min = 4 devices' shares on empty histograms (d = 3, replace-one) add up to one DLap
    draw of the stage; one share alone carries a quarter of its variance, far less than a draw
    (a device that sent a whole draw would pass the first check only by luck of the others)."""
    d, h, eps_box = 3, 4, 1.0
    zeros = np.zeros((d, 60_000), dtype=np.int64)
    shares = [device_release(zeros, eps_box, "replace_one", h_min=h) for _ in range(h)]
    dlap_variance_check(sum(shares), 0.5, sensitivity(d, "replace_one"))
    a = np.exp(-0.5 / sensitivity(d, "replace_one"))
    assert shares[0].var() < 0.4 * 2 * a / (1 - a) ** 2


def _secure_audit(epsilon: float, shrink: float, h: int = 3) -> float:
    """:func:`histogram_audit` of the unmasked sum of h devices' stage releases for d = 1 at the
    box's ``epsilon`` (each stage ε/2); ``shrink`` divides the noise's scale."""
    def noise(shape):
        zeros = np.zeros((1, shape[0] * shape[1]), dtype=np.int64)
        total = sum(device_release(zeros, epsilon * shrink, "replace_one", h_min=h)
                    for _ in range(h))
        return total[0].reshape(shape)

    return histogram_audit(noise)


def test_the_secure_sum_of_a_stage_stays_below_its_epsilon():
    assert _secure_audit(2.0, 1.0) <= 1.0  # one stage of a box at ε = 2


def test_the_audit_catches_a_secure_sum_at_half_its_noise():
    assert _secure_audit(2.0, 2.0) > 1.0


def test_secure_aggregation_needs_replace_one():
    with pytest.raises(ValueError, match="replace-one"):
        device_release(np.zeros((1, COARSE_BINS), dtype=np.int64), 1.0, "add_remove", h_min=2)


def test_a_sum_carries_one_draw_a_device_plainly_and_a_share_securely():
    assert draws(100, None) == 100.0
    assert draws(100, 90) == pytest.approx(100 / 90)
    for bad in ((0, None), (5, 6), (5, 0)):
        with pytest.raises(ValueError):
            draws(*bad)


@pytest.mark.parametrize(("h_min", "widths", "most_clipped"), [(18, (0.8, 1.6), 0.03),
                                                              (None, (0.45, 3.2), 0.10)])
def test_the_federated_box_fits_records_in_their_own_units(h_min, widths, most_clipped):
    """n = 50,000 over 20 devices, ε_box = 1 (d = 3), 3 boxes: each column's box against the
    data's [0.5 %, 99.5 %] range. Securely (20/18 draws a count) the central box's bounds hold
    (width 0.8–1.6, at most 3 % clipped; test_private_box); measured over 150 boxes: 0.87–1.31,
    at most 2.5 %. Plainly the sum carries 20 draws, √20 times the noise: measured 0.60–2.63 and
    at most 7.7 % of the heavy-tailed column clipped over 150 boxes; bounds 0.45–3.2 and 10 %."""
    x = natural_units(50_000, 2)
    q = np.quantile(x, [0.005, 0.995], axis=0)
    for _ in range(3):
        box = federated_box(devices_of(x, 20), 3, 1.0, h_min=h_min).box
        clipped = ((x < box.lo) | (x > box.hi)).mean(axis=0)
        width = (box.hi - box.lo) / (q[1] - q[0])
        assert np.all(clipped <= most_clipped), clipped
        assert np.all((width >= widths[0]) & (width <= widths[1])), width


def test_the_reading_accounts_for_the_noise_of_many_devices():
    """200 plain devices, each with 200 records of one narrow column (300 ± 1 kelvin): the sum
    carries 200 draws a count, whose spread read as one draw's would make bins far from the data
    significant. Measured over 300 runs: lo 212–290, hi 310–407 (stage 1's range is 181–430;
    stage 2's noise floor, 2.1 standard deviations a bin, lets a noise bin or two stretch the
    box in 5 % of runs); with the draws ignored, the box is ±10¹¹. Bounds 150 and 450, 3 runs."""
    rng = np.random.default_rng(4)
    x = rng.normal(300, 1, (40_000, 1))
    for _ in range(3):
        box = federated_box(devices_of(x, 200), 1, 2.0).box
        assert 150 <= box.lo[0] < 299 and 301 < box.hi[0] <= 450, (box.lo, box.hi)


def test_a_column_too_sparse_for_the_sum_is_refused_in_words():
    with pytest.raises(ValueError, match="column 1: no coarse histogram bin holds the ~"):
        federated_box(devices_of(natural_units(200, 3), 50), 3, 0.5)
