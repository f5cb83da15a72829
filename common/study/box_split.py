"""How a study with ``--bounds auto`` splits its ε and states its box (what ``create-study`` and
``simulate`` build; :mod:`fedsketch.common.study.box_plan` runs the round).

The box round takes ``fraction``·ε of each device's ε (sequential composition); the rest goes
to the study as without it (round 0, the sketch, refinement rounds). The study's own box is
the widest, [−2^40, 2^40]^d (:meth:`~fedsketch.common.sketch.box.Box.widest`): nothing is clipped
before the box is read. Under ``--scale auto`` σ's search range follows the box read unless the
user states one: until then the spec states the range of the widest box, a placeholder that
no device releases on.

Units: ε dimensionless; σ and the box in data units; seconds.
"""

from __future__ import annotations

import math

from ..choices import BOX_ROUND_FRACTION, RANGE_PER_HALF_WIDTH, ROUND_SECONDS
from ..sketch.box import WIDEST
from .box_plan import BoxPlan

#: σ's range while the box is unknown: the default rule's for the widest box.
PLACEHOLDER_RANGE = (RANGE_PER_HALF_WIDTH[0] * WIDEST, RANGE_PER_HALF_WIDTH[1] * WIDEST)


def split_box(epsilon: float, fraction: float = BOX_ROUND_FRACTION, derive_range: bool = True,
              round_seconds: float = ROUND_SECONDS) -> tuple[BoxPlan, float]:
    """(the box round's plan, the ε left for the rest of the study) for devices that spend
    ``epsilon`` in all; ValueError as :func:`check_split`."""
    check_split(epsilon, fraction)
    return (BoxPlan(fraction * epsilon, round_seconds=round_seconds, derive_range=derive_range),
            (1 - fraction) * epsilon)


def check_split(epsilon: float, fraction: float) -> None:
    """ValueError for a box round's ``fraction`` of ε outside (0, 1) or an ``epsilon`` not finite
    and > 0: what :func:`split_box` refuses, checked by ``simulate`` before its simulator (and
    scikit-learn, about 3 CPU s) loads."""
    if not 0 < fraction < 1:
        raise ValueError(f"the box round's share of ε must be in (0, 1), got {fraction!r}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"--bounds auto needs a finite epsilon > 0, got {epsilon!r}")


def widest(d: int) -> tuple[list[float], list[float]]:
    """(lo, hi) a study with a box round states: ∓2^40 on each of d axes."""
    return [-WIDEST] * d, [WIDEST] * d
