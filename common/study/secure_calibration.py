"""Round 0 (:mod:`fedsketch.common.study.calibration_round`) of a secure-aggregation study: its public
parameters and each device's noise shares (MECHANISMS §4; DESIGN §4).

The payload is the exact integer calibration sum of the device's records (2·m0 entries, re then
im, γ steps per unit of the complex map, r = m0); each device adds, per entry, a share
NB(1/h_min, a_0) − NB(1/h_min, a_0), a_0 = exp(−ε_0/Δ1), Δ1 the complex map's replace-one L1
sensitivity at r = m0 (:func:`~fedsketch.common.dp.plan.integer_sum_term`), so the h_min =
L − D − C shares the coordinator cannot know add up to one discrete-Laplace draw: the unmasked
sum is the central calibration release of the devices' pooled records, ε_0-DP for each device's.
The modulus is sized for γ·max_records and a_0 on 2·m0 words; threshold, graph, committee and
assumptions are the study's (:meth:`StudySpec.secure_params`).

:func:`secure_protocol` names what a secure round's parameters derive from: the study (its
sketch, also in the sketch round that follows round 0), a refinement round, or round 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..dp.budget import NoiseTerm
from ..dp.plan import integer_sum_term
from ..dp.samplers import dlap_noise_share
from ..features import GRID
from ..secagg import SecAggParams, modulus_bits
from ..sketch.box import Box, Tally
from ..sketch.scale import calibration_frequencies
from ..sketch.sketching import feature_sum
from .refine import RoundSpec
from .secure_box import SecureBox, StudyRound
from .secure_rounds import SecureRound
from .study import StudySpec, check_params


@dataclass(frozen=True)
class SecureCalibration(StudyRound):
    """Round 0 of a secure study with a calibration round (module docstring)."""

    @property
    def dim(self) -> int:
        """2·m0: the real parts, then the imaginary parts."""
        return 2 * self.study.calibration.m0

    @property
    def term(self) -> NoiseTerm:
        """The discrete-Laplace term of the unmasked sum (module docstring)."""
        m0 = self.study.calibration.m0
        return integer_sum_term("complex", self.study.calibration.epsilon, m0, "replace_one")

    def round_params(self, study_id: str, roster: tuple[str, ...]) -> SecAggParams:
        """Round 0's public parameters for ``roster`` (module docstring)."""
        bound = GRID["complex"] * self.secure_aggregation.max_records
        return self.study.secure_params(study_id, roster, self.dim, lambda shape: modulus_bits(
            bound, self.term.scale, self.dim, shape=shape))

    def check_round(self, params: SecAggParams) -> None:
        """ValueError unless the coordinator's ``params`` are :meth:`round_params`."""
        check_params(params, self.round_params(params.study_id, params.device_ids))

    def noise_shares(self) -> np.ndarray:
        """One device's int64 noise shares (dim,), exact, from OS random bits."""
        term = self.term
        return dlap_noise_share(term.epsilon, term.sensitivity, self.assumptions.min_honest, self.dim)

    def exact_input(self, box: Box, chunks: Iterable[np.ndarray],
                    tally: Tally | None = None) -> tuple[np.ndarray, int]:
        """(the exact integer calibration sum (dim,), records read) of ``chunks`` clipped into
        ``box``: the sum :func:`~fedsketch.common.sketch.scale.calibration_release` noises."""
        freqs = self.study.sketch.frequencies
        spec = self.study.calibration.spec(freqs.d, freqs.seed)
        fs = feature_sum(box.centred(chunks, tally), box.reduce(calibration_frequencies(spec)),
                         "complex")
        return np.concatenate([fs.re, fs.im]), fs.n


#: What a secure round's public parameters derive from (:func:`secure_protocol`).
SecureProtocol = StudySpec | SecureRound | SecureCalibration | SecureBox


def secure_protocol(spec: StudySpec, rnd: RoundSpec | None = None) -> SecureProtocol:
    """What a secure round's public parameters derive from: refinement round ``rnd`` of ``spec``,
    ``spec``'s box round if it declares one, its round 0 if it declares one, else ``spec``
    itself (its sketch)."""
    if rnd is not None:
        return SecureRound(spec, rnd)
    if spec.box is not None:
        return SecureBox(spec)
    return spec if spec.calibration is None else SecureCalibration(spec)
