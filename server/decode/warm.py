"""Compile the numba kernels into numba's disk cache once, before many processes need them:
``python -m fedsketch.server.decode.warm`` (``make test`` runs it first).

The sketch's fused loop (:mod:`fedsketch.common.sketch.trig_compiled`, used from m =
``FUSED_MIN_M``) and CL-OMPR's loops (:mod:`fedsketch.server.decode.kernels`) are compiled on a
process's first call and cached beside their modules; a process that finds the cache loads them
in about 0.6 CPU s instead of compiling them (about 15 CPU s, RESULTS.md §20–21). In a fresh
clone the cache is empty, and the test suite's workers and the coordinators and daemons they
start would each compile the same kernels at once. One tiny sketch (m = ``FUSED_MIN_M``, the
``complex`` map at r = m) and one decoding (k = 2, d = 2, one replicate, float32 screening and the
float64 loops) call every kernel with the types the product uses. Where no cache folder is
writable this compiles in memory and keeps nothing: harmless.
"""

from __future__ import annotations

import numpy as np

from fedsketch.common.sketch.frequencies import FrequencySpec, draw_frequencies
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.sketching import FUSED_MIN_M, feature_sum
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.server.decode.pipeline import decode_centroids


def main() -> None:
    """Sketch 2,000 records of two clusters and decode them once (the numbers are discarded)."""
    rng = np.random.default_rng(0)
    x = (rng.normal(0.0, 0.5, (2000, 2)) + rng.choice([-3.0, 3.0], (2000, 1))).astype(np.float32)
    spec = SketchSpec(FrequencySpec(d=2, m=FUSED_MIN_M, scale=1.0, seed=0), "complex", FUSED_MIN_M,
                      PrivacySpec(float("inf")))
    sketch = feature_sum([x], draw_frequencies(spec.frequencies), "complex").clean_sketch()
    decode_centroids(sketch, spec, 2, np.full(2, -6.0), np.full(2, 6.0), replicates=1, rng=rng)


if __name__ == "__main__":
    main()
