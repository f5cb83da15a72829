"""Shamir t-of-n sharing over GF(2^521 − 1): recovery from any t shares, no information from
t − 1 (uniform shares), and refusal of bad arguments."""

from __future__ import annotations

import random
import secrets

import numpy as np
import pytest
from scipy import stats

from fedsketch.common.secagg.shamir import (
    MAX_SECRET_BYTES,
    PRIME,
    SHARE_BYTES,
    combine,
    decode_share,
    encode_share,
    split,
)


def _buckets(values: list[int], k: int) -> np.ndarray:
    """Counts of ⌊y·k/p⌋: uniform values over GF(p) fill the k buckets evenly."""
    return np.bincount([y * k // PRIME for y in values], minlength=k)


def test_any_t_shares_recover_many_random_secrets():
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 30)
        t = rng.randint(1, n)
        xs = rng.sample(range(1, 10**6), n - 1) + [PRIME - 1 - rng.randrange(1000)]
        length = rng.randint(1, MAX_SECRET_BYTES)
        secret = secrets.token_bytes(length)
        shares = split(secret, t, xs)
        assert sorted(shares) == sorted(xs)
        subset = {x: shares[x] for x in rng.sample(xs, rng.randint(t, n))}
        assert combine(subset, length, t=t) == secret


def test_leading_zero_bytes_and_empty_secret_survive():
    for secret in (bytes(32), b"\x00\x00\x01", b"", b"\xff" * MAX_SECRET_BYTES):
        shares = split(secret, 3, [5, 9, 11, 12])
        assert combine({x: shares[x] for x in (9, 11, 12)}, len(secret)) == secret


@pytest.mark.parametrize("secret", [bytes(32), b"\xff" * 32])
def test_one_share_of_a_two_threshold_is_uniform(secret):
    """t = 2, one share y = s + a·x with a uniform: y is uniform over GF(p) whatever s is."""
    values = [split(secret, 2, [3, 8])[3] for _ in range(4000)]
    assert stats.chisquare(_buckets(values, 32)).pvalue > 1e-4
    assert len(set(values)) == len(values)


def test_two_shares_of_a_three_threshold_are_jointly_uniform():
    pairs = [split(b"fixed secret", 3, [1, 2, 3]) for _ in range(4000)]
    cells = [(s[1] * 6 // PRIME) * 6 + s[2] * 6 // PRIME for s in pairs]
    assert stats.chisquare(np.bincount(cells, minlength=36)).pvalue > 1e-4


def test_t_minus_one_shares_do_not_give_the_secret():
    for t in (2, 3, 8):
        for _ in range(50):
            secret = secrets.token_bytes(32)
            shares = split(secret, t, list(range(1, t + 3)))
            fewer = dict(list(shares.items())[: t - 1])
            with pytest.raises(ValueError):  # the interpolated value is uniform over GF(p)
                combine(fewer, 32)
    wrong = 0
    for _ in range(50):  # a 65-byte secret: a wrong value may fit, but it is not the secret
        secret = secrets.token_bytes(MAX_SECRET_BYTES)
        shares = split(secret, 4, [1, 2, 3, 4])
        try:
            wrong += combine({x: shares[x] for x in (1, 2, 3)}, MAX_SECRET_BYTES) != secret
        except ValueError:
            wrong += 1
    assert wrong == 50


def test_a_random_wrong_share_is_detected_almost_surely():
    shares = split(b"k" * 32, 3, [1, 2, 3])
    shares[2] = secrets.randbelow(PRIME)
    with pytest.raises(ValueError):
        combine(shares, 32)


def test_split_refuses_bad_arguments():
    with pytest.raises(ValueError):
        split(b"s", 0, [1, 2])
    with pytest.raises(ValueError):
        split(b"s", 3, [1, 2])
    with pytest.raises(ValueError):
        split(b"s", 2, [1, 1, 2])
    for bad in (0, -1, PRIME, PRIME + 1):
        with pytest.raises(ValueError):
            split(b"s", 1, [1, bad])
    with pytest.raises(ValueError):
        split(bytes(MAX_SECRET_BYTES + 1), 1, [1])


def test_combine_refuses_bad_arguments():
    shares = split(b"secret", 2, [1, 2, 3])
    with pytest.raises(ValueError):
        combine({}, 6)
    with pytest.raises(ValueError):
        combine({1: shares[1]}, 6, t=2)
    with pytest.raises(ValueError):
        combine({0: 5, 1: shares[1]}, 6)
    with pytest.raises(ValueError):
        combine({PRIME + 1: 5, 1: shares[1]}, 6)  # ≡ 2 mod p: a duplicate coordinate
    with pytest.raises(ValueError):
        combine({1: PRIME, 2: shares[2]}, 6)


def test_share_encoding_round_trips_and_rejects_garbage():
    for x, y in ((1, 0), (PRIME - 1, PRIME - 1), (42, secrets.randbelow(PRIME))):
        data = encode_share(x, y)
        assert len(data) == SHARE_BYTES
        assert decode_share(data) == (x, y)
    with pytest.raises(ValueError):
        decode_share(bytes(SHARE_BYTES - 1))
    with pytest.raises(ValueError):
        decode_share(bytes(SHARE_BYTES))  # x = 0
    with pytest.raises(ValueError):
        decode_share(encode_share(1, 0)[:66] + PRIME.to_bytes(66, "big"))
    with pytest.raises(ValueError):
        encode_share(0, 1)
