"""The prime field (fedsketch.common.validity.field) against Python integers, and the range
circuit (fedsketch.common.validity.circuit): zero on valid encodings, nonzero on every kind of
invalid one, and read back linearly from additive shares."""

from __future__ import annotations

import numpy as np
import pytest

from fedsketch.common.validity import circuit, field
from fedsketch.common.validity.field import P


def test_field_operations_match_python_integers():
    rng = np.random.default_rng(1)
    a = np.concatenate([[0, 1, P - 1, P - 2], field.random_elements(1000, rng)])
    b = np.concatenate([[P - 1, P - 1, P - 1, 2], field.random_elements(1000, rng)])
    for got, want in ((field.add(a, b), lambda x, y: (x + y) % P),
                      (field.sub(a, b), lambda x, y: (x - y) % P),
                      (field.mul(a, b), lambda x, y: (x * y) % P)):
        assert got.tolist() == [want(int(x), int(y)) for x, y in zip(a, b, strict=True)]
    assert field.dot(a, b) == sum(int(x) * int(y) for x, y in zip(a, b, strict=True)) % P
    nonzero = a[a != 0]
    assert (field.mul(nonzero, field.inv(nonzero)) == 1).all()
    with pytest.raises(ZeroDivisionError):
        field.inv([3, 0])
    x = np.array([-5, 0, 7, -(P // 2) + 1])
    assert field.from_field(field.to_field(x)).tolist() == x.tolist()
    with pytest.raises(ValueError, match="within"):
        field.to_field([P // 2])


def _check(encoded, circ, rng, trials=20) -> list[int]:
    return [circ.evaluate(encoded, field.random_elements(circ.joint_rand_len, rng))
            for _ in range(trials)]


def test_valid_encodings_pass_and_read_back_from_shares():
    rng = np.random.default_rng(2)
    bound, n = 1000, 50
    x = np.concatenate([[-bound, bound, 0], rng.integers(-bound, bound + 1, n - 3)])
    circ = circuit.RangeCircuit(n, bound)
    encoded = circ.encode(x)
    assert encoded.size == 2 * n * circuit.width(bound)
    assert _check(encoded, circ, rng) == [0] * 20
    left, right = field.share(encoded, rng)
    total = field.add(circ.decode(left, num_shares=2), circ.decode(right, num_shares=2))
    assert field.from_field(total).tolist() == x.tolist()
    with pytest.raises(ValueError, match="outside"):
        circ.encode(np.r_[x[:-1], bound + 1])


@pytest.mark.parametrize("tamper", ["bit_two", "y_too_big", "z_mismatch", "field_noise"])
def test_invalid_encodings_fail(tamper):
    """A bit worth 2, an entry beyond the bound whose y + z = 2B holds (y = 2B + 1 in valid bits,
    z = −1 as one "bit" p − 1: only the bits' check sees it), bits of z that do not complement
    y, or a random element: C ≠ 0 in every trial (a false pass has
    probability at most 2/p each)."""
    rng = np.random.default_rng(3)
    bound, n = 1000, 8
    w = circuit.width(bound)
    circ = circuit.RangeCircuit(n, bound)
    encoded = circ.encode(rng.integers(-bound, bound + 1, n)).copy()
    if tamper == "bit_two":
        encoded[5] = 2
    elif tamper == "y_too_big":  # x = B + 1: y = 2B + 1 in w valid bits, z = −1 as a "bit"
        encoded[:w] = (2 * bound + 1 >> np.arange(w)) & 1  # worth p − 1: y + z = 2B holds
        encoded[n * w: n * w + w] = 0
        encoded[n * w] = P - 1
    elif tamper == "z_mismatch":
        encoded[n * w + 1] ^= 1
    else:
        encoded[-1] = 12345
    assert 0 not in _check(encoded, circ, rng)


def test_xof_streams_are_keyed_labelled_and_in_the_field():
    """expand: the same (seed, label) gives the same stream, another label or seed another one;
    every element in [0, p), and the elements' mean near p/2 (uniform: standard error p/√12·n^−½,
    the bound is 8 of them); derive binds every part (no two lists of parts collide)."""
    from fedsketch.common.validity import xof

    key = xof.seed()
    stream = xof.expand(key, b"a", 100_000)
    assert stream.tolist() == xof.expand(key, b"a", 100_000).tolist()
    assert (stream >= 0).all() and (stream < P).all()
    assert abs(stream.mean() - P / 2) < 8 * P / (12 * 100_000) ** 0.5
    assert (stream[:50] != xof.expand(key, b"b", 50)).any()
    assert (stream[:50] != xof.expand(xof.seed(), b"a", 50)).any()
    assert xof.derive(b"l", b"ab", b"c") != xof.derive(b"l", b"a", b"bc")
    with pytest.raises(ValueError, match="16 bytes"):
        xof.expand(b"short", b"a", 1)
    assert field.product([3, P - 1, 5]) == (3 * (P - 1) * 5) % P and field.product([]) == 1
