"""Refinement rounds of a federated study: private Lloyd steps across devices after the sketch.

A study may declare T refinement rounds (:class:`RefineSpec`, part of its hashed spec): after
the sketch round is decoded into a start C_0, round t = 1..T publishes centres C_{t−1} (K × d,
data units) in a round study of its own (:class:`RoundSpec`, ``fedsketch.round/2``), and every
device on that round's roster releases, once, for its records clipped into the study's public
box (half-widths h_l), each in the cell of its nearest centre c_j:

    N~_j = N_j + DLap(ε_count/f)          records in the cell of centre j  (sensitivity 1)
    T~_jl = Σ_{i ∈ j} rint(clip(x_il − c_jl, −r_l, r_l)/g_l) + DLap(ε_dim/f)   steps (sensitivity STEPS)

with r_l = ρ·h_l the study's public radius (ρ = :attr:`RefineSpec.radius`, a fraction fixed in
the spec, not read from data) and g_l = r_l/STEPS: each record's offset from its centre, clipped.
The noise of a mean offset, in data units, scales with r, not with the box; clipping only biases
records farther than r from their centre (the coordinator's step toward them is shorter).

with (ε_count, ε_dim) Su et al.'s split of the round's ε_t (:func:`round_split`,
:func:`~fedsketch.common.dp.lloyd.su_split`) and f the relation factor (2 under replace-one: a
replaced record leaves one cell and joins another). The cells partition the device's records, so
the release is ε_t-DP for its records (MECHANISMS §5.1, §6.2); the study's rounds compose
sequentially with its sketch, so a device that takes part in all of them spends the study's
:meth:`~fedsketch.common.study.study.StudySpec.total_epsilon`. The coordinator's next centres are
post-processing of the summed releases.

The payload (``Contribution.int64_cells``) is the K counts then the K·d sums (row-major),
little-endian int64; the contribution's record count is Σ_j N~_j (post-processing: under
add/remove the true count stays private). :func:`check_cells` refuses what the mechanism cannot
produce.

Units: centres and the box in data units; counts in records; sums in grid steps; ε
dimensionless; seconds for the round window.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np

from ..choices import ROUND_RADIUS, ROUND_SECONDS, ROUND_SHARE
from ..dp.calibration import dlap_param, noise_radius
from ..dp.grid import STEPS
from ..dp.lloyd import add_cell_noise, exact_cell_stats, relation_factor, su_split
from ..secagg import MAX_BITS, modulus_bits
from ..sketch.box import Box, Tally
from ..sketch.spec import canonical_json
from ..spec_fields import integer, json_type, number, numbers, optional_number, text

#: Written and read: the spec of one refinement round.
ROUND_FORMAT = "fedsketch.round/2"
#: The payload kind of a round release (``Contribution.int64_cells``).
CELLS_KIND = "int64_cells"
#: Most refinement rounds a study may declare, and most centres one round may publish.
MAX_ROUNDS = 20
MAX_CENTRES = 4096
#: Largest radius fraction ρ: offsets within the box never exceed twice its half-widths.
MAX_RADIUS = 2.0


class CellsError(ValueError):
    """A round payload the round's mechanism cannot have produced, or a malformed one."""


@dataclass(frozen=True)
class RefineSpec:
    """The refinement rounds a study declares: ``epsilon`` the ε of each round in order (T =
    its length, each finite and > 0), ``round_seconds`` how long each round collects at most,
    ``radius`` ρ in (0, MAX_RADIUS]: each offset coordinate l is clipped to ±ρ·h_l (module
    docstring)."""

    epsilon: tuple[float, ...]
    round_seconds: float = ROUND_SECONDS
    radius: float = ROUND_RADIUS

    def __post_init__(self) -> None:
        eps = tuple(float(e) for e in self.epsilon)
        if not 1 <= len(eps) <= MAX_ROUNDS:
            raise ValueError(f"a study declares 1 to {MAX_ROUNDS} refinement rounds, got {len(eps)}")
        if not all(math.isfinite(e) and e > 0 for e in eps):
            raise ValueError(f"each refinement round needs a finite ε > 0, got {list(eps)}")
        if not (isinstance(self.round_seconds, (int, float)) and math.isfinite(self.round_seconds)
                and self.round_seconds > 0):
            raise ValueError(f"round_seconds must be finite and > 0, got {self.round_seconds!r}")
        check_radius(self.radius)
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "round_seconds", float(self.round_seconds))
        object.__setattr__(self, "radius", float(self.radius))

    @property
    def rounds(self) -> int:
        """T."""
        return len(self.epsilon)

    @property
    def total(self) -> float:
        """Σ_t ε_t (sequential composition over the rounds)."""
        return math.fsum(self.epsilon)

    @classmethod
    def split(cls, epsilon: float, rounds: int, round_seconds: float = ROUND_SECONDS) -> RefineSpec:
        """``rounds`` rounds sharing ``epsilon`` equally."""
        return cls((epsilon / rounds,) * rounds, round_seconds)

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"epsilon": list(self.epsilon), "round_seconds": self.round_seconds,
                "radius": self.radius}

    @classmethod
    def from_dict(cls, data: dict) -> RefineSpec:
        """Parse; ValueError or TypeError for anything malformed, a field of another JSON type
        than its own included (:mod:`~.spec_fields`). A spec written before the radius was
        declared reads as ρ = 1 (offsets clipped to the box's half-widths)."""
        if not isinstance(data, dict) or "epsilon" not in data:
            raise ValueError("refine must be an object with an epsilon list")
        return cls(numbers(data["epsilon"], "refine.epsilon"),
                   number(data.get("round_seconds", ROUND_SECONDS), "refine.round_seconds"),
                   number(data.get("radius", 1.0), "refine.radius"))


def check_radius(radius: object) -> None:
    """ValueError unless ``radius`` is a number in (0, MAX_RADIUS]."""
    if not (isinstance(radius, (int, float)) and not isinstance(radius, bool)
            and 0 < radius <= MAX_RADIUS):
        raise ValueError(f"the rounds' radius must be a fraction of the box's half-widths in "
                         f"(0, {MAX_RADIUS:g}], got {radius!r}")


def split_study_epsilon(epsilon: float, rounds: int, share: float = ROUND_SHARE,
                        round_seconds: float = ROUND_SECONDS) -> tuple[float, RefineSpec | None]:
    """(the sketch's ε, the refinement) of a study whose devices spend ``epsilon`` in all: with
    ``rounds`` = 0 the sketch takes it all; otherwise the rounds take ``share`` of it in equal
    parts and the sketch the rest. ValueError for rounds < 0 or a share outside (0, 1)."""
    if type(rounds) is not int or rounds < 0:
        raise ValueError(f"rounds must be an integer >= 0, got {rounds!r}")
    if rounds and not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"a study with refinement rounds needs a finite epsilon > 0, got {epsilon!r}")
    if rounds == 0:
        return epsilon, None
    if not 0 < share < 1:
        raise ValueError(f"the rounds' share of ε must be in (0, 1), got {share!r}")
    return (1 - share) * epsilon, RefineSpec.split(share * epsilon, rounds, round_seconds)


def round_split(epsilon: float, neighbouring: str, d: int) -> tuple[float, float]:
    """(ε_count, ε_dim): the add/remove ε of a round's noisy counts and of each coordinate sum,
    Su's split of ε_t/f (module docstring); ε_count + d·ε_dim = ε_t/f."""
    return su_split(epsilon / relation_factor(neighbouring), d)


@dataclass(frozen=True)
class RoundSpec:
    """Round ``round`` (1..T) of the study ``parent_id`` whose spec hashes to ``parent_sha256``:
    the centres (K, d) it publishes (data units), its quorum and deadline (Unix seconds; None
    under secure aggregation, which runs by stage timeouts), on round 1 the sketch round's public
    result (``start``: what the study's result reports of it), the study's secure
    aggregation as its spec states it (a dict; None for a plain study): a secure study's rounds
    are collected securely too (:mod:`fedsketch.common.study.secure_rounds`), and the study's radius
    fraction ρ (:class:`RefineSpec`), so that a device computes its cells from the round alone."""

    parent_id: str
    parent_sha256: str
    round: int
    centroids: tuple[tuple[float, ...], ...]
    min_devices: int
    deadline: float | None
    start: dict | None = None
    secure_aggregation: dict | None = None
    radius: float = ROUND_RADIUS

    def __post_init__(self) -> None:
        check_radius(self.radius)
        cents = tuple(tuple(float(v) for v in row) for row in self.centroids)
        if not 1 <= len(cents) <= MAX_CENTRES or len({len(row) for row in cents}) != 1:
            raise ValueError(f"a round publishes 1 to {MAX_CENTRES} centres of one dimension")
        if not all(math.isfinite(v) for row in cents for v in row):
            raise ValueError("a round's centres must be finite")
        if type(self.round) is not int or not 1 <= self.round <= MAX_ROUNDS:
            raise ValueError(f"round must be an integer in 1..{MAX_ROUNDS}, got {self.round!r}")
        if type(self.min_devices) is not int or self.min_devices < 1:
            raise ValueError(f"min_devices must be an integer >= 1, got {self.min_devices!r}")
        if self.deadline is not None and not math.isfinite(self.deadline):
            raise ValueError("the deadline must be a finite Unix time")
        if len(self.parent_sha256) != 64 or not self.parent_id:
            raise ValueError("a round names its study and that study's spec hash")
        object.__setattr__(self, "centroids", cents)
        object.__setattr__(self, "radius", float(self.radius))

    @property
    def shape(self) -> tuple[int, int]:
        """(K, d)."""
        return len(self.centroids), len(self.centroids[0])

    def epsilon(self, parent) -> float:
        """ε_t: what this round of ``parent`` (its :class:`~fedsketch.common.study.study.StudySpec`)
        costs a device."""
        return parent.refine.epsilon[self.round - 1]

    def split(self, parent) -> tuple[float, float]:
        """(ε_count, ε_dim) of this round's release: :func:`round_split` of ε_t under the study's
        neighbouring relation."""
        return round_split(self.epsilon(parent), parent.sketch.privacy.neighbouring,
                           self.shape[1])

    def check_parent(self, parent) -> None:
        """ValueError unless this round fits ``parent`` (a
        :class:`~fedsketch.common.study.study.StudySpec`): the study declares this round, the centres
        have its d and lie in its box, and the quorum and radius are the study's. A device checks it before
        it registers; the centres themselves are the coordinator's choice (any public centres
        give the same privacy)."""
        if parent.refine is None or self.round > parent.refine.rounds:
            declared = 0 if parent.refine is None else parent.refine.rounds
            raise ValueError(f"the study declares {declared} refinement rounds; this is round "
                             f"{self.round}")
        if self.shape[1] != parent.sketch.frequencies.d:
            raise ValueError(f"the round's centres have d = {self.shape[1]}, the study "
                             f"{parent.sketch.frequencies.d}")
        c = np.array(self.centroids)
        if np.any(c < np.array(parent.lo)) or np.any(c > np.array(parent.hi)):
            raise ValueError("the round's centres leave the study's box")
        if self.min_devices != parent.min_devices:
            raise ValueError(f"the round asks a quorum of {self.min_devices}, the study "
                             f"{parent.min_devices}")
        if self.radius != parent.refine.radius:
            raise ValueError(f"the round's radius is {self.radius:g}, the study's "
                             f"{parent.refine.radius:g}")
        secure = None if parent.secure_aggregation is None else asdict(parent.secure_aggregation)
        if self.secure_aggregation != secure:
            raise ValueError("the round's secure aggregation is not the study's")

    def to_json(self) -> str:
        """The canonical JSON that travels and is hashed."""
        return canonical_json({"format": ROUND_FORMAT, "parent_id": self.parent_id,
                               "parent_sha256": self.parent_sha256, "round": self.round,
                               "centroids": [list(r) for r in self.centroids],
                               "min_devices": self.min_devices, "deadline": self.deadline,
                               "start": self.start,
                               "secure_aggregation": self.secure_aggregation,
                               "radius": self.radius})

    @classmethod
    def from_json(cls, spec_json: str) -> RoundSpec:
        """Parse and validate; ValueError with the reason on anything malformed, a field of
        another JSON type than its own included (:mod:`~.spec_fields`)."""
        try:
            data = json.loads(spec_json)
            if not isinstance(data, dict) or data.get("format") != ROUND_FORMAT:
                found = data.get("format") if isinstance(data, dict) else None
                raise ValueError(f"a round spec must be a {ROUND_FORMAT} object, got {found!r}"
                                 + (" (an earlier release's rounds, whose sums this release no "
                                    "longer computes)" if found == "fedsketch.round/1" else ""))
            start, secure = data.get("start"), data.get("secure_aggregation")
            if any(v is not None and not isinstance(v, dict) for v in (start, secure)):
                raise ValueError("a round's start and secure aggregation must be objects")
            centres = data["centroids"]
            if type(centres) is not list:
                raise ValueError(f"centroids must be an array of centres, got {json_type(centres)}")
            return cls(text(data["parent_id"], "parent_id"), text(data["parent_sha256"], "parent_sha256"),
                       integer(data["round"], "round"),
                       tuple(numbers(c, f"centroids[{j}]") for j, c in enumerate(centres)),
                       integer(data["min_devices"], "min_devices"),
                       optional_number(data["deadline"], "deadline"), start, secure,
                       number(data["radius"], "radius"))
        except (KeyError, TypeError, OverflowError, json.JSONDecodeError, RecursionError) as exc:
            # RecursionError: JSON nested deeper than the interpreter's stack
            raise ValueError(f"incomplete or malformed round spec: {exc!r}") from None


def cells_bits(max_records: int, split: tuple[float, float], k: int, d: int,
               shape: float) -> int:
    """Bits of the secure-aggregation modulus for a round's summed cells (MECHANISMS §4.4): the
    largest of the counts' (|Σ N| ≤ max_records, DLap(ε_count) shares) and the sums' (|Σ T| ≤
    STEPS·max_records, DLap(ε_dim/STEPS) shares), K counts and K·d sums, noise shape ``shape``.
    ValueError with the reason past the 62 bits a masked word holds."""
    eps_count, eps_dim = split
    bits = max(modulus_bits(max_records, dlap_param(eps_count, 1.0), k, shape),
               modulus_bits(STEPS * max_records, dlap_param(eps_dim, float(STEPS)), k * d, shape))
    if bits > MAX_BITS:
        raise ValueError(f"secure aggregation of a refinement round needs a {bits}-bit modulus "
                         f"({max_records} records of {STEPS} steps per sum) but a masked word "
                         f"holds {MAX_BITS}: lower max_records")
    return bits


def is_round(spec_json: str) -> bool:
    """Whether a spec's JSON is a round's, of this release's format or an earlier one (cheap: no
    validation; :meth:`RoundSpec.from_json` refuses an earlier one with the reason)."""
    return '"format":"fedsketch.round/' in spec_json


def round_cells(box: Box, rnd: RoundSpec, chunks: Iterable[np.ndarray],
                tally: Tally | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """The exact statistics of the round's cells for records streamed in ``chunks``, clipped
    into the study's ``box``: (N (K,) records, T (K, d) grid steps of g_l = r_l/STEPS, records
    read), :func:`~fedsketch.common.dp.lloyd.exact_cell_stats` of the offsets from the round's
    centres clipped to the radius r = ρ·h (module docstring)."""
    return exact_cell_stats(box.centred(chunks, tally), np.array(rnd.centroids) - box.center,
                            rnd.radius * box.half, relative=True)


def release_cells(parent, rnd: RoundSpec, chunks: Iterable[np.ndarray],
                  tally: Tally | None = None) -> tuple[int, bytes]:
    """One device's round release (module docstring) for records streamed in ``chunks``:
    (n = Σ_j N~_j, payload bytes). Exact noise from OS random bits."""
    counts, sums, _ = round_cells(Box(parent.lo, parent.hi), rnd, chunks, tally)
    eps_count, eps_dim = rnd.split(parent)
    noisy_counts, noisy_sums = add_cell_noise(counts, sums, eps_count,
                                              np.full(rnd.shape[1], eps_dim))
    return int(noisy_counts.sum()), encode_cells(noisy_counts, noisy_sums)


def encode_cells(counts: np.ndarray, sums: np.ndarray) -> bytes:
    """The payload of (N~ (K,), T~ (K, d)): K counts then K·d sums, little-endian int64."""
    return np.concatenate([counts.ravel(), sums.ravel()]).astype("<i8").tobytes()


def decode_cells(data: bytes, k: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """(N~ (K,), T~ (K, d)) int64 of a payload; CellsError for the wrong length."""
    expected = 8 * k * (d + 1)
    if len(data) != expected:
        raise CellsError(f"payload has {len(data)} bytes, the round needs 8·K·(d + 1) = {expected}")
    values = np.frombuffer(data, dtype="<i8").astype(np.int64)
    return values[:k], values[k:].reshape(k, d)


def noise_radii(parent, rnd: RoundSpec) -> tuple[int, int]:
    """(count radius, sum radius): the DLap noise of a round's counts and of its sums stays within
    them but for a probability below 2^−40 (:func:`~fedsketch.common.dp.calibration.noise_radius`)."""
    k, d = rnd.shape
    eps_count, eps_dim = rnd.split(parent)
    return (noise_radius(dlap_param(eps_count, 1.0), k),
            noise_radius(dlap_param(eps_dim, float(STEPS)), k * d))


def check_cells(parent, rnd: RoundSpec, kind: str | None, data: bytes,
                n: float) -> tuple[np.ndarray, np.ndarray]:
    """Decode and validate one device's round release; CellsError with the reason unless the
    mechanism can have produced it from at most N = ``parent.device_cap`` records (a device
    with more takes no part), r_c and r_s the count's and sum's noise radii: n = Σ_j N~_j
    (summed exactly), an integer of at most N + K(r_c + 1); each N~_j in −(r_c + 1) ..
    N + r_c + 1; and each sum |T~_jl| ≤ STEPS·min(max(N~_j + r_c + 1, 0), N) + r_s + 1, since
    cell j holds at most N~_j + r_c + 1 (and at most N) records of at most STEPS steps each."""
    if kind != CELLS_KIND:
        raise CellsError(f"a refinement round's release travels as {CELLS_KIND}, got {kind}")
    k, d = rnd.shape
    counts, sums = decode_cells(data, k, d)
    if not (math.isfinite(n) and n == int(n)):
        raise CellsError(f"the record count must be an integer, got {n}")
    if sum(int(c) for c in counts) != int(n):  # Python integers: an int64 sum could wrap
        raise CellsError(f"the record count {n:g} is not the sum of the cell counts")
    r_count, r_sum = noise_radii(parent, rnd)
    cap = parent.device_cap
    if int(counts.min()) < -(r_count + 1):
        raise CellsError(f"cell count {int(counts.min())} is below {-(r_count + 1)}, the lowest "
                         "the round's mechanism can release")
    if int(counts.max()) > cap + r_count + 1 or n > cap + k * (r_count + 1):
        raise CellsError(f"the cell counts (max {int(counts.max())}, total {n:g}) exceed what the "
                         f"round's mechanism can release for at most {cap:,} records, the "
                         "study's max_device_records")
    for j in range(k):
        bound = STEPS * min(max(int(counts[j]) + r_count + 1, 0), cap) + r_sum + 1
        worst = max(int(sums[j].max()), -int(sums[j].min()))
        if worst > bound:
            raise CellsError(f"cell {j}'s sum {worst} exceeds {bound}, the largest the round's "
                             "mechanism can release with its count")
    return counts, sums
