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
   back), keeps the statements that verify under the roster's keys from its own round setup
   (the coordinator's word) for the holders of its own shares, N⁺(u): at need(H, t, C) of
   them, itself among them, it voids the spend with the certificate (its SHA-256 sealed in the
   void row, :mod:`.ledger_voids`); while the coordinator still collects (not ``final``) it
   keeps the session and asks again on its next pass; once final, the spend stands and the
   log says so.

The daemon asks once per pass, and only about rounds it holds a session of; a coordinator that
does not know the call (an older release), or refuses the statement, leaves the spend standing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from fedsketch.client.ledger import Identity, Ledger
from fedsketch.client.ledger_chain import MASKED
from fedsketch.client.roster_steps import FINAL_REFUSALS
from fedsketch.client.secure_session import Session
from fedsketch.client.study_pass import RPC_TIMEOUT
from fedsketch.common.net.device_reads import audience
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.secagg import wire as sw
from fedsketch.common.secagg.abort import Certificate, sign_statement, valid_statements
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
        to = audience(self._coordinator or "")
        statement = pb.AbortStatement(study_id=study_id, device_id=identity.device_id, audience=to,
                                      signature=sign_statement(identity.private_key, to, study_id,
                                                               identity.device_id))
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
                or not (Session.sent_masked(text) or spend.acked_at is not None)
                or session.setup is None):
            return True  # nothing left the device that rule B must cover
        params, keys, _ = sw.params_from_json(study_id, sw.load(session.setup))
        holders = {v: keys.get(v, b"") for v in params.closed(identity.device_id)}
        cert = Certificate(study_id, identity.device_id, to, params.threshold, params.colluders,
                           holders, valid_statements(((s.device_id, s.audience, s.signature)
                                                      for s in reply.statements),
                                                     holders, to, study_id))
        signed, need = len(cert.statements), cert.need
        if cert.sufficient:
            self.ledger.void(study_id, f"the round aborted before the masked input could be "
                             f"unmasked: certificate of abort from {signed} of the {len(holders)} "
                             f"holders of its shares ({need} needed)", certificate=cert.to_bytes())
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
