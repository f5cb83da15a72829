"""Alias of :mod:`fedsketch.common.dp.calibration`, the module's home since the ``dp`` package.

Kept only because ``server/bench`` (refactored in a separate change) still imports this path:
importing it yields the very same module object. New code imports ``fedsketch.common.dp.calibration``.
"""

import sys

from .dp import calibration

sys.modules[__name__] = calibration
