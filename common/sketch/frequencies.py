"""Public random frequencies Ω and dither ξ of the sketch, bit-identical on every platform.

Math and units (DESIGN §3, MECHANISMS §2.1). Records x are in data units and σ = ``scale`` > 0 is
in data units. Column j of Ω ∈ R^{d×m} is

    ω_j = R_j·φ_j / σ        (1/data units),

φ_j uniform on the unit sphere S^{d−1} (dimensionless), R_j ≥ 0 a dimensionless radius drawn from
the law (``LAWS``):

* ``gaussian``:        ω_j ~ N(0, σ^{−2}·I_d), i.e. R_j ~ χ_d, drawn as ω_j = g_j/σ, g_j ~ N(0, I);
* ``folded_gaussian``: R_j ~ |N(0, 1)|;
* ``adapted_radius``:  p(R) = C·√(R² + R⁴/4)·e^{−R²/2} on R ≥ 0, 1/C = 1.21068, E R = 1.3514.

The dither is ξ_j ~ U[0, 2π) (radians), or ξ = 0 without dithering. The phases ωᵀx + ξ are in
radians.

Reproducibility. Ω and ξ are a pure function of the :class:`FrequencySpec` and must come out
bit-identical on every IEEE-754 platform and numpy version, because devices check
``Frequencies.sha256`` against the study spec before sketching. So no numpy ``Generator``
distribution method, no libm/numpy transcendental function and no reordered (pairwise or SIMD)
summation is on the path from the seed to Ω and ξ:

* raw bits: SHAKE-256 of a domain-separated key (seed, purpose), read as little-endian uint64
  words, each keeping its 53 high bits; a uniform on [0, 1) is k·2^−53 for a 53-bit integer k;
* normals: Marsaglia's polar method on exact uniforms of [−1, 1), with
  :func:`fedsketch.common.exactmath.log`; rejections are resolved in stream order, and a short batch
  is extended by reading a longer prefix of the same stream (SHAKE prefixes are consistent);
* directions: φ_j = g_j/‖g_j‖ with ‖g_j‖² accumulated sequentially over the d coordinates;
* ``adapted_radius``: inverse CDF, linear between the nodes of a trapezoid table of p on
  [0, 8] (8192 steps; :func:`fedsketch.common.exactmath.exp`, sequential cumulative sum);
* everything else is elementwise ``+ − × ÷ √``, comparisons and integer operations.

Streams: directions (purpose ``b"omega-directions"``) take the normals in order, d per column; the
radii and the dither take one word per column. Ω is therefore nested in m: the first m' columns
of Ω (and entries of ξ) for m > m' equal those drawn with m', everything else fixed. The directions
do not depend on the law, and no stream depends on σ (Ω scales as 1/σ up to rounding).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import numbers
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate

import numpy as np

from .. import exactmath
from ..choices import LAWS

#: Purpose of the direction stream of Ω; pass another purpose to :func:`draw_directions` for a set
#: of directions independent of every study's Ω.
OMEGA_DIRECTIONS = b"omega-directions"
_XOF_DOMAIN = b"fedsketch/frequencies/v1"
_PURPOSE_RADII = {
    "folded_gaussian": b"radii/folded_gaussian",
    "adapted_radius": b"radii/adapted_radius",
}
_PURPOSE_DITHER = b"dither"
_TWO_PI = 2.0 * math.pi  # rounded below 2π, and 2π·(1 − 2^−53) rounds below it: ξ < 2π
#: Polar method: a candidate pair is accepted with probability π/4; ask for 2 % more than expected.
_POLAR_BATCH = 1.02 * 4.0 / math.pi
_POLAR_BLOCK = 1 << 15  # candidate pairs per block (results do not depend on it)
#: adapted_radius table: nodes R_i = i·h, h = 2^−10, on [0, 8]; the mass beyond 8 is 4.4e-14.
AR_RADIUS_MAX = 8.0
AR_INTERVALS = 8192


@dataclass(frozen=True)
class FrequencySpec:
    """Public, hashable description of Ω ∈ R^{d×m} and ξ ∈ [0, 2π)^m (see the module docstring).

    ``scale`` is σ in data units (ω_j = R_j φ_j/σ), ``seed`` a public study seed (never a privacy
    noise seed), ``dither`` selects ξ ~ U[0, 2π) rather than ξ = 0. Integer-like and real-like
    values are normalized to int/float so that :meth:`to_dict` is JSON-ready.
    """

    d: int
    m: int
    scale: float
    law: str = "adapted_radius"
    seed: int = 0
    dither: bool = True

    def __post_init__(self) -> None:
        for name in ("d", "m"):
            object.__setattr__(self, name, _check_count(name, getattr(self, name)))
        scale = self.scale
        if not (_is_real(scale) and math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a finite number > 0 (σ in data units), got {scale!r}")
        object.__setattr__(self, "scale", float(scale))
        if not isinstance(self.law, str) or self.law not in LAWS:
            raise ValueError(f"unknown law {self.law!r}; choose one of {', '.join(LAWS)}")
        object.__setattr__(self, "seed", _check_seed(self.seed))
        if not isinstance(self.dither, (bool, np.bool_)):
            raise ValueError(f"dither must be a bool, got {self.dither!r}")
        object.__setattr__(self, "dither", bool(self.dither))

    def to_dict(self) -> dict[str, int | float | str | bool]:
        """JSON-ready dict of every field (float σ round-trips exactly through JSON)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> FrequencySpec:
        """Inverse of :meth:`to_dict`; ValueError on a missing, unknown or invalid field."""
        if not isinstance(data, dict):
            raise ValueError(f"a frequency spec must be a dict, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        missing, unknown = sorted(names - data.keys()), sorted(data.keys() - names, key=str)
        if missing or unknown:
            raise ValueError(f"frequency spec: missing fields {missing}, unknown fields {unknown}")
        return cls(**data)


@dataclass(frozen=True, eq=False)
class Frequencies:
    """Ω (``omega``, float64 (d, m), 1/data units) and ξ (``xi``, float64 (m,), radians in [0, 2π)).

    Both arrays are C-contiguous and read-only. ``sha256`` = :func:`frequencies_digest` (Ω, ξ), the
    value a device compares with the study spec before sketching.
    """

    spec: FrequencySpec
    omega: np.ndarray
    xi: np.ndarray
    sha256: str


#: Recently drawn frequency sets kept: a device checks Ω's hash and then sketches with the same
#: Ω, and the coordinator decodes with it, so each study's draw is made once per process.
FREQUENCY_CACHE = 8


@lru_cache(maxsize=FREQUENCY_CACHE)
def draw_frequencies(spec: FrequencySpec) -> Frequencies:
    """Draw Ω and ξ for ``spec``: a pure, platform-independent function of the spec (memoized;
    the arrays are read-only, so callers share them safely)."""
    if spec.law == "gaussian":
        omega = _normal_columns(spec.seed, spec.d, spec.m, OMEGA_DIRECTIONS) / spec.scale
    else:
        phi = draw_directions(spec.seed, spec.d, spec.m, OMEGA_DIRECTIONS)
        omega = phi * (_draw_radii(spec) / spec.scale)
    if spec.dither:
        xi = _TWO_PI * _uniforms(_xof_key(spec.seed, _PURPOSE_DITHER), spec.m)
    else:
        xi = np.zeros(spec.m)
    omega.flags.writeable = False
    xi.flags.writeable = False
    return Frequencies(spec, omega, xi, frequencies_digest(omega, xi))


def frequencies_digest(omega: np.ndarray, xi: np.ndarray) -> str:
    """Hex SHA-256 of Ω (little-endian float64, C order) followed by ξ (little-endian float64)."""
    h = hashlib.sha256(np.asarray(omega).astype("<f8").tobytes("C"))
    h.update(np.asarray(xi).astype("<f8").tobytes())
    return h.hexdigest()


def draw_directions(seed: int, d: int, m: int, purpose: bytes) -> np.ndarray:
    """m directions uniform on S^{d−1}, as the unit columns of a float64 (d, m) array.

    Deterministic and platform-independent (module docstring): φ_j = g_j/‖g_j‖ for the j-th block
    of d normals of the stream (seed, purpose). ``draw_frequencies`` uses ``OMEGA_DIRECTIONS``; any
    other non-empty ``purpose`` gives directions independent of Ω (e.g. for the calibration round).
    """
    seed, d, m = _check_seed(seed), _check_count("d", d), _check_count("m", m)
    if not isinstance(purpose, bytes) or not purpose:
        raise ValueError(f"purpose must be non-empty bytes, got {purpose!r}")
    g = _normal_columns(seed, d, m, purpose)
    norm2 = g[0] * g[0]
    for row in g[1:]:
        norm2 = norm2 + row * row
    return g / np.sqrt(norm2)


def _draw_radii(spec: FrequencySpec) -> np.ndarray:
    """R_1..R_m (dimensionless) for the ``folded_gaussian`` or ``adapted_radius`` law."""
    key = _xof_key(spec.seed, _PURPOSE_RADII[spec.law])
    if spec.law == "folded_gaussian":
        return np.abs(_standard_normals(key, spec.m))
    return _adapted_radius_quantile(_uniforms(key, spec.m))


def _adapted_radius_density(r: np.ndarray) -> np.ndarray:
    """Unnormalized adapted-radius density p(R)/C = √(R² + R⁴/4)·e^{−R²/2}, R ≤ 37."""
    r2 = r * r
    return np.sqrt(r2 + (r2 * r2) * 0.25) * exactmath.exp(-0.5 * r2)


@lru_cache(maxsize=1)
def _adapted_radius_table() -> tuple[np.ndarray, np.ndarray, float]:
    """Nodes R_i = i·h of [0, 8], the CDF F(R_i) (F(0) = 0, F(8) = 1), and ∫_0^8 p/C ≈ 1/C.

    Trapezoid rule, summed sequentially (CDF error ~1e-7, far below sampling resolution).
    """
    h = AR_RADIUS_MAX / AR_INTERVALS
    nodes = np.arange(AR_INTERVALS + 1) * h  # exact: small integers times a power of two
    p = _adapted_radius_density(nodes)
    steps = (p[:-1] + p[1:]) * (0.5 * h)
    cumulative = np.array([0.0, *accumulate(steps.tolist())])
    total = float(cumulative[-1])
    cdf = cumulative / total
    nodes.flags.writeable = False
    cdf.flags.writeable = False
    return nodes, cdf, total


def _adapted_radius_quantile(u: np.ndarray) -> np.ndarray:
    """F^{−1}(u) for u ∈ [0, 1), linear between the table nodes."""
    nodes, cdf, _ = _adapted_radius_table()
    i = np.searchsorted(cdf, u, side="right")  # cdf[i−1] ≤ u < cdf[i], so cdf[i] > cdf[i−1]
    lo = cdf[i - 1]
    return nodes[i - 1] + ((u - lo) / (cdf[i] - lo)) * (AR_RADIUS_MAX / AR_INTERVALS)


def _xof_key(seed: int, purpose: bytes) -> bytes:
    """Unambiguous encoding of (domain, purpose, seed): length-prefixed fields, little-endian."""
    seed_bytes = seed.to_bytes(max(1, (seed.bit_length() + 7) // 8), "little")
    return b"".join(
        (
            _XOF_DOMAIN,
            len(purpose).to_bytes(8, "little"),
            purpose,
            len(seed_bytes).to_bytes(8, "little"),
            seed_bytes,
        )
    )


def _stream(key: bytes, words: int) -> np.ndarray:
    """The first ``words`` little-endian uint64 words of the SHAKE-256 stream of ``key``."""
    return np.frombuffer(hashlib.shake_256(key).digest(8 * words), dtype="<u8")


def _uniforms(key: bytes, n: int) -> np.ndarray:
    """n uniforms k·2^−53 on [0, 1), k the 53 high bits of each word (exact conversions)."""
    return (_stream(key, n) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _standard_normals(key: bytes, n: int) -> np.ndarray:
    """The first n N(0, 1) variates of the stream of ``key`` (Marsaglia's polar method).

    Candidate pair i reads words 2i, 2i+1 as u, v = (k − 2^52)·2^−52 ∈ [−1, 1), k their 53 high
    bits (exact); it is accepted iff 0 < s = u² + v² < 1 and then gives u·c, v·c with
    c = √(−2 ln s / s). Accepted pairs are used in stream order, so the output for n is a prefix of
    the output for any larger n. Work is done in cache-sized blocks of candidate pairs.
    """
    need = (n + 1) // 2
    z = np.empty(2 * need)
    have = pairs = 0
    while have < need:
        more = math.ceil((need - have) * _POLAR_BATCH)
        words = _stream(key, 2 * (pairs + more))
        for start in range(2 * pairs, len(words), 2 * _POLAR_BLOCK):
            k = (words[start : start + 2 * _POLAR_BLOCK] >> np.uint64(11)).astype(np.int64) - 2**52
            u = k[0::2] * 2.0**-52
            v = k[1::2] * 2.0**-52
            s = u * u + v * v
            ok = np.flatnonzero((s > 0.0) & (s < 1.0))[: need - have]
            u, v, s = u[ok], v[ok], s[ok]
            c = np.sqrt((-2.0 * exactmath.log(s)) / s)
            z[2 * have : 2 * (have + len(ok)) : 2] = u * c
            z[2 * have + 1 : 2 * (have + len(ok)) : 2] = v * c
            have += len(ok)
            if have == need:
                break
        pairs += more
    return z[:n]


def _normal_columns(seed: int, d: int, m: int, purpose: bytes) -> np.ndarray:
    """Float64 (d, m), C-contiguous: column j holds normals j·d .. j·d + d − 1 of the stream."""
    z = _standard_normals(_xof_key(seed, purpose), d * m)
    return np.ascontiguousarray(z.reshape(m, d).T)


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _check_count(name: str, value: object) -> int:
    if not (_is_int(value) and value >= 1):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _check_seed(seed: object) -> int:
    if not (_is_int(seed) and seed >= 0):
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)
