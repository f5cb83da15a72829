"""A device's part in one secure-aggregation round, and how it is kept in the ledger across a
restart of the daemon (:mod:`.ledger_sessions`)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from fedsketch.common.box import Box
from fedsketch.common.calibration_round import SketchRound, is_sketch_round
from fedsketch.common.refine import RoundSpec
from fedsketch.common.secagg import Client
from fedsketch.common.secagg import wire as sw
from fedsketch.common.secure_calibration import SecureProtocol, secure_protocol
from fedsketch.common.study import StudySpec

from .ledger import Identity
from .localdata import LocalData
from .study_pass import Later, release_cost

#: Format of a session as the ledger keeps it.
SESSION_FORMAT = "fedsketch.secure-session/1"


@dataclass
class Session:
    """This device's part in one secure-aggregation round: of a study's sketch or round 0, or of
    one of its refinement rounds or its sketch round (``round``; for a sketch round ``spec`` is
    the study it collects). ``replies``: each stage's message as computed (once), re-sent as is
    until the coordinator takes it; ``setup``: the ADVERTISE_KEYS bundle (round parameters and
    enrolled keys) ``client`` was made for; ``later``: what the study asks after this release
    (:func:`~.study_pass.later_rounds`). ``data`` is None in a session taken up after a
    restart whose data no longer opens (it is read only at MASKED_INPUT)."""

    spec: StudySpec
    box: Box
    data: LocalData | None
    n: int
    client: Client | None = None
    done: set[int] = field(default_factory=set)
    left: bool = False
    round: RoundSpec | SketchRound | None = None
    replies: dict[int, bytes] = field(default_factory=dict)
    later: Later = Later()
    setup: bytes | None = None

    @property
    def epsilon(self) -> float:
        """ε of this device's release here (:func:`~.study_pass.release_cost`)."""
        return release_cost(self.spec, self.round)[0]

    @property
    def protocol(self) -> SecureProtocol:
        """What the round's public parameters derive from."""
        return secure_protocol(self.spec, self.round if isinstance(self.round, RoundSpec) else None)

    def dump(self) -> bytes:
        """The session as the ledger keeps it (JSON; the client's secrets included)."""
        def b64(raw: bytes) -> str:
            return base64.b64encode(raw).decode()

        return json.dumps({
            "format": SESSION_FORMAT, "spec": self.spec.to_json(),
            "round": None if self.round is None else self.round.to_json(),
            "later": [self.later.epsilon, self.later.seconds], "n": self.n,
            "done": sorted(self.done), "left": self.left,
            "replies": {str(stage): b64(body) for stage, body in self.replies.items()},
            "setup": None if self.setup is None else b64(self.setup),
            "client": None if self.client is None else self.client.state()}, sort_keys=True).encode()

    @classmethod
    def load(cls, study_id: str, text: bytes, identity: Identity,
             data: Callable[[], LocalData | None]) -> Session:
        """The session :meth:`dump` wrote for the round of ``study_id``, its client rebuilt for
        ``identity`` (:meth:`Client.resumed`) and its data reopened by ``data``; ValueError for
        anything else."""
        try:
            doc = json.loads(text)
            if doc["format"] != SESSION_FORMAT:
                raise ValueError(f"format {doc['format']!r}, not {SESSION_FORMAT}")
            spec = StudySpec.from_json(doc["spec"])
            rnd = doc["round"]
            if rnd is not None:
                rnd = SketchRound.from_json(rnd) if is_sketch_round(rnd) else RoundSpec.from_json(rnd)
            setup = None if doc["setup"] is None else base64.b64decode(doc["setup"], validate=True)
            client = None
            if setup is not None and doc["client"] is not None:
                params, keys, _ = sw.params_from_json(study_id, sw.load(setup))
                client = Client.resumed(params, identity.device_id, identity.private_key, keys, doc["client"])
            replies = {int(stage): base64.b64decode(body, validate=True)
                       for stage, body in doc["replies"].items()}
            return cls(spec, Box(spec.lo, spec.hi), data(), int(doc["n"]), client,
                       {int(stage) for stage in doc["done"]}, bool(doc["left"]), rnd, replies,
                       Later(*map(float, doc["later"])), setup)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"unreadable secure session of study {study_id!r}: {exc}") from None
