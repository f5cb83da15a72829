"""The private box (:mod:`fedsketch.common.sketch.private_box`) read across devices: what each
device releases in the box's two rounds, and how the coordinator reads the sum.

Each stage of the central box is a per-column histogram, a sum over records: across L devices
the exact counts add up to the pooled records' histogram, so the federated box is the central
one read from a sum that carries more noise. In stage s (s = 1: the scale-free signed log grid,
:data:`~fedsketch.common.sketch.private_box.COARSE_BINS` bins a column; s = 2:
:data:`~fedsketch.common.sketch.private_box.FINE_BINS` equal bins in stage 1's range [lo1, hi1],
public once stage 1 is read) device j releases

* plainly, h_j + N_j, N_j i.i.d. DLap(e^{−ε_s/Δ1}) on every count (ε_s = ε_box/2, Δ1 =
  :func:`~fedsketch.common.sketch.private_box.sensitivity`: 2d under replace-one, d under
  add/remove): ε_s-DP for its records on its own; the sum carries L draws a count;
* under secure aggregation, h_j + Z_j, Z_j = NB(1/h_min, a) − NB(1/h_min, a) a count
  (:func:`~fedsketch.common.dp.samplers.dlap_noise_share`, a = e^{−ε_s/Δ1}): any h_min honest
  devices' shares add up to one DLap(a) draw, so the unmasked sum is ε_s-DP for every device's
  records, and L shares carry L/h_min draws' worth of variance.

The coordinator sums the releases and reads them with the central rule
(:func:`~fedsketch.common.sketch.private_box.read_coarse`, then
:func:`~fedsketch.common.sketch.private_box.read_fine`), its thresholds raised for a sum of
``draws`` DLap draws (L plainly, L/h_min securely): post-processing. A device that takes part in
both stages spends ε_box = ε_1 + ε_2 (sequential composition).

Units: values and edges in data units; counts in records; ε dimensionless.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ..dp.calibration import check_epsilon
from ..dp.samplers import dlap_noise_share
from ..sketch.private_box import (
    PrivateBox,
    coarse_counts,
    fine_counts,
    read_coarse,
    read_fine,
    release_histograms,
    sensitivity,
)

#: One device's records, as a function that yields (rows, d) chunks afresh on each call.
Records = Callable[[], Iterable[np.ndarray]]


def stage_epsilon(epsilon: float) -> float:
    """ε of each of the box's two releases: half the box's ε (finite, > 0)."""
    if not math.isfinite(check_epsilon(epsilon)) or epsilon <= 0:
        raise ValueError(f"a private box needs a finite ε > 0, got {epsilon!r}")
    return epsilon / 2


def device_release(counts: np.ndarray, epsilon: float, neighbouring: str,
                   h_min: int | None = None) -> np.ndarray:
    """One device's release of its exact histograms ``counts`` (d, bins) in a stage of the box
    whose ε in all is ``epsilon``: plus DLap noise of the stage (``h_min`` None, a plain study),
    or plus its noise share for secure aggregation with ``h_min`` honest devices (module
    docstring). Exact samplers, OS random bits."""
    eps = stage_epsilon(epsilon)
    if h_min is None:
        return release_histograms(counts, eps, neighbouring)
    if neighbouring != "replace_one":
        raise ValueError("secure aggregation supports replace-one only")
    share = dlap_noise_share(eps, sensitivity(counts.shape[0], neighbouring), h_min, counts.size)
    return counts + share.reshape(counts.shape)


def draws(devices: int, h_min: int | None) -> float:
    """How many DLap draws of a stage's scale the sum of ``devices`` releases carries a count:
    one a device plainly, devices/h_min under secure aggregation (a share is 1/h_min of a draw)."""
    if devices < 1 or (h_min is not None and not 1 <= h_min <= devices):
        raise ValueError(f"need devices >= 1 and 1 <= h_min <= devices, got {devices}, {h_min}")
    return float(devices) if h_min is None else devices / h_min


def federated_box(devices: Sequence[Records], d: int, epsilon: float, *,
                  neighbouring: str = "replace_one", h_min: int | None = None) -> PrivateBox:
    """The box's two rounds over ``devices`` run in one process (what the coordinator reads
    from the devices' releases; tests and benchmarks): each device's stage-1 release, their
    sum read into [lo1, hi1], each device's stage-2 release in it, their sum read into the box.
    Under secure aggregation (``h_min``) only the sums are formed, as the unmasking would give
    them. ValueError for a column too sparse for the box's ε (before stage 2 when stage 1
    already fails)."""
    eps, many = stage_epsilon(epsilon), draws(len(devices), h_min)
    total = sum(device_release(coarse_counts(rec(), d), epsilon, neighbouring, h_min)
                for rec in devices)
    lo1, hi1, tau1 = read_coarse(total, eps, neighbouring, many)
    total = sum(device_release(fine_counts(rec(), lo1, hi1), epsilon, neighbouring, h_min)
                for rec in devices)
    box, tau2 = read_fine(total, lo1, hi1, eps, neighbouring, many)
    return PrivateBox(box, epsilon, (lo1, hi1), (tau1, tau2))

