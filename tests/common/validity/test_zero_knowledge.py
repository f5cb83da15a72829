"""Zero knowledge, statistically: what one aggregator sees of a report (its input share, its proof
shares, the other aggregator's verifier shares, and so their sum) has the same distribution for
two different valid inputs. Per coordinate, two two-sample chi-square tests over 1,200 reports
per input (300 for a mutation): on 8 equal bins of F_p (the value's top bits) and on its residue
mod 8 (its low bits); every p-value must stay above 10^-8 (with about 200 coordinates, 400
tests, an honest construction fails with probability below 4·10^-6, Bonferroni). Three wrong
constructions, checked here as mutations, break it: an unmasked input share (the helper's share
leaked to the coordinator); proofs without their random wire seeds (then the summed verifier's
f(r) is a function of the input's bits: for x1 one wire's values are all 1 − 1 = 0, so f_R(r) =
0 every time); and shares that leak one bit of the input (the helper's seed redrawn until the
coordinator's first input share has the parity of x_0: every report still verifies, and the
top-bits test alone does not see it)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from fedsketch.common.validity import circuit, field, flp, sharing
from fedsketch.common.validity.field import P

PROVEN = sharing.ProvenInput(circuit.RangeCircuit(3, 3), proofs=2)
INPUTS = ([-3, -3, -3], [3, 0, 2])
SAMPLES = 1200
#: Reports per input for a mutation: each leak makes a coordinate constant or confines it to one
#: parity, which 300 reports show at p far below 10^-8 (measured: 0, 7·10^-102 and 2·10^-125).
MUTATION_SAMPLES = 300
BINS = 8


def _views(x, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """(leader's views, helper's views), one row per report."""
    key = os.urandom(16)
    leaders, helpers = [], []
    for _ in range(samples):
        nonce = os.urandom(16)
        leader, helper = PROVEN.shard(x, nonce)
        to_leader, to_helper = PROVEN.prepare(leader, key, nonce), PROVEN.prepare(helper, key, nonce)
        assert PROVEN.decide(to_leader, to_helper)
        total = field.add(to_leader.verifier, to_helper.verifier)
        helper_input, helper_proof = PROVEN._helper_streams(helper.seed)
        leaders.append(np.concatenate([leader.input, leader.proof, to_helper.verifier, total]))
        helpers.append(np.concatenate([helper_input, helper_proof, to_leader.verifier, total]))
    return np.array(leaders), np.array(helpers)


def _smallest_p_value(first: np.ndarray, second: np.ndarray) -> float:
    """The smallest p-value of the per-coordinate two-sample chi-square tests, on the top bits
    and on the low bits (a coordinate constant and equal in both samples carries nothing and is
    skipped)."""
    smallest = 1.0
    for column in range(first.shape[1]):
        if (first[:, column] == first[0, column]).all() and (
                second[:, column] == first[0, column]).all():
            continue
        for binned in (lambda v: v * BINS // P, lambda v: v % BINS):
            counts = np.array([np.bincount(binned(sample[:, column]), minlength=BINS)
                               for sample in (first, second)])
            counts = counts[:, counts.sum(axis=0) > 0]
            if counts.shape[1] == 1:
                return 0.0  # one bin in both samples, but the values differ
            smallest = min(smallest, chi2_contingency(counts).pvalue)
    return smallest


def _distinguish(samples: int) -> tuple[float, float]:
    (leader0, helper0), (leader1, helper1) = (_views(x, samples) for x in INPUTS)
    return _smallest_p_value(leader0, leader1), _smallest_p_value(helper0, helper1)


def test_views_of_two_valid_inputs_have_the_same_distribution():
    leader, helper = _distinguish(SAMPLES)
    assert leader > 1e-8 and helper > 1e-8, (leader, helper)


@pytest.mark.parametrize("mutation", ["unmasked_input_share", "no_wire_seeds", "one_bit_leak"])
def test_a_leaking_construction_is_detected(mutation, monkeypatch):
    if mutation == "one_bit_leak":
        shard = sharing.ProvenInput.shard

        def leaky(self, x, nonce):
            while True:  # a valid sharing whose leader input share carries x_0's parity
                leader, helper = shard(self, x, nonce)
                if leader.input[0] % 2 == int(x[0]) % P % 2:
                    return leader, helper
        monkeypatch.setattr(sharing.ProvenInput, "shard", leaky)
    elif mutation == "unmasked_input_share":
        streams = sharing.ProvenInput._helper_streams
        monkeypatch.setattr(sharing.ProvenInput, "_helper_streams", lambda self, seed: (
            np.zeros_like(streams(self, seed)[0]), streams(self, seed)[1]))
    else:
        prove = flp.Flp.prove
        monkeypatch.setattr(flp.Flp, "prove", lambda self, encoded, rand, joint: prove(
            self, encoded, np.zeros_like(rand), joint))
    leader, helper = _distinguish(MUTATION_SAMPLES)
    assert min(leader, helper) < 1e-8, (leader, helper)
