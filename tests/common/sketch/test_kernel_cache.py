"""The fused r = m kernel loads from numba's disk cache; where numba finds no writable cache
folder (the shipped deploy/fedsketch-device.service: ProtectSystem=strict makes the install
read-only, ProtectHome=read-only the user's ~/.cache) it is compiled in memory instead (before:
``import trig_compiled`` raised "cannot cache function 'kernel': no locator available", and
every m >= 256 complex sketch failed). Emulated: another user, HOME absent, the tree not its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

SCRIPT = """
import numpy as np
from fedsketch.common.sketch.frequencies import draw_frequencies
from fedsketch.common.sketch.spec import FrequencySpec
from fedsketch.common.sketch.sketching import feature_sum
fr = draw_frequencies(FrequencySpec(d=3, m=256, scale=1.5, seed=3))
x = np.random.default_rng(0).normal(size=(1000, 3)).astype(np.float32)
print(int(feature_sum([x], fr, "complex").re[0]))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to run as another user")
def test_the_fused_kernel_runs_without_a_writable_cache_folder():
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", SCRIPT],
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}, cwd="/", capture_output=True,
        text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-600:]
