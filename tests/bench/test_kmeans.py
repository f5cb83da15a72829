"""The k-means family of ``fedsketch compare``: budget splits and traces against their formulas,
noise scales measured over many draws, empty clusters, clipping, colored-noise constraints, and
utility against the non-private reference on paper 004's Gaussian mixtures."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest
from conftest import seeded_words

from fedsketch.common.data.synthetic import gmm
from fedsketch.common.dp import exact, grid
from fedsketch.common.dp import lloyd as common_lloyd
from fedsketch.common.dp.calibration import dgauss_sigma, gamma_mahalanobis, laplace_scale
from fedsketch.common.dp.samplers import dlap_noise
from fedsketch.server.bench import kmeans as kp
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, sse_per_n
from fedsketch.server.bench.task import Task

#: Seeded outcomes here depend on floating-point summation order (BLAS kernels): tests/test_blas_kernels.py
#: re-runs this module under each OpenBLAS kernel the CPU offers.
pytestmark = pytest.mark.blas


RELATIONS = ("add_remove", "replace_one")
FACTOR = {"add_remove": 1, "replace_one": 2}
PRIVATE = ("dplloyd", "dplloyd-su", "dplloyd-su-overseed", "white", "colored")


def _box_task(x: np.ndarray, k: int, epsilon: float, half: float | np.ndarray, seed: int = 0,
              **kw) -> Task:
    d = x.shape[1]
    h = np.broadcast_to(np.asarray(half, dtype=np.float64), (d,))
    return Task(x, k, epsilon, lo=-h.copy(), hi=h.copy(), rng=np.random.default_rng(seed), **kw)


def _blobs(n: int, d: int, k: int, seed: int = 0) -> np.ndarray:
    """k tight blobs well inside [−5, 5]^d."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-3.0, 3.0, (k, d))
    return centres[rng.integers(0, k, n)] + 0.3 * rng.standard_normal((n, d))


# --- budget splits and traces -----------------------------------------------------------------


def test_classical_split_sums_to_eps_t_with_one_shared_scale():
    h = np.array([0.5, 2.0, 7.0])
    eps_count, eps_dims = kp.classical_split(0.3, h)
    assert math.isclose(eps_count + eps_dims.sum(), 0.3, rel_tol=1e-12)
    shared = (1.0 + h.sum()) / 0.3  # §5.2: b = (1 + Σh)/ε_t on every count and sum coordinate
    assert math.isclose(1.0 / eps_count, shared, rel_tol=1e-12)
    np.testing.assert_allclose(h / eps_dims, shared, rtol=1e-12)


@pytest.mark.parametrize("d", [2, 5, 10, 100])
def test_su_split_gives_the_count_the_cube_root_factor(d):
    eps_count, eps_dim = kp.su_split(0.7, d)
    c_rho = (4 * d * 0.225**2) ** (1 / 3)
    assert math.isclose(eps_count + d * eps_dim, 0.7, rel_tol=1e-12)
    assert math.isclose(eps_count / eps_dim, c_rho, rel_tol=1e-12)
    # diffprivlib's inverted split (§6.3) would give the per-coordinate share c_ρ·ε_t/(d + c_ρ)
    assert not math.isclose(eps_dim, c_rho * 0.7 / (d + c_rho), rel_tol=1e-3)


@pytest.mark.parametrize("relation", RELATIONS)
def test_dplloyd_budget_spends_eps_over_t_per_iteration(relation):
    h = np.array([1.0, 3.0])
    trace = kp.dplloyd_budget(2.0, relation, h, 4)
    assert len(trace.iterations) == 4 and trace.count_epsilon == 0.0
    for it in trace.iterations:
        assert math.isclose(it.epsilon, 0.5, rel_tol=1e-12)
        # each share is an add/remove ε: under replace-one the iteration is calibrated to ε_t/2
        assert math.isclose(it.eps_count + sum(it.eps_dims), 0.5 / FACTOR[relation], rel_tol=1e-12)
    assert math.isclose(trace.total, 2.0, rel_tol=1e-12)


@pytest.mark.parametrize(("relation", "n", "expected_t"), [
    ("add_remove", 100_000, 3), ("replace_one", 100_000, 2), ("add_remove", 10**7, 7),
    ("replace_one", 10**7, 7), ("replace_one", 100, 2)])
def test_su_budget_iteration_rule_and_totals(relation, n, expected_t):
    # k = d = 10: ε_m = sqrt(500·k³(d + c_ρ)³)/n = 0.26736 at n = 1e5; the iterations get
    # 0.95ε (add/remove, 5 % buys the noisy n) or ε, and the rule sees that over the factor
    trace = kp.su_budget(1.0, relation, n, 10, 10)
    assert len(trace.iterations) == expected_t
    count_eps = 0.05 if relation == "add_remove" else 0.0
    assert trace.count_epsilon == count_eps
    for it in trace.iterations:
        assert math.isclose(it.epsilon, (1.0 - count_eps) / expected_t, rel_tol=1e-12)
        assert math.isclose(it.eps_count / it.eps_dims[0], (40 * 0.225**2) ** (1 / 3), rel_tol=1e-12)
    assert math.isclose(trace.total, 1.0, rel_tol=1e-12)


@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize("method", ["dplloyd", "dplloyd-su", "dplloyd-su-overseed"])
def test_runs_spend_what_their_trace_says(monkeypatch, relation, method):
    """The noise actually drawn in a run uses the trace's shares, and the trace sums to ε."""
    calls = []
    original = common_lloyd.noisy_cluster_stats

    def spy(x, c, h, eps_count, eps_dims):
        calls.append(eps_count + float(np.sum(eps_dims)))
        return original(x, c, h, eps_count, eps_dims)

    monkeypatch.setattr(common_lloyd, "noisy_cluster_stats", spy)
    x = _blobs(2000, 3, 3)
    out = kp.METHODS[method](_box_task(x, 3, 0.8, 5.0, neighbouring=relation))
    trace = json.loads(out.notes)["budget_trace"]
    assert (out.epsilon, out.delta, out.kind, out.neighbouring) == (0.8, 0.0, "pure", relation)
    assert math.isclose(trace["total"], 0.8, rel_tol=1e-12)
    assert len(calls) == len(trace["iterations"])
    per_iteration = (0.8 - trace["count_epsilon"]) / len(calls)
    np.testing.assert_allclose(calls, per_iteration / FACTOR[relation], rtol=1e-12)


def test_su_noisy_count_only_under_add_remove():
    x = _blobs(3000, 2, 3)
    exact = json.loads(kp.dplloyd_su(_box_task(x, 3, 1.0, 5.0)).notes)
    assert exact["n_public"] == 3000.0
    # n + DLap(scale 20): one draw is exactly 0 with probability (1 − a)/(1 + a) ≈ 2.5 %
    # (a = e^{−1/20}), so four draws are all 0 with probability 4·10⁻⁷
    noisy = [json.loads(kp.dplloyd_su(_box_task(x, 3, 1.0, 5.0, neighbouring="add_remove"))
                        .notes)["n_public"] for _ in range(4)]
    assert any(n != 3000.0 for n in noisy)
    assert all(abs(n - 3000.0) < 20.0 * 25 for n in noisy)


@pytest.mark.parametrize("method", PRIVATE)
def test_every_privacy_draw_reads_the_exact_samplers_bits(method, small_gmm, monkeypatch):
    """Every noise draw of every mechanism of the family comes from the exact samplers' OS bits
    (``exact.random_words``): replaying the same words with the same Task seed gives the same
    output bit for bit, and fresh OS words give another one. A float generator anywhere in the
    release would break the first; no noise at all would break the second."""
    def run(words) -> np.ndarray:
        if words is not None:
            monkeypatch.setattr(exact, "random_words", words)
        return kp.METHODS[method](_box_task(small_gmm, 3, 1.0, 9.0, neighbouring="add_remove")).output

    np.testing.assert_array_equal(run(seeded_words(5)), run(seeded_words(5)))
    monkeypatch.undo()
    assert not np.array_equal(run(None), run(None))


# --- noise scales -------------------------------------------------------------------------------


def _exact_stats(x: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    labels = ((x[:, None, :] - c[None, :, :]) ** 2).sum(axis=2).argmin(axis=1)
    counts = np.bincount(labels, minlength=c.shape[0]).astype(float)
    sums = np.array([x[labels == j].sum(axis=0) for j in range(c.shape[0])])
    return counts, sums


def _measured_scales(it: kp.IterationBudget, h: np.ndarray, draws: int) -> tuple[float, np.ndarray]:
    """Mean |noise| (= the Laplace scale b) of the count and of each sum coordinate, over
    ``draws`` releases of 40 clusters (most of them empty) on fixed data."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-h, h, (150, h.size))
    c = rng.uniform(-h, h, (40, h.size))
    counts, sums = _exact_stats(x, c)
    dc, ds = [], []
    for _ in range(draws):
        nc, ns = common_lloyd.noisy_cluster_stats(x, c, h, it.eps_count, np.array(it.eps_dims))
        dc.append(nc - counts)
        ds.append(ns * grid.step(h) - sums)  # sums are released in steps of h/2^20
    return float(np.abs(dc).mean()), np.abs(np.array(ds)).mean(axis=(0, 1))


@pytest.mark.parametrize("relation", RELATIONS)
def test_dplloyd_laplace_scale_matches_formula(relation):
    h = np.array([1.0, 2.0, 5.0])
    it = kp.dplloyd_budget(1.0, relation, h, 5).iterations[0]
    b_count, b_dims = _measured_scales(it, h, 600)
    expected = FACTOR[relation] * 5 * (1.0 + h.sum()) / 1.0  # §5.2: (d·h + 1)·T/ε, doubled
    assert b_count == pytest.approx(expected, rel=0.03)
    np.testing.assert_allclose(b_dims, expected, rtol=0.03)


@pytest.mark.parametrize("relation", RELATIONS)
def test_su_laplace_scales_match_formula(relation):
    h = np.array([1.0, 2.0, 5.0])
    trace = kp.su_budget(2.0, relation, 10**6, 4, 3)
    t = len(trace.iterations)
    eps_iter = 2.0 * (0.95 if relation == "add_remove" else 1.0)
    c_rho = (12 * 0.225**2) ** (1 / 3)
    b_count, b_dims = _measured_scales(trace.iterations[0], h, 600)
    f = FACTOR[relation]
    assert b_count == pytest.approx(f * t * (3 + c_rho) / (c_rho * eps_iter), rel=0.03)
    np.testing.assert_allclose(b_dims, f * t * h * (3 + c_rho) / eps_iter, rtol=0.03)


def _local_rows(x, labels, c, lo, hi, relation):
    """Every local difference of the fixed-assignment model, recomputed here from §7.1 and the
    module's stated relation rules (removal rows, box-corner addition rows)."""
    corners = np.array(list(itertools.product(*zip(lo, hi, strict=True))))
    rows = []
    for j in range(c.shape[0]):
        xj = x[labels == j]
        n_j = xj.shape[0]
        add = n_j + 1 if relation == "add_remove" else n_j
        rows.append(np.vstack([(xj - c[j]) / (n_j - 1), (corners - c[j]) / add]))
    return rows


@pytest.fixture(scope="module")
def small_gmm() -> np.ndarray:
    return gmm(600, 3, 3, 2.5, 7)[0].astype(np.float64)


@pytest.mark.parametrize("relation", RELATIONS)
def test_white_sigma_matches_formula_and_draws(small_gmm, relation):
    task = _box_task(small_gmm, 3, 1.0, 9.0, delta=1e-5, neighbouring=relation)
    plan = kp.white_plan(task)
    cl = plan.clusters
    rows = _local_rows(cl.x, cl.labels, cl.centroids, cl.lo, cl.hi, relation)
    delta2 = max(np.linalg.norm(r, axis=1).max() for r in rows)
    sigma = dgauss_sigma(FACTOR[relation] * delta2, 1.0, 1e-5)  # the discrete Gaussian's σ
    assert plan.notes["non_private"]["sigma"] == pytest.approx(sigma, rel=1e-9)
    noise = np.array([kp.gaussian_release(task, plan).output - cl.centroids for _ in range(3000)])
    assert noise.std() == pytest.approx(sigma, rel=0.03)
    out = kp.white_gaussian(dataclasses.replace(task, rng=np.random.default_rng(0)))
    assert (out.kind, out.epsilon, out.delta) == ("local-sensitivity", 1.0, 1e-5)
    assert 0 < np.abs(out.output - cl.centroids).max() < 10 * sigma


def test_colored_draws_have_the_planned_covariance(small_gmm):
    """S_j^{-1/2}·w_j ~ N(0, I) for every block: per-block mean of w_jᵀS_j⁻¹w_j = d, and the
    pooled covariance of the whitened draws is I."""
    task = _box_task(small_gmm, 3, 1.0, 9.0)
    plan = kp.colored_plan(task)
    noise = np.array([kp.gaussian_release(task, plan).output - plan.clusters.centroids
                      for _ in range(8000)])
    whitened = []
    for j, cov in enumerate(plan.covariances):
        w, u = np.linalg.eigh(cov)
        z = noise[:, j, :] @ (u / np.sqrt(w)) @ u.T
        assert (z * z).sum(axis=1).mean() == pytest.approx(3.0, rel=0.05)
        whitened.append(z)
    np.testing.assert_allclose(np.cov(np.vstack(whitened).T), np.eye(3), atol=0.04)


# --- empty clusters, clipping, refusals -------------------------------------------------------


def test_noisy_stats_noise_empty_clusters():
    """An empty cluster is released like any other: its count is DLap(e^{−ε_count}) noise (zero
    with probability (1 − a)/(1 + a)) and its sums are noise of Laplace scale h/ε_dim in data units
    (standard deviation √2·40 here)."""
    x = np.zeros((50, 2))
    c = np.array([[0.0, 0.0], [9.0, 9.0]])  # the second cluster is empty
    h, eps_dims = np.array([10.0, 10.0]), np.array([0.25, 0.25])
    draws = [common_lloyd.noisy_cluster_stats(x, c, h, 0.5, eps_dims) for _ in range(1000)]
    counts = np.array([d[0][1] for d in draws])
    sums = np.array([d[1][1] for d in draws]) * grid.step(h)
    a = math.exp(-0.5)
    p0 = (1 - a) / (1 + a)
    assert abs(np.mean(counts == 0) - p0) < 4 * math.sqrt(p0 * (1 - p0) / 1000)
    assert sums.std() == pytest.approx(math.sqrt(2) * 40.0, rel=0.15)


@pytest.mark.parametrize("method", ["dplloyd", "dplloyd-su"])
def test_empty_cluster_centroid_moves(method):
    """All records sit at one point by a corner: the cluster of the far initial centroid is
    empty, yet its centroid is re-drawn every run (diffprivlib would keep the old one). A large ε
    keeps the noisy sums small enough that the centroid is not clipped onto a box corner."""
    x = np.full((200, 2), -9.5)
    runs = [kp.METHODS[method](_box_task(x, 2, 1e3, 10.0, seed=4)) for _ in range(2)]
    rng = np.random.default_rng(4)
    h = np.array([10.0, 10.0])
    init = kp.uniform_init(2, h, rng) if method == "dplloyd" else kp.sphere_packing_init(2, 2, rng)[0] * h
    far = int(np.linalg.norm(init - x[0], axis=1).argmax())
    assert not np.allclose(runs[0].output[far], init[far])
    assert not np.array_equal(runs[0].output[far], runs[1].output[far])


@pytest.mark.parametrize("method", PRIVATE)
def test_clipping_is_counted_and_strict_refuses(method, small_gmm):
    x = small_gmm.copy()
    x[:3, 0] = 50.0
    out = kp.METHODS[method](_box_task(x, 3, 1.0, 9.0))
    assert out.clipped == 3
    assert np.all(np.abs(out.output[:, 0]) <= 9.0) or out.kind == "local-sensitivity"
    with pytest.raises(ValueError, match="outside the public box"):
        kp.METHODS[method](_box_task(x, 3, 1.0, 9.0, strict=True))


@pytest.mark.parametrize("method", PRIVATE)
def test_refusals(method, small_gmm):
    with pytest.raises(ValueError, match="public box"):
        kp.METHODS[method](Task(small_gmm, 3, 1.0))
    with pytest.raises(ValueError, match="'kmeans' reference"):
        kp.METHODS[method](_box_task(small_gmm, 3, math.inf, 9.0))
    with pytest.raises(ValueError, match="shape"):
        kp.METHODS[method](Task(small_gmm, 3, 1.0, lo=np.zeros(2), hi=np.ones(2)))


def test_mechanism_specific_refusals():
    x = np.random.default_rng(0).normal(size=(100, 13))
    with pytest.raises(ValueError, match="2\\^d box corners"):
        kp.colored_gaussian(_box_task(x, 2, 1.0, 9.0))
    with pytest.raises(ValueError, match="iterations"):
        kp.dplloyd(_box_task(x, 2, 1.0, 9.0), iterations=0)
    messages = []
    for size in (1, 0):  # a cluster of one record, and one left empty by the k-means
        lonely = np.vstack([np.zeros((20, 2)), np.full((size, 2), 8.0)]) if size else np.zeros((20, 2))
        with pytest.raises(ValueError, match=">= 2 records") as refused:
            kp.white_gaussian(_box_task(lonely, 2, 1.0, 9.0))
        messages.append(str(refused.value))
    assert messages[0] == messages[1]  # the size is a statistic of the records: never said


# --- colored noise ------------------------------------------------------------------------------


@pytest.mark.parametrize("relation", RELATIONS)
def test_colored_constraints_hold_and_beat_white(small_gmm, relation):
    task = _box_task(small_gmm, 3, 0.5, 9.0, delta=1e-5, neighbouring=relation)
    plan = kp.colored_plan(task)
    white = kp.white_plan(dataclasses.replace(task, rng=np.random.default_rng(0)))
    gamma = gamma_mahalanobis(0.5, 1e-5) / FACTOR[relation] ** 2
    assert plan.gamma == pytest.approx(gamma, rel=1e-12)
    cl = plan.clusters
    rows = _local_rows(cl.x, cl.labels, cl.centroids, cl.lo, cl.hi, relation)
    worst = max(np.einsum("ij,jk,ik->i", r, np.linalg.inv(s), r).max() for r, s in zip(rows, plan.covariances,
                                                                                       strict=True))
    assert worst <= gamma * (1 + 1e-9)
    assert worst >= gamma * (1 - 1e-9)  # rescaled so the binding constraint is tight
    colored_trace = np.trace(plan.covariances, axis1=1, axis2=2).sum()
    assert colored_trace <= np.trace(white.covariances, axis1=1, axis2=2).sum()
    assert plan.notes["non_private"]["max_duality_gap"] <= kp.COVER_TOL


def test_min_trace_cover_orthogonal_closed_form():
    """§7.5 finding 1: for an orthogonal extreme set, Σ* = (1/γ)Σ v_i v_iᵀ; interior rows are slack."""
    q, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(4, 4)))
    extreme = q * np.array([0.5, 1.0, 2.0, 3.0])[:, None]  # orthogonal rows
    interior = np.array([0.4 * extreme[0] + 0.3 * extreme[2], -0.2 * extreme[1] + 0.5 * extreme[3]])
    res = kp.min_trace_cover(np.vstack([extreme, interior]), 0.07, tol=1e-9)
    np.testing.assert_allclose(res.cov, extreme.T @ extreme / 0.07, rtol=1e-6, atol=1e-6)


# --- reference and utility ------------------------------------------------------------------------


def test_methods_table_and_reference_matches_sklearn():
    assert list(kp.METHODS) == ["kmeans", "dplloyd", "dplloyd-su", "dplloyd-su-overseed", "white", "colored"]
    x = gmm(20_000, 4, 3, 2.5, 11)[0]
    out = kp.kmeans_reference(Task(x, 4, 1.0, rng=np.random.default_rng(0)))
    assert (out.kind, out.epsilon) == ("none", math.inf)
    ours, theirs = sse_per_n([x], out.output), sse_per_n([x], sklearn_kmeans_centroids(x, 4))
    assert ours == pytest.approx(theirs, rel=1e-3)


@pytest.fixture(scope="module")
def gmm_small_k():
    x = gmm(100_000, 3, 3, 2.5, 0)[0]
    return x, sse_per_n([x], kp.kmeans_reference(Task(x, 3, math.inf, rng=np.random.default_rng(1))).output)


@pytest.mark.parametrize("relation", RELATIONS)
def test_su_at_eps_1_is_close_to_the_reference(gmm_small_k, relation):
    x, ref = gmm_small_k
    tasks = [_box_task(x, 3, 1.0, 9.0, seed=s, neighbouring=relation) for s in range(5)]
    rel = [sse_per_n([x], kp.dplloyd_su(task).output) / ref for task in tasks]
    assert np.median(rel) <= 1.2


@pytest.fixture(scope="module")
def gmm_k10():
    return gmm(100_000, 10, 10, 2.5, 0)[0]


def test_su_beats_plain_dplloyd_at_small_eps(gmm_k10):
    def median_sse(method):
        return np.median([sse_per_n([gmm_k10], kp.METHODS[method](_box_task(gmm_k10, 10, 0.1, 12.0,
                                                                               seed=s)).output)
                          for s in range(5)])

    assert median_sse("dplloyd-su") < median_sse("dplloyd")


# --- the over-seeded Su variant ---------------------------------------------------------------


def test_weighted_lloyd_equals_lloyd_on_replicated_records():
    """Integer weights w_i act as w_i copies of record i: same centres, labels and SSE."""
    rng = np.random.default_rng(5)
    x = _blobs(300, 3, 4, seed=5)
    w = rng.integers(1, 5, x.shape[0]).astype(np.float64)
    init = x[[0, 50, 100, 150]]
    c_w, labels_w, sse_w = kp.lloyd(x, init, w)
    c_r, labels_r, sse_r = kp.lloyd(np.repeat(x, w.astype(int), axis=0), init)
    np.testing.assert_allclose(c_w, c_r, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(np.repeat(labels_w, w.astype(int)), labels_r)
    assert sse_w == pytest.approx(sse_r, rel=1e-10)


def test_reduce_centroids_pools_copies_and_drops_noise_level_ones():
    """Three released copies of each of 4 centres, plus two noise-level centroids at box corners
    (counts below 3 count-noise scales): the reduction drops those two and returns the mean of
    each group of copies weighted by N~ − 3b."""
    rng = np.random.default_rng(2)
    truth = np.array([[-4.0, 0, 0], [4, 0, 0], [0, 4, 0], [0, -4, 3]])
    copies = np.repeat(truth, 3, axis=0) + 0.1 * rng.standard_normal((12, 3))
    counts = rng.uniform(500, 1500, 12)
    centroids = np.vstack([copies, [[9.0, 9, 9], [-9, -9, 9]]])
    noisy_counts = np.concatenate([counts, [40.0, 55.0]])
    centres, reliable = kp.reduce_centroids(centroids, noisy_counts, 20.0, 4, np.random.default_rng(0),
                                            np.zeros(3))
    assert reliable == 12
    pooled = np.array([(copies[3 * j:3 * j + 3] * (counts[3 * j:3 * j + 3, None] - 60.0)).sum(axis=0)
                       / (counts[3 * j:3 * j + 3] - 60.0).sum() for j in range(4)])
    order = [int(np.linalg.norm(centres - p, axis=1).argmin()) for p in pooled]
    assert sorted(order) == [0, 1, 2, 3]
    np.testing.assert_allclose(centres[order], pooled, atol=1e-9)


def test_reduce_centroids_falls_back_to_the_box_centre_when_too_few_are_reliable():
    """One reliable centroid (count 100 > 3·20): it, then the fallback, then the heaviest other."""
    centroids = np.array([[1.0, 1], [5, 5], [-5, 5], [5, -5]])
    fallback = np.array([0.5, -0.5])
    centres, reliable = kp.reduce_centroids(centroids, np.array([100.0, 30, 2, -7]), 20.0, 3,
                                            np.random.default_rng(0), fallback)
    assert reliable == 1
    np.testing.assert_array_equal(centres, [[1.0, 1], [0.5, -0.5], [5, 5]])


def test_relocate_unreliable_moves_only_noise_level_centroids_beside_reliable_ones():
    """Counts above 3b stay put; each spare lands at RELOCATE_STEP × (its anchor's distance to
    the nearest reliable neighbour) from one reliable centroid, inside the box."""
    h = np.full(3, 10.0)
    centroids = np.array([[-4.0, 0, 0], [4, 0, 0], [0, 6, 0], [9, 9, 9], [-9, 9, -9], [0, 0, 9]])
    counts = np.array([5000.0, 3000, 2000, 50, -20, 59])
    moved, how_many = kp.relocate_unreliable(centroids, counts, 20.0, 3, h, np.random.default_rng(3))
    assert how_many == 3
    np.testing.assert_array_equal(moved[:3], centroids[:3])
    gap = math.sqrt(52.0)  # every reliable centroid's nearest reliable neighbour is √52 away
    for spare in moved[3:]:
        dist = np.linalg.norm(centroids[:3] - spare, axis=1)
        assert np.isclose(dist, kp.RELOCATE_STEP * gap).any()
    assert np.all(np.abs(moved) <= h)
    for k in (4, 5):  # fewer than k reliable: the release cannot place k clusters, nothing moves
        untouched, none = kp.relocate_unreliable(centroids, counts, 20.0, k, h, np.random.default_rng(3))
        assert none == 0 and untouched is centroids


def test_relocate_unreliable_sends_spares_in_proportion_to_the_noisy_counts():
    """Anchors with counts 9000 and 1000 get the spares in a 9 : 1 ratio (binomial, 4 sd)."""
    centroids = np.vstack([[[-5.0, 0], [5, 0]], np.zeros((4000, 2))])
    counts = np.concatenate([[9000.0, 1000.0], np.zeros(4000)])
    moved, _ = kp.relocate_unreliable(centroids, counts, 10.0, 2, np.full(2, 50.0), np.random.default_rng(4))
    near_heavy = np.mean(moved[2:, 0] < 0)
    assert abs(near_heavy - 0.9) < 4 * math.sqrt(0.9 * 0.1 / 4000)


def test_overseed_moves_exactly_the_noise_level_centres_between_iterations(gmm_k10, monkeypatch):
    """Spy on the private release: iteration 2 starts from iteration 1's clipped centroids,
    except at the centres whose noisy count is at or below 3 noise scales, which all moved."""
    calls = []
    release = common_lloyd.noisy_cluster_stats

    def spy(x, centroids, h, eps_count, eps_dims):
        counts, sums = release(x, centroids, h, eps_count, eps_dims)
        calls.append((centroids.copy(), counts, sums, laplace_scale(1.0, eps_count), h))
        return counts, sums

    monkeypatch.setattr(common_lloyd, "noisy_cluster_stats", spy)
    notes = json.loads(kp.dplloyd_su_overseed(_box_task(gmm_k10, 10, 1.0, 12.0)).notes)
    assert len(calls) == notes["iterations"] >= 2
    _, counts, sums, b, h = calls[0]
    released = np.clip(sums * (h / 2**20) / np.maximum(counts, 1.0)[:, None], -h, h)
    spare = counts <= kp.OVERSEED_KEEP_SCALES * b
    started = calls[1][0]
    assert 10 <= (~spare).sum() and spare.sum() == notes["relocated"][0] > 0
    np.testing.assert_array_equal(started[~spare], released[~spare])
    assert np.all(np.linalg.norm(started[spare] - released[spare], axis=1) > 0)


def test_overseed_is_no_worse_than_the_box_centre_when_noise_swamps_it(gmm_k10):
    """ε = 10⁻⁴ on 10^5 records: no count clears its noise, and the box centre bounds the SSE."""
    ref_box_centre = sse_per_n([gmm_k10], np.zeros((1, 10)))
    for s in range(3):
        out = kp.dplloyd_su_overseed(_box_task(gmm_k10, 10, 1e-4, 12.0, seed=s))
        assert json.loads(out.notes)["reliable_centroids"] < 10
        assert sse_per_n([gmm_k10], out.output) <= ref_box_centre


def test_overseed_runs_su_on_five_centres_per_cluster(gmm_k10):
    notes = json.loads(kp.dplloyd_su_overseed(_box_task(gmm_k10, 10, 1.0, 12.0)).notes)
    assert notes["overseed"] == kp.OVERSEED == 5
    assert notes["iterations"] == kp.su_iterations(0.5, 100_000, 50, 10)
    assert len(notes["relocated"]) == notes["iterations"] - 1
    assert all(0 < r < 40 for r in notes["relocated"])
    assert 10 <= notes["reliable_centroids"] <= 50


def test_overseed_escapes_the_local_optima_of_su(gmm_k10):
    """k = d = 10 Gaussians at ε = 1, n = 10^5 (the noise level of paper 004's n = 10^6 at
    ε = 0.1): Lloyd from Su's data-independent start stalls (a centre straddling two clusters,
    relative SSE ≈ 1.8 here); over-seeding and reducing stays near the reference."""
    ref = sse_per_n([gmm_k10], kp.kmeans_reference(Task(gmm_k10, 10, math.inf,
                                                        rng=np.random.default_rng(1))).output)

    def median_rel(method):
        return np.median([sse_per_n([gmm_k10], kp.METHODS[method](_box_task(gmm_k10, 10, 1.0, 12.0,
                                                                              seed=s)).output) / ref
                          for s in range(5)])

    over, su = median_rel("dplloyd-su-overseed"), median_rel("dplloyd-su")
    assert over <= 1.3 and over < su


def test_converged_clusters_is_one_function_of_the_data(small_gmm):
    """f(X) depends on (clipped records, box, k) only: another rng gives the same clustering and
    is not consumed; the memo keeps its own read-only copy; the clipped count is per call."""
    x = small_gmm.copy()
    rng = np.random.default_rng(2)
    a = kp.converged_clusters(_box_task(x, 3, 1.0, 9.0, seed=1))
    state = rng.bit_generator.state
    b = kp.converged_clusters(Task(x, 3, 1.0, lo=np.full(3, -9.0), hi=np.full(3, 9.0), rng=rng))
    assert rng.bit_generator.state == state
    np.testing.assert_array_equal(b.centroids, a.centroids)
    np.testing.assert_array_equal(b.labels, a.labels)
    assert b.x is not x and not b.x.flags.writeable
    x[0] += 1.0  # the caller's later edit does not reach the memo
    assert not np.array_equal(kp.converged_clusters(_box_task(x, 3, 1.0, 9.0)).x, a.x)
    outlier = np.vstack([small_gmm, [[50.0, 0.0, 0.0]]])
    on_box = np.vstack([small_gmm, [[9.0, 0.0, 0.0]]])  # the same records once clipped
    assert kp.converged_clusters(_box_task(outlier, 3, 1.0, 9.0)).clipped == 1
    assert kp.converged_clusters(_box_task(on_box, 3, 1.0, 9.0)).clipped == 0
    c = kp.converged_clusters(_box_task(small_gmm, 3, 1.0, 8.0))
    assert np.array_equal(c.hi, np.full(small_gmm.shape[1], 8.0))
    assert kp.converged_clusters(_box_task(small_gmm, 2, 1.0, 9.0)).centroids.shape[0] == 2


def test_weighted_kmeans_plus_plus_never_picks_weightless_records():
    """Seeding draws ∝ w·D² (the first ∝ w): records of weight 0 are never chosen."""
    x = np.random.default_rng(8).normal(size=(60, 2)) * 5
    w = np.zeros(60)
    w[::3] = 1.0
    allowed = {tuple(r) for r in x[::3]}
    for seed in range(30):
        seeds = kp.kmeans_plus_plus(x, 4, np.random.default_rng(seed), w)
        assert {tuple(r) for r in seeds} <= allowed


# --- integer releases ---------------------------------------------------------------------------


def test_lloyd_release_is_exact_integer_noise_on_the_encoded_sums(monkeypatch):
    """The Lloyd step releases int64 counts and sums in steps g = h/2^20: with replayed OS words
    the noise is exactly the replayed draws DLap(ε_count) and DLap(ε_dim,l/2^20) per coordinate; a
    record on the box edge encodes to 2^20 steps; records moved towards their grid points give
    bit-identical releases (the law depends on the data only through the integers)."""
    rng = np.random.default_rng(0)
    h = np.array([2.0, 5.0])
    x = rng.uniform(-h, h, (300, 2))
    x[0] = h
    c = np.array([[-1.0, 0.0], [1.0, 0.0]])
    g = h / 2**20
    q = np.rint(x / g)
    assert q[0].tolist() == [2**20, 2**20]
    labels = (x[:, 0] > 0).astype(int)
    counts = np.bincount(labels, minlength=2)
    sums = np.array([q[labels == j].sum(axis=0) for j in range(2)])
    eps_dims = np.array([0.1, 0.2])

    def release(data):
        monkeypatch.setattr(exact, "random_words", seeded_words(2))
        return common_lloyd.noisy_cluster_stats(data, c, h, 0.3, eps_dims)

    nc, ns = release(x)
    assert nc.dtype == ns.dtype == np.int64
    monkeypatch.setattr(exact, "random_words", seeded_words(2))
    np.testing.assert_array_equal(nc - counts, dlap_noise(0.3, 1.0, 2))
    for col in range(2):
        np.testing.assert_array_equal(ns[:, col] - sums[:, col], dlap_noise(eps_dims[col], 2.0**20, 2))
    near = x + 0.5 * (q * g - x)  # halfway to each value's grid point: other floats, same integers
    assert not np.array_equal(near, x)
    assert np.array_equal(np.rint(near / g), q)
    near_nc, near_ns = release(near)
    np.testing.assert_array_equal(near_nc, nc)
    np.testing.assert_array_equal(near_ns, ns)


@pytest.mark.parametrize("plan", [kp.white_plan, kp.colored_plan])
def test_gaussian_centroids_are_an_integer_release_in_whitened_steps(small_gmm, plan):
    """Each released centroid is U_j·Λ_j^{1/2}·g·Y_j with Y_j integer (whitened steps of
    g = f·√γ/2^20) and discrete Gaussian noise of σ_Z steps, which the whitened sensitivity in
    steps (2^20 + √d, times the float margin) sets; the noise factor g·σ_Z is 1 + O(√d/2^20)."""
    task = _box_task(small_gmm, 3, 1.0, 9.0, delta=1e-5, neighbouring="replace_one")
    p = plan(task)
    out = kp.gaussian_release(task, p)
    notes = json.loads(out.notes)
    g, sigma_z = notes["grid_step"], notes["sigma_steps"]
    assert g == pytest.approx(2 * math.sqrt(p.gamma) / 2**20, rel=1e-15)
    assert sigma_z == pytest.approx(dgauss_sigma((2**20 + math.sqrt(3)) * (1 + 2.0**-20), 1.0, 1e-5),
                                    rel=1e-12)
    assert 1.0 < notes["noise_factor"] < 1.0 + 1e-5
    w, u = np.linalg.eigh(p.covariances)
    y = np.einsum("kji,kj->ki", u, out.output) / np.sqrt(w) / g  # the box is centred on 0 here
    np.testing.assert_allclose(y, np.rint(y), atol=1e-3)
    # outside "non_private", the notes hold public calibration only: the same for other records
    public = {key: value for key, value in notes.items() if key != "non_private"}
    assert set(public) <= {"gamma", "grid_step", "sigma_steps", "noise_factor"}
    other = _box_task(small_gmm * 0.9 + 0.1, 3, 1.0, 9.0, delta=1e-5, neighbouring="replace_one")
    other_notes = json.loads(kp.gaussian_release(other, plan(other)).notes)
    assert {key: value for key, value in other_notes.items() if key != "non_private"} == public
    assert other_notes["non_private"] != notes["non_private"]


@pytest.mark.parametrize("method", ["white", "colored"])
def test_gaussian_release_of_data_far_from_the_origin(method):
    """Data at 10^7 in a box of width 8 around it: the whitened centroids are measured from the
    box centre, so they stay on the grid's range, and the release lies around the centroids."""
    x = gmm(3000, 3, 2, 2.5, 5)[0].astype(np.float64) / 4.0 + 1e7
    task = Task(x, 3, 1.0, delta=1e-5, lo=np.full(2, 1e7 - 4), hi=np.full(2, 1e7 + 4),
                rng=np.random.default_rng(0))
    out = kp.METHODS[method](task)
    centroids = kp.converged_clusters(task).centroids
    assert np.abs(out.output - centroids).max() < 0.5


def test_su_noisy_count_is_n_plus_the_replayed_discrete_laplace(monkeypatch):
    """Under add/remove Su's n~ is n + DLap(0.05ε) (sensitivity 1), floored at 1: with replayed OS
    words it is exactly n plus the replayed draw."""
    from fedsketch.server.bench.kmeans.dplloyd import public_count

    draws = []
    for seed in range(20):
        monkeypatch.setattr(exact, "random_words", seeded_words(seed))
        got = public_count(3000, 0.05 * 0.4)
        monkeypatch.setattr(exact, "random_words", seeded_words(seed))
        expected = max(3000 + int(dlap_noise(0.05 * 0.4, 1.0, 1)[0]), 1)
        assert got == float(expected)
        draws.append(got - 3000)
    assert len(set(draws)) > 10  # noise of scale 50 records, not a constant


def test_records_outside_the_box_count_as_on_its_face(monkeypatch):
    """A record passed to the Lloyd step beyond the box (the bench clips first; a caller may not)
    encodes to at most 2^20 steps, so it moves a sum no more than a record on the face would:
    the releases are bit-identical under replayed words."""
    h = np.array([1.0, 1.0])
    c = np.array([[0.5, 0.0], [-0.5, 0.0]])
    x = np.array([[0.2, 0.1], [-0.3, 0.4], [0.9, -0.2]])
    far, face = x.copy(), x.copy()
    far[0] = [1e9, 0.1]
    face[0] = [1.0, 0.1]
    releases = []
    for data in (far, face):
        monkeypatch.setattr(exact, "random_words", seeded_words(7))
        releases.append(common_lloyd.noisy_cluster_stats(data, c, h, 1.0, np.array([1.0, 1.0])))
    np.testing.assert_array_equal(releases[0][0], releases[1][0])
    np.testing.assert_array_equal(releases[0][1], releases[1][1])
