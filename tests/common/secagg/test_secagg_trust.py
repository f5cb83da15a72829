"""The stated assumptions of secure aggregation (common/secagg/trust.py): h_min, the safe
thresholds, and the attack the threshold rule stops, run with the real protocol code: a
coordinator that lists one device as a survivor to part of its neighbourhood and as dropped to
the rest, and colluders that hand over every share they hold."""

from __future__ import annotations

import json
from dataclasses import fields, replace

import numpy as np
import pytest

from fedsketch.common.net import signing
from fedsketch.common.secagg import (
    KEY_BYTES,
    KIND_B,
    Client,
    SecAggAbort,
    SecAggParams,
    SignedSurvivors,
    neighbours,
    prg,
    survivors_digest,
)
from fedsketch.common.secagg import wire as sw
from fedsketch.common.secagg.crypto import add_pair_mask, agree, mask_seed
from fedsketch.common.secagg.shamir import combine, decode_share
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions, fraction_of, neighbourhood_size
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.study import StudySpec

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


def _masked_round(params: SecAggParams) -> tuple[dict, dict, dict, dict]:
    """Run the real protocol to the masked inputs: (clients, adverts, inputs x, masked y)."""
    keys = {u: signing.new_private_key() for u in params.device_ids}
    enrolled = {u: signing.public_key(k) for u, k in keys.items()}
    clients = {u: Client(params, u, keys[u], enrolled) for u in params.device_ids}
    adverts = {u: c.advertise() for u, c in clients.items()}
    out = {u: c.share_keys({v: adverts[v] for v in params.graph[u]}) for u, c in clients.items()}
    xs = {u: np.arange(DIM) * (i + 1) - 7 for i, u in enumerate(params.device_ids)}
    y = {u: c.masked_input(xs[u], {v: out[v][u] for v in params.graph[u]})
         for u, c in clients.items()}
    return clients, adverts, xs, y


def any_split_recovers(params: SecAggParams, victim: str, colluders: frozenset[str]) -> bool:
    """Whether any split of the victim's honest neighbours into A (told it survived) and B (told
    it dropped) gives a coordinator both secrets: it interpolates every b-share of the victim,
    A and the colluders, and every s_sk-share of B and the colluders, that the devices
    actually hold after the real protocol ran, and compares with the victim's secrets."""
    clients = _masked_round(params)[0]
    secret_b = clients[victim]._b
    secret_sk = clients[victim]._s_sk.private_bytes_raw()
    bad = sorted(colluders & params.graph[victim])
    honest = sorted(params.graph[victim] - colluders)
    held = {v: clients[v]._held[victim] for v in (victim, *honest, *bad)}
    for mask in range(2 ** len(honest)):
        group_a = [v for i, v in enumerate(honest) if mask >> i & 1]
        group_b = [v for v in honest if v not in group_a]
        b_shares = {params.share_x[v]: held[v][1] for v in (victim, *group_a, *bad)}
        sk_shares = {params.share_x[v]: held[v][0] for v in (*group_b, *bad)}
        try:
            if (combine(b_shares, KEY_BYTES) == secret_b
                    and sk_shares and combine(sk_shares, KEY_BYTES) == secret_sk):
                return True
        except ValueError:  # too few shares interpolate to no 32-byte secret
            continue
    return False


def split_through_the_devices(params: SecAggParams, victim: str,
                              colluders: frozenset[str]) -> tuple[dict[int, int], dict[int, int]]:
    """The split attack through the devices' own answers, now that they sign the survivor list
    (stages 4 and 5): the victim and a group A of t − 1 − C_u honest neighbours are given the
    full list Y, the other neighbours (B) the list without the victim, so that A would reveal
    the victim's b-shares and B its s_sk-shares; colluders sign both lists and hand over both
    kinds. A device unmasks only against the consistency quorum of signatures on its own list.
    Returns the victim's b-shares and s_sk-shares the coordinator collects (x → share)."""
    clients, _, _, _ = _masked_round(params)
    bad = colluders & params.graph[victim]
    honest = sorted(params.graph[victim] - bad)
    need_a = max(0, params.threshold - 1 - len(bad))
    full = params.device_ids
    lists = {v: full for v in (victim, *honest[:need_a])}
    lists |= {v: tuple(u for u in full if u != victim) for v in honest[need_a:]}
    lists |= {v: full for v in sorted(set(full) - lists.keys() - bad)}  # the rest: Y
    signatures: dict[tuple[str, ...], dict[str, bytes]] = {}
    for v, listed in lists.items():
        try:
            signatures.setdefault(listed, {})[v] = clients[v].sign_survivors(listed)
        except SecAggAbort:
            continue
    for v in bad:  # a colluder signs every list with its own key
        for listed in set(lists.values()):
            digest = survivors_digest(params.study_id, v, listed)
            signatures.setdefault(listed, {})[v] = signing.sign(clients[v]._signing_key, digest)
    b_shares, sk_shares = {}, {}
    for v, listed in lists.items():
        try:
            answer = clients[v].unmask(SignedSurvivors(listed, signatures.get(listed, {})))
        except SecAggAbort:
            continue
        if victim in answer:
            kind, share = answer[victim]
            x, y = decode_share(share)
            (b_shares if kind == KIND_B else sk_shares)[x] = y
    for v in bad:
        sk_shares[params.share_x[v]], b_shares[params.share_x[v]] = clients[v]._held[victim]
    return b_shares, sk_shares


@pytest.mark.parametrize(("devices", "degree", "colluders"), [
    (4, None, 0), (5, None, 0), (5, None, 1), (7, None, 2), (9, 4, 0), (9, 4, 1), (10, 5, 2),
])
def test_the_smallest_safe_threshold_stops_the_split_attack_and_one_less_does_not(
        devices, degree, colluders):
    """At the smallest threshold the rule allows, no split of any neighbourhood's shares
    unmasks a device; at one less (refused by the parameters, forced here) one does. Through
    the devices' answers the consistency round stops that split as well: the coordinator gets
    fewer than t − 1 shares of one of the victim's two secrets. The colluders are the victim's
    neighbours, the worst case."""
    ids = _ids(devices)
    t = Assumptions(devices, 0, colluders).smallest_private_threshold(degree)
    params = SecAggParams("study-x", ids, t, BITS, DIM, degree, b"g", colluders)
    victim = ids[0]
    bad = frozenset(sorted(params.graph[victim])[:colluders])
    assert not any_split_recovers(params, victim, bad)
    with pytest.raises(ValueError, match="too low"):
        SecAggParams("study-x", ids, t - 1, BITS, DIM, degree, b"g", colluders)
    weak = _forced(SecAggParams("study-x", ids, t, BITS, DIM, degree, b"g", colluders), t - 1)
    assert any_split_recovers(weak, victim, bad)
    b_shares, sk_shares = split_through_the_devices(weak, victim, bad)
    assert min(len(b_shares), len(sk_shares)) < t - 1  # never both secrets


def test_a_threshold_safe_without_colluders_falls_to_one():
    """t = 3 of 5 is a strict majority of N⁺(u), safe when nobody colludes. One colluding
    neighbour, beyond the stated C = 0, signs both survivor lists: each then reaches the
    quorum ⌊5/2⌋ + 1 = 3, and the devices' own answers hand the coordinator t shares of both
    of the victim's secrets. That is why the operator states C (with C = 1, t = 3 is refused)."""
    ids = _ids(5)
    params = SecAggParams("study-y", ids, 3, BITS, DIM)
    assert not any_split_recovers(params, ids[0], frozenset())
    b_shares, sk_shares = split_through_the_devices(params, ids[0], frozenset({ids[1]}))
    assert min(len(b_shares), len(sk_shares)) >= 3
    with pytest.raises(ValueError, match="too low"):
        SecAggParams("study-y", ids, 3, BITS, DIM, colluders=1)


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


@pytest.mark.parametrize("change", [
    {"threshold": 4.0}, {"threshold": True}, {"dropouts": 0.5}, {"colluders": "1"},
    {"max_records": float("inf")}, {"degree": 2.5}, {"stage_timeout": True},
    {"stage_timeout": float("nan")}, {"dropouts": -1},
])
def test_secure_specs_take_only_integers(change):
    with pytest.raises(ValueError, match="secure aggregation"):
        _secure_study(**change)


def _mangled(**sa) -> str:
    data = json.loads(_secure_study(threshold=4, dropouts=0, colluders=0).to_json())
    data["secure_aggregation"] |= sa
    return json.dumps(data)


@pytest.mark.parametrize("text", [
    _mangled(threshold=float("inf")),
    _mangled(dropouts=0.5),
    _mangled(degree=True),
    _mangled(min_honest=4, colluders=1).replace('"dropouts": 0, ', ""),  # half old, half new
    _mangled().replace('"dropouts": 0, "', '"min_honest": Infinity, "').replace(
        '"colluders": 0, ', ""),
    _mangled().replace('"dropouts": 0, "', '"min_honest": true, "').replace('"colluders": 0, ', ""),
    _mangled().replace('"min_devices": 6', '"min_devices": Infinity'),
    json.dumps(json.loads(_mangled()) | {"secure_aggregation": [{"threshold": 4}]}),
])
def test_a_malformed_secure_spec_is_a_value_error(text):
    """Whatever a stored or listed spec holds, parsing it raises ValueError, which the device
    turns into a refusal (an OverflowError or TypeError would stop the daemon)."""
    assert text != _mangled()
    with pytest.raises(ValueError, match="secure.aggregation|malformed study spec|min_devices must be"):
        StudySpec.from_json(text)


def test_round_parameters_on_the_wire_take_only_integers_and_id_strings():
    spec = _secure_study()
    params = spec.round_params("st-1", _ids(5))
    body = sw.params_to_json(params, {u: b"k" * 32 for u in params.device_ids}, 100.0)
    assert sw.params_from_json("st-1", body)[0] == params
    for key in ("threshold", "bits", "dim", "colluders", "min_submitters", "degree"):
        for value in (float("inf"), True, 4.0, "4"):
            with pytest.raises(ValueError, match="malformed round parameters|must be an integer"):
                sw.params_from_json("st-1", body | {key: value})
    with pytest.raises(ValueError, match="malformed round parameters"):
        sw.params_from_json("st-1", body | {"records": 10**400})  # float() overflows
    for roster in ([1, 2, 3, 4, 5], "dev-00", [["dev-00"]]):
        with pytest.raises(ValueError):
            sw.params_from_json("st-1", body | {"roster": roster})


def _connected(graph: dict[str, frozenset[str]], removed: set[str]) -> bool:
    left = set(graph) - removed
    seen, todo = set(), [next(iter(left))]
    while todo:
        u = todo.pop()
        if u not in seen:
            seen.add(u)
            todo.extend(graph[u] - removed - seen)
    return seen == left


def test_the_sparse_graph_stays_connected_after_any_degree_minus_one_removals():
    """Rule 5 rests on it: with at most C colluders and D' devices left out, and
    |N(u)| > C + D', the honest survivors form one group whose masks cancel only together."""
    from itertools import combinations

    for n in range(5, 14):
        for degree in range(2, n - 1):
            ids = _ids(n)
            graph = {u: frozenset(v) for u, v in neighbours(ids, degree, b"ring").items()}
            size = neighbourhood_size(n, degree)
            for removed in combinations(ids, size - 1):
                assert _connected(graph, set(removed)), (n, degree, removed)


def test_a_device_whose_neighbours_all_collude_is_read_alone_so_the_degree_must_exceed_c_plus_d():
    """Degree 4 with C = 4 passes rules 2 and 3 (they force t = 5 and D = 0) but not rule 5:
    with the colluders on one victim's neighbourhood, a coordinator that follows the protocol
    reads the victim's own input: the victim's b-share and its colluding neighbours' make t,
    and the colluders know every pairwise mask of the victim."""
    with pytest.raises(ValueError, match="degree must exceed C \\+ D = 4"):
        Assumptions(20, 0, 4).default_threshold(4)
    assert Assumptions(20, 0, 3).default_threshold(4) == 5  # one honest neighbour is enough
    ids = _ids(20)
    params = SecAggParams("study-c", ids, 5, BITS, DIM, 4, b"ring", 4, 20)
    clients, adverts, xs, y = _masked_round(params)
    survivors = params.device_ids
    signatures = {u: clients[u].sign_survivors(survivors) for u in survivors}
    request = SignedSurvivors(survivors, {u: signatures[u] for u in sorted(params.committee)})
    victim = ids[0]
    bad = params.graph[victim]
    b_shares = dict(decode_share(clients[v].unmask(request)[victim][1]) for v in (victim, *bad))
    seed = combine(b_shares, KEY_BYTES, t=5)
    masks = np.zeros(DIM, dtype=np.uint64)
    for v in bad:  # each colluder's own mask key
        pair = mask_seed(agree(clients[v]._s_sk, adverts[victim].s_pk), params.study_id, v, victim)
        add_pair_mask(masks, prg(pair, DIM, BITS), victim, v)
    plain = (y[victim] - prg(seed, DIM, BITS) - masks) & np.uint64(2**BITS - 1)
    signed = plain.astype(np.int64)
    signed[plain >= 2 ** (BITS - 1)] -= 2**BITS
    assert np.array_equal(signed, xs[victim])
