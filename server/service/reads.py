"""Who reads what: the studies and results a device may read, and how its read is authenticated.

Study details (spec, state, counts, failure detail) and results (centroids) are not public:

* the operator reads every study and result with its token (the Operator service: ``ListStudies``,
  ``ShowStudy``, ``GetResult``; :class:`~fedsketch.server.service.api.OperatorService`);
* an enrolled device reads with a ``DeviceRead`` signed by its enrolled key over the coordinator
  it is meant for (its audience), the method, the study (or "" for the list) and the moment it
  signed (:func:`~fedsketch.common.net.signing.read_digest`):

  - ``ListStudies``: the accepting studies it may join: every study an operator created, the
    refinement rounds of the studies whose roster it is on, and any study whose roster it is on;
  - ``GetStudy``: one of those, or, in any state, a study whose roster it is on or a refinement
    round of one (a device reads the centres C_t a round publishes, and the state of what it
    spent on);
  - ``GetResult``: a study it contributed to, by its sketch or in one of its refinement rounds;

  "on the roster" is the store's roster (:meth:`~fedsketch.server.store.base.Store.memberships`)
  for a plain study, and for a secure-aggregation study its round's roster once REGISTER closed
  ("contributed": its masked input arrived), held by the round
  (:meth:`~fedsketch.server.service.secure_round.SecAggRound.members`), which the store keeps
  across a coordinator restart, running or ended;
* anyone else is refused, UNAUTHENTICATED: a read with no signature, in another digest format
  than :data:`~fedsketch.common.net.signing.READ_FORMAT` (an older device's), signed outside the
  freshness window or for another coordinator is told so (none of these looks at the store); an
  unknown device id, a device not enrolled here and a signature that does not verify (or is not
  64 bytes, refused before the store is asked) all get one and the same answer
  (:meth:`Reads._unverified`), so a read cannot tell whether a device id is enrolled here; the
  store is asked once and one signature checked in each case (an unknown device's against a
  stand-in key, refused whatever that check says), so neither does its time.

The audience (:mod:`fedsketch.common.net.device_reads`): a read must be signed for a name the
coordinator's certificate names (``Coordinator.audiences``), so a read a device sent to another
coordinator, replayed here, is refused. A plaintext coordinator (``--insecure``, a loopback demo)
proves no name and checks none: there anyone on the path reads the answers anyway.

A device asking for a study it may not read gets PERMISSION_DENIED with the same text whether
the study exists or not, so a device cannot learn which study ids exist. Freshness: ``signed_at``
must be within :data:`READ_WINDOW_SECONDS` of the coordinator's clock, either side (clocks
differ). No replay cache is kept: a read replayed within the window (by whoever captured it)
asks again, for the same device, method and study, what that device may read anyway, answered
as of the replay; after the window it is refused.
"""

from __future__ import annotations

import threading
import time

from fedsketch.common.net import signing
from fedsketch.common.net.device_reads import audience_name, names_audience
from fedsketch.common.study.study import StudySpec
from fedsketch.server.errors import Code, Refusal
from fedsketch.server.service.messages import ReadMessage
from fedsketch.server.service.secure_round import SecAggRound
from fedsketch.server.store.base import ACCEPTING, Store, StudyRow

#: How far (seconds) a signed read's ``signed_at`` may lie from the coordinator's clock, either way.
READ_WINDOW_SECONDS = 300.0
#: The Device methods a device reads with (``ReadMessage.method``), as its signature names them.
READ_METHODS = ("ListStudies", "GetStudy", "GetResult")
#: The stand-in key an unknown device's read is checked against, so that it costs what a known
#: device's does (module docstring): the all-zero private key's, a valid point; the read is
#: refused whether it verifies or not.
_NOBODY = signing.public_key(bytes(signing.PUBLIC_KEY_BYTES))
#: What a device may read, said in every refusal of a read.
WHAT_A_DEVICE_READS = ("a device reads the open studies, the studies whose roster it is on and "
                       "their refinement rounds, and the results of the studies it contributed to")


class Reads:
    """The signed reads of :class:`~fedsketch.server.service.coordinator.Coordinator`, which
    provides ``store``, ``audiences`` (the names its certificate proves, None in plaintext),
    ``rounds`` (the secure-aggregation rounds), ``_lock`` and ``result``."""

    store: Store
    audiences: frozenset[str] | None
    rounds: dict[str, SecAggRound]
    _lock: threading.Lock

    def _authenticate_read(self, r: ReadMessage) -> None:
        """Refuse (UNAUTHENTICATED) a read that is not signed by an enrolled device, in format
        :data:`~fedsketch.common.net.signing.READ_FORMAT`, for this coordinator, over its method,
        study and ``signed_at`` within the window (module docstring)."""
        if not r.device_id or not r.signature:
            raise Refusal(Code.UNAUTHENTICATED, f"Device/{r.method} needs a read signed by an enrolled "
                          "device (device_id, signed_at, audience, format, signature over "
                          "fedsketch.common.net.signing.read_digest); the operator reads with its token "
                          f"through the Operator service")
        if r.format != signing.READ_FORMAT:  # unset (0): an earlier release's, format 1
            was = "format 1 (an earlier release's, naming no coordinator)" if not r.format else (
                f"format {r.format}")
            raise Refusal(Code.UNAUTHENTICATED, f"the read is signed in {was}; this coordinator takes "
                          f"format {signing.READ_FORMAT}, signed for its name: update the device's "
                          "fedsketch")
        if not abs(time.time() - r.signed_at) <= READ_WINDOW_SECONDS:  # NaN included
            raise Refusal(Code.UNAUTHENTICATED, f"the read's signed_at ({r.signed_at!r}, Unix seconds) "
                          f"is not within ±{READ_WINDOW_SECONDS:g} s of the coordinator's clock: sign "
                          "it afresh, and check the device's clock")
        if self.audiences is not None and not names_audience(self.audiences, audience_name(r.audience)):
            raise Refusal(Code.UNAUTHENTICATED, f"the read is signed for coordinator {r.audience!r}, "
                          f"and this coordinator's certificate names {', '.join(sorted(self.audiences))}: "
                          "a device signs for the host of its --coordinator (a list's first address), "
                          "which must be one of these")
        if len(r.signature) != signing.SIGNATURE_BYTES:
            raise self._unverified(r)
        key = self.store.device_key(r.device_id)
        digest = signing.read_digest(r.audience, r.method, r.device_id, r.study_id, r.signed_at)
        if not signing.verify(key or _NOBODY, digest, r.signature) or key is None:
            raise self._unverified(r)

    @staticmethod
    def _unverified(r: ReadMessage) -> Refusal:
        """The one refusal of a read by an unknown device id, by a device not enrolled here, or
        whose signature does not verify: the same words whichever it is, naming no device
        (module docstring)."""
        return Refusal(Code.UNAUTHENTICATED, f"Device/{r.method}: the read's signature does not verify: "
                       "its device_id is not enrolled here, or this is not that device's signature "
                       "over fedsketch.common.net.signing.read_digest of this coordinator, method, study "
                       "and time")

    def _memberships(self, device_id: str, study_ids: list[str]) -> dict[str, bool]:
        """Of ``study_ids``, those whose roster (plain or secure) holds the device, each mapped to
        whether it contributed."""
        ids = tuple(dict.fromkeys(study_ids))
        found = self.store.memberships(device_id, ids)
        with self._lock:
            secure = [self.rounds[sid] for sid in ids if sid in self.rounds]
        for rnd in secure:
            if (contributed := rnd.members().get(device_id)) is not None:
                found[rnd.study_id] = contributed
        return found

    def _readable(self, device_id: str, rows: list[StudyRow]) -> list[StudyRow]:
        """The rows the device may read (module docstring)."""
        member = self._memberships(device_id, [r.study_id for r in rows]
                                   + [r.parent for r in rows if r.parent is not None])
        return [r for r in rows if (r.parent is None and r.state in ACCEPTING)
                or r.study_id in member or r.parent in member]

    @staticmethod
    def _denied(r: ReadMessage, what: str) -> Refusal:
        """The one refusal of a study a device may not read, or that does not exist."""
        return Refusal(Code.PERMISSION_DENIED, f"device {r.device_id} may not read {what} "
                       f"{r.study_id!r}, or there is none: {WHAT_A_DEVICE_READS}")

    def read_studies(self, r: ReadMessage) -> list[StudyRow]:
        """The accepting studies the device may join, oldest first."""
        self._authenticate_read(r)
        if r.study_id:
            raise Refusal(Code.INVALID_ARGUMENT, "ListStudies names no study: sign it with study_id \"\"")
        return self._readable(r.device_id, self.store.list_studies(ACCEPTING))

    def read_study(self, r: ReadMessage) -> StudyRow:
        """One study the device may read."""
        self._authenticate_read(r)
        try:
            rows = [self.store.get_study(r.study_id)]
        except Refusal as exc:
            if exc.code != Code.NOT_FOUND:
                raise
            rows = []
        if not (readable := self._readable(r.device_id, rows)):
            raise self._denied(r, "study")
        return readable[0]

    def read_result(self, r: ReadMessage) -> tuple[StudySpec, dict]:
        """The spec and result (as :meth:`result`) of a study the device contributed to, by its
        sketch or in one of its refinement rounds."""
        self._authenticate_read(r)
        ids = [r.study_id, *(row.study_id for row in self.store.rounds(r.study_id))]
        if not any(self._memberships(r.device_id, ids).values()):
            raise self._denied(r, "the result of study")
        return self.result(r.study_id)
