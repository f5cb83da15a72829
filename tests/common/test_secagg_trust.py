"""The stated assumptions of secure aggregation (common/secagg/trust.py): h_min, the safe
thresholds, and the attack the threshold rule stops, run with the real protocol code: a
coordinator that lists one device as a survivor to part of its neighbourhood and as dropped to
the rest, and colluders that hand over every share they hold."""

from __future__ import annotations

import json
from dataclasses import fields, replace

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedsketch.common import signing
from fedsketch.common.frequencies import FrequencySpec
from fedsketch.common.privacy import PrivacySpec
from fedsketch.common.secagg import (
    KEY_BYTES,
    KIND_B,
    KIND_SK,
    Client,
    SecAggAbort,
    SecAggParams,
    neighbours,
    prg,
)
from fedsketch.common.secagg.crypto import add_pair_mask, agree, mask_seed
from fedsketch.common.secagg.trust import Assumptions, fraction_of, neighbourhood_size
from fedsketch.common.shamir import combine, decode_share
from fedsketch.common.spec import SketchSpec
from fedsketch.common.study import SecAggSpec, StudySpec

DIM, BITS = 6, 30


def _ids(n: int) -> tuple[str, ...]:
    return tuple(f"dev-{i:02d}" for i in range(n))


def test_neighbourhood_size_is_that_of_the_graph():
    for n in range(2, 30):
        for degree in (None, *range(1, n + 1)):
            graph = neighbours(_ids(n), degree, b"seed")
            assert {len(v) for v in graph.values()} == {neighbourhood_size(n, degree)}, (n, degree)


def test_fractions_round_up_to_whole_devices_and_h_min_follows():
    assert [fraction_of(f, 100) for f in (0.0, 0.1, 0.2, 0.29, 0.3, 0.7)] == [0, 10, 20, 29, 30, 70]
    assert fraction_of(0.25, 10) == 3 and fraction_of(0.01, 10) == 1
    trust = Assumptions.from_fractions(100, 0.2, 0.1)  # the example of MECHANISMS §4.3
    assert (trust.dropouts, trust.colluders, trust.min_honest, trust.min_submitters) == (20, 10, 70, 80)
    for bad in (1.0, -0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"\[0, 1\)"):
            fraction_of(bad, 10)
    with pytest.raises(ValueError, match="h_min = L − D − C = 0: .* less than one noise draw"):
        Assumptions.from_fractions(10, 0.5, 0.5)
    with pytest.raises(ValueError, match="D, C >= 0"):
        Assumptions(10, -1, 0)


def test_the_threshold_range_of_a_complete_and_a_sparse_graph():
    full = Assumptions(100, 20, 10)
    # 2t > 99 + 1 + 10 → t ≥ 56; 20 dropouts leave 80 of every neighbourhood → t ≤ 80
    assert full.smallest_private_threshold(None) == 56 and full.largest_live_threshold(None) == 80
    assert full.default_threshold(None) == 56
    assert Assumptions(10, 0, 0).default_threshold(None) == 6  # a strict majority of N⁺(u)
    sparse = Assumptions(100, 2, 1)  # degree 10: |N(u)| = 10 → 2t > 12; 2 dropouts → t ≤ 9
    assert (sparse.smallest_private_threshold(10), sparse.largest_live_threshold(10)) == (7, 9)
    with pytest.raises(ValueError, match="too low .* t must be >= 7"):
        sparse.check(6, 10)
    with pytest.raises(ValueError, match="too high .* t must be <= 9"):
        sparse.check(10, 10)
    with pytest.raises(ValueError, match="no threshold fits a graph of degree 10"):
        Assumptions(100, 5, 3).default_threshold(10)
    with pytest.raises(ValueError, match="no threshold fits the complete graph"):
        Assumptions(10, 5, 0).default_threshold(None)  # t > 5 and t ≤ 5


def test_params_refuse_a_threshold_that_one_split_of_a_neighbourhood_reaches():
    assert SecAggParams("s", _ids(4), 3, BITS, DIM).threshold == 3
    with pytest.raises(ValueError, match="too low"):  # t > |N(u)|/2 = 1.5, but not > |N⁺(u)|/2
        SecAggParams("s", _ids(4), 2, BITS, DIM)
    assert SecAggParams("s", _ids(5), 3, BITS, DIM).threshold == 3
    with pytest.raises(ValueError, match="with 1 colluders"):
        SecAggParams("s", _ids(5), 3, BITS, DIM, colluders=1)
    with pytest.raises(ValueError, match="min_submitters"):
        SecAggParams("s", _ids(5), 3, BITS, DIM, min_submitters=6)


def _forced(params: SecAggParams, threshold: int) -> SecAggParams:
    """``params`` with a threshold its validation refuses: only to run the attack it prevents."""
    object.__setattr__(params, "threshold", threshold)
    return params


def split_attack(params: SecAggParams, victim: str, colluders: frozenset[str]) -> np.ndarray | None:
    """Run the round to its masked inputs, then unmask ``victim`` alone: it and a group A of its
    honest neighbours are told it survived (b-shares), the others, B, that it dropped (s_sk
    shares); colluders hand over both. Returns x_victim as the coordinator reads it, or None if
    no split of the neighbourhood gives t shares of each kind."""
    keys = {u: signing.new_private_key() for u in params.device_ids}
    enrolled = {u: signing.public_key(k) for u, k in keys.items()}
    clients = {u: Client(params, u, keys[u], enrolled) for u in params.device_ids}
    adverts = {u: c.advertise() for u, c in clients.items()}
    out = {u: c.share_keys({v: adverts[v] for v in params.graph[u]}) for u, c in clients.items()}
    xs = {u: np.arange(DIM) * (i + 1) - 7 for i, u in enumerate(params.device_ids)}
    y = {u: c.masked_input(xs[u], {v: out[v][u] for v in params.graph[u]})
         for u, c in clients.items()}
    t, near = params.threshold, params.graph[victim]
    bad = colluders & near
    honest = sorted(near - bad)
    need_a, need_b = max(0, t - 1 - len(bad)), max(0, t - len(bad))
    if need_a + need_b > len(honest):
        return None
    everyone = set(params.device_ids)
    b_shares, sk_shares = {}, {}
    for v in (victim, *honest[:need_a]):
        kind, share = clients[v].unmask(sorted(params.closed(v) & everyone), [])[victim]
        assert kind == KIND_B
        b_shares.update([decode_share(share)])
    for v in honest[need_a:]:
        kind, share = clients[v].unmask(sorted(params.closed(v) - {victim}), [victim])[victim]
        assert kind == KIND_SK
        sk_shares.update([decode_share(share)])
    for v in bad:
        s_share, b_share = clients[v]._held[victim]
        sk_shares[params.share_x[v]], b_shares[params.share_x[v]] = s_share, b_share
    seed = combine(b_shares, KEY_BYTES, t=t)
    key = X25519PrivateKey.from_private_bytes(combine(sk_shares, KEY_BYTES, t=t))
    masks = np.zeros(DIM, dtype=np.uint64)
    for v in near:
        pair = mask_seed(agree(key, adverts[v].s_pk), params.study_id, victim, v)
        add_pair_mask(masks, prg(pair, DIM, BITS), victim, v)
    plain = (y[victim] - prg(seed, DIM, BITS) - masks) & np.uint64(2**BITS - 1)
    signed = plain.astype(np.int64)
    signed[plain >= 2 ** (BITS - 1)] -= 2**BITS
    assert np.array_equal(signed, xs[victim])  # the attack, when it runs, reads x_victim exactly
    return signed


@pytest.mark.parametrize(("devices", "degree", "colluders"), [
    (4, None, 0), (5, None, 0), (5, None, 1), (7, None, 2), (9, 4, 0), (9, 4, 1), (10, 5, 2),
])
def test_the_smallest_safe_threshold_stops_the_split_attack_and_one_less_does_not(
        devices, degree, colluders):
    """At the smallest threshold the rule allows, no split of any neighbourhood unmasks a
    device; at one less (refused by the parameters, forced here) the attack reads the victim's
    input exactly. The colluders are the victim's neighbours, the worst case."""
    ids = _ids(devices)
    t = Assumptions(devices, 0, colluders).smallest_private_threshold(degree)
    params = SecAggParams("study-x", ids, t, BITS, DIM, degree, b"g", colluders)
    victim = ids[0]
    bad = frozenset(sorted(params.graph[victim])[:colluders])
    assert split_attack(params, victim, bad) is None
    with pytest.raises(ValueError, match="too low"):
        SecAggParams("study-x", ids, t - 1, BITS, DIM, degree, b"g", colluders)
    weak = _forced(SecAggParams("study-x", ids, t, BITS, DIM, degree, b"g", colluders), t - 1)
    assert split_attack(weak, victim, bad) is not None


def test_a_threshold_safe_without_colluders_falls_to_one():
    """t = 3 of 5 is a strict majority of N⁺(u), safe when nobody colludes; one colluding
    neighbour turns it into an attack, which is why the operator states C."""
    ids = _ids(5)
    params = SecAggParams("study-y", ids, 3, BITS, DIM)
    assert split_attack(params, ids[0], frozenset()) is None
    assert split_attack(SecAggParams("study-y", ids, 3, BITS, DIM), ids[0],
                        frozenset({ids[1]})) is not None


def test_in_the_complete_graph_a_device_refuses_to_unmask_fewer_than_l_minus_d():
    ids = _ids(5)
    params = SecAggParams("study-z", ids, 3, BITS, DIM, min_submitters=4)
    keys = {u: signing.new_private_key() for u in ids}
    enrolled = {u: signing.public_key(k) for u, k in keys.items()}
    clients = {u: Client(params, u, keys[u], enrolled) for u in ids}
    adverts = {u: c.advertise() for u, c in clients.items()}
    out = {u: c.share_keys({v: adverts[v] for v in params.graph[u]}) for u, c in clients.items()}
    for u, c in clients.items():
        c.masked_input(np.zeros(DIM, np.int64), {v: out[v][u] for v in params.graph[u]})
    a, b, c, d, e = ids
    with pytest.raises(SecAggAbort, match="only 3 survivors listed, fewer than the 4"):
        clients[a].unmask([a, b, c], [d, e])
    assert set(clients[b].unmask([a, b, c, d], [e])) == {a, b, c, d, e}


def _secure_study(devices: int = 6, **sa) -> StudySpec:
    sketch = SketchSpec(FrequencySpec(d=2, m=20, scale=1.0), "quantized", 4, PrivacySpec(1.0))
    spec = {"threshold": 4, "max_records": 10_000, "dropouts": 1, "colluders": 1} | sa
    return StudySpec.create("secure", sketch, 2, [-1.0] * 2, [1.0] * 2, min_devices=devices,
                            secure_aggregation=SecAggSpec(**spec))


def test_a_device_recomputes_the_round_parameters_and_refuses_any_other():
    spec = _secure_study()  # L = 6, D = 1, C = 1: 2t > 5 + 1 + 1 → t ≥ 4; rosters of 5 or 6
    spec.check_trust()
    roster = _ids(5)
    params = spec.round_params("st-1", roster)
    assert (params.threshold, params.colluders, params.min_submitters) == (4, 1, 5)
    spec.check_round(params)
    for name, value in (("threshold", 5), ("bits", params.bits + 1), ("degree", 3),
                        ("graph_seed", b"chosen"), ("colluders", 0), ("min_submitters", 4)):
        with pytest.raises(ValueError, match=f"differ from the study's in {name}"):
            spec.check_round(replace(params, **{name: value}))
    assert {f.name for f in fields(SecAggParams)} == {
        "study_id", "device_ids", "threshold", "bits", "dim", "degree", "graph_seed", "colluders",
        "min_submitters"}
    for size in (4, 7):
        with pytest.raises(ValueError, match="the study needs 5 to 6"):
            spec.round_params("st-1", _ids(size))


def test_studies_of_the_previous_release_read_their_min_honest_as_dropouts():
    spec = _secure_study(threshold=4, dropouts=0, colluders=0)
    data = json.loads(spec.to_json())
    sa = data["secure_aggregation"]
    del sa["dropouts"], sa["colluders"]
    sa["min_honest"] = 4
    old = StudySpec.from_json(json.dumps(data))
    assert (old.secure_aggregation.dropouts, old.secure_aggregation.colluders) == (2, 0)
    assert old.assumptions.min_honest == 4
