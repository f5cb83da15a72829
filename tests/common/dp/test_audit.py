"""An empirical audit of ε for every release path (MECHANISMS §1.9 item 7, §1.10, §4.2).

For each path (``complex`` and ``quantized`` × replace-one and add/remove × δ = 0 and δ > 0, and
h_min secure-aggregation shares) two worst-case neighbouring datasets D, D′ are sketched by the
real sketching code in a tiny setting (d = 1, m = 1, r = 1, Ω = 1, ξ = 0): a record at phase π/4
against one at 5π/4 (replace-one), or that record against none (add/remove). Their releases are
drawn in bulk with the noise terms ``privatize`` uses (checked here to be the ones it adds, draw
for draw), and a threshold test E on the releases gives a Clopper–Pearson lower bound on ε:

    ε̂ = ln((p_lo(E | D) − δ) / p_hi(E | D′)),

which may exceed the claimed ε only with probability α (here 10⁻⁶ over all thresholds). For the
discrete Laplace the likelihood-ratio-optimal event is known: every coordinate lies beyond its
value under D, away from D′, where the loss equals ε exactly. For the discrete Gaussian the test
thresholds the projection on the shift direction over a grid of 17 thresholds (Bonferroni).
The same audit with a noise scale divided by √2 must report more than the claimed ε: the test
has the power to catch a wrong constant.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from conftest import seeded_words
from scipy.stats import beta

from fedsketch.common.dp import exact
from fedsketch.common.dp.calibration import l1_sensitivity
from fedsketch.common.dp.plan import noise_plan
from fedsketch.common.dp.samplers import dlap_noise_share, draw
from fedsketch.common.sketch.privacy import PrivacySpec, privatize
from fedsketch.common.sketch.sketching import FeatureSum, feature_sum
from fedsketch.common.study.validated import bounded_noise_share
from fedsketch.server.sim.config import SimConfig
from fedsketch.server.sim.simulate import _study_spec

ALPHA = 1e-6
EPSILON = 1.0
#: δ of the Gaussian paths: large enough that the δ-region is measurable with 4·10⁵ draws.
DELTA = 0.01
#: Draws per dataset. Enough for the power the √2 tests show, measured over three audits each:
#: the discrete Laplace paths at a scale ÷ √2 give ε̂ = 1.27–1.31 (replace-one, add/remove) and
#: the h_min shares 1.29–1.32 at 5·10⁴ (1.35 at 2·10⁵); the Gaussian ones 1.15–1.17 (complex,
#: replace-one) and 1.09–1.11 (quantized, add/remove) at 4·10⁵ (1.21, 1.14 at 8·10⁵), each ≥ 12
#: of its standard deviations above ε = 1; at ε itself 0.86–0.93 and 0.69–0.71.
DRAWS = {"discrete_laplace": 50_000, "discrete_gaussian": 400_000}
PATHS = [(f, nb, d) for f in ("complex", "quantized") for nb in ("replace_one", "add_remove")
         for d in (0.0, DELTA)]


class _Phases:
    """Ω = 1 (1×1), ξ = 0: a record x has phase x."""

    omega = np.ones((1, 1))
    xi = np.zeros(1)


def _sum(records: list[float], feature: str) -> FeatureSum:
    return feature_sum([np.array(records, dtype=np.float32)[:, None]], _Phases(), feature, 1)


def _neighbours(feature: str, relation: str) -> tuple[FeatureSum, FeatureSum]:
    """Worst-case D, D′: a record at π/4 (q = (724, 724) or (1, 1)) against one at 5π/4 or none."""
    base = [2.0]
    d = _sum(base + [math.pi / 4], feature)
    other = base + [5 * math.pi / 4] if relation == "replace_one" else base
    return d, _sum(other, feature)


def _releases(fs: FeatureSum, privacy: PrivacySpec, size: int, shrink: float) -> np.ndarray:
    """``size`` releases (rows: re, im[, count]) with ``privatize``'s terms, scales ÷ ``shrink``."""
    terms = noise_plan(fs.feature, fs.m, fs.r, privacy)
    if shrink != 1.0:
        terms = tuple(replace(t, epsilon=t.epsilon * shrink) if t.law == "discrete_laplace"
                      else replace(t, scale=t.scale / shrink) for t in terms)
    clean = np.array([fs.re[0], fs.im[0]])
    rows = clean[:, None] + draw(terms[0], 2 * size).reshape(2, size)
    if privacy.neighbouring == "add_remove":
        rows = np.vstack([rows, fs.n + draw(terms[1], size)])
    return rows


def _bound(hits: int, misses_prime: int, size: int, size_prime: int, delta: float,
           tests: int) -> float:
    """ln((p_lo − δ)/p′_hi) with two-sided Clopper–Pearson limits at level ALPHA/tests."""
    a = ALPHA / (2 * tests)
    p_lo = beta.ppf(a, hits, size - hits + 1) if hits else 0.0
    p_hi = beta.ppf(1 - a, misses_prime + 1, size_prime - misses_prime)
    return -math.inf if p_lo <= delta else math.log((p_lo - delta) / p_hi)


def _audit_laplace(x: np.ndarray, y: np.ndarray, mu: np.ndarray, mu_prime: np.ndarray) -> float:
    """E = every shifted coordinate at or beyond its D value, away from D′."""
    sign = np.sign(mu - mu_prime)[:, None]
    def event(rows: np.ndarray) -> int:
        return int(np.all(sign * (rows - mu[:, None]) >= 0, axis=0).sum())
    return _bound(event(x), event(y), x.shape[1], y.shape[1], 0.0, 1)


def _audit_gaussian(x: np.ndarray, y: np.ndarray, mu: np.ndarray, mu_prime: np.ndarray,
                    sigma: float, delta: float) -> float:
    """Best of 17 thresholds c·σ, c = 0, 0.25, …, 4, on the projection (rows − μ′)·v/|v|."""
    v = (mu - mu_prime)[:2] / np.linalg.norm((mu - mu_prime)[:2])
    tx = v @ (x[:2] - mu_prime[:2, None])
    ty = v @ (y[:2] - mu_prime[:2, None])
    if x.shape[0] == 3:  # add/remove: the count must also lie at or above its D value
        tx = np.where(x[2] >= mu[2], tx, -np.inf)
        ty = np.where(y[2] >= mu[2], ty, -np.inf)
    grid = np.arange(0, 4.01, 0.25) * sigma
    return max(_bound(int((tx >= c).sum()), int((ty >= c).sum()), tx.size, ty.size, delta,
                      grid.size) for c in grid)


def audit(feature: str, relation: str, delta: float, shrink: float = 1.0) -> float:
    """The ε lower bound of one path (module docstring)."""
    d, d_prime = _neighbours(feature, relation)
    privacy = PrivacySpec(EPSILON, delta, relation)
    term = noise_plan(feature, 1, 1, privacy)[0]
    size = DRAWS[term.law]
    x, y = _releases(d, privacy, size, shrink), _releases(d_prime, privacy, size, shrink)
    mu = np.array([d.re[0], d.im[0], d.n][: x.shape[0]], dtype=np.float64)
    mu_prime = np.array([d_prime.re[0], d_prime.im[0], d_prime.n][: x.shape[0]], dtype=np.float64)
    if term.law == "discrete_laplace":
        return _audit_laplace(x, y, mu, mu_prime)
    return _audit_gaussian(x, y, mu, mu_prime, term.scale / shrink, delta)


def test_the_audit_datasets_are_worst_case():
    """The neighbours move the encoded sum by (nearly) its whole sensitivity."""
    for feature in ("complex", "quantized"):
        d, d_prime = _neighbours(feature, "replace_one")
        moved = abs(d.re[0] - d_prime.re[0]) + abs(d.im[0] - d_prime.im[0])
        assert moved >= l1_sensitivity(feature, 1, "replace_one") * (2896 / 2900)


def test_the_audit_draws_what_privatize_adds(monkeypatch):
    """Fed the same bits, privatize's release is the audit's first draw, for every path."""
    for feature, relation, delta in PATHS:
        d, _ = _neighbours(feature, relation)
        privacy = PrivacySpec(EPSILON, delta, relation)
        monkeypatch.setattr(exact, "random_words", seeded_words(0))
        rel = privatize(d, privacy)
        got = np.concatenate([rel.payload, [rel.n]]) if relation == "add_remove" else rel.payload
        monkeypatch.setattr(exact, "random_words", seeded_words(0))
        np.testing.assert_array_equal(got, _releases(d, privacy, 1, 1.0)[:, 0])
        assert rel.noise == noise_plan(feature, 1, 1, privacy)


@pytest.mark.parametrize(("feature", "relation", "delta"), PATHS)
def test_no_release_path_exceeds_its_epsilon(feature, relation, delta):
    assert audit(feature, relation, delta) <= EPSILON


@pytest.mark.parametrize(("feature", "relation", "delta"),
                         [("complex", "replace_one", 0.0), ("quantized", "add_remove", 0.0),
                          ("complex", "replace_one", DELTA), ("quantized", "add_remove", DELTA)])
def test_the_audit_catches_a_scale_divided_by_sqrt2(feature, relation, delta):
    assert audit(feature, relation, delta, shrink=math.sqrt(2)) > EPSILON


def _secure_releases(clean: np.ndarray, h_min: int, size: int, shrink: float) -> np.ndarray:
    """S + Σ of h_min devices' shares, the shares sized for the study's total term."""
    term = noise_plan("quantized", 1, 1, PrivacySpec(EPSILON))[0]
    total = sum(dlap_noise_share(term.epsilon * shrink, term.sensitivity, h_min, 2 * size)
                for _ in range(h_min))
    return clean[:, None] + total.reshape(2, size)


def _validated_releases(clean: np.ndarray, h_min: int, size: int, shrink: float) -> np.ndarray:
    """S + Σ of h_min devices' shares as a study validated by a helper draws them
    (:func:`~fedsketch.common.study.validated.bounded_noise_share`: redrawn until within the
    per-entry and L1 radii), for a secure study of ε·``shrink`` (quantized, r = 1, L = h_min)
    with m = ``size`` frequencies: its (Re_j, Im_j) pairs are the audit's ``size`` draws of one
    frequency (the L1 radius conditions the whole vector, at 2^−40: no draw here is redrawn)."""
    spec = _study_spec(SimConfig(devices=h_min, records=1000 * h_min, m=size, feature="quantized",
                                 r=1, epsilon=EPSILON * shrink, secure_aggregation=True))
    assert spec.assumptions.min_honest == h_min
    total = sum(bounded_noise_share(spec) for _ in range(h_min))
    return clean[:, None] + total.reshape(2, size)


@pytest.mark.parametrize("shares", ["secagg", "validated"])
@pytest.mark.parametrize("shrink", [1.0, math.sqrt(2)])
def test_secure_aggregation_shares_audit(shrink, shares):
    """h_min = 5 shares of NB(1/5) − NB(1/5) carry exactly the study's ε (and √2 is caught);
    so do the bounded shares of a validated study, drawn by the product's own function."""
    d, d_prime = _neighbours("quantized", "replace_one")
    mu = np.array([d.re[0], d.im[0]], dtype=np.float64)
    mu_prime = np.array([d_prime.re[0], d_prime.im[0]], dtype=np.float64)
    size = DRAWS["discrete_laplace"]
    releases = _secure_releases if shares == "secagg" else _validated_releases
    bound = _audit_laplace(releases(mu, 5, size, shrink), releases(mu_prime, 5, size, shrink),
                           mu, mu_prime)
    assert (bound <= EPSILON) if shrink == 1.0 else (bound > EPSILON)


def test_neighbouring_datasets_produce_the_same_releases():
    """Mironov's attack on float noise finds releases that only one of two neighbours can produce.
    Exhaustively, in a tiny setting (``quantized``, m = r = 1, ε = 2, so a release has about a
    thousand likely values): every release that either neighbour produces with probability
    ≥ 10⁻³ is also observed from the other (probability ≥ e^{−2}·10⁻³, 27 expected sightings in
    2·10⁵ draws), and the two lattices of releases coincide."""
    d, d_prime = _neighbours("quantized", "replace_one")
    privacy = PrivacySpec(2.0)
    x, y = _releases(d, privacy, 200_000, 1.0), _releases(d_prime, privacy, 200_000, 1.0)
    values_x, counts_x = np.unique(x.T, axis=0, return_counts=True)
    values_y, counts_y = np.unique(y.T, axis=0, return_counts=True)
    likely_x = {tuple(v) for v, c in zip(values_x, counts_x, strict=True) if c >= 200}
    likely_y = {tuple(v) for v, c in zip(values_y, counts_y, strict=True) if c >= 200}
    seen_x, seen_y = {tuple(v) for v in values_x}, {tuple(v) for v in values_y}
    assert len(likely_x) > 100 and len(likely_y) > 100
    assert likely_x <= seen_y and likely_y <= seen_x
