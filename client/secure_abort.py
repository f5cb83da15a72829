"""Rule B of docs/secure-aggregation.md ("When a failed round gives ε back"), the device's side:
the abort statement it signs for a secure round that FAILED, and the certificate of abort that
gives back a spend whose masked input had left it (:mod:`fedsketch.common.secagg.abort`).

When a daemon learns that a round it holds a session of has FAILED (the round is no longer
listed, and GetStudy says so), it

1. signs nothing if it computed its UNMASK message (``UNMASK`` in the session's replies, kept
   before the first send: it may have revealed shares); the round then leaves it as before;
2. otherwise records in its ledger session that it aborted the round (``aborted``, ``left``)
   and erases the round's secrets from it (the shares of its neighbours' secrets it holds, its
   keys, x and e: the old row overwritten, the write-ahead log truncated), committed, *before*
   the statement leaves: a restarted daemon, or a coordinator that lists the round again at
   UNMASK, finds a left session and a device that holds no share to reveal;
3. sends the statement (``Device/SecAggAbort``) and gets back the certificate collected so far;
4. if it spent on the round and its masked input may have left it (else rule A gives the spend
   back), keeps the statements of the round's instance R that verify under the keys its spend
   recorded (the round terms, ledger schema 9: R, t, C and the holders of its own shares
   N⁺(u) with their keys, from the round setup it received, the coordinator's word): at
   need(H, t, C) of them, itself among them, it voids the spend with the certificate (its
   SHA-256 sealed in the void row, :mod:`.ledger_voids`, which checks it against the terms);
   while the coordinator still collects (not ``final``) it keeps the session and asks again
   on its next pass; once final, the spend stands and the log says so. A spend without terms
   (recorded by an earlier release) stands.

A device signs only for the round instance it received (R, the SHA-256 of its ADVERTISE_KEYS
bundle): one that never received it holds no share of the round and signs nothing.

The daemon asks once per pass, and only about rounds it holds a session of; a coordinator that
does not know the call (an older release), or refuses the statement, leaves the spend standing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from fedsketch.client.ledger import Identity, Ledger, LedgerError
from fedsketch.client.ledger_chain import MASKED
from fedsketch.client.roster_steps import FINAL_REFUSALS
from fedsketch.client.secure_session import Session
from fedsketch.client.study_pass import RPC_TIMEOUT
from fedsketch.common.net.device_reads import audience
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.secagg.abort import (
    Certificate,
    RoundTerms,
    bundle_digest,
    sign_statement,
    valid_statements,
)
from fedsketch.common.text import printable

log = logging.getLogger("fedsketch.device")


class SecureAbort:
    """The rule-B step of :class:`fedsketch.client.agent.Agent` (a mixin: the agent provides the
    stub, the ledger, its source and the coordinator's name)."""

    stub: pb_grpc.DeviceStub
    ledger: Ledger
    source: str
    _coordinator: str | None
    _void_unsent: Callable[..., None]

    def _forget_round(self, identity: Identity, study_id: str, text: bytes, ended: str) -> None:
        """The round of ``study_id`` (its stored session ``text``) ended ``ended``: for a FAILED
        one, rule B first (nothing more while the certificate may still grow); then rule A gives
        back a spend whose masked input never left, and the session goes, unless the device
        signed the round's abort: then it stays as a tombstone (:meth:`Session.tombstone`)."""
        if ended == "FAILED" and not self._abort_settled(identity, study_id, text):
            return
        self._void_unsent(study_id, Session.sent_masked(text), f"the round ended ({ended})",
                          ended=ended)
        if Session.signed_abort(kept := self.ledger.sessions(self.source).get(study_id, b"")):
            self.ledger.save_session(study_id, self.source, Session.tombstone(kept), scrub=True)
        else:
            self.ledger.drop_session(study_id, self.source)

    def _abort_settled(self, identity: Identity, study_id: str, text: bytes) -> bool:
        """Sign the abort of the FAILED round of ``study_id`` (its stored session ``text``) and
        act on the certificate (module docstring); True once the device is done with the round
        (its session may go), False to ask again on the next pass. A transient RPC error
        propagates (the pass is retried)."""
        name = printable(study_id)
        try:
            session = Session.load(study_id, text, identity)
        except ValueError:
            return True  # nothing to sign with; the caller's rule A decides on the spend
        if pb.UNMASK in session.replies or pb.UNMASK in session.done:
            log.info("study %s: the device computed its UNMASK shares for the round: it signs "
                     "no abort statement", name)
            return True
        if not session.aborted:
            session.aborted = session.left = True
            session.client = session.input = session.noise = None
            self.ledger.save_session(study_id, self.source, session.dump(), scrub=True)
        if session.setup is None:
            log.info("study %s: the device never received the round's parameters (ADVERTISE_KEYS): "
                     "it holds no share of the round and has no round instance to sign for", name)
            return True
        to, r = audience(self._coordinator or ""), bundle_digest(session.setup)
        statement = pb.AbortStatement(
            study_id=study_id, device_id=identity.device_id, audience=to, round_sha256=r,
            signature=sign_statement(identity.private_key, to, study_id, r, identity.device_id))
        try:
            reply = self.stub.SecAggAbort(statement, timeout=RPC_TIMEOUT)
        except grpc.RpcError as exc:
            if exc.code() not in (*FINAL_REFUSALS, grpc.StatusCode.UNIMPLEMENTED):
                raise
            log.warning("study %s: the coordinator refused the device's abort statement (%s: %s)",
                        name, exc.code().name, printable(exc.details() or ""))
            return True
        spend = self.ledger.find(study_id)
        if (spend is None or spend.kind != MASKED or self.ledger.voided(study_id)
                or not (Session.sent_masked(text) or spend.acked_at is not None)):
            return True  # nothing left the device that rule B must cover
        if spend.round_terms is None:
            log.warning("study %s: the spend recorded no round terms (an earlier release wrote "
                        "it): no certificate of abort can give it back; it stands", name)
            return True
        terms = RoundTerms.from_bytes(spend.round_terms)
        holders = terms.holders
        cert = Certificate(study_id, identity.device_id, to, terms.threshold, terms.colluders,
                           holders, valid_statements(((s.device_id, s.audience, s.round_sha256,
                                                       s.signature) for s in reply.statements),
                                                     holders, to, study_id, terms.bundle_sha256),
                           terms.bundle_sha256)
        signed, need = len(cert.statements), cert.need
        if cert.sufficient:
            try:
                self.ledger.void(study_id, f"the round aborted before the masked input could be "
                                 f"unmasked: certificate of abort from {signed} of the "
                                 f"{len(holders)} holders of its shares ({need} needed)",
                                 certificate=cert.to_bytes())
            except LedgerError as exc:
                log.warning("study %s: %s", name, exc)
                return True
            log.warning("study %s: certificate of abort from %d of the %d holders of the device's "
                        "shares (%d needed): its masked input can never be unmasked; its spend "
                        "of ε = %g is void and given back", name, signed, len(holders), need,
                        spend.epsilon)
            return True
        if reply.final:
            log.info("study %s: the certificate of abort holds %d of the %d holders' statements "
                     "needed, and the coordinator collects no more", name, signed, need)
            return True
        log.info("study %s: the certificate of abort holds %d of the %d holders' statements "
                 "needed so far; the device asks again on its next pass", name, signed, need)
        return False
