"""A plain study's roster, as the coordinator keeps it: signed registrations and leaves.

Devices join a plain study's roster (signed, spending nothing); once its quorum has joined,
each roster device that asks (inside its spend transaction, just before it spends) gets an
input ticket: the coordinator's promise to take its contribution for :data:`TICKET_SECONDS`,
even if a close is requested meanwhile. A device that joined and can no longer take part
leaves, signed in its own domain (:data:`~fedsketch.common.net.signing.LEAVE_DOMAIN`), and frees
its place for another; nobody else can take a device's place away, and a device that
contributed, or holds a live ticket (it may have spent), cannot leave, so a leave replayed
after the device joined again cannot cost it a contribution it paid for.

A device that declines a study (of any kind) may say why: a reason code, signed in its own
domain (:data:`~fedsketch.common.net.signing.REFUSAL_DOMAIN`), kept once per study and device for the
operator (``coordinator status``). Nothing depends on it: a device that never reports (an older
release) is simply absent, as before.
"""

from __future__ import annotations

from fedsketch.common.net import signing
from fedsketch.server.errors import Code, Refusal
from fedsketch.server.service.accounting import study_cost
from fedsketch.server.service.messages import RefusalMessage, RegistrationMessage
from fedsketch.server.store.base import Store, StudyRow

#: How long (seconds) a plain study promises to take the contribution of a roster device it
#: told to send (its input ticket), even if a close is requested meanwhile: longer than a
#: device needs between its re-check and its Submit.
TICKET_SECONDS = 120.0
#: Most enrolled keys kept in memory (32 bytes and an id each; the cache starts over when full).
MAX_KEYS = 100_000


class Roster:
    """The roster calls of :class:`~fedsketch.server.service.coordinator.Coordinator`, which
    provides ``store``, ``spec``, ``spec_hash`` and ``_keys``; and ``_enrolled_key``, which
    every signed message of a device needs."""

    store: Store
    _keys: dict[str, bytes]

    def _enrolled_key(self, device_id: str) -> bytes:
        """The device's enrolled Ed25519 public key (unauthenticated for an unknown device);
        kept once read (at most :data:`MAX_KEYS`), so a Submit reads no key from the store."""
        key = self._keys.get(device_id)
        if key is None:
            key = self.store.device_key(device_id)
            if key is None:
                raise Refusal(Code.UNAUTHENTICATED, f"unenrolled device {device_id!r}")
            self._remember_key(device_id, key)
        return key

    def _remember_key(self, device_id: str, key: bytes) -> None:
        """Keep an enrolled key in memory (the cache starts over once it holds MAX_KEYS)."""
        if len(self._keys) >= MAX_KEYS:
            self._keys.clear()
        self._keys[device_id] = key

    def _plain_study(self, study_id: str, spec_sha256: str, what: str) -> None:
        """Refuse a plain-round message for an unknown study (not_found), a secure-aggregation
        study or another spec (failed_precondition)."""
        if self.spec(study_id).secure_aggregation is not None:  # not_found for an unknown study
            raise Refusal(Code.FAILED_PRECONDITION,
                          "this study uses secure aggregation: send stage messages instead")
        if spec_sha256 != self.spec_hash(study_id):
            raise Refusal(Code.FAILED_PRECONDITION,
                          f"spec hash mismatch: the {what} was made for another spec")

    def _check_roster_message(self, r: RegistrationMessage, domain: bytes, what: str) -> None:
        """Refuse a registration or leave (``domain``) that is not for a plain study of this spec
        or is not signed by an enrolled device."""
        self._plain_study(r.study_id, r.spec_sha256, what)
        digest = signing.registration_digest(r.study_id, r.device_id, r.spec_sha256, domain)
        if not signing.verify(self._enrolled_key(r.device_id), digest, r.signature):
            raise Refusal(Code.UNAUTHENTICATED, f"invalid {what} signature for this device and study")

    def register(self, r: RegistrationMessage) -> tuple[bool, StudyRow, float]:
        """Add a device to a plain study's roster, and if it asks for one once the roster is
        full, give it an input ticket; (duplicate, the study after, the ticket's seconds or 0).
        Raises Refusal."""
        self._check_roster_message(r, signing.REGISTRATION_DOMAIN, "registration")
        cost = study_cost(self.spec, r.study_id)  # refused early if it cannot pay (accounting)
        added, row = self.store.register(r.study_id, r.device_id, cost)
        seconds = self.store.ticket(r.study_id, r.device_id, TICKET_SECONDS) if r.ticket else 0.0
        return not added, row, seconds

    def leave(self, r: RegistrationMessage) -> tuple[bool, StudyRow]:
        """Take a device that has not contributed and holds no live input ticket (it may have
        spent) off an accepting plain study's roster, at its signed word; (whether it was on
        it, the study after). Raises Refusal."""
        self._check_roster_message(r, signing.LEAVE_DOMAIN, "leave")
        return self.store.leave(r.study_id, r.device_id)

    def report_refusal(self, r: RefusalMessage) -> bool:
        """Keep a device's signed reason for declining a study (any kind, any state); True if
        it had reported one already (the first stands). Refused: an unknown study (not_found),
        another spec (failed_precondition), an unenrolled device or a bad signature
        (unauthenticated)."""
        row = self.store.get_study(r.study_id)
        if r.spec_sha256 != row.spec_sha256:
            raise Refusal(Code.FAILED_PRECONDITION,
                          "spec hash mismatch: the refusal was made for another spec")
        digest = signing.refusal_digest(r.study_id, r.device_id, r.spec_sha256, r.code)
        if not signing.verify(self._enrolled_key(r.device_id), digest, r.signature):
            raise Refusal(Code.UNAUTHENTICATED, "invalid refusal signature for this device and study")
        return not self.store.add_refusal(r.study_id, r.device_id, r.reason)
