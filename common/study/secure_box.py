"""The box round (:mod:`fedsketch.common.study.box_plan`) of a secure-aggregation study: its
public parameters and each device's noise shares (MECHANISMS §4).

The payload is the device's exact per-column histograms on the box round's grid (d·bins
counts, each at most the device's n); each device adds, per count, a share NB(1/h_min, a_b) −
NB(1/h_min, a_b), a_b = exp(−ε_b/Δ1), Δ1 = 2d (replace-one:
:func:`~fedsketch.common.sketch.private_box.sensitivity`), so the h_min = L − D − C shares the
coordinator cannot know add up to one discrete-Laplace draw: the unmasked sum is the central
histogram release of the devices' pooled records, ε_b-DP for each device's, and the L shares
of the sum carry L/h_min draws' worth of variance, which the reading's thresholds take into
account (:func:`~fedsketch.common.study.box_plan.read_box`, ``draws`` = L/h_min). The modulus is
sized for max_records and a_b on d·bins words; threshold, graph, committee and assumptions are
the study's (:meth:`StudySpec.secure_params`).

Units: counts in records; ε dimensionless.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields

import numpy as np

from ..dp.samplers import dlap_noise_share, dlap_rate, share_rate
from ..secagg import SecAggParams, check_capacity, modulus_bits
from ..secagg.spec import SecAggSpec
from ..secagg.trust import Assumptions
from ..sketch.box import Tally
from ..sketch.private_box import coarse_counts, sensitivity


def box_noise_param(study) -> float:
    """a_b = exp(−ε_b/Δ1), Δ1 = 2d: the DLap parameter of the box round's unmasked sum."""
    return math.exp(-dlap_rate(study.box.epsilon, sensitivity(study.sketch.frequencies.d,
                                                               "replace_one")))


def check_box_capacity(study, shape: float) -> None:
    """ValueError unless secure aggregation can carry the box round's sum (its shares' rate and
    the modulus for max_records on d·bins words, ``shape`` = L/h_min)."""
    d = study.sketch.frequencies.d
    share_rate(study.box.epsilon, sensitivity(d, "replace_one"))
    check_capacity(study.secure_aggregation.max_records, box_noise_param(study),
                   study.box.size(d), shape=shape)


@dataclass(frozen=True)
class StudyRound:
    """What a secure round of a study (its box round, its round 0) reads from the study
    (``study``, a StudySpec with secure aggregation): its secure aggregation, quorum, record
    bounds and trust assumptions, all the study's own."""

    study: object

    @property
    def secure_aggregation(self) -> SecAggSpec:
        """The study's."""
        return self.study.secure_aggregation

    @property
    def min_devices(self) -> int:
        return self.study.min_devices

    @property
    def min_records(self) -> int:
        return self.study.min_records

    @property
    def device_cap(self) -> int:
        return self.study.device_cap

    @property
    def assumptions(self) -> Assumptions:
        return self.study.assumptions


@dataclass(frozen=True)
class SecureBox(StudyRound):
    """The box round of a secure study (module docstring)."""

    @property
    def dim(self) -> int:
        """d·bins: the d histograms, row by row."""
        return self.study.box.size(self.study.sketch.frequencies.d)

    def round_params(self, study_id: str, roster: tuple[str, ...]) -> SecAggParams:
        """The box round's public parameters for ``roster`` (module docstring)."""
        bound, a = self.secure_aggregation.max_records, box_noise_param(self.study)
        return self.study.secure_params(study_id, roster, self.dim, lambda shape: modulus_bits(
            bound, a, self.dim, shape=shape))

    def check_round(self, params: SecAggParams) -> None:
        """ValueError, naming the fields that differ, unless the coordinator's ``params`` are
        :meth:`round_params`."""
        expected = self.round_params(params.study_id, params.device_ids)
        differ = [f.name for f in fields(SecAggParams)
                  if getattr(params, f.name) != getattr(expected, f.name)]
        if differ:
            raise ValueError(f"the coordinator's round parameters differ from the study's in "
                             f"{', '.join(differ)}")

    def noise_shares(self) -> np.ndarray:
        """One device's int64 noise shares (dim,), exact, from OS random bits."""
        d = self.study.sketch.frequencies.d
        return dlap_noise_share(self.study.box.epsilon, sensitivity(d, "replace_one"),
                                self.assumptions.min_honest, self.dim)

    def exact_input(self, chunks: Iterable[np.ndarray],
                    tally: Tally | None = None) -> tuple[np.ndarray, int]:
        """(the exact histograms (dim,), records read) of ``chunks`` (nothing clipped)."""
        counts = coarse_counts(chunks, self.study.sketch.frequencies.d, self.study.box.levels)
        n = int(counts[0].sum())
        if tally is not None:
            tally.records += n
        return counts.ravel().astype(np.int64), n
