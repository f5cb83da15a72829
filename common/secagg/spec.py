"""The secure-aggregation part of a study's public spec: Shamir threshold, the public bound on
the total record count, and the operator's stated dropout and collusion assumptions."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .trust import Assumptions


@dataclass(frozen=True)
class SecAggSpec:
    """Secure aggregation of a study (MECHANISMS §4; DESIGN §4).

    ``threshold`` t of Shamir sharing (and the fewest devices a stage may proceed with);
    ``max_records`` a public bound on the total record count N (it sizes the modulus);
    ``dropouts`` D and ``colluders`` C, the operator's stated assumptions: at most D of the
    ``min_devices`` roster drop out and at most C collude with the coordinator, from which
    follow h_min = L − D − C and the range of safe thresholds (:mod:`fedsketch.common.secagg.trust`);
    ``degree`` the neighbours of each device in the SecAgg+ graph (None: every device shares
    with every other); ``stage_timeout`` seconds after which a stage proceeds without the
    devices that did not answer. ``validation`` "helper" replaces the masking by a two-aggregator
    sharing with a range proof per input (docs/bounded-influence.md): ``helper`` is the helper's
    HOST:PORT and ``helper_ca`` the PEM of the CA its certificate is checked against, both part
    of the hashed spec, so every device sees which helper it trusts (None: not validated; the
    three are then left out of the spec's JSON, which hashes as before).
    """

    threshold: int
    max_records: int
    dropouts: int
    colluders: int
    degree: int | None = None
    stage_timeout: float = 30.0
    validation: str | None = None
    helper: str | None = None
    helper_ca: str | None = None

    def __post_init__(self) -> None:
        for name, least in (("threshold", 1), ("max_records", 1), ("dropouts", 0),
                            ("colluders", 0), ("degree", 1)):
            value = getattr(self, name)
            if name == "degree" and value is None:
                continue
            if type(value) is not int or value < least:
                raise ValueError(f"secure aggregation: {name} must be an integer >= {least}, "
                                 f"got {value!r}")
        if (type(self.stage_timeout) not in (int, float) or not math.isfinite(self.stage_timeout)
                or self.stage_timeout <= 0):
            raise ValueError("secure aggregation: stage_timeout must be > 0 seconds")
        if self.validation not in (None, "helper"):
            raise ValueError(f"secure aggregation: validation must be 'helper' or absent, got "
                             f"{self.validation!r}")
        if (self.validation is None) != (self.helper is None) or (
                self.validation is None) != (self.helper_ca is None):
            raise ValueError("secure aggregation: validation 'helper' takes the helper's address "
                             "and CA, and only it does")
        if self.validation is not None and not (
                isinstance(self.helper, str) and isinstance(self.helper_ca, str)
                and ":" in self.helper and "BEGIN CERTIFICATE" in self.helper_ca):
            raise ValueError("secure aggregation: the helper is HOST:PORT and its CA a PEM "
                             "certificate")

    def to_dict(self) -> dict:
        """JSON-ready; the validation fields only when set (an older spec hashes as before)."""
        data = asdict(self)
        if self.validation is None:
            for name in ("validation", "helper", "helper_ca"):
                del data[name]
        return data

    @classmethod
    def assuming(cls, assumptions: Assumptions, max_records: int, degree: int | None = None,
                 stage_timeout: float = 30.0, threshold: int | None = None) -> SecAggSpec:
        """The spec for ``assumptions`` (its L is the study's ``min_devices``); ``threshold``
        None takes the smallest safe one. ValueError, with the reason, if no threshold or the
        given one is unsafe (:meth:`~fedsketch.common.secagg.trust.Assumptions.check`)."""
        if threshold is None:
            threshold = assumptions.default_threshold(degree)
        else:
            assumptions.check(threshold, degree)
        return cls(threshold, max_records, assumptions.dropouts, assumptions.colluders, degree,
                   stage_timeout)

    @classmethod
    def from_dict(cls, data: dict, min_devices: int) -> SecAggSpec:
        """Parse (ValueError or TypeError on anything malformed); a spec of the release before
        stated assumptions (``min_honest`` h, and neither dropouts nor colluders) reads as
        D = min_devices − h dropouts and no colluders, which is what it assumed."""
        if not isinstance(data, dict):
            raise ValueError("secure_aggregation must be a JSON object")
        data = dict(data)
        if "min_honest" in data and not {"dropouts", "colluders"} & data.keys():
            honest = data.pop("min_honest")
            if type(honest) is not int:
                raise ValueError(f"secure aggregation: min_honest must be an integer, "
                                 f"got {honest!r}")
            data |= {"dropouts": min_devices - honest, "colluders": 0}
        return cls(**data)
