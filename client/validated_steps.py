"""The device's side of a secure study validated by a helper (``validation: "helper"``,
docs/bounded-influence.md): REGISTER as in any secure study, then one report instead of the
masking stages.

* REGISTER: as :mod:`.secure_steps` (the count n, then the exact input x read once), but the
  noise share e is drawn within its public radii
  (:func:`~fedsketch.common.study.validated.bounded_noise_share`,
  redrawn until it is: the δ = (1 + e^ε)·L·2^−39 this costs is recorded with the spend).
* MASKED_INPUT (no keys were exchanged: the round goes there from REGISTER): the device
  proves x + e in the range of its registered n (:func:`~fedsketch.common.study.validated.device_circuit`)
  and splits it into the coordinator's share (input and proof shares, 480 kB at m = 1000) and
  the helper's (48 bytes), keeps both in its session, records the spend (with the coordinator's
  bytes, like a masked input, and δ), then uploads the helper's share to the helper the spec
  names (TLS against the spec's CA), and only then sends the coordinator's share. Each step is
  kept before the next, so a restarted daemon goes on with the same bytes; an upload the helper
  refuses leaves the round, and the spend is given back (nothing of x left the device).

A validated round has no other stage: a coordinator that announces any other (ADVERTISE_KEYS,
CONSISTENCY, UNMASK, …) for a validated study is not following the protocol, and the device
leaves the round at once, saying why (a spend on a report already sent stands; one whose report
never left is given back). The helper's share is kept in the session's own ``helper_upload``
field, which no stage's code reads, and erased once the helper has it. A helper that cannot be
reached (UNAVAILABLE, DEADLINE_EXCEEDED) is a :class:`~.localdata.Retry` for this study only,
naming the helper. Hostile behaviour lives in the simulator only (``server/sim/hostile.py``).
"""

from __future__ import annotations

import grpc
import numpy as np

from fedsketch.client.declines import Declined
from fedsketch.client.ledger import BudgetExceeded, Identity, LedgerError
from fedsketch.client.localdata import LocalData, Retry
from fedsketch.client.roster_steps import FINAL_REFUSALS
from fedsketch.client.secure_session import Session
from fedsketch.client.secure_steps import SECURE_KIND, SecureSteps
from fedsketch.client.study_pass import RPC_TIMEOUT, Outcome, fault_point, spend_labels
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.sketch.box import Tally
from fedsketch.common.study.validated import (
    bounded_noise_share,
    device_circuit,
    is_validated,
    validity_delta,
)
from fedsketch.common.validity import xof
from fedsketch.common.validity.sharing import ProvenInput, proven
from fedsketch.common.validity.wire import leader_to_bytes

#: The only stages of a validated round (:mod:`fedsketch.server.service.validated_round`).
VALIDATED_STAGES = (pb.REGISTER, pb.MASKED_INPUT)


def upload_to_helper(spec, body: bytes) -> None:
    """Send the helper's share (a serialized ``HelperUpload``) to the spec's helper."""
    sa = spec.secure_aggregation
    channel = grpc.secure_channel(
        sa.helper, grpc.ssl_channel_credentials(root_certificates=sa.helper_ca.encode()))
    try:
        pb_grpc.HelperStub(channel).Upload(pb.HelperUpload.FromString(body), timeout=RPC_TIMEOUT)
    finally:
        channel.close()


class ValidatedSteps(SecureSteps):
    """:class:`SecureSteps` with the validated study's report (module docstring)."""

    def _secure_step(self, identity: Identity, study: pb.Study, out: Outcome) -> str | None:
        session = self._sessions.get(study.study_id)
        if session is None or not is_validated(session.spec):
            return super()._secure_step(identity, study, out)
        if study.stage not in VALIDATED_STAGES:
            if session.left:
                return None
            return self._drop(study.study_id, session, Declined(
                f"the coordinator announced {pb.Stage.Name(study.stage)} for a study validated by "
                "a helper, whose round has only REGISTER and MASKED_INPUT: the device leaves the "
                "round and sends nothing more", pb.OTHER))
        if (study.stage == pb.MASKED_INPUT and not session.left
                and pb.MASKED_INPUT not in session.done):
            return self._report_step(study, session, out, identity)
        return super()._secure_step(identity, study, out)

    @staticmethod
    def _exact_input(session: Session, data: LocalData,
                     tally: Tally) -> tuple[np.ndarray, int, np.ndarray]:
        x, n, noise = SecureSteps._exact_input(session, data, tally)
        return x, n, (bounded_noise_share(session.spec) if is_validated(session.spec) else noise)

    def _shard(self, proof: ProvenInput, value: np.ndarray, nonce: bytes):
        """The report's (leader, helper) shares of ``value`` with its proofs; ValueError when
        ``value`` is out of its range (an honest device then sends nothing)."""
        return proof.shard(value, nonce)

    def _report_step(self, study: pb.Study, session: Session, out: Outcome,
                     identity: Identity) -> str | None:
        sid, spec = study.study_id, session.spec
        if session.input is None or session.noise is None:
            return self._drop(sid, session, Declined(
                "the round's session holds no input (an earlier release's): the device leaves "
                "the round, unspent", pb.OTHER))
        if pb.MASKED_INPUT not in session.replies:
            proof, nonce = proven(*device_circuit(spec, session.n)), xof.seed()
            try:
                leader, helper = self._shard(proof, session.input + session.noise, nonce)
            except ValueError as exc:  # never for an honest input: its bound is its n's
                return self._drop(sid, session, Declined(
                    f"the input does not fit its public range ({exc}); nothing is sent", pb.OTHER))
            session.replies[pb.MASKED_INPUT] = leader_to_bytes(nonce, leader)
            session.helper_upload = pb.HelperUpload(
                study_id=sid, nonce=nonce, seed=helper.seed, blind=helper.blind,
                peer_part=helper.peer_part).SerializeToString()
            self._keep(sid, session)  # proven once: a restart spends on and sends these bytes
        if (spend := self.ledger.find(sid)) is None:
            premask = (session.input + session.noise).astype("<i8").tobytes()
            try:
                spend = self.ledger.record_spend(
                    study_id=sid, source=self.source, epsilon=session.epsilon,
                    delta=validity_delta(spec), n=float(session.n), kind=SECURE_KIND,
                    payload=session.replies[pb.MASKED_INPUT], spec_sha256=study.spec_sha256,
                    premask=premask, **spend_labels(spec, session.round, session.later))
            except BudgetExceeded as exc:
                return self._drop(sid, session, Declined(str(exc), pb.BUDGET))
            except LedgerError as exc:
                return self._drop(sid, session, str(exc))
            fault_point()
        if session.helper_upload is None:  # a session kept before the field: out, nothing sent
            return self._drop(sid, session, Declined(
                "the round's session holds no helper share: the device leaves the round",
                pb.OTHER))
        try:  # the helper's share first: a report whose helper share is missing is excluded
            upload_to_helper(spec, session.helper_upload)
        except grpc.RpcError as exc:
            if exc.code() not in FINAL_REFUSALS:  # the helper may come back: this study waits
                return Retry(f"the helper at {spec.secure_aggregation.helper} cannot be reached "
                             f"({exc.code().name}: {exc.details()}); the device tries again on "
                             "its next pass", pb.OTHER)
            return self._drop(sid, session, Declined(
                f"the helper refused this device's share: {exc.code().name}: {exc.details()}",
                pb.OTHER))
        self.bytes_sent += len(session.helper_upload)
        session.done.add(pb.MASKED_INPUT)
        session.input = session.noise = session.helper_upload = None  # served only the report
        self.ledger.save_session(sid, self.source, session.dump(), scrub=True)
        if spend.acked_at is None:
            if (refused := self._deliver(identity, spend)) is not None:
                return self._drop(sid, session, refused)
            out.submitted.append(sid)
        return None
