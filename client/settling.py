"""How a device learns that the studies it spent on have ended, and records it: the final state
(DONE or FAILED) beside each spend, so that ``fedsketch device budget`` shows what each spend
bought, and a round's promise of ε for its study's later rounds ends (:mod:`.ledger_schema`)."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from fedsketch.client.ledger import Identity, Ledger
from fedsketch.client.study_pass import RPC_TIMEOUT
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc


class Settling:
    """The agent's settling of ended studies (a mixin of :class:`fedsketch.client.agent.Agent`,
    which provides the ledger, the stub and ``_read``, its signed device read)."""

    ledger: Ledger
    stub: pb_grpc.DeviceStub
    _read: Callable[..., pb.DeviceRead]

    def _settle(self) -> None:
        """Record the final state (DONE or FAILED) of studies this device spent on, once they end,
        so that ``fedsketch device budget`` can show what each spend bought. A round's release
        that keeps ε for its study's later rounds (:func:`~.ledger_schema.promises`) is settled
        only once the study itself has ended too: the record ends the promise."""
        identity = self.ledger.identity()
        for spend in self.ledger.unsettled():
            ended = [self._ended(identity, spend.study_id)]
            if spend.parent is not None and spend.study_epsilon is not None and ended[0]:
                ended.append(self._ended(identity, spend.parent))
            if all(ended):
                self.ledger.set_final_state(spend.study_id, ended[0])

    def _ended(self, identity: Identity, study_id: str) -> str | None:
        """How study ``study_id`` ended (DONE, FAILED, or that the coordinator does not let this
        device read it), or None while it runs."""
        try:
            study = self.stub.GetStudy(self._read(identity, "GetStudy", study_id), timeout=RPC_TIMEOUT)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.PERMISSION_DENIED:
                raise
            return "UNKNOWN to the coordinator, or not readable by this device"
        return pb.StudyState.Name(study.state) if study.state in (pb.DONE, pb.FAILED) else None
