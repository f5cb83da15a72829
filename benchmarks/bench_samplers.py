"""The exact samplers of fedsketch.common.dp.exact against numpy's float samplers.

For ``--size`` (2,000) entries per call, the median over ``--runs`` (9) calls of each exact
sampler at a few scales, after one warm-up call (which fills the enclosure caches), beside its
numpy peer in the same run: ``Generator.geometric`` (a difference of two for the discrete
Laplace), ``Generator.normal`` for the discrete Gaussian, and a difference of two
``Generator.negative_binomial`` for a share. Prints a table with the ratio exact / numpy.

Usage: python benchmarks/bench_samplers.py [--runs 9] [--size 2000]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from fedsketch.common.dp import exact


def median_ms(call: Callable[[], object], runs: int) -> float:
    """Median wall time of ``call`` in milliseconds over ``runs`` calls, after one warm-up."""
    call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def cases(size: int, rng: np.random.Generator) -> list[tuple[str, str, Callable, Callable]]:
    """(sampler, parameters, exact call, numpy call) for every row of the table."""
    rows = []
    for scale in (Fraction(7, 10), Fraction(50), Fraction(10**4), Fraction(10**6)):
        lam, p = 1 / scale, -math.expm1(-1 / float(scale))
        rows.append(("geometric", f"1/lam = {float(scale):g}", lambda lam=lam: exact.geometric(lam, size),
                     lambda p=p: rng.geometric(p, size) - 1))
        rows.append(("discrete_laplace", f"1/lam = {float(scale):g}",
                     lambda lam=lam: exact.discrete_laplace(lam, size),
                     lambda p=p: rng.geometric(p, size) - rng.geometric(p, size)))
    for sigma in (Fraction(3, 2), Fraction(20), Fraction(10**3), Fraction(10**5)):
        rows.append(("discrete_gaussian", f"sigma = {float(sigma):g}",
                     lambda s=sigma: exact.discrete_gaussian(s * s, size),
                     lambda s=float(sigma): rng.normal(0.0, s, size)))
    for scale in (Fraction(50), Fraction(10**6)):
        for h in (1, 3, 50, 1000):
            lam, p = 1 / scale, -math.expm1(-1 / float(scale))
            rows.append(("dlap_share", f"h = {h}, 1/lam = {float(scale):g}",
                         lambda lam=lam, h=h: exact.dlap_share(lam, h, size),
                         lambda p=p, h=h: rng.negative_binomial(1 / h, p, size)
                         - rng.negative_binomial(1 / h, p, size)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--size", type=int, default=2000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"{args.size} entries per call, median of {args.runs} calls\n")
    print("| sampler | parameters | exact ms | numpy ms | exact / numpy |")
    print("|---|---|---|---|---|")
    for name, params, exact_call, numpy_call in cases(args.size, rng):
        ours, peer = median_ms(exact_call, args.runs), median_ms(numpy_call, args.runs)
        print(f"| {name} | {params} | {ours:.2f} | {peer:.3f} | {ours / peer:.0f} |", flush=True)


if __name__ == "__main__":
    main()
