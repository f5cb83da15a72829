from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RefusalReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REFUSAL_REASON_UNSPECIFIED: _ClassVar[RefusalReason]
    BUDGET: _ClassVar[RefusalReason]
    POLICY: _ClassVar[RefusalReason]
    TOO_FEW_RECORDS: _ClassVar[RefusalReason]
    TOO_MANY_RECORDS: _ClassVar[RefusalReason]
    DATA_UNREADABLE: _ClassVar[RefusalReason]
    DIMENSION_MISMATCH: _ClassVar[RefusalReason]
    SPEC_MISMATCH: _ClassVar[RefusalReason]
    OTHER: _ClassVar[RefusalReason]

class StudyState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STUDY_STATE_UNSPECIFIED: _ClassVar[StudyState]
    OPEN: _ClassVar[StudyState]
    COLLECTING: _ClassVar[StudyState]
    DECODING: _ClassVar[StudyState]
    DONE: _ClassVar[StudyState]
    FAILED: _ClassVar[StudyState]

class Stage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STAGE_UNSPECIFIED: _ClassVar[Stage]
    PLAIN_INPUT: _ClassVar[Stage]
    ADVERTISE_KEYS: _ClassVar[Stage]
    SHARE_KEYS: _ClassVar[Stage]
    MASKED_INPUT: _ClassVar[Stage]
    UNMASK: _ClassVar[Stage]
    REGISTER: _ClassVar[Stage]
    FINISHED: _ClassVar[Stage]
    CONSISTENCY: _ClassVar[Stage]
REFUSAL_REASON_UNSPECIFIED: RefusalReason
BUDGET: RefusalReason
POLICY: RefusalReason
TOO_FEW_RECORDS: RefusalReason
TOO_MANY_RECORDS: RefusalReason
DATA_UNREADABLE: RefusalReason
DIMENSION_MISMATCH: RefusalReason
SPEC_MISMATCH: RefusalReason
OTHER: RefusalReason
STUDY_STATE_UNSPECIFIED: StudyState
OPEN: StudyState
COLLECTING: StudyState
DECODING: StudyState
DONE: StudyState
FAILED: StudyState
STAGE_UNSPECIFIED: Stage
PLAIN_INPUT: Stage
ADVERTISE_KEYS: Stage
SHARE_KEYS: Stage
MASKED_INPUT: Stage
UNMASK: Stage
REGISTER: Stage
FINISHED: Stage
CONSISTENCY: Stage

class EnrollRequest(_message.Message):
    __slots__ = ("token", "public_key", "label", "budget_epsilon", "budget_delta")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    BUDGET_EPSILON_FIELD_NUMBER: _ClassVar[int]
    BUDGET_DELTA_FIELD_NUMBER: _ClassVar[int]
    token: str
    public_key: bytes
    label: str
    budget_epsilon: float
    budget_delta: float
    def __init__(self, token: _Optional[str] = ..., public_key: _Optional[bytes] = ..., label: _Optional[str] = ..., budget_epsilon: _Optional[float] = ..., budget_delta: _Optional[float] = ...) -> None: ...

class EnrollResponse(_message.Message):
    __slots__ = ("device_id",)
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    def __init__(self, device_id: _Optional[str] = ...) -> None: ...

class ListStudiesRequest(_message.Message):
    __slots__ = ("include_closed",)
    INCLUDE_CLOSED_FIELD_NUMBER: _ClassVar[int]
    include_closed: bool
    def __init__(self, include_closed: _Optional[bool] = ...) -> None: ...

class DeviceRead(_message.Message):
    __slots__ = ("device_id", "study_id", "signed_at", "signature", "audience", "format")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNED_AT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    AUDIENCE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    study_id: str
    signed_at: float
    signature: bytes
    audience: str
    format: int
    def __init__(self, device_id: _Optional[str] = ..., study_id: _Optional[str] = ..., signed_at: _Optional[float] = ..., signature: _Optional[bytes] = ..., audience: _Optional[str] = ..., format: _Optional[int] = ...) -> None: ...

class Account(_message.Message):
    __slots__ = ("budget_epsilon", "budget_delta", "charged_epsilon", "charged_delta", "charges")
    BUDGET_EPSILON_FIELD_NUMBER: _ClassVar[int]
    BUDGET_DELTA_FIELD_NUMBER: _ClassVar[int]
    CHARGED_EPSILON_FIELD_NUMBER: _ClassVar[int]
    CHARGED_DELTA_FIELD_NUMBER: _ClassVar[int]
    CHARGES_FIELD_NUMBER: _ClassVar[int]
    budget_epsilon: float
    budget_delta: float
    charged_epsilon: float
    charged_delta: float
    charges: _containers.RepeatedCompositeFieldContainer[Charge]
    def __init__(self, budget_epsilon: _Optional[float] = ..., budget_delta: _Optional[float] = ..., charged_epsilon: _Optional[float] = ..., charged_delta: _Optional[float] = ..., charges: _Optional[_Iterable[_Union[Charge, _Mapping]]] = ...) -> None: ...

class Charge(_message.Message):
    __slots__ = ("study_id", "epsilon", "delta", "secure", "running")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    SECURE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    epsilon: float
    delta: float
    secure: bool
    running: bool
    def __init__(self, study_id: _Optional[str] = ..., epsilon: _Optional[float] = ..., delta: _Optional[float] = ..., secure: _Optional[bool] = ..., running: _Optional[bool] = ...) -> None: ...

class ListStudiesResponse(_message.Message):
    __slots__ = ("studies",)
    STUDIES_FIELD_NUMBER: _ClassVar[int]
    studies: _containers.RepeatedCompositeFieldContainer[Study]
    def __init__(self, studies: _Optional[_Iterable[_Union[Study, _Mapping]]] = ...) -> None: ...

class StudyRef(_message.Message):
    __slots__ = ("study_id",)
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    def __init__(self, study_id: _Optional[str] = ...) -> None: ...

class Study(_message.Message):
    __slots__ = ("study_id", "spec_json", "spec_sha256", "state", "stage", "contributions", "records", "detail", "registered")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    SPEC_SHA256_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    spec_json: str
    spec_sha256: str
    state: StudyState
    stage: Stage
    contributions: int
    records: float
    detail: str
    registered: int
    def __init__(self, study_id: _Optional[str] = ..., spec_json: _Optional[str] = ..., spec_sha256: _Optional[str] = ..., state: _Optional[_Union[StudyState, str]] = ..., stage: _Optional[_Union[Stage, str]] = ..., contributions: _Optional[int] = ..., records: _Optional[float] = ..., detail: _Optional[str] = ..., registered: _Optional[int] = ...) -> None: ...

class Registration(_message.Message):
    __slots__ = ("study_id", "device_id", "spec_sha256", "signature", "join_only")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_SHA256_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    JOIN_ONLY_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    device_id: str
    spec_sha256: str
    signature: bytes
    join_only: bool
    def __init__(self, study_id: _Optional[str] = ..., device_id: _Optional[str] = ..., spec_sha256: _Optional[str] = ..., signature: _Optional[bytes] = ..., join_only: _Optional[bool] = ...) -> None: ...

class LeaveReply(_message.Message):
    __slots__ = ("left", "registered")
    LEFT_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    left: bool
    registered: int
    def __init__(self, left: _Optional[bool] = ..., registered: _Optional[int] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("duplicate", "stage", "registered", "input_seconds")
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    INPUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    stage: Stage
    registered: int
    input_seconds: float
    def __init__(self, duplicate: _Optional[bool] = ..., stage: _Optional[_Union[Stage, str]] = ..., registered: _Optional[int] = ..., input_seconds: _Optional[float] = ...) -> None: ...

class Contribution(_message.Message):
    __slots__ = ("study_id", "device_id", "spec_sha256", "n", "int32_pairs", "int64_pairs", "int64_cells", "signature")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_SHA256_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    INT32_PAIRS_FIELD_NUMBER: _ClassVar[int]
    INT64_PAIRS_FIELD_NUMBER: _ClassVar[int]
    INT64_CELLS_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    device_id: str
    spec_sha256: str
    n: float
    int32_pairs: bytes
    int64_pairs: bytes
    int64_cells: bytes
    signature: bytes
    def __init__(self, study_id: _Optional[str] = ..., device_id: _Optional[str] = ..., spec_sha256: _Optional[str] = ..., n: _Optional[float] = ..., int32_pairs: _Optional[bytes] = ..., int64_pairs: _Optional[bytes] = ..., int64_cells: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("duplicate", "receipt")
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    receipt: str
    def __init__(self, duplicate: _Optional[bool] = ..., receipt: _Optional[str] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("study_id", "k", "d", "centroids", "weights", "residual", "devices", "records", "status", "status_reason", "z", "threshold", "rounds", "calibration_json", "verdict_json", "box_json")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    D_FIELD_NUMBER: _ClassVar[int]
    CENTROIDS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    RESIDUAL_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATUS_REASON_FIELD_NUMBER: _ClassVar[int]
    Z_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_JSON_FIELD_NUMBER: _ClassVar[int]
    VERDICT_JSON_FIELD_NUMBER: _ClassVar[int]
    BOX_JSON_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    k: int
    d: int
    centroids: _containers.RepeatedScalarFieldContainer[float]
    weights: _containers.RepeatedScalarFieldContainer[float]
    residual: float
    devices: int
    records: float
    status: str
    status_reason: str
    z: _containers.RepeatedScalarFieldContainer[float]
    threshold: float
    rounds: int
    calibration_json: str
    verdict_json: str
    box_json: str
    def __init__(self, study_id: _Optional[str] = ..., k: _Optional[int] = ..., d: _Optional[int] = ..., centroids: _Optional[_Iterable[float]] = ..., weights: _Optional[_Iterable[float]] = ..., residual: _Optional[float] = ..., devices: _Optional[int] = ..., records: _Optional[float] = ..., status: _Optional[str] = ..., status_reason: _Optional[str] = ..., z: _Optional[_Iterable[float]] = ..., threshold: _Optional[float] = ..., rounds: _Optional[int] = ..., calibration_json: _Optional[str] = ..., verdict_json: _Optional[str] = ..., box_json: _Optional[str] = ...) -> None: ...

class CreateStudyRequest(_message.Message):
    __slots__ = ("spec_json",)
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    spec_json: str
    def __init__(self, spec_json: _Optional[str] = ...) -> None: ...

class IssueTokensRequest(_message.Message):
    __slots__ = ("count",)
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

class IssueTokensReply(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tokens: _Optional[_Iterable[str]] = ...) -> None: ...

class RefusalReport(_message.Message):
    __slots__ = ("study_id", "device_id", "spec_sha256", "reason", "signature")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_SHA256_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    device_id: str
    spec_sha256: str
    reason: RefusalReason
    signature: bytes
    def __init__(self, study_id: _Optional[str] = ..., device_id: _Optional[str] = ..., spec_sha256: _Optional[str] = ..., reason: _Optional[_Union[RefusalReason, str]] = ..., signature: _Optional[bytes] = ...) -> None: ...

class RefusalAck(_message.Message):
    __slots__ = ("duplicate",)
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    def __init__(self, duplicate: _Optional[bool] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("study_id", "limit")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    limit: int
    def __init__(self, study_id: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class RosterEntry(_message.Message):
    __slots__ = ("device_id", "label", "registered_at", "contributed_at")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTED_AT_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    label: str
    registered_at: float
    contributed_at: float
    def __init__(self, device_id: _Optional[str] = ..., label: _Optional[str] = ..., registered_at: _Optional[float] = ..., contributed_at: _Optional[float] = ...) -> None: ...

class RefusalEntry(_message.Message):
    __slots__ = ("device_id", "label", "reason", "reported_at")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    label: str
    reason: RefusalReason
    reported_at: float
    def __init__(self, device_id: _Optional[str] = ..., label: _Optional[str] = ..., reason: _Optional[_Union[RefusalReason, str]] = ..., reported_at: _Optional[float] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("study", "created_at", "min_devices", "roster_size", "filled_at", "deadline", "collect_seconds", "epsilon", "parent_id", "round", "roster", "refusals", "refused", "rounds")
    STUDY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    MIN_DEVICES_FIELD_NUMBER: _ClassVar[int]
    ROSTER_SIZE_FIELD_NUMBER: _ClassVar[int]
    FILLED_AT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    COLLECT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ROSTER_FIELD_NUMBER: _ClassVar[int]
    REFUSALS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    study: Study
    created_at: float
    min_devices: int
    roster_size: int
    filled_at: float
    deadline: float
    collect_seconds: float
    epsilon: float
    parent_id: str
    round: int
    roster: _containers.RepeatedCompositeFieldContainer[RosterEntry]
    refusals: _containers.RepeatedCompositeFieldContainer[RefusalEntry]
    refused: int
    rounds: _containers.RepeatedCompositeFieldContainer[Study]
    def __init__(self, study: _Optional[_Union[Study, _Mapping]] = ..., created_at: _Optional[float] = ..., min_devices: _Optional[int] = ..., roster_size: _Optional[int] = ..., filled_at: _Optional[float] = ..., deadline: _Optional[float] = ..., collect_seconds: _Optional[float] = ..., epsilon: _Optional[float] = ..., parent_id: _Optional[str] = ..., round: _Optional[int] = ..., roster: _Optional[_Iterable[_Union[RosterEntry, _Mapping]]] = ..., refusals: _Optional[_Iterable[_Union[RefusalEntry, _Mapping]]] = ..., refused: _Optional[int] = ..., rounds: _Optional[_Iterable[_Union[Study, _Mapping]]] = ...) -> None: ...

class AuditRequest(_message.Message):
    __slots__ = ("limit", "study_id")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    limit: int
    study_id: str
    def __init__(self, limit: _Optional[int] = ..., study_id: _Optional[str] = ...) -> None: ...

class AuditEntry(_message.Message):
    __slots__ = ("at", "actor", "action", "detail")
    AT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    at: float
    actor: str
    action: str
    detail: str
    def __init__(self, at: _Optional[float] = ..., actor: _Optional[str] = ..., action: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class HelperUpload(_message.Message):
    __slots__ = ("study_id", "nonce", "seed", "blind", "peer_part")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    BLIND_FIELD_NUMBER: _ClassVar[int]
    PEER_PART_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    nonce: bytes
    seed: bytes
    blind: bytes
    peer_part: bytes
    def __init__(self, study_id: _Optional[str] = ..., nonce: _Optional[bytes] = ..., seed: _Optional[bytes] = ..., blind: _Optional[bytes] = ..., peer_part: _Optional[bytes] = ...) -> None: ...

class HelperAck(_message.Message):
    __slots__ = ("duplicate",)
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    def __init__(self, duplicate: _Optional[bool] = ...) -> None: ...

class HelperClose(_message.Message):
    __slots__ = ("study_id", "seed_commitment")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    SEED_COMMITMENT_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    seed_commitment: bytes
    def __init__(self, study_id: _Optional[str] = ..., seed_commitment: _Optional[bytes] = ...) -> None: ...

class HelperCloseReply(_message.Message):
    __slots__ = ("helper_seed", "reports")
    HELPER_SEED_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    helper_seed: bytes
    reports: int
    def __init__(self, helper_seed: _Optional[bytes] = ..., reports: _Optional[int] = ...) -> None: ...

class ReportCircuit(_message.Message):
    __slots__ = ("nonce", "entries", "bound", "l1_bound")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    L1_BOUND_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    entries: int
    bound: int
    l1_bound: int
    def __init__(self, nonce: _Optional[bytes] = ..., entries: _Optional[int] = ..., bound: _Optional[int] = ..., l1_bound: _Optional[int] = ...) -> None: ...

class HelperPrepare(_message.Message):
    __slots__ = ("study_id", "leader_seed", "reports")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_SEED_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    leader_seed: bytes
    reports: _containers.RepeatedCompositeFieldContainer[ReportCircuit]
    def __init__(self, study_id: _Optional[str] = ..., leader_seed: _Optional[bytes] = ..., reports: _Optional[_Iterable[_Union[ReportCircuit, _Mapping]]] = ...) -> None: ...

class PrepShare(_message.Message):
    __slots__ = ("nonce", "present", "verifier", "own_part", "peer_part")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FIELD_NUMBER: _ClassVar[int]
    OWN_PART_FIELD_NUMBER: _ClassVar[int]
    PEER_PART_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    present: bool
    verifier: bytes
    own_part: bytes
    peer_part: bytes
    def __init__(self, nonce: _Optional[bytes] = ..., present: _Optional[bool] = ..., verifier: _Optional[bytes] = ..., own_part: _Optional[bytes] = ..., peer_part: _Optional[bytes] = ...) -> None: ...

class HelperPrepareReply(_message.Message):
    __slots__ = ("shares",)
    SHARES_FIELD_NUMBER: _ClassVar[int]
    shares: _containers.RepeatedCompositeFieldContainer[PrepShare]
    def __init__(self, shares: _Optional[_Iterable[_Union[PrepShare, _Mapping]]] = ...) -> None: ...

class HelperAggregate(_message.Message):
    __slots__ = ("study_id", "leader", "min_reports")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    MIN_REPORTS_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    leader: _containers.RepeatedCompositeFieldContainer[PrepShare]
    min_reports: int
    def __init__(self, study_id: _Optional[str] = ..., leader: _Optional[_Iterable[_Union[PrepShare, _Mapping]]] = ..., min_reports: _Optional[int] = ...) -> None: ...

class HelperAggregateReply(_message.Message):
    __slots__ = ("accepted", "share")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    accepted: _containers.RepeatedScalarFieldContainer[bytes]
    share: bytes
    def __init__(self, accepted: _Optional[_Iterable[bytes]] = ..., share: _Optional[bytes] = ...) -> None: ...

class AuditReply(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ...) -> None: ...

class SecAggMessage(_message.Message):
    __slots__ = ("study_id", "device_id", "stage", "body", "signature")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    device_id: str
    stage: Stage
    body: bytes
    signature: bytes
    def __init__(self, study_id: _Optional[str] = ..., device_id: _Optional[str] = ..., stage: _Optional[_Union[Stage, str]] = ..., body: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class AbortStatement(_message.Message):
    __slots__ = ("study_id", "device_id", "audience", "signature", "round_sha256")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    AUDIENCE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    ROUND_SHA256_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    device_id: str
    audience: str
    signature: bytes
    round_sha256: bytes
    def __init__(self, study_id: _Optional[str] = ..., device_id: _Optional[str] = ..., audience: _Optional[str] = ..., signature: _Optional[bytes] = ..., round_sha256: _Optional[bytes] = ...) -> None: ...

class AbortCertificate(_message.Message):
    __slots__ = ("study_id", "statements", "final")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    STATEMENTS_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    statements: _containers.RepeatedCompositeFieldContainer[AbortStatement]
    final: bool
    def __init__(self, study_id: _Optional[str] = ..., statements: _Optional[_Iterable[_Union[AbortStatement, _Mapping]]] = ..., final: _Optional[bool] = ...) -> None: ...

class SecAggAck(_message.Message):
    __slots__ = ("duplicate",)
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    def __init__(self, duplicate: _Optional[bool] = ...) -> None: ...

class SecAggBundle(_message.Message):
    __slots__ = ("stage", "body")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    stage: Stage
    body: bytes
    def __init__(self, stage: _Optional[_Union[Stage, str]] = ..., body: _Optional[bytes] = ...) -> None: ...
