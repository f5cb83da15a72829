"""The public specification of a federated study, shared verbatim by coordinator and devices.

A :class:`StudySpec` fixes everything a device needs to compute its release (the sketch spec:
frequencies, feature map, r, privacy budget) and everything the coordinator needs to decode
(k, the public box [lo, hi]^d in data units, replicates, the decoder's seed), plus the round's
rules (minimum devices, minimum records per device, deadline in Unix seconds). Its canonical
JSON (sorted keys, compact) is what travels; ``sha256`` of those UTF-8 bytes is the spec hash a
device checks before it spends any budget, and ``omega_sha256`` is the SHA-256 of Ω‖ξ that it
recomputes from the frequency spec.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass

from .dp.plan import integer_sum_term
from .features import GRID
from .frequencies import draw_frequencies
from .secagg import check_capacity
from .spec import SketchSpec, canonical_json

#: Written by this code. Version 2 means "plain studies fill a roster first": a device of the
#: first release, which would spend as soon as it saw an open study, refuses a /2 spec as
#: unreadable instead of spending on a study that would refuse its contribution.
FORMAT = "fedsketch.study/2"
#: Also read: studies stored before rosters (their contributors joined the rosters when the
#: store was migrated).
READ_FORMATS = ("fedsketch.study/1", FORMAT)


@dataclass(frozen=True)
class SecAggSpec:
    """Secure aggregation of a study (MECHANISMS §4; DESIGN §4).

    ``threshold`` t of Shamir sharing (and the fewest devices a stage may proceed with);
    ``min_honest`` h_min, the guaranteed minimum number of honest devices that submit: each
    device adds NB(1/h_min, 1−a) − NB(1/h_min, 1−a) to its integer sum so that any h_min of them
    carry one DLap(a) between them; ``max_records`` a public bound on the total record count N
    (it sizes the modulus); ``degree`` the neighbours of each device in the SecAgg+ graph (None:
    every device shares with every other); ``stage_timeout`` seconds after which a stage
    proceeds without the devices that did not answer.
    """

    threshold: int
    min_honest: int
    max_records: int
    degree: int | None = None
    stage_timeout: float = 30.0

    def __post_init__(self) -> None:
        for name in ("threshold", "min_honest", "max_records"):
            if getattr(self, name) < 1:
                raise ValueError(f"secure aggregation: {name} must be >= 1")
        if self.degree is not None and self.degree < 1:
            raise ValueError("secure aggregation: degree must be >= 1")
        if not (math.isfinite(self.stage_timeout) and self.stage_timeout > 0):
            raise ValueError("secure aggregation: stage_timeout must be > 0 seconds")


@dataclass(frozen=True)
class StudySpec:
    """One study: the sketch every device releases and how the coordinator decodes the average."""

    name: str
    sketch: SketchSpec
    omega_sha256: str
    k: int
    lo: tuple[float, ...]
    hi: tuple[float, ...]
    min_devices: int = 1
    min_records: int = 1
    deadline: float | None = None
    replicates: int = 3
    decode_seed: int = 0
    secure_aggregation: SecAggSpec | None = None

    def __post_init__(self) -> None:
        d, m = self.sketch.frequencies.d, self.sketch.frequencies.m
        if self.secure_aggregation is not None:
            self._check_secure_aggregation()
        if not self.name or len(self.name) > 200:
            raise ValueError("a study needs a name of 1 to 200 characters")
        if not math.isfinite(self.sketch.privacy.epsilon):
            raise ValueError("a federated study needs a finite epsilon: devices never release "
                             "a noiseless sketch")
        if not 1 <= self.k <= m:
            raise ValueError(f"k must be in 1..m = 1..{m}, got {self.k}")
        object.__setattr__(self, "lo", tuple(float(v) for v in self.lo))
        object.__setattr__(self, "hi", tuple(float(v) for v in self.hi))
        if len(self.lo) != d or len(self.hi) != d:
            raise ValueError(f"bounds need {d} values each, got {len(self.lo)} and {len(self.hi)}")
        if not all(math.isfinite(a) and math.isfinite(b) and a < b for a, b in zip(self.lo, self.hi,
                                                                                    strict=True)):
            raise ValueError("bounds need finite lo < hi on every axis")
        for name in ("min_devices", "min_records", "replicates"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.deadline is not None and not math.isfinite(self.deadline):
            raise ValueError("the deadline must be a finite Unix time")
        if len(self.omega_sha256) != 64:
            raise ValueError("omega_sha256 must be a hex SHA-256")

    def check_new(self) -> None:
        """Rules for a study being created (older stored studies stay readable): ValueError if
        its name holds a control character (devices show it to their owners), or if it asks
        for ``min_records`` > 1 under add/remove, where n is private: whether a device takes
        part would then be a deterministic function of its n (datasets of min_records − 1 and
        min_records records would be told apart), so devices ignore the rule there."""
        if not self.name.isprintable():
            raise ValueError("a study's name must not hold control characters")
        if self.sketch.privacy.neighbouring == "add_remove" and self.min_records > 1:
            raise ValueError("min_records applies under replace-one only: under add/remove a "
                             "device's record count is private, and refusing by it would reveal it")

    def _check_secure_aggregation(self) -> None:
        """Refuse a secure-aggregation study that cannot work, with the reason."""
        sa = self.secure_aggregation
        if self.sketch.privacy.neighbouring != "replace_one" or self.sketch.privacy.delta > 0:
            raise ValueError("secure aggregation supports replace-one, pure ε (n public)")
        if sa.threshold > self.min_devices or sa.min_honest > self.min_devices:
            raise ValueError("secure aggregation: threshold and min_honest cannot exceed "
                             "min_devices (the roster size)")
        if self.deadline is not None:
            raise ValueError("secure aggregation runs by stage timeouts, not a deadline")
        if sa.degree is not None and sa.threshold > sa.degree + 1:
            raise ValueError(f"secure aggregation: threshold {sa.threshold} exceeds a "
                             f"neighbourhood of degree {sa.degree} plus the device itself")
        check_capacity(self.sum_bound(), self.noise_param(), 2 * self.sketch.frequencies.m,
                       shape=self.min_devices / sa.min_honest)

    def sum_bound(self) -> int:
        """γ·max_records: the largest |entry| of the devices' summed encoded sketches (grid steps)."""
        return GRID[self.sketch.feature] * self.secure_aggregation.max_records

    def noise_param(self) -> float:
        """a = exp(−ε/Δ1), Δ1 = 2rκ: the DLap parameter of the integer sum (MECHANISMS §1.5, §1.10).

        The scale of :func:`~fedsketch.common.dp.plan.integer_sum_term` (replace-one), the noise
        the devices' shares add up to under secure aggregation (§4.2).
        """
        return integer_sum_term(self.sketch.feature, self.sketch.privacy.epsilon, self.sketch.r,
                                "replace_one").scale

    @classmethod
    def create(cls, name: str, sketch: SketchSpec, k: int, lo, hi, **rules) -> StudySpec:
        """A spec whose ``omega_sha256`` is computed from ``sketch.frequencies``."""
        return cls(name, sketch, draw_frequencies(sketch.frequencies).sha256, k, tuple(lo),
                   tuple(hi), **rules)

    def to_dict(self) -> dict:
        """JSON-ready dict (with a ``format`` tag)."""
        return {
            "format": FORMAT,
            "name": self.name,
            "sketch": self.sketch.to_dict(),
            "omega_sha256": self.omega_sha256,
            "k": self.k,
            "lo": list(self.lo),
            "hi": list(self.hi),
            "min_devices": self.min_devices,
            "min_records": self.min_records,
            "deadline": self.deadline,
            "replicates": self.replicates,
            "decode_seed": self.decode_seed,
            "secure_aggregation": (None if self.secure_aggregation is None
                                   else asdict(self.secure_aggregation)),
        }

    def to_json(self) -> str:
        """The canonical JSON that travels and is hashed."""
        return canonical_json(self.to_dict())

    def sha256(self) -> str:
        """Hex SHA-256 of :meth:`to_json` (UTF-8)."""
        return spec_sha256(self.to_json())

    @classmethod
    def from_json(cls, text: str) -> StudySpec:
        """Parse and validate; ValueError with the reason on anything malformed."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"study spec is not JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("format") not in READ_FORMATS:
            raise ValueError(f"study spec must be a {FORMAT} object")
        try:
            return cls(
                name=str(data["name"]),
                sketch=SketchSpec.from_dict(data["sketch"]),
                omega_sha256=str(data["omega_sha256"]),
                k=int(data["k"]),
                lo=tuple(data["lo"]),
                hi=tuple(data["hi"]),
                min_devices=int(data["min_devices"]),
                min_records=int(data["min_records"]),
                deadline=None if data["deadline"] is None else float(data["deadline"]),
                replicates=int(data["replicates"]),
                decode_seed=int(data["decode_seed"]),
                secure_aggregation=(None if data.get("secure_aggregation") is None
                                    else SecAggSpec(**data["secure_aggregation"])),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"incomplete study spec: {exc!r}") from None


def spec_sha256(spec_json: str) -> str:
    """Hex SHA-256 of a spec's JSON text (UTF-8)."""
    return hashlib.sha256(spec_json.encode()).hexdigest()
