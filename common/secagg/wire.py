"""Bodies of the secure-aggregation stage messages (``SecAggMessage``, ``SecAggBundle``).

Every stage message is signed by the device's enrolled Ed25519 key over
``message_digest(study, device, stage, body)``. Bodies, by stage (device → coordinator):

* REGISTER: JSON ``{"n": records}`` (replace-one: n is public), exactly that key, an integer,
  at most :data:`MAX_REGISTER_BYTES`;
* ADVERTISE_KEYS: JSON ``{"c_pk", "s_pk", "signature"}`` (base64), the :class:`Advert`;
* SHARE_KEYS: JSON ``{receiver: base64 ciphertext}``;
* MASKED_INPUT: the masked vector as little-endian uint64 (2m values: Re then Im);
* CONSISTENCY: JSON ``{"signature": base64}``, the device's signature on the survivor list;
* UNMASK: JSON ``{peer: [kind, base64 share]}``.

Bundles (coordinator → device), fetched per stage:

* ADVERTISE_KEYS: JSON round parameters: ``roster``, ``threshold``, ``bits``, ``dim``,
  ``degree``, ``graph_seed`` (hex), ``colluders``, ``min_submitters``, ``keys`` (device →
  base64 Ed25519 public key), ``records``;
* SHARE_KEYS: JSON ``{peer: advert}``; MASKED_INPUT: JSON ``{sender: base64 ciphertext}``;
* CONSISTENCY: JSON ``{"survivors": [sorted ids]}``, the list Y to sign;
* UNMASK: JSON ``{"survivors": [...], "signatures": {signer: base64}}``, Y and the signatures
  collected on it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from collections.abc import Mapping

import numpy as np

from ..net.signing import field
from ..pb import fedsketch_pb2 as pb
from .params import SecAggParams
from .protocol import Advert, SignedSurvivors, Stage

#: The pb value of each protocol stage (``proto/fedsketch.proto``'s ``Stage`` uses the same names).
PB_STAGE: dict[Stage, int] = {stage: pb.Stage.Value(stage.name) for stage in Stage}
#: The stages of a secure-aggregation study, in order (``Study.stage``, ``SecAggMessage.stage``):
#: REGISTER (devices join; not part of the protocol), then the protocol's.
STAGES: tuple[int, ...] = (pb.REGISTER, *PB_STAGE.values())

DOMAIN = b"fedsketch/secagg/v1"
#: The largest REGISTER body taken; ``{"n":1099511627776}`` (2^40, the largest count) has 19.
MAX_REGISTER_BYTES = 64


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _raw(text: object) -> bytes:
    """The bytes of a base64 string; ValueError for anything else (a number, a list, ...)."""
    if not isinstance(text, str):
        raise ValueError(f"expected a base64 string, got {type(text).__name__}")
    return base64.b64decode(text.encode(), validate=True)


def message_digest(study_id: str, device_id: str, stage: int, body: bytes) -> bytes:
    """What a stage message's signature covers (see the proto)."""
    h = hashlib.sha256(DOMAIN)
    for text in (study_id, device_id):
        h.update(field(text))
    h.update(struct.pack("<I", stage))
    h.update(hashlib.sha256(body).digest())
    return h.digest()


def dump(obj: object) -> bytes:
    """Canonical JSON bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def load(body: bytes) -> object:
    """Parse a JSON body; ValueError on anything malformed."""
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError: JSON nested deeper than the interpreter's stack
        raise ValueError(f"malformed secure-aggregation body: {exc!r}") from None


def register_body(n: int) -> bytes:
    """A device's REGISTER body declaring ``n`` records."""
    return dump({"n": n})


def register_from_body(body: bytes, least: int, most: int) -> int:
    """The record count of a REGISTER body; ValueError with the reason unless the body has at
    most :data:`MAX_REGISTER_BYTES` bytes and is exactly ``{"n": integer}`` with
    ``least`` ≤ n ≤ ``most``."""
    if len(body) > MAX_REGISTER_BYTES:
        raise ValueError(f"a REGISTER body has at most {MAX_REGISTER_BYTES} bytes, got {len(body)}")
    obj = load(body)
    if not isinstance(obj, dict) or set(obj) != {"n"}:
        keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise ValueError(f'a REGISTER body is exactly {{"n": records}}, got {keys}')
    n = obj["n"]
    if type(n) is not int:  # not a bool, nor a float such as 1e300
        raise ValueError(f"the record count must be an integer, got {n!r}")
    if not least <= n <= most:
        raise ValueError(f"the record count {n} is outside {least:,} .. {most:,}")
    return n


def advert_to_json(advert: Advert) -> dict:
    """The ADVERTISE_KEYS body of an advert (keys and signature in base64)."""
    return {"device_id": advert.device_id, "c_pk": _b64(advert.c_pk), "s_pk": _b64(advert.s_pk),
            "signature": _b64(advert.signature)}


def advert_from_json(obj: Mapping) -> Advert:
    """Inverse of :func:`advert_to_json`; ValueError on anything malformed."""
    try:
        return Advert(str(obj["device_id"]), _raw(obj["c_pk"]), _raw(obj["s_pk"]),
                      _raw(obj["signature"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed advert: {exc!r}") from None


def bytes_map_to_json(items: Mapping[str, bytes]) -> dict:
    """``{key: base64}`` of a map of raw bytes (ciphertexts, public keys)."""
    return {k: _b64(v) for k, v in items.items()}


def bytes_map_from_json(obj: object) -> dict[str, bytes]:
    """Inverse of :func:`bytes_map_to_json`; ValueError on anything malformed."""
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object of base64 strings")
    try:
        return {str(k): _raw(v) for k, v in obj.items()}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"malformed base64 map: {exc}") from None


def _id_list(obj: object, what: str) -> tuple[str, ...]:
    """A JSON list of distinct device-id strings (the roster or a survivor list), sorted;
    ValueError naming ``what`` otherwise."""
    if not isinstance(obj, list) or not all(isinstance(u, str) for u in obj):
        raise ValueError(f"the {what} must be a list of device ids")
    if len(set(obj)) != len(obj):
        raise ValueError(f"the {what} names a device twice")
    return tuple(sorted(obj))


def params_to_json(params: SecAggParams, keys: Mapping[str, bytes], records: float) -> dict:
    """The ADVERTISE_KEYS bundle: round parameters, enrolled keys and the record count N."""
    return {"roster": list(params.device_ids), "threshold": params.threshold,
            "bits": params.bits, "dim": params.dim, "degree": params.degree,
            "graph_seed": params.graph_seed.hex(), "colluders": params.colluders,
            "min_submitters": params.min_submitters, "records": records,
            "keys": bytes_map_to_json(keys)}


def params_from_json(study_id: str, obj: Mapping) -> tuple[SecAggParams, dict[str, bytes], float]:
    """Inverse of :func:`params_to_json`: (parameters, keys, N); ValueError on anything malformed."""
    try:
        params = SecAggParams(study_id, _id_list(obj["roster"], "roster"), obj["threshold"],
                              obj["bits"], obj["dim"], obj["degree"],
                              bytes.fromhex(obj["graph_seed"]), obj["colluders"],
                              obj["min_submitters"])
        return params, bytes_map_from_json(obj["keys"]), float(obj["records"])
    except (KeyError, TypeError, OverflowError) as exc:  # OverflowError: a huge "records"
        raise ValueError(f"malformed round parameters: {exc!r}") from None


def masked_to_bytes(y: np.ndarray) -> bytes:
    """The MASKED_INPUT body: ``y`` as little-endian uint64."""
    return np.asarray(y, dtype="<u8").tobytes()


def masked_from_bytes(body: bytes, dim: int) -> np.ndarray:
    """Inverse of :func:`masked_to_bytes` for a round of ``dim`` words; ValueError on a wrong length."""
    if len(body) != 8 * dim:
        raise ValueError(f"masked input has {len(body)} bytes, the round needs {8 * dim}")
    return np.frombuffer(body, dtype="<u8").astype(np.uint64)


def unmask_to_json(shares: Mapping[str, tuple[str, bytes]]) -> dict:
    """The UNMASK body: ``{peer: [kind, base64 share]}``."""
    return {peer: [kind, _b64(raw)] for peer, (kind, raw) in shares.items()}


def unmask_from_json(obj: object) -> dict[str, tuple[str, bytes]]:
    """Inverse of :func:`unmask_to_json`; ValueError on anything malformed."""
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object of [kind, share] pairs")
    try:
        return {str(peer): (str(kind), _raw(raw)) for peer, (kind, raw) in obj.items()}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"malformed unmask response: {exc}") from None


def survivors_to_json(survivors: tuple[str, ...]) -> dict:
    """The CONSISTENCY bundle: the survivor list Y to sign."""
    return {"survivors": list(survivors)}


def survivors_from_json(obj: object) -> tuple[str, ...]:
    """Inverse of :func:`survivors_to_json`; ValueError on anything malformed."""
    if not isinstance(obj, dict) or "survivors" not in obj:
        raise ValueError("malformed survivor list: expected {\"survivors\": [...]}")
    return _id_list(obj["survivors"], "survivor list")


def signature_to_json(signature: bytes) -> dict:
    """The CONSISTENCY body: a device's signature on the survivor list."""
    return {"signature": _b64(signature)}


def signature_from_json(obj: object) -> bytes:
    """Inverse of :func:`signature_to_json`; ValueError on anything malformed."""
    if not isinstance(obj, dict) or not isinstance(obj.get("signature"), str):
        raise ValueError("malformed consistency signature: expected {\"signature\": base64}")
    try:
        return _raw(obj["signature"])
    except ValueError as exc:
        raise ValueError(f"malformed consistency signature: {exc}") from None


def signed_to_json(signed: SignedSurvivors) -> dict:
    """The UNMASK bundle: Y and the signatures on it."""
    return {"survivors": list(signed.survivors), "signatures": bytes_map_to_json(signed.signatures)}


def signed_from_json(obj: object) -> SignedSurvivors:
    """Inverse of :func:`signed_to_json`; ValueError on anything malformed."""
    if not isinstance(obj, dict) or not {"survivors", "signatures"} <= obj.keys():
        raise ValueError("malformed unmask request: expected survivors and signatures")
    return SignedSurvivors(_id_list(obj["survivors"], "survivor list"),
                           bytes_map_from_json(obj["signatures"]))
