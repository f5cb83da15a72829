"""Frequencies Ω and dither ξ: pinned bytes, an independent reference of the random stream, the
three radius laws and the directions tested statistically, the exact log/exp, and spec validation."""

from __future__ import annotations

import hashlib
import json
import math
from decimal import Decimal, getcontext

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import integrate, special, stats

from fedsketch.common import exactmath
from fedsketch.common.sketch import frequencies as fq
from fedsketch.common.sketch.frequencies import (
    LAWS,
    OMEGA_DIRECTIONS,
    Frequencies,
    FrequencySpec,
    draw_directions,
    draw_frequencies,
    frequencies_digest,
)

# --- golden bytes ----------------------------------------------------------------------------

#: SHA-256 of Ω‖ξ. A change here changes every study's Ω: devices and coordinators on different
#: versions would refuse each other's spec hash. Never update these to make a test pass.
GOLDEN = [
    (
        FrequencySpec(d=2, m=7, scale=1.0),
        "e6faefe677014783649c21d53d18f84358fac907545485642909850068e4d3ff",
    ),
    (
        FrequencySpec(d=5, m=300, scale=0.25, law="gaussian", seed=1),
        "bd707298eb8700bffeea822fecb808aafed00ef169fafdfb54f421a917907d71",
    ),
    (
        FrequencySpec(d=3, m=1000, scale=2.5, law="folded_gaussian", seed=2**70 + 3),
        "cea03ae27efc268dc2ce017735e0bd2aa0625c1da212ccbf2196a4456eb94cd8",
    ),
    (
        FrequencySpec(d=10, m=257, scale=1e-3, law="adapted_radius", seed=42, dither=False),
        "e73bb3a23b37263f38b65896da241d7c114040d84310c0c01fb8047bd974c209",
    ),
    (
        FrequencySpec(d=1, m=1, scale=3.0, law="gaussian", seed=7),
        "90cba8509359b62fed1d5aadc4eac491766e5c551dfd5b0010704b49e2b7103d",
    ),
]
#: draw_directions(5, 4, 50, b"calibration-directions")
GOLDEN_DIRECTIONS = "6a79e64c0985d4e0161e97f57f7373762ae68b3a2087bce7f9233b45ef346b67"


@pytest.mark.parametrize(("spec", "digest"), GOLDEN, ids=lambda v: getattr(v, "law", ""))
def test_golden_digest(spec: FrequencySpec, digest: str) -> None:
    freqs = draw_frequencies(spec)
    assert freqs.sha256 == digest
    assert frequencies_digest(freqs.omega, freqs.xi) == digest


def test_golden_directions() -> None:
    phi = draw_directions(5, 4, 50, b"calibration-directions")
    assert frequencies_digest(phi, np.zeros(0)) == GOLDEN_DIRECTIONS


def test_digest_is_sha256_of_little_endian_bytes() -> None:
    freqs = draw_frequencies(FrequencySpec(d=3, m=11, scale=1.0, seed=5))
    raw = freqs.omega.astype("<f8").tobytes("C") + freqs.xi.astype("<f8").tobytes()
    assert freqs.sha256 == hashlib.sha256(raw).hexdigest()
    # the digest reads values, not memory layout or byte order
    big_endian_f = np.asfortranarray(freqs.omega.astype(">f8"))
    assert frequencies_digest(big_endian_f, freqs.xi.astype(">f8")) == freqs.sha256


# --- an independent reference of the stream --------------------------------------------------


def _ref_key(seed: int, purpose: bytes) -> bytes:
    seed_bytes = seed.to_bytes(max(1, (seed.bit_length() + 7) // 8), "little")
    return (
        b"fedsketch/frequencies/v1"
        + len(purpose).to_bytes(8, "little")
        + purpose
        + len(seed_bytes).to_bytes(8, "little")
        + seed_bytes
    )


def _ref_words53(key: bytes, count: int) -> list[int]:
    raw = hashlib.shake_256(key).digest(8 * count)
    return [int.from_bytes(raw[8 * i : 8 * i + 8], "little") >> 11 for i in range(count)]


def _ref_normals(key: bytes, n: int) -> list[float]:
    """Marsaglia's polar method, one scalar candidate pair at a time, in Python floats."""
    words = _ref_words53(key, 2 * n + 64)  # 2n + 64 words: far more than the ~1.27n needed
    accepted = []
    for k1, k2 in zip(words[0::2], words[1::2], strict=True):
        u, v = (k1 - 2**52) * 2.0**-52, (k2 - 2**52) * 2.0**-52
        s = u * u + v * v
        if 0.0 < s < 1.0:
            accepted.append((u, v, s))
    logs = exactmath.log([s for _, _, s in accepted]).tolist()
    out = []
    for (u, v, s), log_s in zip(accepted, logs, strict=True):
        c = math.sqrt((-2.0 * log_s) / s)
        out += [u * c, v * c]
    assert len(out) >= n
    return out[:n]


def test_gaussian_law_matches_scalar_reference() -> None:
    """σ = 1: Ω is exactly the normal stream, d consecutive normals per column."""
    spec = FrequencySpec(d=3, m=4001, scale=1.0, law="gaussian", seed=2**64 + 9)
    freqs = draw_frequencies(spec)
    expected = _ref_normals(_ref_key(spec.seed, OMEGA_DIRECTIONS), spec.d * spec.m)
    assert freqs.omega.T.ravel().tolist() == expected
    dither = [2.0 * math.pi * (k * 2.0**-53) for k in _ref_words53(_ref_key(spec.seed, b"dither"),
                                                                     spec.m)]
    assert freqs.xi.tolist() == dither


def test_normals_do_not_depend_on_batching(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short batches (the stream extended many times) and tiny blocks give the same bits."""
    key = _ref_key(3, b"batching")
    expected = fq._standard_normals(key, 2001)
    monkeypatch.setattr(fq, "_POLAR_BATCH", 0.3)
    monkeypatch.setattr(fq, "_POLAR_BLOCK", 7)
    assert fq._standard_normals(key, 2001).tolist() == expected.tolist()
    for n in range(1, 60):
        assert fq._standard_normals(key, n).tolist() == expected[:n].tolist()


@pytest.mark.parametrize("law", LAWS)
def test_nested_in_m_and_independent_of_dither(law: str) -> None:
    big = draw_frequencies(FrequencySpec(d=4, m=500, scale=0.7, law=law, seed=11))
    small = draw_frequencies(FrequencySpec(d=4, m=37, scale=0.7, law=law, seed=11, dither=False))
    assert np.array_equal(big.omega[:, :37], small.omega)
    assert not small.xi.any()


def test_directions_shared_by_laws_and_scale_is_a_factor() -> None:
    omegas = [draw_frequencies(FrequencySpec(d=6, m=300, scale=2.0, law=law)).omega for law in LAWS]
    directions = [w / np.sqrt((w * w).sum(axis=0)) for w in omegas]
    for phi in directions[1:]:
        np.testing.assert_allclose(phi, directions[0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(
        directions[1], draw_directions(0, 6, 300, OMEGA_DIRECTIONS), rtol=0, atol=1e-15
    )
    unit = draw_frequencies(FrequencySpec(d=6, m=300, scale=1.0)).omega
    np.testing.assert_allclose(omegas[2] * 2.0, unit, rtol=1e-15)


# --- determinism and array contract ----------------------------------------------------------


def test_determinism_and_seed_sensitivity() -> None:
    spec = FrequencySpec(d=4, m=64, scale=1.0, seed=3)
    a, b = draw_frequencies(spec), draw_frequencies(FrequencySpec.from_dict(spec.to_dict()))
    assert a.omega.tobytes() == b.omega.tobytes() and a.xi.tobytes() == b.xi.tobytes()
    assert a.sha256 == b.sha256
    others = [FrequencySpec(d=4, m=64, scale=1.0, seed=s) for s in (4, 3 + 2**64)]
    for other in map(draw_frequencies, others):
        assert other.sha256 != a.sha256
        assert not np.any(other.omega == a.omega) and not np.any(other.xi == a.xi)


@pytest.mark.parametrize("law", LAWS)
def test_arrays_contract(law: str) -> None:
    freqs = draw_frequencies(FrequencySpec(d=3, m=2000, scale=0.5, law=law, seed=1))
    assert isinstance(freqs, Frequencies)
    for arr, shape in ((freqs.omega, (3, 2000)), (freqs.xi, (2000,))):
        assert arr.dtype == np.float64 and arr.shape == shape
        assert arr.flags.c_contiguous and not arr.flags.writeable
        assert np.all(np.isfinite(arr))
    with pytest.raises(ValueError, match="read-only"):
        freqs.omega[0, 0] = 0.0
    assert freqs.xi.min() >= 0.0 and freqs.xi.max() < 2 * math.pi


def test_directions_are_unit_columns() -> None:
    phi = draw_directions(1, 7, 1000, b"test")
    assert phi.shape == (7, 1000) and phi.flags.c_contiguous
    # rounding: one ulp per squared coordinate and per addition, d = 7
    np.testing.assert_allclose((phi * phi).sum(axis=0), 1.0, rtol=0, atol=14 * 2.0**-53)
    assert not np.array_equal(phi, draw_directions(1, 7, 1000, OMEGA_DIRECTIONS))
    assert np.array_equal(np.abs(draw_directions(2, 1, 50, b"test")), np.ones((1, 50)))


# --- statistical checks of the laws ----------------------------------------------------------

M_STAT = 20000


def _adapted_radius_cdf(r: np.ndarray) -> np.ndarray:
    """Closed form: ∫_0^R √(t² + t⁴/4) e^{−t²/2} dt = (e²/√2)·Γ(3/2)·(Q(3/2, 2) − Q(3/2, 2 + R²/2)),
    Q the regularized upper incomplete gamma (substitute w = 1 + t²/4, then 2w)."""
    return 1.0 - special.gammaincc(1.5, 2.0 + np.square(r) / 2.0) / special.gammaincc(1.5, 2.0)


def _adapted_radius_density(r: float) -> float:
    return math.sqrt(r * r + r**4 / 4) * math.exp(-r * r / 2)


def test_adapted_radius_constants_by_quadrature() -> None:
    """1/C = 1.21068, E R = 1.3514 (MECHANISMS §2.1); the closed-form CDF agrees with quad; the
    implementation's table has the same normalizer."""
    inv_c = integrate.quad(_adapted_radius_density, 0, np.inf)[0]
    mean = integrate.quad(lambda r: r * _adapted_radius_density(r), 0, np.inf)[0] / inv_c
    assert inv_c == pytest.approx(1.21068, abs=1e-5)
    assert mean == pytest.approx(1.3514, abs=1e-4)
    for r in (0.2, 1.0, 1.7, 3.0, 5.0):
        assert _adapted_radius_cdf(r) == pytest.approx(
            integrate.quad(_adapted_radius_density, 0, r)[0] / inv_c, abs=1e-12
        )
    _, _, table_total = fq._adapted_radius_table()
    assert table_total == pytest.approx(inv_c, rel=1e-6)


RADIUS_CDFS = {
    "gaussian": lambda r, d: stats.chi(d).cdf(r),
    "folded_gaussian": lambda r, d: stats.halfnorm.cdf(r),
    "adapted_radius": lambda r, d: _adapted_radius_cdf(r),
}


@pytest.mark.parametrize("d", [1, 3])
@pytest.mark.parametrize("law", LAWS)
def test_radius_law(law: str, d: int) -> None:
    """σ‖ω_j‖ follows the law's radius distribution, and is rejected by the other two laws."""
    if law == "gaussian" and d == 1:
        pytest.skip("χ_1 is the half-normal: the laws coincide")
    spec = FrequencySpec(d=d, m=M_STAT, scale=0.3, law=law, seed=d)
    omega = draw_frequencies(spec).omega
    radius = np.sqrt((omega * omega).sum(axis=0)) * spec.scale
    assert stats.kstest(radius, lambda r: RADIUS_CDFS[law](r, d)).pvalue > 1e-3
    same_at_d1 = {"gaussian", "folded_gaussian"}
    for other, cdf in RADIUS_CDFS.items():
        if other != law and not (d == 1 and {law, other} == same_at_d1):
            assert stats.kstest(radius, lambda r, cdf=cdf: cdf(r, d)).pvalue < 1e-8


def test_gaussian_law_coordinates_are_normal() -> None:
    spec = FrequencySpec(d=4, m=M_STAT // 4, scale=2.0, law="gaussian", seed=8)
    omega = draw_frequencies(spec).omega * spec.scale
    assert stats.kstest(omega.ravel(), "norm").pvalue > 1e-3
    cov = np.cov(omega)
    np.testing.assert_allclose(cov, np.eye(4), atol=0.05)


@pytest.mark.parametrize("d", [2, 3, 5])
def test_directions_uniform_on_sphere(d: int) -> None:
    """Mean 0, E[φφᵀ] = I/d, and each coordinate ~ 2·Beta((d−1)/2, (d−1)/2) − 1
    (arcsine law for d = 2, uniform on [−1, 1] for d = 3)."""
    phi = draw_directions(d, d, M_STAT, OMEGA_DIRECTIONS)
    np.testing.assert_allclose(phi.mean(axis=1), 0.0, atol=5 / math.sqrt(M_STAT * d))
    np.testing.assert_allclose(phi @ phi.T / M_STAT, np.eye(d) / d, atol=0.01)
    coordinate_law = stats.beta((d - 1) / 2, (d - 1) / 2, loc=-1, scale=2)
    for row in phi:
        assert stats.kstest(row, coordinate_law.cdf).pvalue > 1e-3
    if d != 3:  # the test has power: d = 2 and 5 are not uniform on [−1, 1]
        assert stats.kstest(phi[0], "uniform", args=(-1, 2)).pvalue < 1e-8


def test_dither_uniform() -> None:
    xi = draw_frequencies(FrequencySpec(d=2, m=M_STAT, scale=1.0, seed=4)).xi
    assert stats.kstest(xi, "uniform", args=(0, 2 * math.pi)).pvalue > 1e-3
    assert abs(np.corrcoef(xi[:-1], xi[1:])[0, 1]) < 5 / math.sqrt(M_STAT)


# --- exact log and exp -----------------------------------------------------------------------


def _ulp_error(value: float, exact: Decimal) -> float:
    return float(abs(Decimal(value) - exact) / Decimal(float(np.spacing(abs(float(exact))))))


def test_log_matches_numpy_on_a_wide_range() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            2.0 ** rng.uniform(-1074, 1024, 200_000),
            1.0 + rng.uniform(-0.3, 0.3, 50_000),
            1.0 + np.arange(-500, 500) * 2.0**-52,
            [5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 0.5, 1.0, 2.0],
        ]
    )
    mine, ref = exactmath.log(x), np.log(x)
    assert exactmath.log(1.0) == 0.0
    nonzero = ref != 0
    assert np.all(mine[~nonzero] == 0.0)
    assert np.max(np.abs(mine - ref)[nonzero] / np.abs(ref[nonzero])) < 1e-15


def test_exp_matches_numpy_on_its_domain() -> None:
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-708, 708, 200_000), rng.uniform(-1, 1, 50_000), [0.0, 708.0]])
    mine, ref = exactmath.exp(x), np.exp(x)
    assert exactmath.exp(0.0) == 1.0
    assert np.max(np.abs(mine - ref) / ref) < 1e-15


@given(st.floats(min_value=5e-324, max_value=1.7976931348623157e308))
def test_log_below_one_ulp(x: float) -> None:
    getcontext().prec = 40
    exact = Decimal(x).ln()
    if exact != 0:
        assert _ulp_error(float(exactmath.log(x)), exact) < 1.0


@given(st.floats(min_value=-708.0, max_value=708.0))
def test_exp_below_one_ulp(x: float) -> None:
    getcontext().prec = 40
    assert _ulp_error(float(exactmath.exp(x)), Decimal(x).exp()) < 1.0


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_log_domain(bad: float) -> None:
    with pytest.raises(ValueError, match="finite x > 0"):
        exactmath.log(np.array([1.0, bad]))


@pytest.mark.parametrize("bad", [709.0, -709.0, math.nan, math.inf])
def test_exp_domain(bad: float) -> None:
    with pytest.raises(ValueError, match=r"\|x\| <= 708"):
        exactmath.exp(np.array([0.0, bad]))


# --- spec validation and serialization -------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"d": 0}, r"d must be an integer >= 1, got 0"),
        ({"d": 2.0}, r"d must be an integer >= 1, got 2\.0"),
        ({"d": True}, r"d must be an integer >= 1, got True"),
        ({"m": 0}, r"m must be an integer >= 1, got 0"),
        ({"m": "10"}, r"m must be an integer >= 1, got '10'"),
        ({"scale": 0.0}, r"scale must be a finite number > 0 \(σ in data units\), got 0\.0"),
        ({"scale": -1.0}, r"scale must be a finite number > 0"),
        ({"scale": math.nan}, r"scale must be a finite number > 0 .*got nan"),
        ({"scale": math.inf}, r"scale must be a finite number > 0 .*got inf"),
        ({"scale": "1"}, r"scale must be a finite number > 0"),
        ({"law": "normal"}, r"unknown law 'normal'; choose one of gaussian, folded_gaussian, "
                            r"adapted_radius"),
        ({"seed": -1}, r"seed must be a non-negative integer, got -1"),
        ({"seed": 1.0}, r"seed must be a non-negative integer, got 1\.0"),
        ({"dither": "yes"}, r"dither must be a bool, got 'yes'"),
    ],
)
def test_spec_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FrequencySpec(**{"d": 2, "m": 10, "scale": 1.0, **kwargs})


def test_draw_directions_validation() -> None:
    with pytest.raises(ValueError, match="purpose must be non-empty bytes"):
        draw_directions(0, 2, 3, b"")
    with pytest.raises(ValueError, match="purpose must be non-empty bytes"):
        draw_directions(0, 2, 3, "omega-directions")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        draw_directions(-1, 2, 3, b"x")
    with pytest.raises(ValueError, match="m must be an integer >= 1"):
        draw_directions(0, 2, 0, b"x")


def test_dict_round_trip_through_json() -> None:
    spec = FrequencySpec(
        d=np.int64(7), m=np.int32(123), scale=np.float64(0.1), law="folded_gaussian",
        seed=2**80 + 1, dither=np.bool_(False),
    )
    data = json.loads(json.dumps(spec.to_dict()))
    assert data == {
        "d": 7, "m": 123, "scale": 0.1, "law": "folded_gaussian", "seed": 2**80 + 1,
        "dither": False,
    }
    back = FrequencySpec.from_dict(data)
    assert back == spec and hash(back) == hash(spec)
    assert type(back.d) is int and type(back.scale) is float and type(back.dither) is bool
    assert FrequencySpec(d=1, m=1, scale=2).scale == 2.0


def test_from_dict_rejects_missing_and_unknown_fields() -> None:
    data = FrequencySpec(d=2, m=3, scale=1.0).to_dict()
    with pytest.raises(ValueError, match=r"missing fields \['seed'\], unknown fields \[\]"):
        FrequencySpec.from_dict({k: v for k, v in data.items() if k != "seed"})
    with pytest.raises(ValueError, match=r"unknown fields \['sigma'\]"):
        FrequencySpec.from_dict({**data, "sigma": 1.0})
    with pytest.raises(ValueError, match="must be a dict"):
        FrequencySpec.from_dict([("d", 2)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown law"):
        FrequencySpec.from_dict({**data, "law": "Gaussian"})
