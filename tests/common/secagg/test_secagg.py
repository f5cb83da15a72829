"""Secure aggregation: the released sum is exact under dropouts at every stage, a single masked
input looks uniform to the coordinator, a deviating coordinator gets SecAggAbort and nothing
else, and the distributed noise shares sum to the discrete Laplace of MECHANISMS §4."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
from scipy import stats

from fedsketch.common.dp.calibration import dlap_variance, noise_radius
from fedsketch.common.dp.samplers import dlap_noise_share
from fedsketch.common.net import signing
from fedsketch.common.secagg import (
    MAX_BITS,
    Aggregator,
    Client,
    SecAggAbort,
    SecAggParams,
    SignedSurvivors,
    check_capacity,
    modulus_bits,
    neighbours,
    prg,
)
from fedsketch.common.secagg.shamir import combine, decode_share

STAGES = ("advertise", "share_keys", "masked_input", "consistency", "unmask")
#: 30 devices (a round's cost grows as L²: every device verifies every advert and agrees a key
#: with each neighbour; L = 50 took three times as long). The sparse graph joins each device to
#: 20 of the other 29, so its neighbourhood of 21 keeps t = 11 through any 9 dropouts (30 %).
L, DIM, DEGREE = 30, 2000, 20


def _ids(n: int) -> list[str]:
    return [f"device-{i:03d}" for i in range(n)]


def _params(n: int, dim: int, degree: int | None, bits: int = 40,
            threshold: int | None = None) -> SecAggParams:
    size = n if degree is None else degree + 1  # |N⁺(u)| (degree even)
    t = size // 2 + 1 if threshold is None else threshold
    return SecAggParams("study-7", tuple(_ids(n)), t, bits, dim, degree, b"public graph seed")


@dataclass
class Run:
    """One simulated round: the release (None if aborted), who submitted, and every abort."""

    result: np.ndarray | None = None
    submitted: set[str] = field(default_factory=set)
    aborted: str | None = None
    client_aborts: dict[str, str] = field(default_factory=dict)
    clients: dict[str, Client] = field(default_factory=dict)


def _enrolled_clients(params: SecAggParams) -> tuple[dict, dict, dict[str, Client]]:
    """Fresh signing keys, the enrolled public keys, and one Client per device."""
    keys = {u: signing.new_private_key() for u in params.device_ids}
    enrolled = {u: signing.public_key(k) for u, k in keys.items()}
    return keys, enrolled, {u: Client(params, u, keys[u], enrolled) for u in params.device_ids}


def run_round(params: SecAggParams, xs: dict[str, np.ndarray], drops: dict[str, set[str]] | None = None,
              noise: dict[str, np.ndarray] | None = None) -> Run:
    """Drive the five stages in memory; devices in ``drops[stage]`` go silent from that stage on.

    A device whose stage raises SecAggAbort is silent too (recorded in ``client_aborts``).
    """
    drops = drops or {}
    _, enrolled, clients = _enrolled_clients(params)
    run = Run(clients=clients)
    agg = Aggregator(params, enrolled)
    live = set(params.device_ids)

    def stage(name: str, act) -> dict:
        nonlocal live
        out = {}
        for u in sorted(live - drops.get(name, set())):
            try:
                out[u] = act(run.clients[u])
            except SecAggAbort as exc:
                run.client_aborts[u] = exc.reason
        live = set(out)
        return out

    try:
        routed = agg.collect_adverts(stage("advertise", Client.advertise))
        routed = agg.collect_shares(stage("share_keys", lambda c: c.share_keys(routed[c.device_id])))
        masked = stage("masked_input", lambda c: c.masked_input(
            xs[c.device_id], routed[c.device_id], None if noise is None else noise[c.device_id]))
        run.submitted = set(masked)
        survivors = agg.collect_masked(masked)
        signed = agg.collect_signatures(stage("consistency", lambda c: c.sign_survivors(survivors)))
        run.result = agg.collect_unmask(stage("unmask", lambda c: c.unmask(signed[c.device_id])))
    except SecAggAbort as exc:
        run.aborted = exc.reason
        with pytest.raises(SecAggAbort):  # an aborted coordinator stays aborted
            agg.collect_unmask({})
    return run


def _inputs(n: int, dim: int, seed: int = 0, bound: int = 1000) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {u: rng.integers(-bound, bound + 1, dim) for u in _ids(n)}


def _dropped(fraction: float, seed: int) -> set[str]:
    return {str(u) for u in np.random.default_rng(seed).choice(_ids(L), round(fraction * L), replace=False)}


# ---------------------------------------------------------------- public parameters


@pytest.mark.parametrize("a", [0.3, 0.9, math.exp(-1 / 4000)])
@pytest.mark.parametrize("dim", [1, 2000])
def test_noise_radius_is_the_smallest_with_the_dlap_tail_below_2_pow_minus_40(a, dim):
    t = noise_radius(a, dim)

    def log_tail(s: int) -> float:  # log(dim · P(|DLap(a)| > s))
        return math.log(dim * 2 / (1 + a)) + (s + 1) * math.log(a)

    assert log_tail(t) <= -40 * math.log(2) < log_tail(t - 1)
    bits = modulus_bits(123_456, a, dim)
    assert 2 ** (bits - 2) <= 123_456 + t < 2 ** (bits - 1)


@pytest.mark.parametrize("shape", [1.5, 2.0, 5.0])
def test_noise_radius_covers_more_submitters_than_h_min(shape):
    """Σ of m' = ρ·h_min shares is NB(ρ) − NB(ρ): the radius must bound its exact tail."""
    a, dim = 0.99, 2000
    t = noise_radius(a, dim, shape)
    exact = math.log(2 * dim) + stats.nbinom.logsf(t, shape, 1 - a)  # ≥ log(dim · P(|Z| > t))
    assert exact <= -40 * math.log(2)
    assert noise_radius(a, dim) < t < noise_radius(a, dim, shape + 1)


def test_modulus_without_noise_and_capacity_refusal():
    assert noise_radius(0.0, 100) == 0
    assert modulus_bits(0, 0.0, 10) == 1
    assert modulus_bits(1000, 0.0, 10) == 11
    assert check_capacity(2**60, 0.0, 10) == 62  # 2^61 > 2^60
    with pytest.raises(ValueError, match="62"):
        check_capacity(2**61, 0.0, 10)
    with pytest.raises(ValueError, match="noise radius"):
        check_capacity(2**61 - 10, 0.5, 10)
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError):
            noise_radius(bad, 10)
    with pytest.raises(ValueError):
        noise_radius(0.5, 10, shape=0.5)


def test_neighbour_graph_is_public_undirected_and_of_the_asked_degree():
    ids = _ids(30)
    full = neighbours(ids, None, b"s")
    assert all(set(v) == set(ids) - {u} for u, v in full.items())
    for n, degree, expected in ((30, 6, 6), (30, 7, 7), (29, 7, 8), (29, 6, 6)):
        graph = neighbours(ids[:n], degree, b"seed-1")
        assert graph == neighbours(list(reversed(ids[:n])), degree, b"seed-1")  # deterministic
        assert all(u not in v and len(v) == expected for u, v in graph.items())
        assert all(u in graph[v] for u, vs in graph.items() for v in vs)  # undirected
        assert graph != neighbours(ids[:n], degree, b"seed-2")
    assert neighbours(ids, 29, b"s") == full
    with pytest.raises(ValueError):
        neighbours(["a", "a", "b"], None, b"")


def test_params_refuse_a_threshold_above_the_smallest_neighbourhood_and_wide_moduli():
    assert _params(10, 4, 4, threshold=5).threshold == 5
    with pytest.raises(ValueError):
        _params(10, 4, 4, threshold=6)
    with pytest.raises(ValueError):
        _params(10, 4, None, threshold=0)
    with pytest.raises(ValueError):
        _params(10, 4, None, bits=MAX_BITS + 1)


def test_prg_is_a_deterministic_uniform_stream_mod_2_pow_b():
    seed = bytes(range(32))
    words = prg(seed, 50_000, 20)
    assert words.dtype == np.uint64 and int(words.max()) < 2**20
    assert np.array_equal(prg(seed, 10, 20), words[:10])
    assert not np.array_equal(prg(bytes(32), 10, 20), words[:10])
    assert stats.chisquare(np.bincount((words >> np.uint64(14)).astype(np.int64), minlength=64)).pvalue > 1e-4
    assert stats.chisquare(np.bincount((words & np.uint64(63)).astype(np.int64), minlength=64)).pvalue > 1e-4


# ---------------------------------------------------------------- exactness under dropouts


def _check_exact(run: Run, xs: dict[str, np.ndarray], expect_submitted: set[str]) -> None:
    assert run.aborted is None and not run.client_aborts
    assert run.submitted == expect_submitted
    plain = np.sum([xs[u] for u in sorted(run.submitted)], axis=0)
    assert run.result.dtype == np.int64
    assert np.array_equal(run.result, plain)  # bit for bit, negative entries included


@pytest.mark.slow
@pytest.mark.parametrize("degree", [None, DEGREE], ids=["full", "sparse"])
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("fraction", [0.1, 0.3])
def test_sum_is_exact_when_devices_drop_at_one_stage(degree, stage, fraction):
    xs = _inputs(L, DIM, seed=1)
    gone = _dropped(fraction, seed=10 * STAGES.index(stage) + round(10 * fraction))
    run = run_round(_params(L, DIM, degree), xs, {stage: gone})
    before_input = STAGES.index(stage) <= STAGES.index("masked_input")
    _check_exact(run, xs, set(_ids(L)) - gone if before_input else set(_ids(L)))


@pytest.mark.slow
@pytest.mark.parametrize("degree", [None, DEGREE], ids=["full", "sparse"])
def test_sum_is_exact_without_dropouts_and_with_dropouts_at_every_stage(degree):
    xs = _inputs(L, DIM, seed=2)
    _check_exact(run_round(_params(L, DIM, degree), xs), xs, set(_ids(L)))
    ids = [str(u) for u in np.random.default_rng(3).permutation(_ids(L))]
    drops = {s: set(ids[2 * i: 2 * i + 2]) for i, s in enumerate(STAGES)}  # 7 % more at each stage
    run = run_round(_params(L, DIM, degree), xs, drops)
    _check_exact(run, xs, set(ids[6:]))  # those dropped at consistency and unmask are in the sum


@pytest.mark.slow
@pytest.mark.parametrize("degree, gone", [(None, 15), (DEGREE, 20)], ids=["full", "sparse"])
@pytest.mark.parametrize("stage", STAGES)
def test_below_the_threshold_the_round_aborts_and_releases_nothing(degree, gone, stage):
    params = _params(L, DIM, degree)
    assert L - gone < params.threshold
    run = run_round(params, _inputs(L, DIM), {stage: set(_ids(L)[:gone])})
    assert run.result is None
    assert ("quorum" if stage == "consistency" else "threshold") in run.aborted


def test_a_sparse_neighbourhood_below_the_threshold_aborts_on_the_device():
    params = _params(12, 4, 4, threshold=4)  # N⁺(u) has 5 members
    u = params.device_ids[0]
    run = run_round(params, _inputs(12, 4), {"advertise": set(sorted(params.graph[u])[2:])})
    assert "holders" in run.client_aborts[u]


# ---------------------------------------------------------------- secrecy


@pytest.mark.slow
def test_one_masked_input_is_uniform_to_the_coordinator_even_after_unmasking():
    """Fixed data, fresh keys per run: y_u, Σ_v y_v, and y_u − PRG(b_u) (what the coordinator holds
    once it knows b_u) are each uniform mod 2^B on one coordinate.

    500 runs (15.6 expected per cell): a mask one bit short is caught far below the 10^-4 bound
    (measured: pair masks of B − 1 bits, y_u − PRG(b_u)'s top bits p = 9·10^-22; self masks of
    B − 1 bits, the sum's top bits p = 10^-9, 4·10^-8, 2·10^-13, 4·10^-9), and a mask left out
    makes a view constant."""
    bits, runs = 12, 500
    params = _params(3, 2, None, bits=bits, threshold=2)
    xs = {u: np.array([5, -7]) for u in params.device_ids}
    u = params.device_ids[0]
    views = {"y_u": [], "sum": [], "y_u - PRG(b_u)": []}
    for _ in range(runs):
        _, enrolled, clients = _enrolled_clients(params)
        agg = Aggregator(params, enrolled)
        routed = agg.collect_adverts({v: c.advertise() for v, c in clients.items()})
        routed = agg.collect_shares({v: c.share_keys(routed[v]) for v, c in clients.items()})
        masked = {v: c.masked_input(xs[v], routed[v]) for v, c in clients.items()}
        survivors = agg.collect_masked(masked)
        signed = agg.collect_signatures({v: c.sign_survivors(survivors) for v, c in clients.items()})
        responses = {v: c.unmask(signed[v]) for v, c in clients.items()}
        b_u = combine(dict(decode_share(r[u][1]) for r in responses.values()), 32)
        assert np.array_equal(agg.collect_unmask(responses), np.array([15, -21]))
        views["y_u"].append(int(masked[u][0]))
        views["sum"].append(int(sum(masked.values())[0] % 2**bits))
        views["y_u - PRG(b_u)"].append(int((masked[u] - prg(b_u, 2, bits))[0] % 2**bits))
    for name, values in views.items():
        values = np.array(values)
        for cells in (values >> 7, values & 31):  # top and low 5 bits: 32 cells each
            assert stats.chisquare(np.bincount(cells, minlength=32)).pvalue > 1e-4, name


def _four_devices_after_adverts():
    params = _params(4, 4, None, threshold=3)
    keys, enrolled, clients = _enrolled_clients(params)
    adverts = {u: c.advertise() for u, c in clients.items()}
    return params, clients, adverts, keys, enrolled


def test_a_tampered_or_unsigned_advert_aborts_share_keys():
    params, clients, adverts, keys, enrolled = _four_devices_after_adverts()
    a, b, c, d = params.device_ids
    others = {v: adverts[v] for v in (b, c, d)}
    sig = bytearray(adverts[b].signature)
    sig[0] ^= 1
    forgeries = [
        replace(adverts[b], signature=bytes(sig)),
        replace(adverts[b], s_pk=adverts[c].s_pk),  # a swapped key under the original signature
        replace(adverts[b], c_pk=adverts[c].c_pk),
        adverts[c],  # filed under the wrong id
    ]
    for forged in forgeries:
        fresh = Client(params, a, keys[a], enrolled)
        fresh.advertise()
        with pytest.raises(SecAggAbort):
            fresh.share_keys(others | {b: forged})
    impostor = enrolled | {b: signing.public_key(signing.new_private_key())}
    fresh = Client(params, a, keys[a], impostor)
    fresh.advertise()
    with pytest.raises(SecAggAbort, match="enrolled"):  # b's advert, but not under b's enrolled key
        fresh.share_keys(others)
    assert clients[a].share_keys(others).keys() == {b, c, d}  # the genuine adverts pass


def test_a_tampered_or_misattributed_ciphertext_aborts_the_masked_input():
    params, clients, adverts, _, _ = _four_devices_after_adverts()
    a, b, c, d = params.device_ids
    outboxes = {u: cl.share_keys({v: adverts[v] for v in params.device_ids if v != u})
                for u, cl in clients.items()}
    ct = bytearray(outboxes[b][a])
    ct[-1] ^= 1
    with pytest.raises(SecAggAbort, match="decrypt"):
        clients[a].masked_input(np.zeros(4, dtype=np.int64), {b: bytes(ct), c: outboxes[c][a]})
    with pytest.raises(SecAggAbort, match="decrypt"):  # b's shares for d presented as c's
        clients[d].masked_input(np.zeros(4, dtype=np.int64), {c: outboxes[b][d]})
    with pytest.raises(SecAggAbort, match="decrypt"):  # shares meant for b replayed to c
        clients[c].masked_input(np.zeros(4, dtype=np.int64), {a: outboxes[a][b]})
    y = clients[b].masked_input(np.zeros(4, dtype=np.int64), {v: outboxes[v][b] for v in (a, c, d)})
    assert y.dtype == np.uint64 and int(y.max()) < 2**params.bits


def test_stages_out_of_order_are_refused():
    params, clients, _, keys, enrolled = _four_devices_after_adverts()
    a, b = params.device_ids[:2]
    with pytest.raises(SecAggAbort):
        clients[a].masked_input(np.zeros(4, dtype=np.int64), {})
    fresh = Client(params, b, keys[b], enrolled)
    with pytest.raises(SecAggAbort):
        fresh.share_keys({})
    for step in (lambda c: c.sign_survivors(params.device_ids),
                 lambda c: c.unmask(SignedSurvivors(params.device_ids, {}))):
        with pytest.raises(SecAggAbort, match="must follow"):
            step(Client(params, b, keys[b], enrolled))
    agg = Aggregator(params, {})
    with pytest.raises(RuntimeError):
        agg.collect_masked({})


def test_a_device_refuses_a_key_map_that_is_not_one_key_per_device():
    params, _, _, keys, enrolled = _four_devices_after_adverts()
    a, b = params.device_ids[:2]
    for bad in ({u: k for u, k in enrolled.items() if u != b},  # a roster device without a key
                enrolled | {b: enrolled[a]},  # two devices with one key
                enrolled | {a: signing.public_key(signing.new_private_key())}):  # not my key
        with pytest.raises(ValueError, match="key map"):
            Client(params, a, keys[a], bad)


# ---------------------------------------------------------------- distributed noise


def _dlap_pmf(a: float, k: int) -> float:
    return (1 - a) / (1 + a) * a ** abs(k)


@pytest.mark.parametrize("a", [0.5, 0.9])
def test_h_min_noise_shares_sum_to_one_discrete_laplace(a):
    """One share has the variance 2a/(h_min(1−a)²) of NB(1/h_min) − NB(1/h_min), and the Σ of h_min
    shares is DLap(a): variance 2a/(1−a)² within 5 %, pmf at 0, ±1, ±2."""
    n, draws = 50, 100_000
    delta1 = 4.0
    epsilon = -delta1 * math.log(a)
    shares = [dlap_noise_share(epsilon, delta1, n, draws) for _ in range(n)]
    # 5·10⁶ i.i.d. shares: the variance's relative s.e. is ≈ 0.6 % (excess kurtosis ≈ 150)
    assert np.concatenate(shares).var() == pytest.approx(dlap_variance(a) / n, rel=0.05)
    total = np.sum(shares, axis=0)
    assert total.dtype == np.int64
    assert total.var() == pytest.approx(dlap_variance(a), rel=0.05)
    for k in (0, 1, -1, 2, -2):
        p = _dlap_pmf(a, k)
        assert abs(np.mean(total == k) - p) < 5 * math.sqrt(p * (1 - p) / draws), k


@pytest.mark.parametrize("submitters", [20, 35])
def test_more_submitters_than_h_min_scale_the_variance(submitters):
    a, h_min, draws = 0.8, 10, 100_000
    epsilon = -math.log(a)
    total = np.sum([dlap_noise_share(epsilon, 1.0, h_min, draws) for _ in range(submitters)], axis=0)
    assert total.var() == pytest.approx(submitters / h_min * dlap_variance(a), rel=0.05)


def test_noise_share_arguments():
    assert not dlap_noise_share(math.inf, 4.0, 5, 100).any()
    with pytest.raises(ValueError):
        dlap_noise_share(1.0, 4.0, 0, 10)
    with pytest.raises(ValueError):
        dlap_noise_share(0.0, 4.0, 5, 10)


@pytest.mark.slow
def test_noise_through_the_protocol_is_exact_and_has_the_h_min_variance():
    """12 devices, h_min = 6; two drop before their masked input, two during unmasking: the
    release is Σ x + Σ e over the 10 submitters bit for bit, with variance (10/6)·2a/(1−a)²."""
    n, h_min, dim, r = 12, 6, 40_000, 4
    epsilon, delta1 = 2.0, 4.0 * r
    a = math.exp(-epsilon / delta1)
    bound = 50
    bits = check_capacity(n * bound, a, dim, shape=n / h_min)
    params = replace(_params(n, dim, None), bits=bits)
    xs = _inputs(n, dim, seed=4, bound=bound)
    noise = {u: dlap_noise_share(epsilon, delta1, h_min, dim) for u in params.device_ids}
    ids = params.device_ids
    run = run_round(params, xs, {"masked_input": {ids[0], ids[5]}, "unmask": {ids[3], ids[9]}}, noise)
    assert run.aborted is None and len(run.submitted) == 10
    noise_sum = np.sum([noise[u] for u in sorted(run.submitted)], axis=0)
    assert np.array_equal(run.result, np.sum([xs[u] for u in sorted(run.submitted)], axis=0) + noise_sum)
    assert noise_sum.var() == pytest.approx(10 / h_min * dlap_variance(a), rel=0.05)
