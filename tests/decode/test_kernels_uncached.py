"""CL-OMPR's compiled loops where numba finds no writable cache folder (a read-only install, a
systemd unit with ProtectSystem=strict): compiled in memory, and the decode still runs (without
the fallback, importing server/decode/kernels.py raises "cannot cache function ...: no locator
available"). Emulated as tests/common/sketch/test_kernel_cache.py does: another user, HOME
absent, the tree not its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

SCRIPT = """
import numpy as np
from fedsketch.server.decode.clompr import clompr
rng = np.random.default_rng(0)
omega, xi = rng.normal(size=(2, 40)), rng.uniform(0, 6.28, 40)
c = np.array([[1.0, -1.0], [-1.0, 1.0]])
s = (np.exp(1j * (c @ omega + xi)) / np.sqrt(40)).mean(axis=0)
out = clompr(s, omega, xi, 2, np.full(2, -3.0), np.full(2, 3.0), rng=np.random.default_rng(1))
print(round(float(np.abs(np.sort(out.centroids[:, 0])).max()), 3))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to run as another user")
def test_the_decoder_runs_without_a_writable_cache_folder():
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", SCRIPT],
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}, cwd="/", capture_output=True,
        text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-600:]
    assert done.stdout.strip() == "1.0"
