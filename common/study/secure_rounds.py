"""A refinement round (:mod:`fedsketch.common.study.refine`) of a secure-aggregation study: its round's
public parameters and each device's noise shares (MECHANISMS §4; DESIGN §4).

The round's payload is the K counts then the K·d coordinate sums of the device's cells, exact
integers; each device adds, per coordinate, a share NB(1/h_min, a) − NB(1/h_min, a) of a
discrete Laplace draw, a = exp(−ε_count) for the counts and exp(−ε_dim/STEPS) for the sums
(Su's split of the round's ε under replace-one, :func:`~fedsketch.common.study.refine.round_split`),
so the h_min = L − D − C shares the coordinator cannot know add up to one DLap draw of the round's
release: the unmasked sum is the central release, ε_t-DP for every device's records. The
modulus is :func:`~fedsketch.common.study.refine.cells_bits` for the study's max_records. Everything
else (threshold, graph, committee, assumptions) is the study's (:meth:`StudySpec.secure_params`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dp.grid import STEPS
from ..dp.samplers import dlap_noise_share
from ..secagg import SecAggParams
from ..secagg.spec import SecAggSpec
from ..secagg.trust import Assumptions
from .refine import RoundSpec, cells_bits
from .study import StudySpec, check_params


@dataclass(frozen=True)
class SecureRound:
    """A round with its (secure) study: what its secure aggregation derives from."""

    parent: StudySpec
    round: RoundSpec

    @property
    def secure_aggregation(self) -> SecAggSpec:
        """The study's."""
        return self.parent.secure_aggregation

    @property
    def min_devices(self) -> int:
        return self.parent.min_devices

    @property
    def min_records(self) -> int:
        return self.parent.min_records

    @property
    def device_cap(self) -> int:
        return self.parent.device_cap

    @property
    def assumptions(self) -> Assumptions:
        return self.parent.assumptions

    @property
    def split(self) -> tuple[float, float]:
        """(ε_count, ε_dim) of the round (replace-one: secure aggregation needs n public)."""
        return self.round.split(self.parent)

    @property
    def dim(self) -> int:
        """K(d + 1): the counts, then the sums."""
        k, d = self.round.shape
        return k * (d + 1)

    def round_params(self, study_id: str, roster: tuple[str, ...]) -> SecAggParams:
        """The round's public parameters for ``roster`` (module docstring)."""
        k, d = self.round.shape
        return self.parent.secure_params(study_id, roster, self.dim, lambda shape: cells_bits(
            self.secure_aggregation.max_records, self.split, k, d, shape))

    def check_round(self, params: SecAggParams) -> None:
        """ValueError unless the coordinator's ``params`` are :meth:`round_params`."""
        check_params(params, self.round_params(params.study_id, params.device_ids))

    def noise_shares(self) -> np.ndarray:
        """One device's int64 noise shares (dim,), exact, from OS random bits (module docstring)."""
        k, d = self.round.shape
        eps_count, eps_dim = self.split
        h_min = self.assumptions.min_honest
        return np.concatenate([dlap_noise_share(eps_count, 1.0, h_min, k),
                               dlap_noise_share(eps_dim, float(STEPS), h_min, k * d)])

    def cells(self, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(Σ N~ (K,), Σ T~ (K, d)) of an unmasked sum (dim,)."""
        k, d = self.round.shape
        total = np.asarray(total, dtype=np.int64)
        return total[:k], total[k:].reshape(k, d)
