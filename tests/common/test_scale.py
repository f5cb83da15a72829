"""The private scale calibration: its public frequencies, the envelope fit, the noise it reports,
and the budget split of ``sketch --scale auto``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from typer.testing import CliRunner

from fedsketch.common.box import Box
from fedsketch.common.dp.calibration import dlap_variance, l1_sensitivity
from fedsketch.common.scale import (
    RHO_SIGMA_HI,
    RHO_SIGMA_LO,
    CalibrationSpec,
    calibrate_scale,
    calibration_frequencies,
    fit_scale,
)
from fedsketch.common.sketchfile import load_sketch
from fedsketch.server.bench.metrics import split
from fedsketch.server.cli.main import app

#: Seeded outcomes here depend on floating-point summation order (BLAS kernels): tests/test_blas_kernels.py
#: re-runs this module under each OpenBLAS kernel the CPU offers.
pytestmark = pytest.mark.blas



def test_calibration_frequencies_span_the_range():
    spec = CalibrationSpec(d=5, m0=64, sigma_lo=0.5, sigma_hi=20.0, seed=3)
    freqs = calibration_frequencies(spec)
    norms = np.sqrt((freqs.omega**2).sum(axis=0))
    np.testing.assert_allclose(norms, spec.radii(), rtol=1e-14)
    assert norms[0] == pytest.approx(RHO_SIGMA_LO / 20.0)
    assert norms[-1] == pytest.approx(RHO_SIGMA_HI / 0.5)
    np.testing.assert_allclose(np.diff(np.log(norms)), np.log(norms[1] / norms[0]), rtol=1e-9)
    assert not freqs.xi.any()
    again = calibration_frequencies(CalibrationSpec(d=5, m0=64, sigma_lo=0.5, sigma_hi=20.0, seed=3))
    assert again.omega.tobytes() == freqs.omega.tobytes()


@pytest.mark.parametrize("sigma", [0.2, 1.0, 3.7, 8.0])
def test_fit_recovers_the_envelope_scale(sigma):
    spec = CalibrationSpec(d=3)
    rho = spec.radii()
    sketch = np.exp(-0.5 * (rho * sigma) ** 2) / math.sqrt(spec.m0) * np.exp(1j * rho)
    assert fit_scale(sketch, 0.0, spec) == pytest.approx(sigma, rel=0.02)


def test_fit_debiases_the_noise_power():
    """Adding the expected noise power to every entry must not move σ̂."""
    spec = CalibrationSpec(d=3)
    rho = spec.radii()
    clean = np.exp(-0.5 * (rho * 2.0) ** 2)
    v = 1e-3  # noise power 2·m0·v = 0.128 on an envelope of 1
    inflated = np.sqrt(clean**2 + 2 * spec.m0 * v) / math.sqrt(spec.m0)
    assert fit_scale(inflated, v, spec) == pytest.approx(2.0, rel=0.02)
    assert fit_scale(inflated, 0.0, spec) < 1.8  # the noise floor in the tail reads as a slower decay


@pytest.mark.parametrize("sigma_c", [0.3, 1.0, 4.0])
def test_single_gaussian_blob_gives_its_standard_deviation(sigma_c):
    x = np.random.default_rng(0).normal(5.0, sigma_c, size=(200_000, 4)).astype(np.float32)
    out = calibrate_scale(lambda: split(x), Box(np.full(4, -45.0), np.full(4, 55.0)), math.inf, seed=1)
    assert out.sigma == pytest.approx(sigma_c, rel=0.1)
    assert out.noise_rms == 0.0 and out.reliable


def test_reported_noise_rms_matches_the_laplace_formula():
    x = np.random.default_rng(0).normal(0.0, 1.0, size=(50_000, 2)).astype(np.float32)
    out = calibrate_scale(lambda: split(x), Box.widest(2), 0.5, m0=32)
    # √(2·m0·v), v = DLap variance of the encoded sum (a = exp(−ε/(2·m0·κ))) / (γ·n·√m0)²: within
    # 0.2 % of the float mechanism's 2·c_f·m0/(nε) = 0.00724
    a = math.exp(-0.5 / l1_sensitivity("complex", 32, "replace_one"))
    expected = math.sqrt(2 * 32 * dlap_variance(a)) / (1024 * 50_000 * math.sqrt(32))
    assert expected == pytest.approx(2.0 * 2 * math.sqrt(2) * 32 / (50_000 * 0.5), rel=0.002)
    assert out.noise_rms == pytest.approx(expected, rel=1e-12)
    assert out.reliable == (expected <= 0.1)
    assert 0.1 <= out.sigma <= 10.0


def test_bad_calibration_specs():
    with pytest.raises(ValueError, match="m0"):
        CalibrationSpec(d=2, m0=4)
    with pytest.raises(ValueError, match="lo < hi"):
        CalibrationSpec(d=2, sigma_lo=2.0, sigma_hi=1.0)
    with pytest.raises(ValueError, match="finite"):
        fit_scale(np.full(64, np.nan), 0.0, CalibrationSpec(d=2))


def test_cli_scale_auto_splits_the_budget(tmp_path):
    x = np.random.default_rng(2).normal(0.0, 2.0, size=(100_000, 3)).astype(np.float32)
    data = tmp_path / "x.npy"
    np.save(data, x)
    out = tmp_path / "s.npz"
    res = CliRunner().invoke(app, ["sketch", str(data), "--m", "40", "--epsilon", "2",
                                   "--auto-fraction", "0.25", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    f = load_sketch(out)
    assert f.calibration["epsilon"] == pytest.approx(0.5)
    assert f.spec.privacy.epsilon == pytest.approx(1.5)
    assert f.calibration["epsilon"] + f.spec.privacy.epsilon == pytest.approx(2.0)
    assert f.epsilon_spent == pytest.approx(2.0)  # the file records ε_cal + ε_main
    assert f.spec.frequencies.scale == f.calibration["sigma"]
    assert f.calibration["sigma"] == pytest.approx(2.0, rel=0.2)
    assert "scale auto: σ =" in res.output
