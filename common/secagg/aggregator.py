"""The coordinator's side of secure aggregation (package docstring, stages 1–5 and the output)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from ..net import signing
from .crypto import (
    KEY_BYTES,
    add_pair_mask,
    agree,
    mask_seed,
    prg,
    public_bytes,
    survivors_digest,
    verify_advert,
)
from .params import SecAggParams
from .protocol import KIND_B, KIND_SK, Advert, SignedSurvivors, Stage, fail, final_on_abort
from .shamir import combine, decode_share


class Aggregator:
    """The coordinator's side: routes the stages and outputs only Σ_{v∈Y} (x_v + e_v).

    Call ``collect_adverts``, ``collect_shares``, ``collect_masked``, ``collect_signatures``,
    ``collect_unmask`` in order, each with the messages that arrived (a missing device has
    dropped). Invalid messages count as missing and are listed in ``rejected`` (device →
    reason). Below the threshold any stage raises SecAggAbort, as do MASKED_INPUT below
    ``min_submitters`` and CONSISTENCY below the consistency quorum, and every later call
    raises it again; nothing is released.
    """

    def __init__(self, params: SecAggParams, enrolled: Mapping[str, bytes]) -> None:
        self.params = params
        self.rejected: dict[str, str] = {}
        self._enrolled = dict(enrolled)
        self._pending: list[Stage] = list(Stage)  # the stages still to collect, in order
        self._aborted: str | None = None
        self._adverts: dict[str, Advert] = {}  # A
        self._keyed: frozenset[str] = frozenset()  # K
        self._survivors: tuple[str, ...] = ()  # Y
        # signer u → the peers whose b-shares and s_sk-shares u must reveal
        self._requests: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
        self._total: np.ndarray | None = None  # Σ_{v∈Y} y_v mod 2^B

    def _enter(self, stage: Stage) -> None:
        """Start collecting ``stage``; RuntimeError unless it is the next one (each runs once, in order)."""
        expected = self._pending[0].value if self._pending else "done"
        if stage.value != expected:
            raise RuntimeError(f"stage {stage.value!r} called while expecting {expected!r}")
        self._pending.pop(0)

    def _require(self, count: int, what: str) -> None:
        if count < self.params.threshold:
            fail(f"only {count} devices {what}; threshold {self.params.threshold}")

    def _keep(self, messages: Mapping, problem: Callable[[str, object], str | None]) -> dict:
        """The messages whose ``problem(u, message)`` is None; the others go to ``rejected``."""
        kept = {}
        for u, message in messages.items():
            reason = problem(u, message)
            if reason is None:
                kept[u] = message
            else:
                self.rejected[u] = reason
        return kept

    def _advert_problem(self, u: str, advert: Advert) -> str | None:
        if u not in self.params.share_x or advert.device_id != u:
            return "advert from an uninvited device or filed under another id"
        key = self._enrolled.get(u)
        if key is None or not verify_advert(advert, self.params.study_id, key):
            return "advert not signed by the enrolled key"
        return None

    @final_on_abort
    def collect_adverts(self, adverts: Mapping[str, Advert]) -> dict[str, dict[str, Advert]]:
        """Stage 1 → 2: A = valid adverts; each u ∈ A gets the adverts of A ∩ N(u)."""
        self._enter(Stage.ADVERTISE_KEYS)
        self._adverts = self._keep(adverts, self._advert_problem)
        self._require(len(self._adverts), "advertised")
        graph = self.params.graph
        return {u: {v: self._adverts[v] for v in graph[u] if v in self._adverts} for u in self._adverts}

    @final_on_abort
    def collect_shares(self, shares: Mapping[str, Mapping[str, bytes]]) -> dict[str, dict[str, bytes]]:
        """Stage 2 → 3: K = devices that sent a ciphertext to each of A ∩ N(u); route to K ∩ N(u)."""
        self._enter(Stage.SHARE_KEYS)
        graph = self.params.graph

        def problem(u: str, outbox: Mapping[str, bytes]) -> str | None:
            if u not in self._adverts:
                return "shares from a device that did not advertise"
            if set(outbox) != graph[u] & self._adverts.keys():
                return "shares not addressed to exactly the advertised neighbours"
            return None

        kept = self._keep(shares, problem)
        self._require(len(kept), "shared keys")
        self._keyed = frozenset(kept)
        return {u: {v: kept[v][u] for v in graph[u] if v in kept} for u in kept}

    @final_on_abort
    def collect_masked(self, masked: Mapping[str, np.ndarray]) -> tuple[str, ...]:
        """Stage 3 → 4: Y = valid masked inputs; keep only Σ y mod 2^B; every u ∈ Y gets Y to sign."""
        self._enter(Stage.MASKED_INPUT)
        p = self.params

        def problem(u: str, y: np.ndarray) -> str | None:
            if u not in self._keyed:
                return "masked input from a device that did not share keys"
            y = np.asarray(y)
            if y.shape != (p.dim,) or y.dtype != np.uint64 or (y >> np.uint64(p.bits)).any():
                return f"masked input is not {p.dim} uint64 values below 2^{p.bits}"
            return None

        kept = self._keep(masked, problem)
        self._require(len(kept), "sent a masked input")
        if len(kept) < p.min_submitters:
            fail(f"only {len(kept)} masked inputs, fewer than the {p.min_submitters} the study "
                 f"assumed: the honest devices' noise shares could add up to less than one draw")
        total = np.zeros(p.dim, dtype=np.uint64)
        for y in kept.values():
            total += np.asarray(y)
        self._total = total
        self._survivors = tuple(sorted(kept))
        return self._survivors

    @final_on_abort
    def collect_signatures(self, signatures: Mapping[str, bytes]) -> dict[str, SignedSurvivors]:
        """Stage 4 → 5: keep the survivors' valid signatures on Y; with fewer than q of the
        signing committee (:class:`~.params.SecAggParams`) abort. Every signer gets Y with q
        committee signatures (the first members by id), and is then expected to answer for
        Y ∩ N⁺(u) (b-shares) and (K \\ Y) ∩ N(u) (s_sk-shares)."""
        self._enter(Stage.CONSISTENCY)
        p, survivors = self.params, frozenset(self._survivors)

        def problem(u: str, signature: bytes) -> str | None:
            if u not in survivors:
                return "signature from a device that is not a survivor"
            key = self._enrolled.get(u)
            if key is None or not signing.verify(
                    key, survivors_digest(p.study_id, u, self._survivors), signature):
                return "signature on the survivor list does not verify"
            return None

        kept = self._keep(signatures, problem)
        members = sorted(u for u in kept if u in p.committee)
        if len(members) < p.consistency_quorum:
            fail(f"only {len(members)} of the signing committee signed the survivor list; "
                 f"unmasking needs the consistency quorum of {p.consistency_quorum}")
        gone = self._keyed - survivors
        self._requests = {u: (p.closed(u) & survivors, p.graph[u] & gone) for u in kept}
        request = SignedSurvivors(self._survivors,
                                  {u: kept[u] for u in members[:p.consistency_quorum]})
        return dict.fromkeys(sorted(kept), request)

    def _response_problem(self, u: str, response: Mapping[str, tuple[str, bytes]]) -> str | None:
        if u not in self._requests:
            return "unmask response from a device that was not asked"
        alive, gone = self._requests[u]
        expected = {v: KIND_B for v in alive} | {v: KIND_SK for v in gone}
        if {v: kind for v, (kind, _) in response.items()} != expected:
            return "unmask response does not answer the request"
        try:
            if any(decode_share(share)[0] != self.params.share_x[u] for _, share in response.values()):
                return "unmask share not at the responder's coordinate"
        except ValueError as exc:
            return f"malformed unmask share: {exc}"
        return None

    def _reconstruct(self, shares: dict[int, int], whose: str, kind: str) -> bytes:
        """The 32-byte secret from the first t shares (by coordinate); SecAggAbort below t."""
        t = self.params.threshold
        if len(shares) < t:
            fail(f"only {len(shares)} shares of {kind} of {whose!r}; threshold {t}")
        try:
            return combine(dict(sorted(shares.items())[:t]), KEY_BYTES, t=t)
        except ValueError as exc:
            fail(f"cannot reconstruct {kind} of {whose!r}: {exc}")

    @final_on_abort
    def collect_unmask(self, responses: Mapping[str, Mapping[str, tuple[str, bytes]]]) -> np.ndarray:
        """Stage 5 → result: interpolate b_v (v ∈ Y) and s_sk_d (d ∈ K \\ Y), strip every mask.

        Returns Σ_{v∈Y} (x_v + e_v) as int64, centred: values ≥ 2^{B−1} are negative.
        """
        self._enter(Stage.UNMASK)
        p = self.params
        kept = self._keep(responses, self._response_problem)
        collected: dict[tuple[str, str], dict[int, int]] = {}
        for response in kept.values():
            for v, (kind, share) in response.items():
                x, y = decode_share(share)
                collected.setdefault((kind, v), {})[x] = y
        survivors = frozenset(self._survivors)
        total = self._total.copy()
        for v in survivors:
            total -= prg(self._reconstruct(collected.get((KIND_B, v), {}), v, KIND_B), p.dim, p.bits)
        for d in sorted(self._keyed - survivors):
            linked = p.graph[d] & survivors
            if linked:
                total -= self._unlink(d, collected.get((KIND_SK, d), {}), linked)
        total &= np.uint64(2**p.bits - 1)
        signed = total.astype(np.int64)
        signed[total >= np.uint64(2 ** (p.bits - 1))] -= np.int64(2**p.bits)
        return signed

    def _unlink(self, d: str, shares: dict[int, int], linked: Collection[str]) -> np.ndarray:
        """Σ_{v ∈ linked} σ(v, d) PRG(s_vd): the masks survivors added for dropped d, from s_sk_d."""
        key = X25519PrivateKey.from_private_bytes(self._reconstruct(shares, d, KIND_SK))
        if public_bytes(key) != self._adverts[d].s_pk:
            fail(f"the reconstructed s_sk of {d!r} does not match its advert")
        out = np.zeros(self.params.dim, dtype=np.uint64)
        for v in linked:
            seed = mask_seed(agree(key, self._adverts[v].s_pk), self.params.study_id, d, v)
            add_pair_mask(out, prg(seed, self.params.dim, self.params.bits), v, d)
        return out
