"""What one release costs a device, as the coordinator counts it against the budget the device
declared at enrollment (:mod:`fedsketch.server.store.accounts`): the same (ε, δ) a device's ledger
records for it (the device's ``release_cost`` in ``client/study_pass.py``).

- a study's sketch, also in a sketch round (whose spec is the study it collects): the sketch's
  (ε, δ), plus, for a study validated by a helper, the δ its bounded noise shares cost
  (:func:`~fedsketch.common.study.validated.validity_delta`, as the device records);
- a study with a box round (its own releases are the box round's): the box round's ε (pure);
- a study with a calibration round 0 (its own releases are round 0's): round 0's ε (pure);
- a secure box round (:class:`~fedsketch.common.study.secure_box.SecureBox`): its ε (pure);
- a secure round 0 (:class:`~fedsketch.common.study.secure_calibration.SecureCalibration`): round 0's
  ε (pure);
- refinement round t (plain: its :class:`~fedsketch.common.study.refine.RoundSpec` with the study's
  spec; secure: a :class:`~fedsketch.common.study.secure_rounds.SecureRound`): ε_t (pure).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from fedsketch.common.study.refine import RoundSpec
from fedsketch.common.study.secure_box import SecureBox
from fedsketch.common.study.secure_calibration import SecureCalibration
from fedsketch.common.study.secure_rounds import SecureRound
from fedsketch.common.study.study import StudySpec
from fedsketch.common.study.validated import is_validated, validity_delta
from fedsketch.server.errors import Code, Refusal


def release_cost(spec: StudySpec | RoundSpec | SecureRound | SecureCalibration | SecureBox,
                 parent: StudySpec | None = None) -> tuple[float, float]:
    """(ε, δ) of one device's release for a study of ``spec`` (a plain round's needs its
    study's spec, ``parent``)."""
    if isinstance(spec, SecureCalibration):
        return spec.study.calibration.epsilon, 0.0
    if isinstance(spec, SecureBox):
        return spec.study.box.epsilon, 0.0
    if isinstance(spec, SecureRound):
        return spec.round.epsilon(spec.parent), 0.0
    if isinstance(spec, RoundSpec):
        if parent is None:
            raise ValueError("a refinement round's cost needs its study's spec")
        return spec.epsilon(parent), 0.0
    if spec.box is not None:
        return spec.box.epsilon, 0.0
    if spec.calibration is not None:
        return spec.calibration.epsilon, 0.0
    extra = validity_delta(spec) if is_validated(spec) else 0.0
    return spec.sketch.privacy.epsilon, spec.sketch.privacy.delta + extra


def study_cost(spec_of: Callable[[str], StudySpec | RoundSpec], study_id: str) -> tuple[float, float]:
    """:func:`release_cost` of a plain study or round, its specs read with ``spec_of``."""
    spec = spec_of(study_id)
    return release_cost(spec, spec_of(spec.parent_id) if isinstance(spec, RoundSpec) else None)


def declared_budget(epsilon: float, delta: float) -> tuple[float, float] | None:
    """The total an Enroll declares: None for none (ε = 0, an older device); INVALID_ARGUMENT
    unless 0 < ε < ∞ and 0 ≤ δ < 1."""
    if epsilon == 0.0 and delta == 0.0:
        return None
    if not (math.isfinite(epsilon) and epsilon > 0 and math.isfinite(delta) and 0 <= delta < 1):
        raise Refusal(Code.INVALID_ARGUMENT, f"a declared budget needs 0 < ε < inf and 0 <= δ < 1, "
                      f"got ε = {epsilon!r}, δ = {delta!r}")
    return epsilon, delta
