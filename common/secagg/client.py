"""The device's side of secure aggregation (package docstring, stages 1–5).

A device that restarts mid-round goes on from :meth:`Client.state`, which it stores (in its
own ledger) before it sends each stage's message: its X25519 keys and b, its advert, its
neighbours' verified adverts, the shares it holds, whether it masked its input and the one
survivor list it signed. :meth:`Client.resumed` rebuilds the same party, so it never draws
new keys, never masks twice, never signs a second list and reveals one kind of share per peer,
across restarts as within one process.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Collection, Mapping

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from ..net import signing
from .crypto import (
    KEY_BYTES,
    add_pair_mask,
    advert_digest,
    agree,
    as_words,
    mask_seed,
    open_sealed,
    prg,
    public_bytes,
    seal,
    survivors_digest,
    verify_advert,
)
from .params import SecAggParams
from .protocol import KIND_B, KIND_SK, Advert, SignedSurvivors, fail, final_on_abort
from .shamir import SHARE_BYTES, decode_share, encode_share, split


class Client:
    """One device's secure-aggregation state for one study (package docstring, stages 1–5).

    ``signing_key`` is the device's raw Ed25519 private key; ``enrolled`` maps device ids to
    their raw Ed25519 public keys as registered at enrollment. Any SecAggAbort is final: every
    later call raises it again.
    """

    def __init__(self, params: SecAggParams, device_id: str, signing_key: bytes,
                 enrolled: Mapping[str, bytes]) -> None:
        if device_id not in params.share_x:
            raise ValueError(f"{device_id!r} is not invited to study {params.study_id!r}")
        roster_keys = [enrolled.get(u) for u in params.device_ids]
        if None in roster_keys or len(set(roster_keys)) != len(roster_keys):
            raise ValueError("the round's key map must give every roster device its own key")
        if enrolled[device_id] != signing.public_key(signing_key):
            raise ValueError("the round's key map does not hold this device's enrolled key")
        self.params = params
        self.device_id = device_id
        self._signing_key = signing_key
        self._enrolled = dict(enrolled)
        self._c_sk = X25519PrivateKey.generate()
        self._s_sk = X25519PrivateKey.generate()
        self._b = secrets.token_bytes(KEY_BYTES)
        self._advert: Advert | None = None
        self._peers: dict[str, Advert] | None = None  # verified adverts of A ∩ N(u)
        self._channels: dict[str, bytes] = {}  # peer → X25519(c_sk_u, c_pk_v), for both directions
        self._held: dict[str, tuple[int, int]] = {}  # peer → (s_sk-share, b-share) at x(u)
        self._masked = False
        self._signed: tuple[tuple[str, ...], bytes] | None = None  # (Y, my signature on it)
        self._aborted: str | None = None

    def state(self) -> dict:
        """Everything this party must keep to go on after a restart (module docstring), as a
        JSON-ready dict; secrets (the keys, b, the shares) are in it: keep it as the device's
        key is kept."""
        def b64(raw: bytes) -> str:
            return base64.b64encode(raw).decode()

        def advert(a: Advert) -> list[str]:
            return [a.device_id, b64(a.c_pk), b64(a.s_pk), b64(a.signature)]

        return {"c_sk": b64(self._c_sk.private_bytes_raw()), "s_sk": b64(self._s_sk.private_bytes_raw()),
                "b": b64(self._b), "advert": None if self._advert is None else advert(self._advert),
                "peers": None if self._peers is None else {v: advert(a) for v, a in self._peers.items()},
                "held": {v: list(pair) for v, pair in self._held.items()}, "masked": self._masked,
                "signed": None if self._signed is None else [list(self._signed[0]), b64(self._signed[1])],
                "aborted": self._aborted}

    @classmethod
    def resumed(cls, params: SecAggParams, device_id: str, signing_key: bytes,
                enrolled: Mapping[str, bytes], state: Mapping) -> Client:
        """The party whose :meth:`state` was ``state``, for the same round (``params``,
        ``enrolled``) and device; ValueError for a state that is not one."""
        try:
            def raw(text: str) -> bytes:
                return base64.b64decode(text, validate=True)

            def advert(item: list) -> Advert:
                return Advert(str(item[0]), raw(item[1]), raw(item[2]), raw(item[3]))

            client = cls(params, device_id, signing_key, enrolled)
            client._c_sk = X25519PrivateKey.from_private_bytes(raw(state["c_sk"]))
            client._s_sk = X25519PrivateKey.from_private_bytes(raw(state["s_sk"]))
            client._b = raw(state["b"])
            client._advert = None if state["advert"] is None else advert(state["advert"])
            if state["peers"] is not None:
                client._peers = {v: advert(a) for v, a in state["peers"].items()}
                client._channels = {v: agree(client._c_sk, a.c_pk) for v, a in client._peers.items()}
            client._held = {v: (int(s), int(b)) for v, (s, b) in state["held"].items()}
            client._masked = bool(state["masked"])
            signed = state["signed"]
            client._signed = None if signed is None else (tuple(signed[0]), raw(signed[1]))
            client._aborted = state["aborted"]
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise ValueError(f"not a secure-aggregation party's state: {exc!r}") from None
        return client

    @final_on_abort
    def advertise(self) -> Advert:
        """Stage 1: the signed advert of (c_pk, s_pk); the same advert if asked again."""
        if self._advert is None:
            c_pk, s_pk = public_bytes(self._c_sk), public_bytes(self._s_sk)
            digest = advert_digest(self.params.study_id, self.device_id, c_pk, s_pk)
            self._advert = Advert(self.device_id, c_pk, s_pk, signing.sign(self._signing_key, digest))
        return self._advert

    def _verified(self, adverts: Mapping[str, Advert]) -> dict[str, Advert]:
        peers = {}
        for v, advert in adverts.items():
            if advert.device_id != v:
                fail(f"advert filed under {v!r} is from {advert.device_id!r}")
            if v == self.device_id:
                if advert != self._advert:
                    fail("my own advert came back altered")
                continue
            if v not in self.params.graph[self.device_id]:
                fail(f"advert from {v!r}, who is not my neighbour")
            key = self._enrolled.get(v)
            if key is None or not verify_advert(advert, self.params.study_id, key):
                fail(f"the advert of {v!r} is not signed by its enrolled key")
            peers[v] = advert
        return peers

    @final_on_abort
    def share_keys(self, adverts: Mapping[str, Advert]) -> dict[str, bytes]:
        """Stage 2: verify the neighbours' adverts, share s_sk and b t-of-|H(u)|; receiver → ciphertext.

        H(u) = {u} ∪ {advertised neighbours}; aborts if |H(u)| < t or any advert is bad.
        """
        if self._advert is None or self._peers is not None:
            fail("share_keys must follow advertise and run once")
        peers = self._verified(adverts)
        t, x = self.params.threshold, self.params.share_x
        holders = [self.device_id, *peers]
        if len(holders) < t:
            fail(f"only {len(holders)} holders (me and advertised neighbours) for threshold {t}")
        xs = [x[v] for v in holders]
        s_shares = split(self._s_sk.private_bytes_raw(), t, xs)
        b_shares = split(self._b, t, xs)
        self._channels = {v: agree(self._c_sk, advert.c_pk) for v, advert in peers.items()}
        self._peers = peers
        self._held[self.device_id] = (s_shares[x[self.device_id]], b_shares[x[self.device_id]])
        return {
            v: seal(self._channels[v], self.params.study_id, self.device_id, v,
                     encode_share(x[v], s_shares[x[v]]) + encode_share(x[v], b_shares[x[v]]))
            for v in peers
        }

    def _receive(self, sender: str, ciphertext: bytes) -> tuple[int, int]:
        if self._peers is None or sender not in self._peers:
            fail(f"shares from {sender!r}, who did not advertise to me")
        plain = open_sealed(self._channels[sender], self.params.study_id, sender, self.device_id, ciphertext)
        try:
            (xs, s_share), (xb, b_share) = (decode_share(plain[:SHARE_BYTES]),
                                            decode_share(plain[SHARE_BYTES:]))
        except ValueError as exc:
            fail(f"the shares from {sender!r} are malformed: {exc}")
        if xs != xb or xs != self.params.share_x[self.device_id]:
            fail(f"the shares from {sender!r} are not at my coordinate")
        return s_share, b_share

    @final_on_abort
    def masked_input(self, x: np.ndarray, ciphertexts: Mapping[str, bytes],
                     noise_share: np.ndarray | None = None) -> np.ndarray:
        """Stage 3: store the neighbours' shares and return y_u (uint64, values < 2^B); once only.

        y_u = x + noise_share + PRG(b_u) + Σ_{v sent shares} σ(u, v) PRG(s_uv) mod 2^B. Aborts on
        a ciphertext that does not decrypt or if fewer than t of N⁺(u) (u included) shared keys.
        """
        if self._peers is None or self._masked:
            fail("masked_input must follow share_keys and run once (one masked input per study)")
        dim, bits, t = self.params.dim, self.params.bits, self.params.threshold
        y = as_words(x, dim, "x")  # a fresh copy
        if noise_share is not None:
            y += as_words(noise_share, dim, "noise_share")
        received = {v: self._receive(v, ct) for v, ct in ciphertexts.items()}
        if len(received) + 1 < t:
            fail(f"only {len(received) + 1} of my neighbourhood shared keys; threshold {t}")
        self._held.update(received)
        self._masked = True
        y += prg(self._b, dim, bits)
        for v in received:
            shared = agree(self._s_sk, self._peers[v].s_pk)
            seed = mask_seed(shared, self.params.study_id, self.device_id, v)
            add_pair_mask(y, prg(seed, dim, bits), self.device_id, v)
        return y & np.uint64(2**bits - 1)

    @final_on_abort
    def sign_survivors(self, survivors: Collection[str]) -> bytes:
        """Stage 4: sign the survivor list Y once (Ed25519 over :func:`~.crypto.survivors_digest`).

        Aborts, signing nothing, unless u is in Y (it sent its masked input), Y lies within the
        roster, |Y| ≥ ``min_submitters`` (L − D), every survivor among u's neighbours sent u its
        shares, and Y ∩ N⁺(u) has t members; or if asked to sign a second, different list. The
        same list gets the same signature again.
        """
        if not self._masked:
            fail("the survivor list must follow masked_input")
        listed = tuple(sorted(set(survivors)))
        if self._signed is not None:
            if listed != self._signed[0]:
                fail("asked to sign a second, different survivor list")
            return self._signed[1]
        p, u = self.params, self.device_id
        if u not in listed:
            fail("left out of the survivor list although I sent my masked input")
        if strangers := set(listed) - p.share_x.keys():
            fail(f"survivors outside the roster: {sorted(strangers)}")
        if len(listed) < p.min_submitters:
            fail(f"only {len(listed)} survivors listed, fewer than the {p.min_submitters} the "
                 f"study assumed")
        near = set(listed) & p.closed(u)
        if unheld := near - self._held.keys():
            fail(f"survivors whose shares I do not hold: {sorted(unheld)}")
        if len(near) < p.threshold:
            fail(f"only {len(near)} survivors in my neighbourhood; threshold {p.threshold}")
        signature = signing.sign(self._signing_key, survivors_digest(p.study_id, u, listed))
        self._signed = (listed, signature)
        return signature

    @final_on_abort
    def unmask(self, request: SignedSurvivors) -> dict[str, tuple[str, bytes]]:
        """Stage 5: peer → (``KIND_B``, b-share) for each survivor in Y ∩ N⁺(u), (``KIND_SK``,
        s_sk-share) for each peer that shared keys with u and is not in Y.

        Both lists follow from the list u signed, never from the coordinator's say, so u
        reveals one kind of share per peer whatever it is asked. Aborts, revealing nothing,
        unless the request carries that same list and signatures on it, each valid under the
        enrolled key of a survivor in the signing committee, from at least
        :attr:`~.params.SecAggParams.consistency_quorum` members: honest members sign one list,
        so no other list can have as many.
        """
        if self._signed is None:
            fail("unmask must follow my signature on the survivor list")
        listed, p = self._signed[0], self.params
        if tuple(sorted(set(request.survivors))) != listed:
            fail("the survivor list to unmask differs from the one I signed")
        if len(request.signatures) < p.consistency_quorum:
            fail(f"only {len(request.signatures)} signatures on the survivor list; unmasking needs "
                 f"{p.consistency_quorum} of the signing committee")
        for v, signature in request.signatures.items():
            key = self._enrolled.get(v)
            if (v not in listed or v not in p.committee or key is None
                    or not signing.verify(key, survivors_digest(p.study_id, v, listed), signature)):
                fail(f"the signature of {v!r} on the survivor list is not a valid one of a "
                     f"surviving committee member")
        alive = set(listed) & p.closed(self.device_id)
        gone = self._held.keys() - set(listed)
        me = p.share_x[self.device_id]
        out = {v: (KIND_B, encode_share(me, self._held[v][1])) for v in alive}
        return out | {v: (KIND_SK, encode_share(me, self._held[v][0])) for v in gone}
