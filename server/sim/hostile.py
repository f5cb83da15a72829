"""Hostile devices for researchers: ``simulate --hostile K:KIND`` (docs/bounded-influence.md).

K of the L simulated devices (the last K: the honest ones register first, as the roster would
have them) run the real device code with one change each, made here and nowhere in
:mod:`fedsketch.client`:

``inflate``    its input is the exact sum of 100·n records at its first record's point, sent with
               its true count n (plain: a private release of them, with their noise);
``random``     its input is uniform words (secure: uniform mod 2^B after masking; plain: uniform
               bytes of the payload's length);
``replay``     it sends another device's input: the records of device (i + 1) mod L, so its
               exact sum, declared with that device's count (the noise is its own);
``overclaim``  it holds the cap's count of records (``max_device_records``), all at its first
               record's point: a genuine release, within every rule.

In a study validated by a helper (docs/bounded-influence.md) a hostile device proves what it
sends whatever it is: ``random`` sends uniform field elements as its encoding, ``inflate`` its
input's bits with the one element that keeps y + z = 2B (:func:`out_of_range`), and both attach
proofs computed honestly on them; the verification must exclude them.

The report says what the defences did: ``excluded`` (the coordinator refused a hostile device's
input or registration), ``study failed`` (the aggregate check,
:mod:`fedsketch.common.study.aggregate`) or ``nothing caught``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import replace

import grpc
import numpy as np

from fedsketch.client.agent import Agent
from fedsketch.client.localdata import LocalData
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.sketch.box import Tally
from fedsketch.common.validity import xof
from fedsketch.common.validity.circuit import RangeCircuit, width
from fedsketch.common.validity.field import P
from fedsketch.common.validity.sharing import ProvenInput
from fedsketch.server.bench.metrics import split

#: The kinds ``--hostile`` takes.
HOSTILE_KINDS = ("inflate", "random", "replay", "overclaim")
#: How many records' worth an ``inflate`` input is, per declared record.
INFLATE = 100


def parse_hostile(text: str | None, devices: int) -> tuple[int, str] | None:
    """(K, KIND) of ``--hostile K:KIND``; ValueError with the reason (K in 1..L − 1)."""
    if text is None:
        return None
    count, _, kind = text.partition(":")
    if kind not in HOSTILE_KINDS or not re.fullmatch("[0-9]{1,9}", count):
        raise ValueError(f"--hostile takes K:KIND, KIND one of {', '.join(HOSTILE_KINDS)}; "
                         f"got {text!r}")
    if not 1 <= int(count) < devices:
        raise ValueError(f"--hostile K must be in 1..{devices - 1} (some device must be honest), "
                         f"got {count}")
    return int(count), kind


def hostile_indices(devices: int, count: int) -> list[int]:
    """The hostile devices: the last ``count`` of ``devices``."""
    return list(range(devices - count, devices))


def hostile_parts(x: np.ndarray, parts: list[np.ndarray], hostile: list[int], kind: str,
                  cap: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """(records, parts) with the hostile devices' records as ``kind`` makes them: ``replay``
    takes device (i + 1) mod L's part, ``overclaim`` ``cap`` copies of its first record
    (appended to the records, which stay the honest devices' for scoring); others keep theirs."""
    parts = list(parts)
    if kind == "replay":
        for i in hostile:
            parts[i] = parts[(i + 1) % len(parts)]
    elif kind == "overclaim":
        for i in hostile:
            start = x.shape[0]
            x = np.concatenate([x, np.repeat(x[parts[i][:1]], cap, axis=0)])
            parts[i] = np.arange(start, start + cap)
    return x, parts


def _point(data: LocalData, count: int) -> LocalData:
    """``count`` copies of the first record of ``data``."""
    first = np.asarray(next(iter(data.chunks())))[:1].astype(np.float64)
    return LocalData(lambda: split(np.repeat(first, count, axis=0)), data.d)


def out_of_range(circuit: RangeCircuit, x: np.ndarray) -> np.ndarray:
    """A hostile encoding of ``x`` beyond ±B: y_i = x_i + B mod 2^w in valid bits, and
    z_i = 2B − y_i as one field element, so that y_i + z_i = 2B holds and only the check that
    every element is a bit fails (the strongest lie about the linear part)."""
    w = width(circuit.bound)
    y = np.mod(np.asarray(x, dtype=np.int64) + circuit.bound, 1 << w)
    encoded = np.zeros(circuit.length, dtype=np.int64)
    encoded[: circuit.n * w] = ((y[:, None] >> np.arange(w)) & 1).ravel()
    encoded[circuit.n * w:: w][: circuit.n] = np.mod(2 * circuit.bound - y, P)
    return encoded


class HostileAgent(Agent):
    """An :class:`Agent` whose input is ``kind``'s (module docstring; ``inflate`` and ``random``
    change the input here, ``replay`` and ``overclaim`` only the records it is given)."""

    def __init__(self, *args, kind: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.kind = kind
        self._rng = np.random.default_rng()
        #: What the coordinator refused of this device (or the device itself declined).
        self.refusals: list[str] = []

    def step(self):
        out = super().step()
        self.refusals.extend(out.refused.values())
        return out

    def _exact_input(self, session, data: LocalData, tally: Tally):
        x, n, noise = Agent._exact_input(session, data, tally)
        if self.kind == "inflate":
            x = Agent._exact_input(session, _point(data, INFLATE * n), Tally())[0]
        elif self.kind == "random":
            x = self._rng.integers(0, 2**62, x.size, dtype=np.int64)
        return x, n, noise

    def _shard(self, proof: ProvenInput, value: np.ndarray, nonce: bytes):
        if self.kind == "random":
            return proof.shard_encoded(xof.expand(xof.seed(), b"hostile", proof.circuit.length),
                                       nonce)
        if self.kind == "inflate":
            return proof.shard_encoded(out_of_range(proof.circuit, value), nonce)
        return super()._shard(proof, value, nonce)

    def _release(self, admitted, tally: Tally) -> tuple[int, str, bytes]:
        n, kind, payload = Agent._release(admitted, tally)
        if self.kind == "inflate":
            payload = Agent._release(replace(admitted, data=_point(admitted.data, INFLATE * n)),
                                     Tally())[2]
        elif self.kind == "random":
            payload = self._rng.bytes(len(payload))
        return n, kind, payload


def plain_passes(agents: list[Agent], watch: Callable[[], pb.Study],
                 close: Callable[[str], None]) -> None:
    """Plain rounds with hostile devices (the sketch's, then any later round's): every device
    steps until the study ends or decodes its last round; a round (a study id) in which every
    device has contributed or been refused (here or in an earlier round) is closed (its quorum
    is the honest devices'), not left to its deadline. A device refused after it was told to
    send still holds its ticket: the coordinator decodes once that lapses (two minutes,
    :data:`fedsketch.server.service.roster.TICKET_SECONDS`), so such a run is slower.
    RuntimeError if an honest device is refused."""
    done: dict[str, set[int]] = {}
    excluded: set[int] = set()  # refused once: a study's later rounds do not admit them
    while watch().state not in (pb.DONE, pb.FAILED):
        for i, agent in enumerate(agents):
            out = agent.step()
            if out.refused and not isinstance(agent, HostileAgent):
                raise RuntimeError(f"device {i} refused: {out.refused}")
            excluded.update([i] if out.refused else [])
            for sid in (*out.submitted, *out.refused):
                done.setdefault(sid, set()).add(i)
        for sid, devices in list(done.items()):
            if len(devices | excluded) == len(agents):
                del done[sid]
                try:
                    close(sid)
                except grpc.RpcError:  # it closed itself (every roster device sent)
                    pass
        time.sleep(0.02)


def defences(kind: str, hostile: list[int], refused: dict[int, list[str]],
             failed: str | None) -> dict:
    """The report's ``hostile`` section: who was hostile, what was refused of each hostile
    device, whether the study failed (and why), and the verdict."""
    excluded = {str(i): "; ".join(why) for i, why in refused.items() if why}
    verdict = ("study failed" if failed is not None else "excluded" if excluded
               else "nothing caught")
    return {"kind": kind, "devices": hostile, "excluded": excluded, "study_failed": failed,
            "defence": verdict}
