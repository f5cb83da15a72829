from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
    __slots__ = ("token", "public_key", "label")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    token: str
    public_key: bytes
    label: str
    def __init__(self, token: _Optional[str] = ..., public_key: _Optional[bytes] = ..., label: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("study_id", "k", "d", "centroids", "weights", "residual", "devices", "records", "status", "status_reason", "z", "threshold", "rounds")
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
    def __init__(self, study_id: _Optional[str] = ..., k: _Optional[int] = ..., d: _Optional[int] = ..., centroids: _Optional[_Iterable[float]] = ..., weights: _Optional[_Iterable[float]] = ..., residual: _Optional[float] = ..., devices: _Optional[int] = ..., records: _Optional[float] = ..., status: _Optional[str] = ..., status_reason: _Optional[str] = ..., z: _Optional[_Iterable[float]] = ..., threshold: _Optional[float] = ..., rounds: _Optional[int] = ...) -> None: ...

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
