"""The consistency round of secure aggregation (common/secagg, stages 4 and 5): a device signs
one survivor list, unmasks only against the consistency quorum of signatures on that list, and
derives which kind of share to reveal from it alone. Run with the real protocol code against a
coordinator that deviates: different survivor lists for different devices (the attack that
read the sum of fewer than h_min honest devices) and, in a sparse graph, a request for the mask
key of a survivor (the attack that unmasked one device)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from fedsketch.common.net import signing
from fedsketch.common.secagg import (
    KIND_B,
    KIND_SK,
    Aggregator,
    Client,
    SecAggAbort,
    SecAggParams,
    SignedSurvivors,
    survivors_digest,
)
from fedsketch.common.secagg import wire as sw
from fedsketch.common.secagg.params import ring_order
from fedsketch.common.secagg.trust import Assumptions

DIM, BITS = 4, 30


def _ids(n: int) -> tuple[str, ...]:
    return tuple(f"dev-{i:02d}" for i in range(n))


@dataclass
class Masked:
    """A round run with the real protocol code up to the masked inputs."""

    params: SecAggParams
    keys: dict[str, bytes]  # device → Ed25519 private key
    clients: dict[str, Client]
    aggregator: Aggregator
    survivors: tuple[str, ...]  # Y, as an honest coordinator computes it

    def signature(self, signer: str, survivors: tuple[str, ...]) -> bytes:
        """The signature a device that colludes puts on any list (it holds its own key)."""
        return signing.sign(self.keys[signer], survivors_digest(self.params.study_id, signer, survivors))


def _masked(params: SecAggParams, silent_from: dict[str, set[str]] | None = None) -> Masked:
    """Devices in ``silent_from["share_keys"]`` advertise and stop; those in
    ``silent_from["masked_input"]`` share keys and stop."""
    silent_from = silent_from or {}
    keys = {u: signing.new_private_key() for u in params.device_ids}
    enrolled = {u: signing.public_key(k) for u, k in keys.items()}
    clients = {u: Client(params, u, keys[u], enrolled) for u in params.device_ids}
    agg = Aggregator(params, enrolled)
    routed = agg.collect_adverts({u: c.advertise() for u, c in clients.items()})
    sharing = set(clients) - silent_from.get("share_keys", set())
    routed = agg.collect_shares({u: clients[u].share_keys(routed[u]) for u in sorted(sharing)})
    masking = sharing - silent_from.get("masked_input", set())
    masked = {u: clients[u].masked_input(np.arange(DIM) + i, routed[u])
              for i, u in enumerate(sorted(masking))}
    return Masked(params, keys, clients, agg, agg.collect_masked(masked))


def test_a_device_signs_one_survivor_list_and_refuses_any_it_cannot_stand_behind():
    ids = _ids(6)
    a, b, c, d, e, f = ids
    params = SecAggParams("study-c", ids, 4, BITS, DIM, min_submitters=4)
    run = _masked(params, {"share_keys": {f}, "masked_input": {e}})
    assert run.survivors == (a, b, c, d)
    cl = run.clients
    with pytest.raises(SecAggAbort, match="only 3 survivors listed, fewer than the 4"):
        cl[a].sign_survivors((a, b, c))
    with pytest.raises(SecAggAbort, match="left out of the survivor list"):
        cl[b].sign_survivors((a, c, d, e))  # b sent its masked input
    with pytest.raises(SecAggAbort, match="outside the roster"):
        cl[c].sign_survivors((a, b, c, d, "dev-99"))
    with pytest.raises(SecAggAbort, match="shares I do not hold"):
        cl[d].sign_survivors((a, b, c, d, f))  # f never shared keys
    with pytest.raises(SecAggAbort, match="already aborted"):  # an abort is final
        cl[a].sign_survivors(run.survivors)
    fresh = _masked(params, {"share_keys": {f}, "masked_input": {e}})
    signature = fresh.clients[a].sign_survivors([d, c, b, a, a])  # order and repeats do not count
    assert signing.verify(signing.public_key(fresh.keys[a]),
                          survivors_digest(params.study_id, a, run.survivors), signature)
    assert fresh.clients[a].sign_survivors(run.survivors) == signature  # the same list again
    with pytest.raises(SecAggAbort, match="second, different survivor list"):
        fresh.clients[a].sign_survivors((a, b, c, d, e))


def test_a_device_signs_no_list_with_fewer_than_t_survivors_around_it():
    ids = _ids(5)
    params = SecAggParams("study-t", ids, 4, BITS, DIM)  # t = 4, q = min_submitters = 3
    run = _masked(params)  # an honest coordinator aborts below t; this one lists three
    with pytest.raises(SecAggAbort, match="only 3 survivors in my neighbourhood; threshold 4"):
        run.clients[ids[0]].sign_survivors(ids[:3])


def _signed(run: Masked) -> dict[str, SignedSurvivors]:
    """Every survivor signs Y; the aggregator's request to each signer."""
    signatures = {u: run.clients[u].sign_survivors(run.survivors) for u in run.survivors}
    return run.aggregator.collect_signatures(signatures)


def test_the_signing_committee_and_its_quorum_follow_the_dropouts_left_and_the_colluders():
    """p = min(n, 2D' + C + 1) devices, the first on the public ring; q = ⌊(p + C)/2⌋ + 1."""
    ids = _ids(100)
    for submitters, colluders, p, q in ((100, 0, 1, 1), (90, 5, 26, 16), (80, 10, 51, 31),
                                        (51, 0, 99, 50), (56, 10, 99, 55), (51, 1, 100, 51)):
        params = SecAggParams("st", ids, 60, BITS, DIM, None, b"seed", colluders, submitters)
        assert (params.committee_size, params.consistency_quorum) == (p, q)
        assert params.committee == frozenset(ring_order(ids, b"seed")[:p])
        left = 100 - submitters
        assert 2 * q > p + colluders  # two lists cannot both reach q
        assert p - min(left, p) >= q  # even if every dropout left is a member, q remain
    other = SecAggParams("st", ids, 60, BITS, DIM, None, b"other seed", 5, 90)
    assert other.committee != SecAggParams("st", ids, 60, BITS, DIM, None, b"seed", 5, 90).committee


def _refusal(params: SecAggParams, silent: set[str], request) -> str:
    """The abort of the first survivor, after every survivor signed Y, on ``request(run, Y,
    honest request)``; a fresh round each time (an abort is final)."""
    run = _masked(params, {"masked_input": silent})
    honest = _signed(run)[run.survivors[0]]
    with pytest.raises(SecAggAbort) as err:
        run.clients[run.survivors[0]].unmask(request(run, run.survivors, honest))
    return err.value.reason


def test_unmask_needs_the_quorum_of_valid_committee_signatures_on_the_list_it_signed():
    ids = _ids(6)
    params = SecAggParams("study-u", ids, 4, BITS, DIM, min_submitters=4)
    q = params.consistency_quorum
    assert (params.committee_size, q) == (5, 3)  # D' = 2, C = 0
    (outsider,) = set(ids) - params.committee
    silent = set(sorted(set(ids) - {outsider})[-2:])  # the outsider survives
    gone = min(silent)
    other = tuple(sorted(set(ids) - {gone}))

    def first(honest: SignedSurvivors) -> dict[str, bytes]:  # all but the last of q
        return dict(list(honest.signatures.items())[:q - 1])

    def last(honest: SignedSurvivors) -> str:
        return list(honest.signatures)[-1]

    assert "only 2 signatures" in _refusal(
        params, silent, lambda run, y, h: SignedSurvivors(y, first(h)))
    assert "differs from the one I signed" in _refusal(
        params, silent, lambda run, y, h: SignedSurvivors(other, h.signatures))
    for signer, on in ((last, other), (lambda h: gone, None), (lambda h: outsider, None)):
        # a member's signature on another list; a non-survivor's and a non-member's on Y
        seen: list[str] = []

        def forged(run, y, h, signer=signer, on=on, seen=seen):
            v = signer(h)
            seen.append(v)
            return SignedSurvivors(y, first(h) | {v: run.signature(v, on or y)})

        reason = _refusal(params, silent, forged)
        assert f"signature of {seen[0]!r}" in reason and "not a valid one" in reason
    fair = _masked(params, {"masked_input": silent})
    requests = _signed(fair)
    assert outsider in fair.survivors and set(requests) == set(fair.survivors)
    assert {len(r.signatures) for r in requests.values()} == {q}
    assert all(set(r.signatures) <= params.committee for r in requests.values())
    u = fair.survivors[0]
    out = fair.clients[u].unmask(requests[u])
    assert {v: kind for v, (kind, _) in out.items()} == (
        dict.fromkeys(fair.survivors, KIND_B) | dict.fromkeys(silent, KIND_SK))
    assert fair.clients[u].unmask(requests[u]) == out  # asked again, the same answer


def test_the_aggregator_keeps_only_survivors_valid_signatures_and_asks_only_the_signers():
    ids = _ids(6)
    params = SecAggParams("study-g", ids, 4, BITS, DIM, min_submitters=4)  # p = 5, q = 3
    (outsider,) = set(ids) - params.committee
    f = max(set(ids) - {outsider})  # silent; the others survive
    run = _masked(params, {"masked_input": {f}})
    y = run.survivors
    signers = [u for u in y if u != y[-1]]
    signatures = {u: run.clients[u].sign_survivors(y) for u in signers}
    signatures[y[-1]] = run.signature(y[-1], signers)  # a survivor's signature on another list
    signatures[f] = run.signature(f, y)  # not a survivor
    requests = run.aggregator.collect_signatures(signatures)
    assert set(requests) == set(signers)  # every valid signer is asked, member or not
    members = sorted(set(signers) & params.committee)
    assert set(requests[signers[0]].signatures) == set(members[:3])
    assert set(run.aggregator.rejected) == {y[-1], f}
    responses = {u: run.clients[u].unmask(requests[u]) for u in signers}
    responses[y[-1]] = responses[signers[0]]  # it did not sign validly: its answer is not taken
    total = run.aggregator.collect_unmask(responses)
    assert "not asked" in run.aggregator.rejected[y[-1]]
    assert np.array_equal(total, sum(np.arange(DIM) + i for i in range(5)))

    short = _masked(params, {"masked_input": {f}})
    two = sorted(set(short.survivors) & params.committee)[:2]
    few = {u: short.clients[u].sign_survivors(short.survivors) for u in two}
    few[outsider] = short.clients[outsider].sign_survivors(short.survivors)  # does not count
    with pytest.raises(SecAggAbort, match="only 2 of the signing committee .* quorum of 3"):
        short.aggregator.collect_signatures(few)
    with pytest.raises(SecAggAbort, match="already aborted"):
        short.aggregator.collect_unmask({})


@pytest.mark.parametrize(("devices", "dropouts", "colluders"),
                         [(10, 2, 1), (12, 2, 1), (12, 3, 2), (9, 2, 0), (7, 3, 0)])
def test_a_coordinator_cannot_get_two_survivor_lists_signed_by_the_quorum(devices, dropouts, colluders):
    """The attack of stop 19's review: devices are told lists of L − D survivors that name
    different devices as dropped, so that the b-shares and s_sk-shares the coordinator collects
    strip the masks from the sum of a group smaller than h_min. The coordinator's best play:
    the colluders are committee members and sign both lists; the dropped devices of each list
    are outside the committee where possible; every honest device is offered both lists it is
    on, members in the order that splits them evenly. At most one list reaches the quorum, and
    a device holding the other, with every committee signature on it, reveals nothing."""
    ids = _ids(devices)
    trust = Assumptions(devices, dropouts, colluders)
    t = trust.default_threshold(None)
    params = SecAggParams("study-a", ids, t, BITS, DIM, None, b"", colluders, trust.min_submitters)
    q = params.consistency_quorum
    run = _masked(params)
    assert run.survivors == ids
    bad = set(sorted(params.committee)[:colluders])
    others = sorted(set(ids) - bad, key=lambda u: (u in params.committee, u))
    lists = (tuple(sorted(set(ids) - set(others[:dropouts]))),
             tuple(sorted(set(ids) - set(others[dropouts:2 * dropouts]))))
    signed: dict[tuple, dict[str, bytes]] = {lst: {} for lst in lists}
    for i, u in enumerate(sorted(set(ids) - bad)):
        offers = [lst for lst in lists if u in lst][::(-1) ** i]
        signed[offers[0]][u] = run.clients[u].sign_survivors(offers[0])
        for later in offers[1:]:
            with pytest.raises(SecAggAbort, match="second, different survivor list"):
                run.clients[u].sign_survivors(later)
    for u in bad:
        for lst in lists:
            signed[lst][u] = run.signature(u, lst)
    counts = sorted(len(set(sig) & params.committee) for sig in signed.values())
    assert counts[0] < q <= params.committee_size, (counts, q)  # never both
    assert sum(counts) <= params.committee_size + colluders
    weak = min(lists, key=lambda lst: len(set(signed[lst]) & params.committee))
    fresh = _masked(params)  # an honest device that holds the weaker list
    holder = next(u for u in weak if u not in bad)
    fresh.clients[holder].sign_survivors(weak)
    with pytest.raises(SecAggAbort, match="signatures on the survivor list; unmasking needs"):
        fresh.clients[holder].unmask(SignedSurvivors(weak, {
            u: fresh.signature(u, weak) for u in signed[weak] if u in params.committee}))


def test_in_a_sparse_graph_no_survivor_s_mask_key_share_is_ever_revealed():
    """Stop 19's second attack: in a sparse graph the coordinator asked the neighbours of a
    survivor w for w's s_sk-shares (calling w dropped to them) while it unmasked w's
    neighbour u. Now each device derives the kind of share from the signed list: no answer
    in the round carries an s_sk-share of a device in Y, and a device asked to sign a list
    without w, after signing Y, refuses."""
    ids = _ids(14)
    trust = Assumptions(14, 1, 0)
    degree = 6
    t = trust.default_threshold(degree)
    params = SecAggParams("study-s", ids, t, BITS, DIM, degree, b"seed", 0, trust.min_submitters)
    run = _masked(params, {"masked_input": {ids[13]}})
    requests = _signed(run)
    assert set(requests) == set(run.survivors)  # every signer is asked ...
    assert (params.committee_size, params.consistency_quorum) == (3, 2)  # D' = 1, C = 0
    assert {len(r.signatures) for r in requests.values()} == {2}  # ... with q signatures
    answers = {u: run.clients[u].unmask(requests[u]) for u in run.survivors}
    y = set(run.survivors)
    for u, answer in answers.items():
        assert {v for v, (kind, _) in answer.items() if kind == KIND_SK} <= {ids[13]} - y
        assert {v for v, (kind, _) in answer.items() if kind == KIND_B} == y & params.closed(u)
    victim = ids[0]
    w = sorted(params.graph[victim])[0]
    for v in sorted(params.graph[w] & y):
        with pytest.raises(SecAggAbort, match="second, different survivor list"):
            run.clients[v].sign_survivors(tuple(sorted(y - {w})))


def test_rules_2_and_3_imply_the_consistency_rule():
    """Wherever a threshold satisfies rules 2 and 3, L > 2D + C (rule 4 of trust.py), so the
    L − D devices that may be left can reach the consistency quorum at every roster size."""
    checked = 0
    for devices in range(2, 26):
        for degree in (None, 2, 3, 4, 6, 9):
            for dropouts in range(devices):
                for colluders in range(devices - dropouts):
                    trust = Assumptions(devices, dropouts, colluders)
                    try:
                        t = trust.default_threshold(degree)
                    except ValueError:
                        continue
                    checked += 1
                    assert devices > 2 * dropouts + colluders, (devices, dropouts, colluders, degree)
                    for n in trust.rosters():
                        params = SecAggParams("s", _ids(n), t, BITS, DIM, degree, b"g", colluders,
                                              trust.min_submitters)
                        left = n - trust.min_submitters
                        assert params.committee_size - left >= params.consistency_quorum
    assert checked > 1000


def test_round_parameters_refuse_fewer_submitters_than_the_quorum():
    assert SecAggParams("s", _ids(7), 5, BITS, DIM, colluders=1).min_submitters == 5  # ⌊8/2⌋ + 1
    with pytest.raises(ValueError, match=r"min_submitters must lie in 5..7, got 4: .* 2D' \+ C < n"):
        SecAggParams("s", _ids(7), 5, BITS, DIM, colluders=1, min_submitters=4)


@pytest.mark.parametrize("body", [
    b'{"survivors": "dev-00"}', b'{"survivors": [1, 2]}', b'{"survivors": ["a", "a"]}', b"[]",
    b'{"other": []}',
])
def test_a_malformed_survivor_list_is_a_value_error(body):
    with pytest.raises(ValueError, match="survivor list"):
        sw.survivors_from_json(sw.load(body))


@pytest.mark.parametrize("body", [
    b'{"survivors": ["a"]}', b'{"survivors": ["a"], "signatures": {"a": "%%%"}}',
    b'{"survivors": ["a"], "signatures": ["a"]}', b'{"survivors": [["a"]], "signatures": {}}',
    b'{"signature": 7}', b'{"survivors": ["a"], "signatures": {"a": 5}}', b"[" * 100_000,
])
def test_a_malformed_unmask_request_or_signature_is_a_value_error(body):
    with pytest.raises(ValueError):  # never another exception, which would stop the daemon
        sw.signed_from_json(sw.load(body))
    with pytest.raises(ValueError):
        sw.signature_from_json(sw.load(body))


def test_survivor_lists_and_signatures_round_trip_on_the_wire():
    survivors = ("dev-00", "dev-03")
    assert sw.survivors_from_json(sw.load(sw.dump(sw.survivors_to_json(survivors)))) == survivors
    assert sw.signature_from_json(sw.load(sw.dump(sw.signature_to_json(b"s" * 64)))) == b"s" * 64
    signed = SignedSurvivors(survivors, {"dev-00": b"x" * 64})
    assert sw.signed_from_json(sw.load(sw.dump(sw.signed_to_json(signed)))) == signed
    assert survivors_digest("st", "a", ["b", "a"]) == survivors_digest("st", "a", ("a", "b", "a"))
    assert survivors_digest("st", "a", ["a", "b"]) != survivors_digest("st", "a", ["ab"])
    assert survivors_digest("st", "a", ["a"]) != survivors_digest("su", "a", ["a"])
    assert survivors_digest("st", "a", ["a", "b"]) != survivors_digest("st", "b", ["a", "b"])
