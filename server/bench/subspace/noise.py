"""The subspace family's float-noise seam: the Gibbs chain and sample-and-aggregate draw from
:func:`noise_rng` (that is :func:`fedsketch.common.dp.samplers.noise_rng`, a fresh
OS-CSPRNG-seeded generator), looked up here at each run, so that replacing
``fedsketch.server.bench.subspace.noise.noise_rng`` (as tests/test_golden.py does) seeds them."""

from __future__ import annotations

from fedsketch.common.dp.samplers import noise_rng

__all__ = ["noise_rng"]
