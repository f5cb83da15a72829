"""The helper's gRPC service (proto/fedsketch.proto, service Helper) over its :class:`HelperStore`.

The protocol of one study (docs/bounded-influence.md, "The helper"):

1. **Upload** (devices): a report's helper share (16-byte seed, blind, the leader's part) under
   its nonce, kept before it is acknowledged; refused once the study's collection is closed.
2. **CloseCollection** (coordinator): the coordinator commits to its 16-byte query seed s_L
   (c = SHA-256(s_L)); the helper draws its own s_H from the OS once and answers it. Neither
   party chooses the verify key k = H(s_L, s_H) alone: the coordinator's seed is fixed before it
   sees s_H, and the helper's is drawn without seeing s_L. Devices see neither, so the query
   points of their proofs are unknown to them when they prove.
3. **Prepare** (coordinator): reveals s_L (checked against c) and names the reports it holds,
   each with its circuit (n entries, bound B, L1 bound B₁: the coordinator's reading of the
   public spec and the device's registered n); the first Prepare fixes them. The helper answers
   its verifier message for each (:meth:`ProvenInput.prepare`), or "absent".
4. **Aggregate** (coordinator): sends its own messages; the helper decides each report itself
   (:meth:`ProvenInput.decide`) and answers the nonces it accepted and its share of their
   decoded sum, Σ decode(share_i) over the accepted reports (n words of F_p). It answers at most
   one aggregate per study, and only over at least max(``min_reports``, the helper's
   ``--min-reports``) reports: a second request with other content is refused, so the
   coordinator cannot difference two sums to read one input.

The coordinator's calls carry ``authorization: Bearer <helper token>`` (UNAUTHENTICATED without,
PERMISSION_DENIED for a wrong one).
"""

from __future__ import annotations

import hashlib
import hmac
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np

from fedsketch.common.net.tls import ServerTLS
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.validity import wire, xof
from fedsketch.common.validity.field import add
from fedsketch.common.validity.sharing import HelperShare, proven, verify_key
from fedsketch.server.errors import Code, Refusal
from fedsketch.server.helper.store import HelperStore
from fedsketch.server.service.handlers import add_service

#: gRPC messages the helper takes and sends (the coordinator's Prepare and Aggregate grow with
#: the reports; the handlers' own limits are smaller).
HELPER_MESSAGE_BYTES = 64 * 1024 * 1024
SEED = xof.SEED_BYTES


def _need(cond: bool, code: Code, message: str) -> None:
    if not cond:
        raise Refusal(code, message)


class HelperService:
    """The four calls of the Helper service (module docstring)."""

    def __init__(self, store: HelperStore, token_sha256: str, min_reports: int = 3) -> None:
        self._store = store
        self._token_sha256 = token_sha256
        self._min_reports = min_reports

    def _authorize(self, context: grpc.ServicerContext) -> None:
        header = dict(context.invocation_metadata()).get("authorization", "")
        if not header.startswith("Bearer "):
            raise Refusal(Code.UNAUTHENTICATED, "the coordinator's calls need "
                          "`authorization: Bearer <helper token>` metadata")
        digest = hashlib.sha256(header.removeprefix("Bearer ").encode()).hexdigest()
        if not hmac.compare_digest(digest, self._token_sha256):
            raise Refusal(Code.PERMISSION_DENIED, "wrong helper token")

    def Upload(self, request: pb.HelperUpload, context) -> pb.HelperAck:
        sid = request.study_id
        _need(0 < len(sid) <= 64, Code.INVALID_ARGUMENT, "a study id of 1 to 64 characters")
        for name in ("nonce", "seed", "blind", "peer_part"):
            _need(len(getattr(request, name)) == SEED, Code.INVALID_ARGUMENT,
                  f"{name} must have {SEED} bytes")
        _need(self._store.closed(sid) is None, Code.FAILED_PRECONDITION,
              f"study {sid}: the helper's collection is closed")
        kept = self._store.upload(sid, request.nonce, request.seed, request.blind,
                                  request.peer_part)
        _need(kept is not None, Code.CONFLICT, "this report's nonce holds another helper share")
        return pb.HelperAck(duplicate=not kept)

    def CloseCollection(self, request: pb.HelperClose, context) -> pb.HelperCloseReply:
        self._authorize(context)
        _need(len(request.seed_commitment) == 32, Code.INVALID_ARGUMENT,
              "the commitment is a SHA-256 (32 bytes)")
        commitment, seed = self._store.close(request.study_id, request.seed_commitment, xof.seed())
        _need(commitment == request.seed_commitment, Code.CONFLICT,
              "the study's collection was closed under another commitment")
        return pb.HelperCloseReply(helper_seed=seed, reports=self._store.count(request.study_id))

    def _key_and_circuits(self, sid: str, leader_seed: bytes | None,
                          circuits: dict | None) -> tuple[bytes, dict]:
        closed = self._store.closed(sid)
        _need(closed is not None, Code.FAILED_PRECONDITION, f"study {sid}: collection not closed")
        commitment, helper_seed, revealed = closed
        if leader_seed is None:  # Aggregate: what Prepare fixed
            _need(revealed is not None, Code.FAILED_PRECONDITION, f"study {sid}: not prepared")
            return verify_key(revealed, helper_seed), self._store.fix_circuits(sid, revealed, {})
        _need(hmac.compare_digest(hashlib.sha256(leader_seed).digest(), commitment),
              Code.PERMISSION_DENIED, "the coordinator's seed does not match its commitment")
        stored = self._store.fix_circuits(sid, leader_seed, circuits)
        _need(stored == circuits, Code.CONFLICT, "the study's reports were prepared with "
              "other circuits")
        return verify_key(leader_seed, helper_seed), stored

    def _prep(self, sid: str, key: bytes, nonce: bytes, circuit: tuple[int, int, int]):
        share = self._store.share(sid, nonce)
        if share is None:
            return None
        try:
            return proven(*circuit).prepare(HelperShare(*share), key, nonce)
        except (ValueError, RuntimeError):
            return None

    def Prepare(self, request: pb.HelperPrepare, context) -> pb.HelperPrepareReply:
        self._authorize(context)
        _need(len(request.leader_seed) == SEED, Code.INVALID_ARGUMENT, f"a seed has {SEED} bytes")
        circuits = {}
        for r in request.reports:
            _need(len(r.nonce) == SEED and r.nonce not in circuits, Code.INVALID_ARGUMENT,
                  "each report once, by its 16-byte nonce")
            try:
                proven(r.entries, r.bound, r.l1_bound)
            except ValueError as exc:
                raise Refusal(Code.INVALID_ARGUMENT, f"a report's circuit: {exc}") from None
            circuits[bytes(r.nonce)] = (r.entries, r.bound, r.l1_bound)
        sid = request.study_id
        key, circuits = self._key_and_circuits(sid, bytes(request.leader_seed), circuits)
        return pb.HelperPrepareReply(shares=[
            wire.to_pb(nonce, self._prep(sid, key, nonce, circ)) for nonce, circ in circuits.items()])

    def Aggregate(self, request: pb.HelperAggregate, context) -> pb.HelperAggregateReply:
        self._authorize(context)
        sid = request.study_id
        digest = hashlib.sha256(request.SerializeToString(deterministic=True)).digest()
        if (done := self._store.aggregate(sid)) is not None:
            _need(done[0] == digest, Code.CONFLICT, f"study {sid}: the helper answered another "
                  "aggregate request; it answers one per study")
            return pb.HelperAggregateReply(accepted=done[1], share=done[2])
        key, circuits = self._key_and_circuits(sid, None, None)
        leader = {bytes(s.nonce): s for s in request.leader}
        _need(set(leader) <= set(circuits), Code.INVALID_ARGUMENT, "a report that was not prepared")
        accepted, total, entries = [], None, None
        for nonce, circuit in circuits.items():
            proof = proven(*circuit)
            mine = self._prep(sid, key, nonce, circuit)
            try:
                theirs = wire.from_pb(leader[nonce], 3 * proof.flp.verifier_len) if nonce in leader else None
            except ValueError:
                theirs = None
            if mine is None or theirs is None or not proof.decide(mine, theirs):
                continue
            _need(entries in (None, circuit[0]), Code.INVALID_ARGUMENT,
                  "the accepted reports have different lengths")
            held = proof.input_share(HelperShare(*self._store.share(sid, nonce)))
            share = proof.circuit.decode(held, num_shares=2)
            total = share if total is None else add(total, share)
            accepted.append(nonce)
            entries = circuit[0]
        floor = max(request.min_reports, self._min_reports)
        _need(len(accepted) >= floor, Code.FAILED_PRECONDITION,
              f"study {sid}: {len(accepted)} valid reports, fewer than {floor}: no share is answered")
        raw = wire.words(np.asarray(total))
        self._store.keep_aggregate(sid, digest, accepted, raw)
        return pb.HelperAggregateReply(accepted=accepted, share=raw)


def build_helper(store: HelperStore, token_sha256: str, listen: str, tls: ServerTLS | None,
                 min_reports: int = 3, workers: int = 8) -> tuple[grpc.Server, int]:
    """A started gRPC server with the Helper service on ``listen``: (server, bound port)."""
    options = [("grpc.max_receive_message_length", HELPER_MESSAGE_BYTES),
               ("grpc.max_send_message_length", HELPER_MESSAGE_BYTES), ("grpc.so_reuseport", 0)]
    server = grpc.server(ThreadPoolExecutor(max_workers=workers), options=options)
    add_service(server, "Helper", HelperService(store, token_sha256, min_reports))
    try:
        port = (server.add_insecure_port(listen) if tls is None
                else server.add_secure_port(listen, tls.credentials))
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {listen}: the address is in use or not available here")
    server.start()
    return server, port
