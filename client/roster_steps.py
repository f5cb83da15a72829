"""The device's side of a plain study's roster: join it, set its cost aside, ask for an input
ticket inside the spend transaction, and leave it.

A device is on a study's roster, as far as it knows, while its ledger holds a reservation of
the study (:mod:`.ledger_reservations`): it writes one as soon as the coordinator has taken its
registration, and ends it once the spend is recorded or the study is no longer listed. A device
that refuses a study whose roster it is on, before it spent anything on it (its budget, policy
or data changed since it joined), tells the coordinator with a signed Leave, so its place goes
to another device instead of staying empty until the collection window ends. After a refusal
for good it keeps the left reservation as a record and does not join the study again; after
one that may pass (:class:`~.localdata.Retry`) it drops the reservation and may join again once
the study takes it. A refusal the device decided itself is reported too, a reason code once
per study (:mod:`.declines`).
"""

from __future__ import annotations

import logging
import math
import time

import grpc

from fedsketch.client.declines import Declined
from fedsketch.client.ledger import Identity, Ledger
from fedsketch.client.ledger_reservations import RESERVATION_SECONDS, Reservation
from fedsketch.client.study_pass import RPC_TIMEOUT, Admitted, Later, spend_labels
from fedsketch.common.net import signing
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.study.calibration_round import SketchRound
from fedsketch.common.study.refine import RoundSpec
from fedsketch.common.text import printable

log = logging.getLogger("fedsketch.device")

#: Deadline (seconds) of the re-check made inside the spend transaction.
RECHECK_TIMEOUT = 10.0
#: Fewest seconds an input ticket must have left for the device to spend: far more than one
#: ledger commit and one Submit take.
TICKET_MARGIN = 30.0
#: Refusals after which re-sending the same bytes can never succeed.
FINAL_REFUSALS = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
                  grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS,
                  grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


class RosterSteps:
    """The roster steps of :class:`fedsketch.client.agent.Agent` (a mixin: the agent provides
    the stub, the ledger, its source, ``bytes_sent``, and ``_unreported`` and ``_reported``
    empty), and the reports of refusals."""

    stub: pb_grpc.DeviceStub
    ledger: Ledger
    source: str
    bytes_sent: int
    _unreported: dict[str, tuple[pb.Study, int]]  # refusals to report (study, code), by study
    _reported: set[str]  # studies whose refusal was reported (or given up on)

    def _roster_message(self, identity: Identity, study: pb.Study,
                        domain: bytes = signing.REGISTRATION_DOMAIN,
                        ticket: bool = False) -> pb.Registration:
        """This device's signed registration for ``study``, asking for an input ticket if
        ``ticket`` (or, with :data:`~fedsketch.common.net.signing.LEAVE_DOMAIN`, its leave)."""
        digest = signing.registration_digest(study.study_id, identity.device_id,
                                             study.spec_sha256, domain)
        msg = pb.Registration(study_id=study.study_id, device_id=identity.device_id,
                              spec_sha256=study.spec_sha256, join_only=not ticket,
                              signature=signing.sign(identity.private_key, digest))
        self.bytes_sent += msg.ByteSize()
        return msg

    def _register(self, identity: Identity, study: pb.Study, timeout: float = RPC_TIMEOUT,
                  ticket: bool = False) -> pb.RegisterReply | str:
        """Join (or confirm a place in) the study's roster: the coordinator's reply (the open
        stage and, if ``ticket`` and input is open, an input ticket), or why not."""
        try:
            message = self._roster_message(identity, study, ticket=ticket)
            return self.stub.Register(message, timeout=timeout)
        except grpc.RpcError as exc:
            if exc.code() not in FINAL_REFUSALS:
                raise
            return f"the coordinator takes no registration: {exc.details() or exc.code().name}"

    def _input_open(self, identity: Identity, study: pb.Study) -> str | None:
        """Run inside the spend transaction: None if the coordinator promises to take this
        device's input (an input ticket of at least :data:`TICKET_MARGIN` seconds), else why
        not. A short deadline: the ledger's write lock is held meanwhile."""
        reply = self._register(identity, study, timeout=RECHECK_TIMEOUT, ticket=True)
        if isinstance(reply, str):
            return reply
        if reply.stage != pb.PLAIN_INPUT or reply.input_seconds < TICKET_MARGIN:
            return "the study takes no input now (no input ticket from the coordinator)"
        return None

    def _joined(self, study_id: str) -> Reservation | None:
        """This source's reservation of the study (the device is on its roster as far as this
        daemon knows), or None; another source's daemon on the same ledger keeps its own."""
        held = self.ledger.reservation(study_id)
        return held if held is not None and held.source == self.source else None

    def _set_aside(self, epsilon: float, rnd: RoundSpec | SketchRound | None, later: Later,
                   root: str | None = None) -> float:
        """ε a study (or round ``rnd`` of it) the device joined and has not paid sets aside: its
        release's ``epsilon`` and what the study asks after it (``later``), as the agent budgets
        it; nothing for a round of a study whose rounds the device already keeps ε for (an
        earlier release of it promised them, :func:`~.ledger_schema.promises`). One rule for
        plain rosters and secure sessions. ``root``: the study a boxed study's release is booked
        to (:class:`~.study_pass.Admitted`)."""
        parent = root if root is not None else None if rnd is None else rnd.parent_id
        if parent is not None and self.ledger.keeps(parent, self.source):
            return 0.0
        return math.fsum((epsilon, later.epsilon))

    def _reserve(self, study: pb.Study, admitted: Admitted) -> None:
        """Set the cost of the plain study whose roster the device joins aside in the ledger
        (ε: :meth:`_set_aside`; δ: the release's and the later rounds') until its deadline, at most
        :data:`~.ledger_reservations.RESERVATION_SECONDS`."""
        epsilon = self._set_aside(admitted.cost[0], admitted.round, admitted.later, admitted.root)
        delta = math.fsum((admitted.cost[1], admitted.later.delta))
        expires_at = time.time() + RESERVATION_SECONDS
        if admitted.deadline is not None:
            expires_at = min(expires_at, admitted.deadline)
        name = spend_labels(admitted.spec, admitted.round, admitted.later,
                            root=admitted.root)["study_name"]
        self.ledger.reserve(study.study_id, name, self.source, epsilon, delta, expires_at)

    def _leave(self, identity: Identity, study: pb.Study, final: bool) -> bool:
        """After a refusal of ``study``: if this daemon put the device on its roster and it
        spent nothing on it, send a signed Leave, then keep the reservation as left (``final``)
        or drop it. True once done (or nothing to do), including when the coordinator refuses
        for good (the study ended, an old coordinator without Leave); False, leaving the
        reservation as it is for the next pass, on a transient error or while the device holds
        an input ticket from a spend transaction that then failed (ABORTED: it lapses)."""
        sid = study.study_id
        joined = self._joined(sid)
        if joined is None or joined.left_at is not None or self.ledger.find(sid) is not None:
            return True
        try:
            self.stub.Leave(self._roster_message(identity, study, signing.LEAVE_DOMAIN),
                            timeout=RPC_TIMEOUT)
            log.info("left the roster of study %s", printable(sid))
        except grpc.RpcError as exc:
            if exc.code() not in (*FINAL_REFUSALS, grpc.StatusCode.UNIMPLEMENTED):
                log.warning("could not leave study %s yet: %s", printable(sid),
                            exc.details() or exc.code().name)
                return False
        if final:
            self.ledger.leave(sid)
        else:
            self.ledger.end_reservation(sid)
        return True

    def _note_refusal(self, study: pb.Study, reason: str) -> None:
        """Queue the report of a refusal the device decided, unless this study's was sent."""
        if isinstance(reason, Declined) and study.study_id not in self._reported:
            self._unreported.setdefault(study.study_id, (study, reason.code))

    def _report_refusals(self, identity: Identity, listed: set[str]) -> None:
        """Send the queued reports of studies still listed (:mod:`.declines`); drop those of
        studies no longer listed."""
        self._reported &= listed  # a study no longer listed never comes back: forget it
        for sid, (study, code) in list(self._unreported.items()):
            if sid in listed:
                digest = signing.refusal_digest(sid, identity.device_id, study.spec_sha256, code)
                msg = pb.RefusalReport(study_id=sid, device_id=identity.device_id,
                                       spec_sha256=study.spec_sha256, reason=code,
                                       signature=signing.sign(identity.private_key, digest))
                try:
                    self.bytes_sent += msg.ByteSize()
                    self.stub.ReportRefusal(msg, timeout=RPC_TIMEOUT)
                except grpc.RpcError as exc:
                    if exc.code() not in (*FINAL_REFUSALS, grpc.StatusCode.UNIMPLEMENTED):
                        log.warning("could not report the refusal of study %s yet: %s",
                                    printable(sid), exc.details() or exc.code().name)
                        continue
                self._reported.add(sid)
            del self._unreported[sid]
