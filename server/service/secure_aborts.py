"""Rule B of docs/secure-aggregation.md ("When a failed round gives ε back"), the coordinator's
side: it collects the abort statements of a failed secure round and hands each device of the
round the certificate collected so far (:mod:`fedsketch.common.secagg.abort`).

A device of the round's roster that learns the round FAILED signs its statement (only if it
sent no UNMASK shares, after recording in its ledger that it never will) for the round's
instance R it received (the SHA-256 of its ADVERTISE_KEYS bundle; statement version 2) and
sends it (``Device/SecAggAbort``); the coordinator checks the signature against the device's
enrolled key and the name it was signed for against its own, keeps it (one per device and
name, :mod:`fedsketch.server.store.abort_statements`), and answers with every statement of the
round. It counts, as the device will, the distinct holders of the caller's shares (N⁺(u) in the
round's graph, rebuilt from the roster the store kept) with a valid statement of the caller's
R; at need(H, t, C) or more it records the caller certified, and the round leaves the caller's
account (:mod:`fedsketch.server.store.accounts`): the device's ledger gives the spend back with
that certificate, so the two books agree. The coordinator does not keep the bundle of a round
that ended, so it does not check R itself: a statement of another R counts for nobody who
received the round's own bundle.

A round that reached UNMASK needs no rule of its own: a device that sent its UNMASK shares never
signs, so a device u of which t shares of b_u were revealed has at most H − t honest signers,
fewer than need(H, t, C) = H − t + 1 + min(C, H − 1): its certificate cannot suffice.

Collection window: the answer is ``final`` once every roster device has signed, or
:data:`WINDOW_TIMEOUTS` stage timeouts after the round's first statement; a device that holds a
certificate too short when it is final keeps its spend and says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fedsketch.common.net import signing
from fedsketch.common.net.device_reads import audience_name, names_audience
from fedsketch.common.secagg.abort import counted, needed, statement_digest
from fedsketch.common.study.secure_calibration import SecureProtocol
from fedsketch.server.errors import Code, Refusal
from fedsketch.server.store.abort_statements import AbortStatementRow
from fedsketch.server.store.base import Store

#: The collection window, in stage timeouts of the round, from its first statement: every
#: device of the roster polls several times within one timeout (docs/secure-aggregation.md).
WINDOW_TIMEOUTS = 2.0


class SecureAborts:
    """A mixin of :class:`~fedsketch.server.service.coordinator.Coordinator`, which provides
    ``store``, ``audiences``, ``_enrolled_key`` and ``_protocol``."""

    store: Store
    audiences: frozenset[str] | None
    _enrolled_key: Callable[[str], bytes]
    _protocol: Callable[[str], SecureProtocol | None]

    def abort_round(self, study_id: str, device_id: str, audience: str, round_sha256: bytes,
                    signature: bytes) -> tuple[list[AbortStatementRow], bool]:
        """Keep one device's abort statement of a failed round's instance ``round_sha256``;
        (every statement of the round, whether the collection is final). Refusals:
        INVALID_ARGUMENT for a statement that names no round instance (a version-1 statement);
        UNAUTHENTICATED for a signature that does not verify or a name that is not this
        coordinator's; PERMISSION_DENIED for a device not in the roster of a round that ended (or
        a round still running); FAILED_PRECONDITION for a round that ended other than FAILED."""
        if len(round_sha256) != 32:
            raise Refusal(Code.INVALID_ARGUMENT, "the abort statement names no round instance (the "
                          "SHA-256 of the round's ADVERTISE_KEYS bundle, 32 bytes): a version-1 "
                          "statement (fedsketch/secagg-abort/v1) is no longer taken")
        key = self._enrolled_key(device_id)
        if not signing.verify(key, statement_digest(audience, study_id, round_sha256, device_id, key),
                              signature):
            raise Refusal(Code.UNAUTHENTICATED, "invalid signature on an abort statement")
        if self.audiences is not None and not names_audience(self.audiences, audience_name(audience)):
            raise Refusal(Code.UNAUTHENTICATED, f"the abort statement is signed for coordinator "
                          f"{audience!r}, and this coordinator's certificate names "
                          f"{', '.join(sorted(self.audiences))}")
        kept = self.store.secure_round(study_id)
        members = kept.members if kept is not None and kept.ended and kept.members else {}
        if device_id not in members:
            self.store.get_study(study_id)  # not_found for an unknown study
            raise Refusal(Code.PERMISSION_DENIED, f"device {device_id} is not in the roster of a "
                          f"secure round of study {study_id} that ended")
        self.store.add_abort_statement(study_id, device_id, audience, signature, round_sha256)
        rows = self.store.abort_statements(study_id)
        protocol = self._protocol(study_id)
        try:
            params = protocol.round_params(study_id, tuple(sorted(members)))
        except ValueError:  # the round failed at REGISTER: it never opened, nobody spent
            return rows, True
        holders = {v: self.store.device_key(v) or b"" for v in params.closed(device_id)}
        signers = counted(((r.device_id, r.audience, r.round_sha256, r.signature) for r in rows),
                          holders, audience, study_id, round_sha256)
        if device_id in signers and len(signers) >= needed(len(holders), params.threshold,
                                                           params.colluders):
            self.store.certify_abort(study_id, device_id)
        window = WINDOW_TIMEOUTS * protocol.secure_aggregation.stage_timeout
        final = (set(members) <= {r.device_id for r in rows}
                 or time.time() > rows[0].received_at + window)
        return rows, final
