"""The public specification of a federated study, shared verbatim by coordinator and devices.

A :class:`StudySpec` fixes everything a device needs to compute its release (the sketch spec:
frequencies, feature map, r, privacy budget) and everything the coordinator needs to decode
(k, the public box [lo, hi]^d in data units, replicates, the decoder's seed), plus the round's
rules (minimum devices, the roster's size, minimum and maximum records per device, deadline in
Unix seconds, how long collection lasts once the quorum has registered). Its canonical
JSON (sorted keys, compact) is what travels; ``sha256`` of those UTF-8 bytes is the spec hash a
device checks before it spends any budget, and ``omega_sha256`` is the SHA-256 of Ω‖ξ that it
recomputes from the frequency spec. A study may add refinement rounds after its sketch
(``refine``) and, with ``--scale auto``, a calibration round 0 before it (``calibration``):
then its own σ is a placeholder and the sketch round's spec carries the σ round 0 chose
(:mod:`fedsketch.common.study.calibration_round`); with ``--bounds auto``, a box round before
everything (``box``, :mod:`fedsketch.common.study.box_plan`): then its own box is the widest,
[−2^40, 2^40]^d, and the boxed study's spec carries the box read
(:mod:`fedsketch.common.study.boxed_round`); the ε of every round is in the hashed spec.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, fields

from ..choices import DEFAULT_MAX_DEVICE_RECORDS
from ..dp.plan import integer_sum_term
from ..dp.samplers import share_rate
from ..features import GRID
from ..secagg import SecAggParams, check_capacity, graph_seed, modulus_bits
from ..secagg.spec import SecAggSpec
from ..secagg.trust import Assumptions
from ..sketch.box import WIDEST
from ..sketch.frequencies import draw_frequencies
from ..sketch.spec import SketchSpec, canonical_json
from ..spec_fields import integer, numbers, optional_number, text
from .box_plan import BoxPlan
from .calibration_plan import CalibrationPlan
from .refine import MAX_CENTRES, RefineSpec, cells_bits, round_split
from .secure_box import check_box_capacity
from .wire import MAX_RECORDS

#: Written by this code for a study without refinement rounds. Version 2 means "plain studies
#: fill a roster first": a device of the first release, which would spend as soon as it saw an
#: open study, refuses a /2 spec as unreadable instead of spending on a study that would refuse
#: its contribution.
FORMAT = "fedsketch.study/2"
#: Written for a study with refinement rounds (:mod:`fedsketch.common.study.refine`): a device that
#: does not know rounds refuses it rather than budget for its sketch alone.
REFINED_FORMAT = "fedsketch.study/3"
#: Written for a study with a calibration round (``--scale auto``,
#: :mod:`fedsketch.common.study.calibration_round`): a device that does not know round 0 refuses it.
CALIBRATED_FORMAT = "fedsketch.study/4"
#: Written for a study with a box round (``--bounds auto``, :mod:`fedsketch.common.study.box_plan`):
#: a device that does not know the box round refuses it.
BOXED_FORMAT = "fedsketch.study/5"
#: Also read: studies stored before rosters (their contributors joined the rosters when the
#: store was migrated).
READ_FORMATS = ("fedsketch.study/1", FORMAT, REFINED_FORMAT, CALIBRATED_FORMAT, BOXED_FORMAT)
#: Most devices one roster takes.
MAX_ROSTER = 1_000_000


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
    refine: RefineSpec | None = None
    roster: int | None = None
    collect_seconds: float | None = None
    max_device_records: int | None = None
    calibration: CalibrationPlan | None = None
    box: BoxPlan | None = None

    def __post_init__(self) -> None:
        d, m = self.sketch.frequencies.d, self.sketch.frequencies.m
        cap, most = self.max_device_records, MAX_RECORDS
        if self.secure_aggregation is not None:
            most = min(most, self.secure_aggregation.max_records)
        if cap is not None and (type(cap) is not int or not self.min_records <= cap <= most):
            raise ValueError(f"max_device_records must be an integer in min_records = "
                             f"{self.min_records} to {most:,} (at most the total max_records "
                             f"under secure aggregation), got {cap!r}")
        if self.secure_aggregation is not None:
            self._check_secure_aggregation()
        if self.calibration is not None and self.sketch.frequencies.scale != self.calibration.placeholder:
            raise ValueError("a study with a calibration round states its sketch's scale as the "
                             "placeholder √(σ_lo·σ_hi): the sketch round's spec carries σ")
        if self.box is not None:
            self._check_box()
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
        self._check_roster()
        if len(self.omega_sha256) != 64:
            raise ValueError("omega_sha256 must be a hex SHA-256")

    def _check_box(self) -> None:
        """A study with a box round states no box of its own (the widest, ±2^40 on every
        axis): ValueError otherwise."""
        if any(v != -WIDEST for v in self.lo) or any(v != WIDEST for v in self.hi):
            raise ValueError("a study with a box round states no box: its lo and hi are ∓2^40")

    def _check_roster(self) -> None:
        """ValueError unless ``min_devices`` is at most MAX_ROSTER, ``roster`` is an integer in
        min_devices..MAX_ROSTER and ``collect_seconds`` finite and > 0 (each or both None), and
        neither is set under secure aggregation, whose roster is its ``min_devices`` (its slack
        is the D dropouts it assumes) and whose stages run by their timeouts."""
        if self.min_devices > MAX_ROSTER:
            raise ValueError(f"min_devices must be at most {MAX_ROSTER}, got {self.min_devices}")
        if self.roster is not None:
            if type(self.roster) is not int or not self.min_devices <= self.roster <= MAX_ROSTER:
                raise ValueError(f"the roster takes min_devices = {self.min_devices} to "
                                 f"{MAX_ROSTER} devices, got {self.roster!r}")
        window = self.collect_seconds
        if window is not None:
            if type(window) not in (int, float) or not (math.isfinite(window) and window > 0):
                raise ValueError(f"collect_seconds must be finite and > 0, got {window!r}")
            object.__setattr__(self, "collect_seconds", float(window))
        if self.secure_aggregation is not None and (self.roster, self.collect_seconds) != (None, None):
            raise ValueError("secure aggregation's roster is its min_devices (the dropouts it "
                             "assumes are its slack) and its stages end by their timeouts: "
                             "no roster or collection window")

    @property
    def capacity(self) -> int:
        """How many devices the roster takes: ``roster``, or the quorum ``min_devices``."""
        return self.min_devices if self.roster is None else self.roster

    @property
    def device_cap(self) -> int:
        """The most records one device may hold and declare: ``max_device_records``, or for a
        study stored before the per-device cap, :data:`~fedsketch.common.study.wire.MAX_RECORDS`."""
        return MAX_RECORDS if self.max_device_records is None else self.max_device_records

    @property
    def total_epsilon(self) -> float:
        """ε of the whole study for a device that takes part in every round: the calibration
        round's, the sketch's and every refinement round's (sequential composition)."""
        rounds = 0.0 if self.refine is None else self.refine.total
        cal = 0.0 if self.calibration is None else self.calibration.epsilon
        box = 0.0 if self.box is None else self.box.epsilon
        return math.fsum((box, cal, self.sketch.privacy.epsilon, rounds))

    def check_new(self) -> None:
        """Rules for a study being created (older stored studies stay readable): ValueError if
        its name holds a control character (devices show it to their owners), or if it asks
        for ``min_records`` > 1 under add/remove, where n is private: whether a device takes
        part would then be a deterministic function of its n (datasets of min_records − 1 and
        min_records records would be told apart), so devices ignore the rule there; or if its
        roster is larger than its quorum with neither a collection window nor a deadline (once
        the quorum has sent, it would wait for ever for the other places); or if it declares no
        ``max_device_records``."""
        if not self.name.isprintable():
            raise ValueError("a study's name must not hold control characters")
        if self.capacity > self.min_devices and self.deadline is None and self.collect_seconds is None:
            raise ValueError("a roster larger than the quorum needs a collection window or a "
                             "deadline: the study would otherwise wait for ever for its last "
                             "places once the quorum has sent")
        if self.max_device_records is None:
            raise ValueError("a new study declares max_device_records, the most records one "
                             "device may hold")
        if self.sketch.privacy.neighbouring == "add_remove" and self.min_records > 1:
            raise ValueError("min_records applies under replace-one only: under add/remove a "
                             "device's record count is private, and refusing by it would reveal it")
        if self.secure_aggregation is not None:
            self.check_trust()

    def _check_secure_aggregation(self) -> None:
        """Refuse a secure-aggregation study that cannot work, with the reason."""
        if self.sketch.privacy.neighbouring != "replace_one" or self.sketch.privacy.delta > 0:
            raise ValueError("secure aggregation supports replace-one, pure ε (n public)")
        if self.deadline is not None:
            raise ValueError("secure aggregation runs by stage timeouts, not a deadline")
        share_rate(self.sketch.privacy.epsilon, integer_sum_term(
            self.sketch.feature, self.sketch.privacy.epsilon, self.sketch.r, "replace_one").sensitivity)
        shape = self.min_devices / self.assumptions.min_honest
        check_capacity(self.sum_bound(), self.noise_param(), 2 * self.sketch.frequencies.m,
                       shape=shape)
        if self.calibration is not None:  # round 0's sum (fedsketch.common.study.secure_calibration)
            m0 = self.calibration.m0
            term = integer_sum_term("complex", self.calibration.epsilon, m0, "replace_one")
            share_rate(term.epsilon, term.sensitivity)
            check_capacity(GRID["complex"] * self.secure_aggregation.max_records, term.scale,
                           2 * m0, shape=shape)
        if self.box is not None:  # the box round's sum (fedsketch.common.study.secure_box)
            check_box_capacity(self, shape)
        if self.refine is not None:  # the largest round any coordinator may publish
            for eps in set(self.refine.epsilon):
                split = round_split(eps, "replace_one", self.sketch.frequencies.d)
                share_rate(split[0], 1.0)  # the counts' shares; the sums' rate is far lower
                cells_bits(self.secure_aggregation.max_records, split, MAX_CENTRES,
                           self.sketch.frequencies.d, shape)

    @property
    def assumptions(self) -> Assumptions:
        """L = min_devices, D and C of the secure aggregation (ValueError if h_min < 1)."""
        sa = self.secure_aggregation
        return Assumptions(self.min_devices, sa.dropouts, sa.colluders)

    def check_trust(self) -> None:
        """ValueError unless the secure-aggregation threshold is safe under the stated
        assumptions: 2t > |N(u)| + 1 + min(C, |N(u)|) (no coordinator can unmask one device) and
        t within what D dropouts leave of every neighbourhood (the round can finish); see
        :mod:`fedsketch.common.secagg.trust`. Devices check it before they register."""
        sa = self.secure_aggregation
        self.assumptions.check(sa.threshold, sa.degree)

    def round_params(self, study_id: str, roster: tuple[str, ...]) -> SecAggParams:
        """The public parameters of this study's round with ``roster`` registered: the spec's
        threshold, degree and colluders, the graph seed of ``study_id``, L − D as the fewest
        submitters, and the modulus for the sum bound, a and noise shape |roster|/h_min
        (MECHANISMS §4.4). ValueError if the roster size lies outside L − D .. L."""
        dim = 2 * self.sketch.frequencies.m
        return self.secure_params(study_id, roster, dim, lambda shape: modulus_bits(
            self.sum_bound(), self.noise_param(), dim, shape=shape))

    def secure_params(self, study_id: str, roster: tuple[str, ...], dim: int,
                      bits: Callable[[float], int]) -> SecAggParams:
        """:meth:`round_params` for a payload of ``dim`` words whose modulus has ``bits(shape)``
        bits, shape = |roster|/h_min (a refinement round's cells use it too)."""
        sa, trust = self.secure_aggregation, self.assumptions
        if len(roster) not in trust.rosters():
            raise ValueError(f"{len(roster)} devices registered; the study needs "
                             f"{trust.min_submitters} to {trust.devices} (at most {sa.dropouts} "
                             f"of {trust.devices} may drop out)")
        return SecAggParams(study_id, tuple(roster), sa.threshold,
                            bits(len(roster) / trust.min_honest), dim, sa.degree,
                            graph_seed(study_id), sa.colluders, trust.min_submitters)

    def check_round(self, params: SecAggParams) -> None:
        """ValueError unless a coordinator's round ``params`` are :meth:`round_params` for its
        roster: a device takes no threshold, graph, modulus or assumption on trust."""
        check_params(params, self.round_params(params.study_id, params.device_ids))

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
        """A spec whose ``omega_sha256`` is computed from ``sketch.frequencies``, with
        :data:`DEFAULT_MAX_DEVICE_RECORDS` (at most a secure study's ``max_records``) unless
        ``max_device_records`` is given."""
        if rules.get("max_device_records") is None:
            secure = rules.get("secure_aggregation")
            rules["max_device_records"] = (DEFAULT_MAX_DEVICE_RECORDS if secure is None else
                                           min(DEFAULT_MAX_DEVICE_RECORDS, secure.max_records))
        return cls(name, sketch, draw_frequencies(sketch.frequencies).sha256, k, tuple(lo),
                   tuple(hi), **rules)

    def to_dict(self) -> dict:
        """JSON-ready dict (with a ``format`` tag; ``refine``, ``calibration``, ``roster``,
        ``collect_seconds`` and ``max_device_records`` only when set, so the spec of a study
        without them reads, and hashes, as before)."""
        data = {
            "format": (BOXED_FORMAT if self.box is not None
                       else CALIBRATED_FORMAT if self.calibration is not None
                       else FORMAT if self.refine is None else REFINED_FORMAT),
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
                                   else self.secure_aggregation.to_dict()),
        }
        if self.refine is not None:
            data["refine"] = self.refine.to_dict()
        if self.calibration is not None:
            data["calibration"] = self.calibration.to_dict()
        if self.box is not None:
            data["box"] = self.box.to_dict()
        for name in ("roster", "collect_seconds", "max_device_records"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        return data

    def to_json(self) -> str:
        """The canonical JSON that travels and is hashed."""
        return canonical_json(self.to_dict())

    def sha256(self) -> str:
        """Hex SHA-256 of :meth:`to_json` (UTF-8)."""
        return spec_sha256(self.to_json())

    @classmethod
    def from_json(cls, spec_json: str) -> StudySpec:
        """Parse and validate; ValueError with the reason on anything malformed, a field of
        another JSON type than its own included (:mod:`~.spec_fields`)."""
        try:
            data = json.loads(spec_json)
        except json.JSONDecodeError as exc:
            raise ValueError(f"study spec is not JSON: {exc}") from None
        except RecursionError:  # nested deeper than the interpreter's stack
            raise ValueError("study spec is not JSON a study can have: nested too deeply") from None
        if not isinstance(data, dict) or data.get("format") not in READ_FORMATS:
            raise ValueError(f"study spec must be a {FORMAT} object")
        try:
            min_devices = integer(data["min_devices"], "min_devices")
            return cls(
                name=text(data["name"], "name"),
                sketch=SketchSpec.from_dict(data["sketch"]),
                omega_sha256=text(data["omega_sha256"], "omega_sha256"),
                k=integer(data["k"], "k"),
                lo=numbers(data["lo"], "lo"),
                hi=numbers(data["hi"], "hi"),
                min_devices=min_devices,
                min_records=integer(data["min_records"], "min_records"),
                deadline=optional_number(data["deadline"], "deadline"),
                replicates=integer(data["replicates"], "replicates"),
                decode_seed=integer(data["decode_seed"], "decode_seed"),
                secure_aggregation=(None if data.get("secure_aggregation") is None
                                    else SecAggSpec.from_dict(data["secure_aggregation"], min_devices)),
                refine=(None if data.get("refine") is None
                        else RefineSpec.from_dict(data["refine"])),
                roster=data.get("roster"),  # an integer, or refused by _check_roster
                collect_seconds=data.get("collect_seconds"),  # a number, or refused
                max_device_records=data.get("max_device_records"),  # an integer, or refused
                calibration=(None if data.get("calibration") is None
                             else CalibrationPlan.from_dict(data["calibration"])),
                box=None if data.get("box") is None else BoxPlan.from_dict(data["box"]),
            )
        except (KeyError, TypeError, OverflowError) as exc:
            raise ValueError(f"incomplete or malformed study spec: {exc!r}") from None


def check_params(params: SecAggParams, expected: SecAggParams) -> None:
    """ValueError naming the fields in which a coordinator's round ``params`` differ from the
    ``expected`` ones a device computed itself."""
    differ = [f.name for f in fields(SecAggParams)
              if getattr(params, f.name) != getattr(expected, f.name)]
    if differ:
        raise ValueError(f"the coordinator's round parameters differ from the study's in "
                         f"{', '.join(differ)}")


def spec_sha256(spec_json: str) -> str:
    """Hex SHA-256 of a spec's JSON text (UTF-8)."""
    return hashlib.sha256(spec_json.encode()).hexdigest()
