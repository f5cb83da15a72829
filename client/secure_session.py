"""A device's part in one secure-aggregation round, and how it is kept in the ledger across a
restart of the daemon (:mod:`.ledger_sessions`).

A session is made when the device prepares its input for the round, before its REGISTER goes
out (:mod:`.secure_steps`): it holds the exact integer input x and the noise share e from then
on, so no stage reads the data and a restarted daemon masks the very x + e it prepared.
Format /1 (sessions of an earlier release, which read the data at MASKED_INPUT) still loads,
without an input: such a session's device leaves the round at MASKED_INPUT, unspent, saying so.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field

import numpy as np

from fedsketch.client.ledger import Identity
from fedsketch.client.study_pass import Later, release_cost
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import Client
from fedsketch.common.secagg import wire as sw
from fedsketch.common.secagg.abort import RoundTerms
from fedsketch.common.sketch.box import Box
from fedsketch.common.study.calibration_round import SketchRound, is_sketch_round
from fedsketch.common.study.refine import RoundSpec
from fedsketch.common.study.secure_calibration import SecureProtocol, secure_protocol
from fedsketch.common.study.study import StudySpec

#: Format of a session as the ledger keeps it (/2: with the prepared input and noise share).
SESSION_FORMAT = "fedsketch.secure-session/2"
#: The earlier format, which kept no input (module docstring).
SESSION_FORMAT_1 = "fedsketch.secure-session/1"


def _words(raw: bytes) -> np.ndarray:
    """An int64 vector from its little-endian bytes (ValueError for a ragged length)."""
    if len(raw) % 8:
        raise ValueError("an input of a ragged length")
    return np.frombuffer(raw, dtype="<i8").astype(np.int64)


@dataclass
class Session:
    """This device's part in one secure-aggregation round: of a study's sketch or round 0, or of
    one of its refinement rounds or its sketch round (``round``; for a sketch round ``spec`` is
    the study it collects). ``replies``: each stage's message as computed (once), re-sent as is
    until the coordinator takes it; ``setup``: the ADVERTISE_KEYS bundle (round parameters and
    enrolled keys) ``client`` was made for; ``later``: what the study asks after this release
    (:func:`~.study_pass.later_rounds`). ``input`` and ``noise``: the exact integer input x
    (read from the data when the session was made, of ``n`` records) and this device's noise
    share e, int64 vectors of the round's dim (None only in a session of format /1).
    ``aborted``: the device signed that the round aborted (rule B, :mod:`.secure_abort`): it
    sends nothing more in it, UNMASK shares least of all, and its secrets are erased.
    ``study_id`` and ``device_id`` name the round and the device the session is for: a stored
    session loads for those only."""

    spec: StudySpec
    box: Box
    n: int
    client: Client | None = None
    done: set[int] = field(default_factory=set)
    left: bool = False
    round: RoundSpec | SketchRound | None = None
    replies: dict[int, bytes] = field(default_factory=dict)
    later: Later = Later()
    setup: bytes | None = None
    study_id: str = ""
    device_id: str = ""
    input: np.ndarray | None = None
    noise: np.ndarray | None = None
    aborted: bool = False
    root: str | None = None  # a boxed study's: the study of its box round (the ledger's)
    helper_upload: bytes | None = None  # a validated study's report share for the helper

    @property
    def epsilon(self) -> float:
        """ε of this device's release here (:func:`~.study_pass.release_cost`)."""
        return release_cost(self.spec, self.round)[0]

    @property
    def terms(self) -> bytes:
        """What the spend records of the round before the masked input leaves the device (rule
        B, ledger schema 9): R, t, C and the holders of its shares with their keys, from
        ``setup`` (:class:`~fedsketch.common.secagg.abort.RoundTerms`)."""
        if self.setup is None:
            raise ValueError("the session holds no round parameters (ADVERTISE_KEYS) yet")
        return RoundTerms.of_round(self.study_id, self.device_id, self.setup).to_bytes()

    @property
    def protocol(self) -> SecureProtocol:
        """What the round's public parameters derive from."""
        return secure_protocol(self.spec, self.round if isinstance(self.round, RoundSpec) else None)

    def dump(self) -> bytes:
        """The session as the ledger keeps it (JSON; the client's secrets included)."""
        def b64(raw: bytes) -> str:
            return base64.b64encode(raw).decode()

        return json.dumps({
            "format": SESSION_FORMAT, "study_id": self.study_id, "device_id": self.device_id,
            "spec": self.spec.to_json(), "round": None if self.round is None else self.round.to_json(),
            "later": [self.later.epsilon, self.later.seconds, self.later.delta], "n": self.n,
            "done": sorted(self.done), "left": self.left, "aborted": self.aborted,
            "replies": {str(stage): b64(body) for stage, body in self.replies.items()},
            "setup": None if self.setup is None else b64(self.setup),
            "client": None if self.client is None else self.client.state(),
            "input": None if self.input is None else b64(self.input.astype("<i8").tobytes()),
            "noise": None if self.noise is None else b64(self.noise.astype("<i8").tobytes()),
            "root": self.root,
            "helper_upload": None if self.helper_upload is None else b64(self.helper_upload)},
            sort_keys=True).encode()

    @staticmethod
    def _field(text: bytes, name: str) -> object:
        """Field ``name`` of the stored session ``text`` (None if the row does not parse)."""
        try:
            doc = json.loads(text)
        except ValueError:
            return None
        return doc.get(name) if isinstance(doc, dict) else None

    @staticmethod
    def signed_abort(text: bytes) -> bool:
        """Whether the stored session ``text`` signed the abort of its round (``aborted``)."""
        return Session._field(text, "aborted") is True

    @staticmethod
    def is_tombstone(text: bytes) -> bool:
        """Whether ``text`` is a settled rule-B session (:meth:`tombstone`)."""
        return Session._field(text, "settled") is True

    @staticmethod
    def tombstone(text: bytes) -> bytes:
        """The stored session ``text`` (of a round whose abort the device signed, its secrets
        already erased) marked ``settled``: kept for good, so the device stays out of any round
        listed again under its study id (its abort statement can never count for a round it
        took part in: a lying coordinator could otherwise relist a failed round's id, have the
        signers join and reveal shares, and hand out their old statements), and never asked
        about again."""
        doc = json.loads(text)
        doc["settled"] = True
        return json.dumps(doc, sort_keys=True).encode()

    @staticmethod
    def sent_masked(text: bytes) -> bool:
        """Whether the stored session ``text`` may have sent its masked input: MASKED_INPUT is in
        its ``done``, which :meth:`~.secure_steps.SecureSteps._masked_step` keeps before the first
        send (True also for a row that does not parse: it cannot show that y stayed)."""
        done = Session._field(text, "done")
        return not isinstance(done, list) or pb.MASKED_INPUT in done

    @classmethod
    def load(cls, study_id: str, text: bytes, identity: Identity) -> Session:
        """The session :meth:`dump` wrote for the round of ``study_id`` and the device of
        ``identity``, its client rebuilt (:meth:`Client.resumed`); ValueError for anything else
        (a row of another round or device, another format, a field of the wrong type: the file
        may be damaged)."""
        try:
            return cls._load(study_id, text, identity)
        except ValueError as exc:
            raise ValueError(f"unreadable secure session of study {study_id!r}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 — whatever a damaged row raises: out of the round
            raise ValueError(f"unreadable secure session of study {study_id!r}: "
                             f"{type(exc).__name__}: {exc}") from None

    @classmethod
    def _load(cls, study_id: str, text: bytes, identity: Identity) -> Session:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("format") not in (SESSION_FORMAT, SESSION_FORMAT_1):
            raise ValueError(f"not a {SESSION_FORMAT} object")
        if (doc["study_id"], doc["device_id"]) != (study_id, identity.device_id):
            raise ValueError(f"it is the session of study {doc['study_id']!r} and device "
                             f"{doc['device_id']!r}")
        stages, replies, later = set(sw.STAGES), doc["replies"], doc["later"]
        done, aborted = doc["done"], doc.get("aborted", False)
        if not (isinstance(replies, dict) and isinstance(done, list) and isinstance(later, list)
                and len(later) == 3 and all(type(v) in (int, float) and math.isfinite(v) for v in later)
                and type(doc["n"]) is int and 0 <= doc["n"] and type(doc["left"]) is bool
                and type(aborted) is bool
                and all(type(s) is int and s in stages for s in done)
                and all(k.isdigit() and int(k) in stages and isinstance(v, str) for k, v in replies.items())):
            raise ValueError("a field of the wrong type")
        spec = StudySpec.from_json(doc["spec"])
        root = doc.get("root")  # absent from sessions stored before box rounds
        if root is not None and not isinstance(root, str):
            raise ValueError("a field of the wrong type")
        upload = doc.get("helper_upload")  # absent before validated studies kept it apart
        if upload is not None and not isinstance(upload, str):
            raise ValueError("a field of the wrong type")
        rnd = doc["round"]
        if rnd is not None:
            rnd = SketchRound.from_json(rnd) if is_sketch_round(rnd) else RoundSpec.from_json(rnd)
        setup = None if doc["setup"] is None else base64.b64decode(doc["setup"], validate=True)
        client = None
        if setup is not None and doc["client"] is not None:
            params, keys, _ = sw.params_from_json(study_id, sw.load(setup))
            client = Client.resumed(params, identity.device_id, identity.private_key, keys, doc["client"])
        x, e = (None, None) if doc["format"] == SESSION_FORMAT_1 else (doc["input"], doc["noise"])
        if (x is None) != (e is None):
            raise ValueError("an input without its noise share, or the reverse")
        if x is not None:
            x, e = _words(base64.b64decode(x, validate=True)), _words(base64.b64decode(e, validate=True))
            if x.shape != e.shape:
                raise ValueError("an input and a noise share of different lengths")
        return cls(spec, Box(spec.lo, spec.hi), doc["n"], client, set(done), doc["left"], rnd,
                   {int(k): base64.b64decode(v, validate=True) for k, v in replies.items()},
                   Later(*map(float, later)), setup, study_id, identity.device_id, x, e, aborted,
                   root, None if upload is None else base64.b64decode(upload, validate=True))
