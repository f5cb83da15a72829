"""Alias of :mod:`fedsketch.common.secagg.wire`, the module's home since the ``secagg`` package.

Kept only because ``server/service`` (refactored in a separate change) still imports this path:
importing it yields the very same module object. New code imports ``fedsketch.common.secagg.wire``.
"""

import sys

from .secagg import wire

sys.modules[__name__] = wire
