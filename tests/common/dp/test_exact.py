"""fedsketch.common.dp.exact: each sampler's law against its closed form (chi-square, tails,
moments), the exact slow path forced, the enclosures against a 60-digit reference, and the only
randomness being ``random_words``."""

from __future__ import annotations

import decimal
import hashlib
import random
import subprocess
import sys
from fractions import Fraction
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from fedsketch.common.dp import exact

N = 10**6
SMALL, LARGE = Fraction(10, 7), Fraction(1, 50)  # 1/lam = 0.7 and 50


def dlap_pmf(lam: Fraction, k: np.ndarray) -> np.ndarray:
    a = np.exp(-float(lam))
    return (1 - a) / (1 + a) * a ** np.abs(k)


def geom_pmf(lam: Fraction, k: np.ndarray) -> np.ndarray:
    a = np.exp(-float(lam))
    return np.where(k >= 0, (1 - a) * a ** np.maximum(k, 0), 0.0)


def nb_pmf(rho: Fraction, lam: Fraction, k: np.ndarray) -> np.ndarray:
    return stats.nbinom(float(rho), -np.expm1(-float(lam))).pmf(k)


def dgauss_pmf(sigma2: Fraction, k: np.ndarray) -> np.ndarray:
    s2 = float(sigma2)
    z = np.exp(-np.arange(-int(40 * s2**0.5) - 40, int(40 * s2**0.5) + 41) ** 2 / (2 * s2)).sum()
    return np.exp(-(k.astype(float) ** 2) / (2 * s2)) / z


def chi2_pvalue(x: np.ndarray, pmf, min_expected: float = 20.0) -> float:
    """Pearson's test of the draws ``x`` against ``pmf`` (a function of an int array): integers
    with an expected count ≥ ``min_expected`` are bins, the rest pool into a left and a right
    tail."""
    span = np.arange(min(x.min(), -5) - 10 * (x.max() - x.min()) - 100,
                     max(x.max(), 5) + 10 * (x.max() - x.min()) + 101)
    p = pmf(span)
    p = p / p.sum()
    kept = np.flatnonzero(p * x.size >= min_expected)
    first, last = span[kept[0]], span[kept[-1]]
    counts = np.bincount(np.clip(x, first - 1, last + 1) - (first - 1), minlength=last - first + 3)
    expected = np.concatenate([[p[: kept[0]].sum()], p[kept[0]: kept[-1] + 1], [p[kept[-1] + 1:].sum()]])
    use = expected > 0
    assert counts[~use].sum() == 0, "draws where the law has no mass"
    obs, exp = counts[use], expected[use] * x.size
    return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def assert_tail(x: np.ndarray, k: int, p: float) -> None:
    """Empirical P(|X| ≥ k) within 5 standard errors of ``p``."""
    emp = np.mean(np.abs(x) >= k)
    assert abs(emp - p) <= 5 * np.sqrt(p * (1 - p) / x.size) + 1e-12, (k, emp, p)


def assert_moments(x: np.ndarray, mean: float, var: float) -> None:
    """Sample mean and variance within 5 standard errors (the variance's from the 4th moment)."""
    d = x.astype(np.float64) - x.mean()
    m2, m4 = np.mean(d**2), np.mean(d**4)
    assert abs(x.mean() - mean) <= 5 * np.sqrt(var / x.size), (x.mean(), mean)
    assert abs(m2 - var) <= 5 * np.sqrt((m4 - m2**2) / x.size), (m2, var)


@pytest.fixture(scope="module", params=[SMALL, LARGE], ids=["1/lam=0.7", "1/lam=50"])
def lam(request):
    return request.param


@pytest.mark.slow
def test_geometric_law(lam):
    x = exact.geometric(lam, N)
    assert x.dtype == np.int64 and x.shape == (N,)
    assert chi2_pvalue(x, partial(geom_pmf, lam)) > 1e-4
    a = np.exp(-float(lam))
    for k in (1, 3, int(5 / float(lam))):
        assert_tail(x, k, a**k)


@pytest.mark.slow
def test_discrete_laplace_law(lam):
    x = exact.discrete_laplace(lam, N)
    assert x.dtype == np.int64 and x.shape == (N,)
    assert chi2_pvalue(x, partial(dlap_pmf, lam)) > 1e-4
    a = np.exp(-float(lam))
    for k in (1, 2, int(3 / float(lam)), int(8 / float(lam))):
        assert_tail(x, k, 2 * a**k / (1 + a))


@pytest.mark.slow
@pytest.mark.parametrize("sigma", [Fraction(3, 2), Fraction(20)])
def test_discrete_gaussian_law(sigma):
    x = exact.discrete_gaussian(sigma**2, N)
    assert x.dtype == np.int64
    assert chi2_pvalue(x, partial(dgauss_pmf, sigma**2)) > 1e-4
    ks = np.arange(-int(40 * sigma) - 40, int(40 * sigma) + 41)
    pk = dgauss_pmf(sigma**2, ks)
    for k in (1, int(2 * sigma), int(3 * sigma)):
        assert_tail(x, k, pk[np.abs(ks) >= k].sum())


@pytest.mark.slow
def test_negative_binomial_law(lam):
    rho = Fraction(1, 3)
    x = exact.negative_binomial(rho, lam, N)
    assert x.dtype == np.int64 and x.min() >= 0
    assert chi2_pvalue(x, partial(nb_pmf, rho, lam)) > 1e-4
    a = np.exp(-float(lam))
    assert_moments(x, float(rho) * a / (1 - a), float(rho) * a / (1 - a) ** 2)
    law = stats.nbinom(float(rho), 1 - a)
    for k in (1, int(1 / float(lam)), int(6 / float(lam))):
        assert_tail(x, k, law.sf(k - 1))


@pytest.mark.slow
def test_large_scale_moments():
    lam = Fraction(1, 10**5)
    a = np.exp(-float(lam))
    assert_moments(exact.discrete_laplace(lam, 200_000), 0.0, 2 * a / (1 - a) ** 2)
    assert_moments(exact.discrete_gaussian(Fraction(10**10), 200_000), 0.0, 1e10)
    share = exact.dlap_share(lam, 50, 200_000)
    assert_moments(share, 0.0, 2 * a / (1 - a) ** 2 / 50)


@pytest.mark.slow
@pytest.mark.parametrize(("h", "n"), [(1, N), (3, 300_000), (50, 40_000)])
def test_shares_sum_to_one_discrete_laplace(h, n):
    total = sum(exact.dlap_share(LARGE, h, n) for _ in range(h))
    assert chi2_pvalue(total, partial(dlap_pmf, LARGE)) > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("h", [3, 50])
def test_one_share_has_negative_binomial_moments(h):
    a = np.exp(-float(LARGE))
    nb = exact.negative_binomial(Fraction(1, h), LARGE, N)
    assert_moments(nb, a / (1 - a) / h, a / (1 - a) ** 2 / h)
    assert_moments(exact.dlap_share(LARGE, h, N), 0.0, 2 * a / (1 - a) ** 2 / h)


def count_settles(monkeypatch) -> list[int]:
    """Spy on the exact slow path: the returned list grows by one per settled draw."""
    calls, real = [], exact._settle
    monkeypatch.setattr(exact, "_settle", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.slow
def test_forced_slow_path_keeps_every_law(monkeypatch):
    """With 4-bit first comparisons and a 25 % float margin most draws are settled exactly,
    reading further 64-bit words; the laws are unchanged."""
    monkeypatch.setattr(exact, "FAST_BITS", 4)
    monkeypatch.setattr(exact, "FLOAT_MARGIN", 0.25)
    calls = count_settles(monkeypatch)
    n = 30_000
    lam, rho, sigma2 = Fraction(1, 3), Fraction(1, 3), Fraction(9)
    assert chi2_pvalue(exact.discrete_laplace(lam, n), partial(dlap_pmf, lam)) > 1e-4
    assert len(calls) > n // 4
    assert chi2_pvalue(exact.discrete_gaussian(sigma2, n), partial(dgauss_pmf, sigma2)) > 1e-4
    assert chi2_pvalue(exact.negative_binomial(rho, lam, n), partial(nb_pmf, rho, lam)) > 1e-4
    assert len(calls) > 2 * n


def test_unbounded_inversion_grows_its_list():
    """Inverting the Poisson CDF from a one-entry list: nearly every draw asks for a longer list
    in the slow path, and the counts are still Poisson(μ)."""
    rho, lam = Fraction(1, 2), Fraction(1, 50)
    mlo, mhi = exact._mu(rho, lam, 64)
    assert mhi - mlo < Fraction(1, 2**80)
    counts = exact._invert(20_000, partial(exact._cdf_poisson, rho, lam), 0, bounded=False)
    assert chi2_pvalue(counts, stats.poisson(float(mlo)).pmf) > 1e-4


@pytest.mark.parametrize("t", [Fraction(0), Fraction(1, 10**6), Fraction(10, 7), Fraction(33, 2),
                               Fraction(10**5, 3), Fraction(1, 3) * 2**20])
@pytest.mark.parametrize("prec", [4, 64, 200])
def test_exp_enclosure_holds_and_is_tight(t, prec):
    with decimal.localcontext() as ctx:
        ctx.prec = 200
        ref = (-decimal.Decimal(t.numerator) / decimal.Decimal(t.denominator)).exp() * 2**prec
    lo, hi = exact._exp_neg(t, prec)
    assert lo <= ref <= hi and hi - lo <= 4


def test_cdf_enclosures_are_ordered_and_reach_one():
    lam, rho = Fraction(1, 50), Fraction(1, 3)
    for prec in (32, 96):
        for lo, hi in (exact._cdf_block(lam, prec, 0), exact._cdf_poisson(rho, lam, prec, 80)):
            assert list(lo) == sorted(lo) and list(hi) == sorted(hi)
            assert all(a <= b <= 2**prec for a, b in zip(lo, hi, strict=True))
            assert lo[-1] > 2**prec - 2**(prec - 20)


class FakeBits:
    """A deterministic stand-in for ``random_words``: SHAKE-256 of a seed and a counter."""

    def __init__(self, seed: int):
        self.seed, self.counter = seed, 0

    def __call__(self, count: int) -> np.ndarray:
        self.counter += 1
        data = hashlib.shake_256(f"{self.seed}/{self.counter}".encode()).digest(8 * count)
        return np.frombuffer(data, dtype=np.uint64)


def draw_all() -> list[np.ndarray]:
    lam = Fraction(1, 20)
    return [exact.geometric(lam, 500), exact.discrete_laplace(lam, 500),
            exact.discrete_gaussian(Fraction(50), 500), exact.negative_binomial(Fraction(2, 3), lam, 500),
            exact.dlap_share(lam, 7, 500)]


def test_outputs_are_a_function_of_random_words_only(monkeypatch):
    outputs = []
    for seed in (1, 1, 2):
        monkeypatch.setattr(exact, "random_words", FakeBits(seed))
        outputs.append(draw_all())
    assert all(np.array_equal(a, b) for a, b in zip(outputs[0], outputs[1], strict=True))
    assert not any(np.array_equal(a, b) for a, b in zip(outputs[0], outputs[2], strict=True))


def test_no_other_generator_is_used(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("a sampler used a non-OS random generator")

    for name in ("default_rng", "Generator", "RandomState", "PCG64", "random", "random_sample", "rand",
                 "randn", "randint", "integers", "uniform", "normal", "geometric", "negative_binomial",
                 "laplace", "poisson", "choice", "bytes", "seed"):
        monkeypatch.setattr(np.random, name, boom, raising=False)
    for name in ("random", "getrandbits", "randrange", "randint", "choice", "seed"):
        monkeypatch.setattr(random, name, boom)
    out = draw_all()
    assert all(o.dtype == np.int64 and o.shape == (500,) for o in out)


@pytest.mark.parametrize("call", [
    lambda: exact.geometric(0, 3), lambda: exact.geometric(Fraction(-1, 2), 3),
    lambda: exact.discrete_laplace(float("nan"), 3), lambda: exact.discrete_laplace(1, -1),
    lambda: exact.discrete_laplace(float("inf"), 3), lambda: exact.discrete_gaussian(0, 3),
    lambda: exact.discrete_gaussian(Fraction(-4), 3), lambda: exact.negative_binomial(0, 1, 3),
    lambda: exact.negative_binomial(Fraction(1, 2), 0, 3), lambda: exact.dlap_share(1, 0, 3),
    lambda: exact.dlap_share(1, 2, -5), lambda: exact.dlap_share(-1, 2, 5),
])
def test_invalid_parameters_raise(call):
    with pytest.raises(ValueError):
        call()


def test_empty_and_float_parameters():
    assert exact.discrete_laplace(0.5, 0).shape == (0,)
    assert exact.dlap_share(Fraction(1.0) / Fraction(0.25), 4, 0).shape == (0,)
    assert exact.negative_binomial(Fraction(1, 4), 0.1, 5).shape == (5,)


def test_benchmark_runs_at_a_tiny_size(tmp_path):
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_samplers.py"
    res = subprocess.run([sys.executable, str(script), "--runs", "1", "--size", "50"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert any(line.startswith("| discrete_laplace") for line in res.stdout.splitlines()), res.stdout
