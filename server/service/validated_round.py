"""The coordinator's side of a secure study validated by a helper (``validation: "helper"``,
docs/bounded-influence.md): REGISTER → MASKED_INPUT → the helper's verification → the sum.

It is a :class:`~.secure_round.SecAggRound` with two stages. REGISTER is the same (a device's
record count n, refused beyond the study's limits; at least L − D registered). At MASKED_INPUT
each roster device sends its report's leader part (:func:`~fedsketch.common.validity.wire.leader_to_bytes`:
its input and proof shares for the circuit of its registered n,
:func:`~fedsketch.common.study.validated.device_circuit`), after uploading the helper part to
the helper the spec names. When the stage closes (every roster device sent, or its timeout), the
coordinator verifies every report with the helper (:func:`fedsketch.server.helper.link.validate`):
a report that is malformed, whose helper share is missing or whose proof fails is excluded, and
counted in the round's outcome; the sum of the valid reports is published through the same
decoding as a masked sum (then the aggregate check runs on it), if at least L − D reports are
valid (the coordinator checks that floor itself, whatever the helper says); else, or on any
error in the helper's answers, the study fails and nothing is published.

What the coordinator learns is the leader shares (uniform in F_p) and the helper's verifier
messages (which reveal only validity: docs/bounded-influence.md) and the sum. A coordinator
restarted after it closed the helper's collection draws a new query seed, which the helper
refuses (it committed to the first): the study fails, without publishing.
"""

from __future__ import annotations

import time
from collections import Counter

import grpc

from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.study.validated import device_circuit
from fedsketch.common.validity import xof
from fedsketch.common.validity.sharing import proven
from fedsketch.common.validity.wire import leader_from_bytes
from fedsketch.server.errors import Code, Refusal
from fedsketch.server.helper.link import Report, helper_stub, validate
from fedsketch.server.service.rounds import failure_detail
from fedsketch.server.service.secure_round import SecAggRound


class ValidatedRound(SecAggRound):
    """A validated study's round (module docstring); ``helper_token`` is the token the helper
    gave the coordinator's operator (``coordinator serve --helper-token-file``)."""

    #: The validated round's stages, in order (the base class replays a restart through them).
    STAGES = (pb.REGISTER, pb.MASKED_INPUT)
    helper_token: str | None = None

    def _blank(self) -> None:
        super()._blank()
        #: the outcome once validated: valid and excluded device ids
        self.validation: dict[str, list[str]] | None = None

    def _expected(self) -> set[str] | None:
        return None if self.stage == pb.REGISTER else set(self._records)

    def _parse(self, stage: int, body: bytes) -> object:
        """REGISTER's count, or a report kept as bytes: its length is checked against its
        device's own circuit when the stage closes (a wrong one is excluded), and bounded here
        only by the transport (a device with fewer records can have the longer encoding: its
        L1 witness may fit the field where the cap's does not)."""
        if stage == pb.REGISTER:
            return self._records_of(body)
        if len(body) < 3 * xof.SEED_BYTES:
            raise Refusal(Code.INVALID_ARGUMENT, f"malformed MASKED_INPUT report: {len(body)} bytes")
        return body

    def _advance(self, replaying: bool = False) -> None:
        closing = self.stage
        parsed = {u: content for u, (_, content) in self._inbox[closing].items()}
        if not replaying:
            self.stage_open[pb.Stage.Name(closing)] = time.time() - self._opened_at
        started = time.perf_counter()
        if closing == pb.REGISTER:
            try:
                self.spec.round_params(self.study_id, tuple(sorted(parsed)))  # the roster's size
            except ValueError as exc:
                self._conclude(None, failure_detail(self.spec, f"validated round aborted at "
                                                    f"REGISTER: {exc}; nobody has spent anything"))
                return
            self._records = parsed
            self.stage = pb.MASKED_INPUT
            self.stage_seconds["REGISTER"] = time.perf_counter() - started
            if not replaying:
                now = time.time()
                self._store.open_stage(self.study_id, self.stage, now)
                self._opened_at, self.deadline = now, now + self.sa.stage_timeout
            return
        total, reason = self._validate(parsed)
        self.stage_seconds["MASKED_INPUT"] = time.perf_counter() - started
        self._conclude(total, reason)

    def _validate(self, bodies: dict[str, bytes]):
        """(the valid reports' sum, "") or (None, why the study fails); sets ``validation`` and
        the survivors (the devices whose reports are in the sum)."""
        parsed = {}
        for device, body in sorted(bodies.items()):
            circuit = device_circuit(self.spec, int(self._records[device]))
            proof = proven(*circuit)
            try:  # a malformed report is left out (excluded)
                nonce, share = leader_from_bytes(body, proof.circuit.length,
                                                 proof.proofs * proof.flp.proof_len)
            except ValueError:
                continue
            parsed[device] = Report(nonce, share, circuit)
        nonces = Counter(r.nonce for r in parsed.values())  # a replayed report: all copies out
        device_of = {r.nonce: u for u, r in parsed.items() if nonces[r.nonce] == 1}
        reports = [r for r in parsed.values() if r.nonce in device_of]
        need = self.spec.assumptions.min_submitters
        try:
            if self.helper_token is None:
                raise RuntimeError("this coordinator was started without --helper-token-file")
            stub, meta = helper_stub(self.sa.helper, self.sa.helper_ca.encode(), self.helper_token)
            out = validate(stub, meta, self.study_id, reports, xof.seed(), need)
            if len(out.accepted) < need:  # validate checks it too: the floor is the coordinator's
                raise RuntimeError(f"{len(out.accepted)} valid reports, fewer than the study's "
                                   f"L - D = {need}")
        except Exception as exc:  # noqa: BLE001 — whatever the helper's answers raise: the study fails
            why = (f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.RpcError)
                   else f"{type(exc).__name__}: {exc}")
            self.validation = {"valid": [], "excluded": sorted(bodies)}
            return None, failure_detail(self.spec, f"validation with the helper failed: {why}; "
                                        "nothing is published")
        valid = sorted(device_of[n] for n in out.accepted)
        excluded = sorted(set(bodies) - set(valid))
        self.validation = {"valid": valid, "excluded": excluded}
        self._survivors = tuple(valid)
        return out.total, (f"validated sum: {len(valid)} reports valid, {len(excluded)} excluded"
                           + (f" ({', '.join(excluded)})" if excluded else ""))
