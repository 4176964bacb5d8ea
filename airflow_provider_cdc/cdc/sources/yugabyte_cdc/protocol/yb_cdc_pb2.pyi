# ruff: noqa
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf.internal import python_message as _python_message
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PeerRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FOLLOWER: _ClassVar[PeerRole]
    LEADER: _ClassVar[PeerRole]
    LEARNER: _ClassVar[PeerRole]
    NON_PARTICIPANT: _ClassVar[PeerRole]
    READ_REPLICA: _ClassVar[PeerRole]
    UNKNOWN_ROLE: _ClassVar[PeerRole]

class YQLDatabase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    YQL_DATABASE_UNKNOWN: _ClassVar[YQLDatabase]
    YQL_DATABASE_CQL: _ClassVar[YQLDatabase]
    YQL_DATABASE_PGSQL: _ClassVar[YQLDatabase]
    YQL_DATABASE_REDIS: _ClassVar[YQLDatabase]

class CDCSDKSnapshotOption(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NOEXPORT_SNAPSHOT: _ClassVar[CDCSDKSnapshotOption]
    USE_SNAPSHOT: _ClassVar[CDCSDKSnapshotOption]

class PersistentDataType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNKNOWN_DATA: _ClassVar[PersistentDataType]
    NULL_VALUE_TYPE: _ClassVar[PersistentDataType]
    INT8: _ClassVar[PersistentDataType]
    INT16: _ClassVar[PersistentDataType]
    INT32: _ClassVar[PersistentDataType]
    INT64: _ClassVar[PersistentDataType]
    STRING: _ClassVar[PersistentDataType]
    BOOL: _ClassVar[PersistentDataType]
    FLOAT: _ClassVar[PersistentDataType]
    DOUBLE: _ClassVar[PersistentDataType]
    BINARY: _ClassVar[PersistentDataType]
    TIMESTAMP: _ClassVar[PersistentDataType]
    DECIMAL: _ClassVar[PersistentDataType]
    VARINT: _ClassVar[PersistentDataType]
    INET: _ClassVar[PersistentDataType]
    LIST: _ClassVar[PersistentDataType]
    MAP: _ClassVar[PersistentDataType]
    SET: _ClassVar[PersistentDataType]
    UUID: _ClassVar[PersistentDataType]
    TIMEUUID: _ClassVar[PersistentDataType]
    TUPLE: _ClassVar[PersistentDataType]
    TYPEARGS: _ClassVar[PersistentDataType]
    USER_DEFINED_TYPE: _ClassVar[PersistentDataType]
    FROZEN: _ClassVar[PersistentDataType]
    DATE: _ClassVar[PersistentDataType]
    TIME: _ClassVar[PersistentDataType]
    JSONB: _ClassVar[PersistentDataType]
    UINT8: _ClassVar[PersistentDataType]
    UINT16: _ClassVar[PersistentDataType]
    UINT32: _ClassVar[PersistentDataType]
    UINT64: _ClassVar[PersistentDataType]
    GIN_NULL: _ClassVar[PersistentDataType]

class QLVirtualValuePB(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LIMIT_MAX: _ClassVar[QLVirtualValuePB]
    LIMIT_MIN: _ClassVar[QLVirtualValuePB]
    COUNTER: _ClassVar[QLVirtualValuePB]
    SS_FORWARD: _ClassVar[QLVirtualValuePB]
    SS_REVERSE: _ClassVar[QLVirtualValuePB]
    TOMBSTONE: _ClassVar[QLVirtualValuePB]
    NULL_LOW: _ClassVar[QLVirtualValuePB]
    ARRAY: _ClassVar[QLVirtualValuePB]

class CDCRecordType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHANGE: _ClassVar[CDCRecordType]
    ALL: _ClassVar[CDCRecordType]
    FULL_ROW_NEW_IMAGE: _ClassVar[CDCRecordType]
    MODIFIED_COLUMNS_OLD_AND_NEW_IMAGES: _ClassVar[CDCRecordType]
    PG_FULL: _ClassVar[CDCRecordType]
    PG_CHANGE_OLD_NEW: _ClassVar[CDCRecordType]
    PG_DEFAULT: _ClassVar[CDCRecordType]
    PG_NOTHING: _ClassVar[CDCRecordType]

class CDCRecordFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JSON: _ClassVar[CDCRecordFormat]
    WAL: _ClassVar[CDCRecordFormat]
    PROTO: _ClassVar[CDCRecordFormat]

class CDCSDKRequestSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEBEZIUM: _ClassVar[CDCSDKRequestSource]
    WALSENDER: _ClassVar[CDCSDKRequestSource]
FOLLOWER: PeerRole
LEADER: PeerRole
LEARNER: PeerRole
NON_PARTICIPANT: PeerRole
READ_REPLICA: PeerRole
UNKNOWN_ROLE: PeerRole
YQL_DATABASE_UNKNOWN: YQLDatabase
YQL_DATABASE_CQL: YQLDatabase
YQL_DATABASE_PGSQL: YQLDatabase
YQL_DATABASE_REDIS: YQLDatabase
NOEXPORT_SNAPSHOT: CDCSDKSnapshotOption
USE_SNAPSHOT: CDCSDKSnapshotOption
UNKNOWN_DATA: PersistentDataType
NULL_VALUE_TYPE: PersistentDataType
INT8: PersistentDataType
INT16: PersistentDataType
INT32: PersistentDataType
INT64: PersistentDataType
STRING: PersistentDataType
BOOL: PersistentDataType
FLOAT: PersistentDataType
DOUBLE: PersistentDataType
BINARY: PersistentDataType
TIMESTAMP: PersistentDataType
DECIMAL: PersistentDataType
VARINT: PersistentDataType
INET: PersistentDataType
LIST: PersistentDataType
MAP: PersistentDataType
SET: PersistentDataType
UUID: PersistentDataType
TIMEUUID: PersistentDataType
TUPLE: PersistentDataType
TYPEARGS: PersistentDataType
USER_DEFINED_TYPE: PersistentDataType
FROZEN: PersistentDataType
DATE: PersistentDataType
TIME: PersistentDataType
JSONB: PersistentDataType
UINT8: PersistentDataType
UINT16: PersistentDataType
UINT32: PersistentDataType
UINT64: PersistentDataType
GIN_NULL: PersistentDataType
LIMIT_MAX: QLVirtualValuePB
LIMIT_MIN: QLVirtualValuePB
COUNTER: QLVirtualValuePB
SS_FORWARD: QLVirtualValuePB
SS_REVERSE: QLVirtualValuePB
TOMBSTONE: QLVirtualValuePB
NULL_LOW: QLVirtualValuePB
ARRAY: QLVirtualValuePB
CHANGE: CDCRecordType
ALL: CDCRecordType
FULL_ROW_NEW_IMAGE: CDCRecordType
MODIFIED_COLUMNS_OLD_AND_NEW_IMAGES: CDCRecordType
PG_FULL: CDCRecordType
PG_CHANGE_OLD_NEW: CDCRecordType
PG_DEFAULT: CDCRecordType
PG_NOTHING: CDCRecordType
JSON: CDCRecordFormat
WAL: CDCRecordFormat
PROTO: CDCRecordFormat
DEBEZIUM: CDCSDKRequestSource
WALSENDER: CDCSDKRequestSource

class RemoteMethodPB(_message.Message):
    __slots__ = ("service_name", "method_name")
    SERVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    METHOD_NAME_FIELD_NUMBER: _ClassVar[int]
    service_name: str
    method_name: str
    def __init__(self, service_name: _Optional[str] = ..., method_name: _Optional[str] = ...) -> None: ...

class RequestHeader(_message.Message):
    __slots__ = ("call_id", "remote_method", "timeout_millis", "sidecar_offsets")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    REMOTE_METHOD_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MILLIS_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    call_id: int
    remote_method: RemoteMethodPB
    timeout_millis: int
    sidecar_offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, call_id: _Optional[int] = ..., remote_method: _Optional[_Union[RemoteMethodPB, _Mapping]] = ..., timeout_millis: _Optional[int] = ..., sidecar_offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class ResponseHeader(_message.Message):
    __slots__ = ("call_id", "is_error", "sidecar_offsets")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    call_id: int
    is_error: bool
    sidecar_offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, call_id: _Optional[int] = ..., is_error: bool = ..., sidecar_offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class ErrorStatusPB(_message.Message):
    __slots__ = ("message", "code")
    Extensions: _python_message._ExtensionDict
    class RpcErrorCodePB(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        FATAL_UNKNOWN: _ClassVar[ErrorStatusPB.RpcErrorCodePB]
        ERROR_APPLICATION: _ClassVar[ErrorStatusPB.RpcErrorCodePB]
        ERROR_NO_SUCH_METHOD: _ClassVar[ErrorStatusPB.RpcErrorCodePB]
        ERROR_NO_SUCH_SERVICE: _ClassVar[ErrorStatusPB.RpcErrorCodePB]
        ERROR_SERVER_TOO_BUSY: _ClassVar[ErrorStatusPB.RpcErrorCodePB]
        ERROR_INVALID_REQUEST: _ClassVar[ErrorStatusPB.RpcErrorCodePB]
        FATAL_SERVER_SHUTTING_DOWN: _ClassVar[ErrorStatusPB.RpcErrorCodePB]
        FATAL_DESERIALIZING_REQUEST: _ClassVar[ErrorStatusPB.RpcErrorCodePB]
        FATAL_VERSION_MISMATCH: _ClassVar[ErrorStatusPB.RpcErrorCodePB]
        FATAL_UNAUTHORIZED: _ClassVar[ErrorStatusPB.RpcErrorCodePB]
    FATAL_UNKNOWN: ErrorStatusPB.RpcErrorCodePB
    ERROR_APPLICATION: ErrorStatusPB.RpcErrorCodePB
    ERROR_NO_SUCH_METHOD: ErrorStatusPB.RpcErrorCodePB
    ERROR_NO_SUCH_SERVICE: ErrorStatusPB.RpcErrorCodePB
    ERROR_SERVER_TOO_BUSY: ErrorStatusPB.RpcErrorCodePB
    ERROR_INVALID_REQUEST: ErrorStatusPB.RpcErrorCodePB
    FATAL_SERVER_SHUTTING_DOWN: ErrorStatusPB.RpcErrorCodePB
    FATAL_DESERIALIZING_REQUEST: ErrorStatusPB.RpcErrorCodePB
    FATAL_VERSION_MISMATCH: ErrorStatusPB.RpcErrorCodePB
    FATAL_UNAUTHORIZED: ErrorStatusPB.RpcErrorCodePB
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    message: str
    code: ErrorStatusPB.RpcErrorCodePB
    def __init__(self, message: _Optional[str] = ..., code: _Optional[_Union[ErrorStatusPB.RpcErrorCodePB, str]] = ...) -> None: ...

class HostPortPB(_message.Message):
    __slots__ = ("host", "port")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    host: str
    port: int
    def __init__(self, host: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class CloudInfoPB(_message.Message):
    __slots__ = ("placement_cloud", "placement_region", "placement_zone")
    PLACEMENT_CLOUD_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_REGION_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_ZONE_FIELD_NUMBER: _ClassVar[int]
    placement_cloud: str
    placement_region: str
    placement_zone: str
    def __init__(self, placement_cloud: _Optional[str] = ..., placement_region: _Optional[str] = ..., placement_zone: _Optional[str] = ...) -> None: ...

class AppStatusPB(_message.Message):
    __slots__ = ("code", "message", "posix_code", "ql_error_code", "source_file", "source_line", "errors")
    class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN_ERROR: _ClassVar[AppStatusPB.ErrorCode]
        OK: _ClassVar[AppStatusPB.ErrorCode]
        NOT_FOUND: _ClassVar[AppStatusPB.ErrorCode]
        CORRUPTION: _ClassVar[AppStatusPB.ErrorCode]
        NOT_SUPPORTED: _ClassVar[AppStatusPB.ErrorCode]
        INVALID_ARGUMENT: _ClassVar[AppStatusPB.ErrorCode]
        IO_ERROR: _ClassVar[AppStatusPB.ErrorCode]
        ALREADY_PRESENT: _ClassVar[AppStatusPB.ErrorCode]
        RUNTIME_ERROR: _ClassVar[AppStatusPB.ErrorCode]
        NETWORK_ERROR: _ClassVar[AppStatusPB.ErrorCode]
        ILLEGAL_STATE: _ClassVar[AppStatusPB.ErrorCode]
        NOT_AUTHORIZED: _ClassVar[AppStatusPB.ErrorCode]
        ABORTED: _ClassVar[AppStatusPB.ErrorCode]
        REMOTE_ERROR: _ClassVar[AppStatusPB.ErrorCode]
        SERVICE_UNAVAILABLE: _ClassVar[AppStatusPB.ErrorCode]
        TIMED_OUT: _ClassVar[AppStatusPB.ErrorCode]
        UNINITIALIZED: _ClassVar[AppStatusPB.ErrorCode]
        CONFIGURATION_ERROR: _ClassVar[AppStatusPB.ErrorCode]
        INCOMPLETE: _ClassVar[AppStatusPB.ErrorCode]
        END_OF_FILE: _ClassVar[AppStatusPB.ErrorCode]
        INVALID_COMMAND: _ClassVar[AppStatusPB.ErrorCode]
        QL_ERROR: _ClassVar[AppStatusPB.ErrorCode]
        INTERNAL_ERROR: _ClassVar[AppStatusPB.ErrorCode]
        EXPIRED: _ClassVar[AppStatusPB.ErrorCode]
        LEADER_NOT_READY_TO_SERVE: _ClassVar[AppStatusPB.ErrorCode]
        LEADER_HAS_NO_LEASE: _ClassVar[AppStatusPB.ErrorCode]
        TRY_AGAIN_CODE: _ClassVar[AppStatusPB.ErrorCode]
        BUSY: _ClassVar[AppStatusPB.ErrorCode]
        SHUTDOWN_IN_PROGRESS: _ClassVar[AppStatusPB.ErrorCode]
        MERGE_IN_PROGRESS: _ClassVar[AppStatusPB.ErrorCode]
        COMBINED_ERROR: _ClassVar[AppStatusPB.ErrorCode]
        SNAPSHOT_TOO_OLD: _ClassVar[AppStatusPB.ErrorCode]
        DEPRECATED_HOST_UNREACHABLE: _ClassVar[AppStatusPB.ErrorCode]
        CACHE_MISS_ERROR: _ClassVar[AppStatusPB.ErrorCode]
        TABLET_SPLIT: _ClassVar[AppStatusPB.ErrorCode]
    UNKNOWN_ERROR: AppStatusPB.ErrorCode
    OK: AppStatusPB.ErrorCode
    NOT_FOUND: AppStatusPB.ErrorCode
    CORRUPTION: AppStatusPB.ErrorCode
    NOT_SUPPORTED: AppStatusPB.ErrorCode
    INVALID_ARGUMENT: AppStatusPB.ErrorCode
    IO_ERROR: AppStatusPB.ErrorCode
    ALREADY_PRESENT: AppStatusPB.ErrorCode
    RUNTIME_ERROR: AppStatusPB.ErrorCode
    NETWORK_ERROR: AppStatusPB.ErrorCode
    ILLEGAL_STATE: AppStatusPB.ErrorCode
    NOT_AUTHORIZED: AppStatusPB.ErrorCode
    ABORTED: AppStatusPB.ErrorCode
    REMOTE_ERROR: AppStatusPB.ErrorCode
    SERVICE_UNAVAILABLE: AppStatusPB.ErrorCode
    TIMED_OUT: AppStatusPB.ErrorCode
    UNINITIALIZED: AppStatusPB.ErrorCode
    CONFIGURATION_ERROR: AppStatusPB.ErrorCode
    INCOMPLETE: AppStatusPB.ErrorCode
    END_OF_FILE: AppStatusPB.ErrorCode
    INVALID_COMMAND: AppStatusPB.ErrorCode
    QL_ERROR: AppStatusPB.ErrorCode
    INTERNAL_ERROR: AppStatusPB.ErrorCode
    EXPIRED: AppStatusPB.ErrorCode
    LEADER_NOT_READY_TO_SERVE: AppStatusPB.ErrorCode
    LEADER_HAS_NO_LEASE: AppStatusPB.ErrorCode
    TRY_AGAIN_CODE: AppStatusPB.ErrorCode
    BUSY: AppStatusPB.ErrorCode
    SHUTDOWN_IN_PROGRESS: AppStatusPB.ErrorCode
    MERGE_IN_PROGRESS: AppStatusPB.ErrorCode
    COMBINED_ERROR: AppStatusPB.ErrorCode
    SNAPSHOT_TOO_OLD: AppStatusPB.ErrorCode
    DEPRECATED_HOST_UNREACHABLE: AppStatusPB.ErrorCode
    CACHE_MISS_ERROR: AppStatusPB.ErrorCode
    TABLET_SPLIT: AppStatusPB.ErrorCode
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    POSIX_CODE_FIELD_NUMBER: _ClassVar[int]
    QL_ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FILE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LINE_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    code: AppStatusPB.ErrorCode
    message: str
    posix_code: int
    ql_error_code: int
    source_file: str
    source_line: int
    errors: bytes
    def __init__(self, code: _Optional[_Union[AppStatusPB.ErrorCode, str]] = ..., message: _Optional[str] = ..., posix_code: _Optional[int] = ..., ql_error_code: _Optional[int] = ..., source_file: _Optional[str] = ..., source_line: _Optional[int] = ..., errors: _Optional[bytes] = ...) -> None: ...

class OpIdPB(_message.Message):
    __slots__ = ("term", "index")
    TERM_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    term: int
    index: int
    def __init__(self, term: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class PartitionPB(_message.Message):
    __slots__ = ("hash_buckets", "partition_key_start", "partition_key_end")
    HASH_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_KEY_START_FIELD_NUMBER: _ClassVar[int]
    PARTITION_KEY_END_FIELD_NUMBER: _ClassVar[int]
    hash_buckets: _containers.RepeatedScalarFieldContainer[int]
    partition_key_start: bytes
    partition_key_end: bytes
    def __init__(self, hash_buckets: _Optional[_Iterable[int]] = ..., partition_key_start: _Optional[bytes] = ..., partition_key_end: _Optional[bytes] = ...) -> None: ...

class QLTypePB(_message.Message):
    __slots__ = ("main", "params", "udtype_info")
    class UDTypeInfo(_message.Message):
        __slots__ = ("keyspace_name", "name", "id", "field_names")
        KEYSPACE_NAME_FIELD_NUMBER: _ClassVar[int]
        NAME_FIELD_NUMBER: _ClassVar[int]
        ID_FIELD_NUMBER: _ClassVar[int]
        FIELD_NAMES_FIELD_NUMBER: _ClassVar[int]
        keyspace_name: str
        name: str
        id: str
        field_names: _containers.RepeatedScalarFieldContainer[str]
        def __init__(self, keyspace_name: _Optional[str] = ..., name: _Optional[str] = ..., id: _Optional[str] = ..., field_names: _Optional[_Iterable[str]] = ...) -> None: ...
    MAIN_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    UDTYPE_INFO_FIELD_NUMBER: _ClassVar[int]
    main: PersistentDataType
    params: _containers.RepeatedCompositeFieldContainer[QLTypePB]
    udtype_info: QLTypePB.UDTypeInfo
    def __init__(self, main: _Optional[_Union[PersistentDataType, str]] = ..., params: _Optional[_Iterable[_Union[QLTypePB, _Mapping]]] = ..., udtype_info: _Optional[_Union[QLTypePB.UDTypeInfo, _Mapping]] = ...) -> None: ...

class QLSeqValuePB(_message.Message):
    __slots__ = ("elems",)
    ELEMS_FIELD_NUMBER: _ClassVar[int]
    elems: _containers.RepeatedCompositeFieldContainer[QLValuePB]
    def __init__(self, elems: _Optional[_Iterable[_Union[QLValuePB, _Mapping]]] = ...) -> None: ...

class QLMapValuePB(_message.Message):
    __slots__ = ("keys", "values")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[QLValuePB]
    values: _containers.RepeatedCompositeFieldContainer[QLValuePB]
    def __init__(self, keys: _Optional[_Iterable[_Union[QLValuePB, _Mapping]]] = ..., values: _Optional[_Iterable[_Union[QLValuePB, _Mapping]]] = ...) -> None: ...

class QLValuePB(_message.Message):
    __slots__ = ("int8_value", "int16_value", "int32_value", "int64_value", "float_value", "double_value", "string_value", "bool_value", "timestamp_value", "binary_value", "inetaddress_value", "map_value", "set_value", "list_value", "decimal_value", "varint_value", "frozen_value", "uuid_value", "timeuuid_value", "jsonb_value", "date_value", "time_value", "uint32_value", "uint64_value", "virtual_value", "gin_null_value", "tuple_value")
    INT8_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT16_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT32_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT64_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_VALUE_FIELD_NUMBER: _ClassVar[int]
    BINARY_VALUE_FIELD_NUMBER: _ClassVar[int]
    INETADDRESS_VALUE_FIELD_NUMBER: _ClassVar[int]
    MAP_VALUE_FIELD_NUMBER: _ClassVar[int]
    SET_VALUE_FIELD_NUMBER: _ClassVar[int]
    LIST_VALUE_FIELD_NUMBER: _ClassVar[int]
    DECIMAL_VALUE_FIELD_NUMBER: _ClassVar[int]
    VARINT_VALUE_FIELD_NUMBER: _ClassVar[int]
    FROZEN_VALUE_FIELD_NUMBER: _ClassVar[int]
    UUID_VALUE_FIELD_NUMBER: _ClassVar[int]
    TIMEUUID_VALUE_FIELD_NUMBER: _ClassVar[int]
    JSONB_VALUE_FIELD_NUMBER: _ClassVar[int]
    DATE_VALUE_FIELD_NUMBER: _ClassVar[int]
    TIME_VALUE_FIELD_NUMBER: _ClassVar[int]
    UINT32_VALUE_FIELD_NUMBER: _ClassVar[int]
    UINT64_VALUE_FIELD_NUMBER: _ClassVar[int]
    VIRTUAL_VALUE_FIELD_NUMBER: _ClassVar[int]
    GIN_NULL_VALUE_FIELD_NUMBER: _ClassVar[int]
    TUPLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    int8_value: int
    int16_value: int
    int32_value: int
    int64_value: int
    float_value: float
    double_value: float
    string_value: bytes
    bool_value: bool
    timestamp_value: int
    binary_value: bytes
    inetaddress_value: bytes
    map_value: QLMapValuePB
    set_value: QLSeqValuePB
    list_value: QLSeqValuePB
    decimal_value: bytes
    varint_value: bytes
    frozen_value: QLSeqValuePB
    uuid_value: bytes
    timeuuid_value: bytes
    jsonb_value: bytes
    date_value: int
    time_value: int
    uint32_value: int
    uint64_value: int
    virtual_value: QLVirtualValuePB
    gin_null_value: int
    tuple_value: QLSeqValuePB
    def __init__(self, int8_value: _Optional[int] = ..., int16_value: _Optional[int] = ..., int32_value: _Optional[int] = ..., int64_value: _Optional[int] = ..., float_value: _Optional[float] = ..., double_value: _Optional[float] = ..., string_value: _Optional[bytes] = ..., bool_value: bool = ..., timestamp_value: _Optional[int] = ..., binary_value: _Optional[bytes] = ..., inetaddress_value: _Optional[bytes] = ..., map_value: _Optional[_Union[QLMapValuePB, _Mapping]] = ..., set_value: _Optional[_Union[QLSeqValuePB, _Mapping]] = ..., list_value: _Optional[_Union[QLSeqValuePB, _Mapping]] = ..., decimal_value: _Optional[bytes] = ..., varint_value: _Optional[bytes] = ..., frozen_value: _Optional[_Union[QLSeqValuePB, _Mapping]] = ..., uuid_value: _Optional[bytes] = ..., timeuuid_value: _Optional[bytes] = ..., jsonb_value: _Optional[bytes] = ..., date_value: _Optional[int] = ..., time_value: _Optional[int] = ..., uint32_value: _Optional[int] = ..., uint64_value: _Optional[int] = ..., virtual_value: _Optional[_Union[QLVirtualValuePB, str]] = ..., gin_null_value: _Optional[int] = ..., tuple_value: _Optional[_Union[QLSeqValuePB, _Mapping]] = ...) -> None: ...

class PgDatumPB(_message.Message):
    __slots__ = ("datum_int32", "datum_int64", "datum_float", "datum_double", "datum_bool", "datum_string", "datum_bytes", "datum_missing")
    DATUM_INT32_FIELD_NUMBER: _ClassVar[int]
    DATUM_INT64_FIELD_NUMBER: _ClassVar[int]
    DATUM_FLOAT_FIELD_NUMBER: _ClassVar[int]
    DATUM_DOUBLE_FIELD_NUMBER: _ClassVar[int]
    DATUM_BOOL_FIELD_NUMBER: _ClassVar[int]
    DATUM_STRING_FIELD_NUMBER: _ClassVar[int]
    DATUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATUM_MISSING_FIELD_NUMBER: _ClassVar[int]
    datum_int32: int
    datum_int64: int
    datum_float: float
    datum_double: float
    datum_bool: bool
    datum_string: str
    datum_bytes: bytes
    datum_missing: bool
    def __init__(self, datum_int32: _Optional[int] = ..., datum_int64: _Optional[int] = ..., datum_float: _Optional[float] = ..., datum_double: _Optional[float] = ..., datum_bool: bool = ..., datum_string: _Optional[str] = ..., datum_bytes: _Optional[bytes] = ..., datum_missing: bool = ...) -> None: ...

class DatumMessagePB(_message.Message):
    __slots__ = ("column_name", "column_type", "datum_int32", "datum_int64", "datum_float", "datum_double", "datum_bool", "datum_string", "datum_bytes", "datum_missing", "cql_type", "pg_type", "pg_value", "cql_value", "pg_ql_value")
    COLUMN_NAME_FIELD_NUMBER: _ClassVar[int]
    COLUMN_TYPE_FIELD_NUMBER: _ClassVar[int]
    DATUM_INT32_FIELD_NUMBER: _ClassVar[int]
    DATUM_INT64_FIELD_NUMBER: _ClassVar[int]
    DATUM_FLOAT_FIELD_NUMBER: _ClassVar[int]
    DATUM_DOUBLE_FIELD_NUMBER: _ClassVar[int]
    DATUM_BOOL_FIELD_NUMBER: _ClassVar[int]
    DATUM_STRING_FIELD_NUMBER: _ClassVar[int]
    DATUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATUM_MISSING_FIELD_NUMBER: _ClassVar[int]
    CQL_TYPE_FIELD_NUMBER: _ClassVar[int]
    PG_TYPE_FIELD_NUMBER: _ClassVar[int]
    PG_VALUE_FIELD_NUMBER: _ClassVar[int]
    CQL_VALUE_FIELD_NUMBER: _ClassVar[int]
    PG_QL_VALUE_FIELD_NUMBER: _ClassVar[int]
    column_name: str
    column_type: int
    datum_int32: int
    datum_int64: int
    datum_float: float
    datum_double: float
    datum_bool: bool
    datum_string: str
    datum_bytes: bytes
    datum_missing: bool
    cql_type: QLTypePB
    pg_type: int
    pg_value: PgDatumPB
    cql_value: QLValuePB
    pg_ql_value: QLValuePB
    def __init__(self, column_name: _Optional[str] = ..., column_type: _Optional[int] = ..., datum_int32: _Optional[int] = ..., datum_int64: _Optional[int] = ..., datum_float: _Optional[float] = ..., datum_double: _Optional[float] = ..., datum_bool: bool = ..., datum_string: _Optional[str] = ..., datum_bytes: _Optional[bytes] = ..., datum_missing: bool = ..., cql_type: _Optional[_Union[QLTypePB, _Mapping]] = ..., pg_type: _Optional[int] = ..., pg_value: _Optional[_Union[PgDatumPB, _Mapping]] = ..., cql_value: _Optional[_Union[QLValuePB, _Mapping]] = ..., pg_ql_value: _Optional[_Union[QLValuePB, _Mapping]] = ...) -> None: ...

class MasterErrorPB(_message.Message):
    __slots__ = ("code", "status")
    class Code(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN_ERROR: _ClassVar[MasterErrorPB.Code]
        INVALID_SCHEMA: _ClassVar[MasterErrorPB.Code]
        OBJECT_NOT_FOUND: _ClassVar[MasterErrorPB.Code]
        OBJECT_ALREADY_PRESENT: _ClassVar[MasterErrorPB.Code]
        TOO_MANY_TABLETS: _ClassVar[MasterErrorPB.Code]
        CATALOG_MANAGER_NOT_INITIALIZED: _ClassVar[MasterErrorPB.Code]
        NOT_THE_LEADER: _ClassVar[MasterErrorPB.Code]
        REPLICATION_FACTOR_TOO_HIGH: _ClassVar[MasterErrorPB.Code]
        CONFIG_VERSION_MISMATCH: _ClassVar[MasterErrorPB.Code]
        IN_TRANSITION_CAN_RETRY: _ClassVar[MasterErrorPB.Code]
        NAMESPACE_NOT_FOUND: _ClassVar[MasterErrorPB.Code]
        NAMESPACE_ALREADY_PRESENT: _ClassVar[MasterErrorPB.Code]
        NO_NAMESPACE_USED: _ClassVar[MasterErrorPB.Code]
        NAMESPACE_IS_NOT_EMPTY: _ClassVar[MasterErrorPB.Code]
        INVALID_CLUSTER_CONFIG: _ClassVar[MasterErrorPB.Code]
        CAN_RETRY_LOAD_BALANCE_CHECK: _ClassVar[MasterErrorPB.Code]
        TYPE_NOT_FOUND: _ClassVar[MasterErrorPB.Code]
        INVALID_TYPE: _ClassVar[MasterErrorPB.Code]
        TYPE_ALREADY_PRESENT: _ClassVar[MasterErrorPB.Code]
        INVALID_TABLE_TYPE: _ClassVar[MasterErrorPB.Code]
        TABLE_CREATION_IS_IN_PROGRESS: _ClassVar[MasterErrorPB.Code]
        SNAPSHOT_NOT_FOUND: _ClassVar[MasterErrorPB.Code]
        SNAPSHOT_FAILED: _ClassVar[MasterErrorPB.Code]
        SNAPSHOT_CANCELLED: _ClassVar[MasterErrorPB.Code]
        PARALLEL_SNAPSHOT_OPERATION: _ClassVar[MasterErrorPB.Code]
        SNAPSHOT_IS_NOT_READY: _ClassVar[MasterErrorPB.Code]
        ROLE_ALREADY_PRESENT: _ClassVar[MasterErrorPB.Code]
        ROLE_NOT_FOUND: _ClassVar[MasterErrorPB.Code]
        INVALID_REQUEST: _ClassVar[MasterErrorPB.Code]
        NOT_AUTHORIZED: _ClassVar[MasterErrorPB.Code]
        CAN_RETRY_ARE_LEADERS_ON_PREFERRED_ONLY_CHECK: _ClassVar[MasterErrorPB.Code]
        REDIS_CONFIG_NOT_FOUND: _ClassVar[MasterErrorPB.Code]
        LOAD_BALANCER_RECENTLY_ACTIVE: _ClassVar[MasterErrorPB.Code]
        INTERNAL_ERROR: _ClassVar[MasterErrorPB.Code]
        INVALID_TABLE_REPLICATION_INFO: _ClassVar[MasterErrorPB.Code]
        REACHED_SPLIT_LIMIT: _ClassVar[MasterErrorPB.Code]
        SPLIT_OR_BACKFILL_IN_PROGRESS: _ClassVar[MasterErrorPB.Code]
        TABLET_NOT_RUNNING: _ClassVar[MasterErrorPB.Code]
        TABLE_NOT_RUNNING: _ClassVar[MasterErrorPB.Code]
        TABLE_SCHEMA_CHANGE_IN_PROGRESS: _ClassVar[MasterErrorPB.Code]
        REPLICATION_SLOT_LIMIT_REACHED: _ClassVar[MasterErrorPB.Code]
    UNKNOWN_ERROR: MasterErrorPB.Code
    INVALID_SCHEMA: MasterErrorPB.Code
    OBJECT_NOT_FOUND: MasterErrorPB.Code
    OBJECT_ALREADY_PRESENT: MasterErrorPB.Code
    TOO_MANY_TABLETS: MasterErrorPB.Code
    CATALOG_MANAGER_NOT_INITIALIZED: MasterErrorPB.Code
    NOT_THE_LEADER: MasterErrorPB.Code
    REPLICATION_FACTOR_TOO_HIGH: MasterErrorPB.Code
    CONFIG_VERSION_MISMATCH: MasterErrorPB.Code
    IN_TRANSITION_CAN_RETRY: MasterErrorPB.Code
    NAMESPACE_NOT_FOUND: MasterErrorPB.Code
    NAMESPACE_ALREADY_PRESENT: MasterErrorPB.Code
    NO_NAMESPACE_USED: MasterErrorPB.Code
    NAMESPACE_IS_NOT_EMPTY: MasterErrorPB.Code
    INVALID_CLUSTER_CONFIG: MasterErrorPB.Code
    CAN_RETRY_LOAD_BALANCE_CHECK: MasterErrorPB.Code
    TYPE_NOT_FOUND: MasterErrorPB.Code
    INVALID_TYPE: MasterErrorPB.Code
    TYPE_ALREADY_PRESENT: MasterErrorPB.Code
    INVALID_TABLE_TYPE: MasterErrorPB.Code
    TABLE_CREATION_IS_IN_PROGRESS: MasterErrorPB.Code
    SNAPSHOT_NOT_FOUND: MasterErrorPB.Code
    SNAPSHOT_FAILED: MasterErrorPB.Code
    SNAPSHOT_CANCELLED: MasterErrorPB.Code
    PARALLEL_SNAPSHOT_OPERATION: MasterErrorPB.Code
    SNAPSHOT_IS_NOT_READY: MasterErrorPB.Code
    ROLE_ALREADY_PRESENT: MasterErrorPB.Code
    ROLE_NOT_FOUND: MasterErrorPB.Code
    INVALID_REQUEST: MasterErrorPB.Code
    NOT_AUTHORIZED: MasterErrorPB.Code
    CAN_RETRY_ARE_LEADERS_ON_PREFERRED_ONLY_CHECK: MasterErrorPB.Code
    REDIS_CONFIG_NOT_FOUND: MasterErrorPB.Code
    LOAD_BALANCER_RECENTLY_ACTIVE: MasterErrorPB.Code
    INTERNAL_ERROR: MasterErrorPB.Code
    INVALID_TABLE_REPLICATION_INFO: MasterErrorPB.Code
    REACHED_SPLIT_LIMIT: MasterErrorPB.Code
    SPLIT_OR_BACKFILL_IN_PROGRESS: MasterErrorPB.Code
    TABLET_NOT_RUNNING: MasterErrorPB.Code
    TABLE_NOT_RUNNING: MasterErrorPB.Code
    TABLE_SCHEMA_CHANGE_IN_PROGRESS: MasterErrorPB.Code
    REPLICATION_SLOT_LIMIT_REACHED: MasterErrorPB.Code
    CODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    code: MasterErrorPB.Code
    status: AppStatusPB
    def __init__(self, code: _Optional[_Union[MasterErrorPB.Code, str]] = ..., status: _Optional[_Union[AppStatusPB, _Mapping]] = ...) -> None: ...

class NamespaceIdentifierPB(_message.Message):
    __slots__ = ("id", "name", "database_type")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATABASE_TYPE_FIELD_NUMBER: _ClassVar[int]
    id: bytes
    name: str
    database_type: YQLDatabase
    def __init__(self, id: _Optional[bytes] = ..., name: _Optional[str] = ..., database_type: _Optional[_Union[YQLDatabase, str]] = ...) -> None: ...

class TableIdentifierPB(_message.Message):
    __slots__ = ("table_id", "table_name", "namespace")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    table_id: bytes
    table_name: str
    namespace: NamespaceIdentifierPB
    def __init__(self, table_id: _Optional[bytes] = ..., table_name: _Optional[str] = ..., namespace: _Optional[_Union[NamespaceIdentifierPB, _Mapping]] = ...) -> None: ...

class TSInfoPB(_message.Message):
    __slots__ = ("permanent_uuid", "private_rpc_addresses", "broadcast_addresses", "cloud_info", "placement_uuid")
    PERMANENT_UUID_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_RPC_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    CLOUD_INFO_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_UUID_FIELD_NUMBER: _ClassVar[int]
    permanent_uuid: bytes
    private_rpc_addresses: _containers.RepeatedCompositeFieldContainer[HostPortPB]
    broadcast_addresses: _containers.RepeatedCompositeFieldContainer[HostPortPB]
    cloud_info: CloudInfoPB
    placement_uuid: bytes
    def __init__(self, permanent_uuid: _Optional[bytes] = ..., private_rpc_addresses: _Optional[_Iterable[_Union[HostPortPB, _Mapping]]] = ..., broadcast_addresses: _Optional[_Iterable[_Union[HostPortPB, _Mapping]]] = ..., cloud_info: _Optional[_Union[CloudInfoPB, _Mapping]] = ..., placement_uuid: _Optional[bytes] = ...) -> None: ...

class TabletLocationsPB(_message.Message):
    __slots__ = ("tablet_id", "start_key", "end_key", "partition", "replicas", "stale", "table_id", "table_ids", "split_depth", "split_parent_tablet_id", "split_tablet_ids", "expected_live_replicas", "expected_read_replicas", "is_deleted", "raft_config_opid_index")
    class ReplicaPB(_message.Message):
        __slots__ = ("ts_info", "role", "member_type", "state")
        TS_INFO_FIELD_NUMBER: _ClassVar[int]
        ROLE_FIELD_NUMBER: _ClassVar[int]
        MEMBER_TYPE_FIELD_NUMBER: _ClassVar[int]
        STATE_FIELD_NUMBER: _ClassVar[int]
        ts_info: TSInfoPB
        role: PeerRole
        member_type: int
        state: int
        def __init__(self, ts_info: _Optional[_Union[TSInfoPB, _Mapping]] = ..., role: _Optional[_Union[PeerRole, str]] = ..., member_type: _Optional[int] = ..., state: _Optional[int] = ...) -> None: ...
    TABLET_ID_FIELD_NUMBER: _ClassVar[int]
    START_KEY_FIELD_NUMBER: _ClassVar[int]
    END_KEY_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_IDS_FIELD_NUMBER: _ClassVar[int]
    SPLIT_DEPTH_FIELD_NUMBER: _ClassVar[int]
    SPLIT_PARENT_TABLET_ID_FIELD_NUMBER: _ClassVar[int]
    SPLIT_TABLET_IDS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_LIVE_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_READ_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    IS_DELETED_FIELD_NUMBER: _ClassVar[int]
    RAFT_CONFIG_OPID_INDEX_FIELD_NUMBER: _ClassVar[int]
    tablet_id: bytes
    start_key: bytes
    end_key: bytes
    partition: PartitionPB
    replicas: _containers.RepeatedCompositeFieldContainer[TabletLocationsPB.ReplicaPB]
    stale: bool
    table_id: bytes
    table_ids: _containers.RepeatedScalarFieldContainer[bytes]
    split_depth: int
    split_parent_tablet_id: bytes
    split_tablet_ids: _containers.RepeatedScalarFieldContainer[bytes]
    expected_live_replicas: int
    expected_read_replicas: int
    is_deleted: bool
    raft_config_opid_index: int
    def __init__(self, tablet_id: _Optional[bytes] = ..., start_key: _Optional[bytes] = ..., end_key: _Optional[bytes] = ..., partition: _Optional[_Union[PartitionPB, _Mapping]] = ..., replicas: _Optional[_Iterable[_Union[TabletLocationsPB.ReplicaPB, _Mapping]]] = ..., stale: bool = ..., table_id: _Optional[bytes] = ..., table_ids: _Optional[_Iterable[bytes]] = ..., split_depth: _Optional[int] = ..., split_parent_tablet_id: _Optional[bytes] = ..., split_tablet_ids: _Optional[_Iterable[bytes]] = ..., expected_live_replicas: _Optional[int] = ..., expected_read_replicas: _Optional[int] = ..., is_deleted: bool = ..., raft_config_opid_index: _Optional[int] = ...) -> None: ...

class GetTableLocationsRequestPB(_message.Message):
    __slots__ = ("table", "partition_key_start", "partition_key_end", "max_returned_locations", "require_tablets_running", "include_inactive", "partitions_only")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_KEY_START_FIELD_NUMBER: _ClassVar[int]
    PARTITION_KEY_END_FIELD_NUMBER: _ClassVar[int]
    MAX_RETURNED_LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_TABLETS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_INACTIVE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_ONLY_FIELD_NUMBER: _ClassVar[int]
    table: TableIdentifierPB
    partition_key_start: bytes
    partition_key_end: bytes
    max_returned_locations: int
    require_tablets_running: bool
    include_inactive: bool
    partitions_only: bool
    def __init__(self, table: _Optional[_Union[TableIdentifierPB, _Mapping]] = ..., partition_key_start: _Optional[bytes] = ..., partition_key_end: _Optional[bytes] = ..., max_returned_locations: _Optional[int] = ..., require_tablets_running: bool = ..., include_inactive: bool = ..., partitions_only: bool = ...) -> None: ...

class GetTableLocationsResponsePB(_message.Message):
    __slots__ = ("error", "tablet_locations", "table_type", "partition_list_version", "creating")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TABLET_LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    TABLE_TYPE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_LIST_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATING_FIELD_NUMBER: _ClassVar[int]
    error: MasterErrorPB
    tablet_locations: _containers.RepeatedCompositeFieldContainer[TabletLocationsPB]
    table_type: int
    partition_list_version: int
    creating: bool
    def __init__(self, error: _Optional[_Union[MasterErrorPB, _Mapping]] = ..., tablet_locations: _Optional[_Iterable[_Union[TabletLocationsPB, _Mapping]]] = ..., table_type: _Optional[int] = ..., partition_list_version: _Optional[int] = ..., creating: bool = ...) -> None: ...

class GetTabletLocationsRequestPB(_message.Message):
    __slots__ = ("tablet_ids", "table_id", "include_inactive", "include_deleted")
    TABLET_IDS_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_INACTIVE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DELETED_FIELD_NUMBER: _ClassVar[int]
    tablet_ids: _containers.RepeatedScalarFieldContainer[bytes]
    table_id: bytes
    include_inactive: bool
    include_deleted: bool
    def __init__(self, tablet_ids: _Optional[_Iterable[bytes]] = ..., table_id: _Optional[bytes] = ..., include_inactive: bool = ..., include_deleted: bool = ...) -> None: ...

class GetTabletLocationsResponsePB(_message.Message):
    __slots__ = ("error", "tablet_locations", "partition_list_version", "errors")
    class Error(_message.Message):
        __slots__ = ("tablet_id", "status")
        TABLET_ID_FIELD_NUMBER: _ClassVar[int]
        STATUS_FIELD_NUMBER: _ClassVar[int]
        tablet_id: bytes
        status: AppStatusPB
        def __init__(self, tablet_id: _Optional[bytes] = ..., status: _Optional[_Union[AppStatusPB, _Mapping]] = ...) -> None: ...
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TABLET_LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_LIST_VERSION_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    error: MasterErrorPB
    tablet_locations: _containers.RepeatedCompositeFieldContainer[TabletLocationsPB]
    partition_list_version: int
    errors: _containers.RepeatedCompositeFieldContainer[GetTabletLocationsResponsePB.Error]
    def __init__(self, error: _Optional[_Union[MasterErrorPB, _Mapping]] = ..., tablet_locations: _Optional[_Iterable[_Union[TabletLocationsPB, _Mapping]]] = ..., partition_list_version: _Optional[int] = ..., errors: _Optional[_Iterable[_Union[GetTabletLocationsResponsePB.Error, _Mapping]]] = ...) -> None: ...

class CDCStreamOptionsPB(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class CDCStreamInfoPB(_message.Message):
    __slots__ = ("stream_id", "table_id", "options", "namespace_id", "transactional", "cdcsdk_ysql_replication_slot_name", "cdcsdk_consistent_snapshot_time", "cdcsdk_consistent_snapshot_option", "stream_creation_time", "replica_identity_map", "cdcsdk_ysql_replication_slot_plugin_name")
    class ReplicaIdentityMapEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONAL_FIELD_NUMBER: _ClassVar[int]
    CDCSDK_YSQL_REPLICATION_SLOT_NAME_FIELD_NUMBER: _ClassVar[int]
    CDCSDK_CONSISTENT_SNAPSHOT_TIME_FIELD_NUMBER: _ClassVar[int]
    CDCSDK_CONSISTENT_SNAPSHOT_OPTION_FIELD_NUMBER: _ClassVar[int]
    STREAM_CREATION_TIME_FIELD_NUMBER: _ClassVar[int]
    REPLICA_IDENTITY_MAP_FIELD_NUMBER: _ClassVar[int]
    CDCSDK_YSQL_REPLICATION_SLOT_PLUGIN_NAME_FIELD_NUMBER: _ClassVar[int]
    stream_id: bytes
    table_id: _containers.RepeatedScalarFieldContainer[bytes]
    options: _containers.RepeatedCompositeFieldContainer[CDCStreamOptionsPB]
    namespace_id: bytes
    transactional: bool
    cdcsdk_ysql_replication_slot_name: str
    cdcsdk_consistent_snapshot_time: int
    cdcsdk_consistent_snapshot_option: CDCSDKSnapshotOption
    stream_creation_time: int
    replica_identity_map: _containers.ScalarMap[str, int]
    cdcsdk_ysql_replication_slot_plugin_name: str
    def __init__(self, stream_id: _Optional[bytes] = ..., table_id: _Optional[_Iterable[bytes]] = ..., options: _Optional[_Iterable[_Union[CDCStreamOptionsPB, _Mapping]]] = ..., namespace_id: _Optional[bytes] = ..., transactional: bool = ..., cdcsdk_ysql_replication_slot_name: _Optional[str] = ..., cdcsdk_consistent_snapshot_time: _Optional[int] = ..., cdcsdk_consistent_snapshot_option: _Optional[_Union[CDCSDKSnapshotOption, str]] = ..., stream_creation_time: _Optional[int] = ..., replica_identity_map: _Optional[_Mapping[str, int]] = ..., cdcsdk_ysql_replication_slot_plugin_name: _Optional[str] = ...) -> None: ...

class GetCDCStreamRequestPB(_message.Message):
    __slots__ = ("stream_id", "cdcsdk_ysql_replication_slot_name")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    CDCSDK_YSQL_REPLICATION_SLOT_NAME_FIELD_NUMBER: _ClassVar[int]
    stream_id: bytes
    cdcsdk_ysql_replication_slot_name: str
    def __init__(self, stream_id: _Optional[bytes] = ..., cdcsdk_ysql_replication_slot_name: _Optional[str] = ...) -> None: ...

class GetCDCStreamResponsePB(_message.Message):
    __slots__ = ("error", "stream")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    error: MasterErrorPB
    stream: CDCStreamInfoPB
    def __init__(self, error: _Optional[_Union[MasterErrorPB, _Mapping]] = ..., stream: _Optional[_Union[CDCStreamInfoPB, _Mapping]] = ...) -> None: ...

class MasterGetCDCDBStreamInfoRequestPB(_message.Message):
    __slots__ = ("db_stream_id",)
    DB_STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    db_stream_id: bytes
    def __init__(self, db_stream_id: _Optional[bytes] = ...) -> None: ...

class MasterGetCDCDBStreamInfoResponsePB(_message.Message):
    __slots__ = ("error", "table_info", "namespace_id")
    class TableInfo(_message.Message):
        __slots__ = ("stream_id", "table_id")
        STREAM_ID_FIELD_NUMBER: _ClassVar[int]
        TABLE_ID_FIELD_NUMBER: _ClassVar[int]
        stream_id: bytes
        table_id: bytes
        def __init__(self, stream_id: _Optional[bytes] = ..., table_id: _Optional[bytes] = ...) -> None: ...
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TABLE_INFO_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    error: MasterErrorPB
    table_info: _containers.RepeatedCompositeFieldContainer[MasterGetCDCDBStreamInfoResponsePB.TableInfo]
    namespace_id: bytes
    def __init__(self, error: _Optional[_Union[MasterErrorPB, _Mapping]] = ..., table_info: _Optional[_Iterable[_Union[MasterGetCDCDBStreamInfoResponsePB.TableInfo, _Mapping]]] = ..., namespace_id: _Optional[bytes] = ...) -> None: ...

class CDCErrorPB(_message.Message):
    __slots__ = ("code", "status")
    class Code(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN_ERROR: _ClassVar[CDCErrorPB.Code]
        TABLET_NOT_FOUND: _ClassVar[CDCErrorPB.Code]
        TABLE_NOT_FOUND: _ClassVar[CDCErrorPB.Code]
        SUBSCRIBER_NOT_FOUND: _ClassVar[CDCErrorPB.Code]
        CHECKPOINT_TOO_OLD: _ClassVar[CDCErrorPB.Code]
        TABLET_NOT_RUNNING: _ClassVar[CDCErrorPB.Code]
        NOT_LEADER: _ClassVar[CDCErrorPB.Code]
        LEADER_NOT_READY: _ClassVar[CDCErrorPB.Code]
        NOT_RUNNING: _ClassVar[CDCErrorPB.Code]
        INTERNAL_ERROR: _ClassVar[CDCErrorPB.Code]
        INVALID_REQUEST: _ClassVar[CDCErrorPB.Code]
        TABLET_SPLIT: _ClassVar[CDCErrorPB.Code]
        OPERATION_DISALLOWED: _ClassVar[CDCErrorPB.Code]
        AUTO_FLAGS_CONFIG_VERSION_MISMATCH: _ClassVar[CDCErrorPB.Code]
    UNKNOWN_ERROR: CDCErrorPB.Code
    TABLET_NOT_FOUND: CDCErrorPB.Code
    TABLE_NOT_FOUND: CDCErrorPB.Code
    SUBSCRIBER_NOT_FOUND: CDCErrorPB.Code
    CHECKPOINT_TOO_OLD: CDCErrorPB.Code
    TABLET_NOT_RUNNING: CDCErrorPB.Code
    NOT_LEADER: CDCErrorPB.Code
    LEADER_NOT_READY: CDCErrorPB.Code
    NOT_RUNNING: CDCErrorPB.Code
    INTERNAL_ERROR: CDCErrorPB.Code
    INVALID_REQUEST: CDCErrorPB.Code
    TABLET_SPLIT: CDCErrorPB.Code
    OPERATION_DISALLOWED: CDCErrorPB.Code
    AUTO_FLAGS_CONFIG_VERSION_MISMATCH: CDCErrorPB.Code
    CODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    code: CDCErrorPB.Code
    status: AppStatusPB
    def __init__(self, code: _Optional[_Union[CDCErrorPB.Code, str]] = ..., status: _Optional[_Union[AppStatusPB, _Mapping]] = ...) -> None: ...

class CDCSDKCheckpointPB(_message.Message):
    __slots__ = ("term", "index", "key", "write_id", "snapshot_time")
    TERM_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    WRITE_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_TIME_FIELD_NUMBER: _ClassVar[int]
    term: int
    index: int
    key: bytes
    write_id: int
    snapshot_time: int
    def __init__(self, term: _Optional[int] = ..., index: _Optional[int] = ..., key: _Optional[bytes] = ..., write_id: _Optional[int] = ..., snapshot_time: _Optional[int] = ...) -> None: ...

class CDCCheckpointPB(_message.Message):
    __slots__ = ("op_id",)
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    op_id: OpIdPB
    def __init__(self, op_id: _Optional[_Union[OpIdPB, _Mapping]] = ...) -> None: ...

class GetChangesRequestPB(_message.Message):
    __slots__ = ("stream_id", "tablet_id", "from_checkpoint", "max_records", "serve_as_proxy", "db_stream_id", "table_id", "from_cdc_sdk_checkpoint", "need_schema_info", "explicit_cdc_sdk_checkpoint", "safe_hybrid_time", "wal_segment_index", "cdcsdk_request_source", "raft_config_opid_index")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    TABLET_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    SERVE_AS_PROXY_FIELD_NUMBER: _ClassVar[int]
    DB_STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_CDC_SDK_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    NEED_SCHEMA_INFO_FIELD_NUMBER: _ClassVar[int]
    EXPLICIT_CDC_SDK_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    SAFE_HYBRID_TIME_FIELD_NUMBER: _ClassVar[int]
    WAL_SEGMENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    CDCSDK_REQUEST_SOURCE_FIELD_NUMBER: _ClassVar[int]
    RAFT_CONFIG_OPID_INDEX_FIELD_NUMBER: _ClassVar[int]
    stream_id: bytes
    tablet_id: bytes
    from_checkpoint: CDCCheckpointPB
    max_records: int
    serve_as_proxy: bool
    db_stream_id: bytes
    table_id: bytes
    from_cdc_sdk_checkpoint: CDCSDKCheckpointPB
    need_schema_info: bool
    explicit_cdc_sdk_checkpoint: CDCSDKCheckpointPB
    safe_hybrid_time: int
    wal_segment_index: int
    cdcsdk_request_source: CDCSDKRequestSource
    raft_config_opid_index: int
    def __init__(self, stream_id: _Optional[bytes] = ..., tablet_id: _Optional[bytes] = ..., from_checkpoint: _Optional[_Union[CDCCheckpointPB, _Mapping]] = ..., max_records: _Optional[int] = ..., serve_as_proxy: bool = ..., db_stream_id: _Optional[bytes] = ..., table_id: _Optional[bytes] = ..., from_cdc_sdk_checkpoint: _Optional[_Union[CDCSDKCheckpointPB, _Mapping]] = ..., need_schema_info: bool = ..., explicit_cdc_sdk_checkpoint: _Optional[_Union[CDCSDKCheckpointPB, _Mapping]] = ..., safe_hybrid_time: _Optional[int] = ..., wal_segment_index: _Optional[int] = ..., cdcsdk_request_source: _Optional[_Union[CDCSDKRequestSource, str]] = ..., raft_config_opid_index: _Optional[int] = ...) -> None: ...

class TypeInfo(_message.Message):
    __slots__ = ("modifier", "value_optional")
    MODIFIER_FIELD_NUMBER: _ClassVar[int]
    VALUE_OPTIONAL_FIELD_NUMBER: _ClassVar[int]
    modifier: str
    value_optional: bool
    def __init__(self, modifier: _Optional[str] = ..., value_optional: bool = ...) -> None: ...

class CDCSDKColumnInfoPB(_message.Message):
    __slots__ = ("name", "type", "is_key", "is_hash_key", "is_nullable", "oid")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    IS_KEY_FIELD_NUMBER: _ClassVar[int]
    IS_HASH_KEY_FIELD_NUMBER: _ClassVar[int]
    IS_NULLABLE_FIELD_NUMBER: _ClassVar[int]
    OID_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: QLTypePB
    is_key: bool
    is_hash_key: bool
    is_nullable: bool
    oid: int
    def __init__(self, name: _Optional[str] = ..., type: _Optional[_Union[QLTypePB, _Mapping]] = ..., is_key: bool = ..., is_hash_key: bool = ..., is_nullable: bool = ..., oid: _Optional[int] = ...) -> None: ...

class CDCSDKTablePropertiesPB(_message.Message):
    __slots__ = ("default_time_to_live", "num_tablets", "is_ysql_catalog_table")
    DEFAULT_TIME_TO_LIVE_FIELD_NUMBER: _ClassVar[int]
    NUM_TABLETS_FIELD_NUMBER: _ClassVar[int]
    IS_YSQL_CATALOG_TABLE_FIELD_NUMBER: _ClassVar[int]
    default_time_to_live: int
    num_tablets: int
    is_ysql_catalog_table: bool
    def __init__(self, default_time_to_live: _Optional[int] = ..., num_tablets: _Optional[int] = ..., is_ysql_catalog_table: bool = ...) -> None: ...

class CDCSDKSchemaPB(_message.Message):
    __slots__ = ("column_info", "tab_info")
    COLUMN_INFO_FIELD_NUMBER: _ClassVar[int]
    TAB_INFO_FIELD_NUMBER: _ClassVar[int]
    column_info: _containers.RepeatedCompositeFieldContainer[CDCSDKColumnInfoPB]
    tab_info: CDCSDKTablePropertiesPB
    def __init__(self, column_info: _Optional[_Iterable[_Union[CDCSDKColumnInfoPB, _Mapping]]] = ..., tab_info: _Optional[_Union[CDCSDKTablePropertiesPB, _Mapping]] = ...) -> None: ...

class CDCSDKOpIdPB(_message.Message):
    __slots__ = ("term", "index", "write_id", "write_id_key")
    TERM_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    WRITE_ID_FIELD_NUMBER: _ClassVar[int]
    WRITE_ID_KEY_FIELD_NUMBER: _ClassVar[int]
    term: int
    index: int
    write_id: int
    write_id_key: bytes
    def __init__(self, term: _Optional[int] = ..., index: _Optional[int] = ..., write_id: _Optional[int] = ..., write_id_key: _Optional[bytes] = ...) -> None: ...

class RowMessage(_message.Message):
    __slots__ = ("transaction_id", "commit_time", "table", "op", "new_tuple", "old_tuple", "new_typeinfo", "schema", "schema_version", "new_table_name", "pgschema_name", "record_time", "pg_lsn", "pg_transaction_id", "table_id", "primary_key")
    class Op(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[RowMessage.Op]
        INSERT: _ClassVar[RowMessage.Op]
        UPDATE: _ClassVar[RowMessage.Op]
        DELETE: _ClassVar[RowMessage.Op]
        BEGIN: _ClassVar[RowMessage.Op]
        COMMIT: _ClassVar[RowMessage.Op]
        DDL: _ClassVar[RowMessage.Op]
        TRUNCATE: _ClassVar[RowMessage.Op]
        READ: _ClassVar[RowMessage.Op]
        SAFEPOINT: _ClassVar[RowMessage.Op]
    UNKNOWN: RowMessage.Op
    INSERT: RowMessage.Op
    UPDATE: RowMessage.Op
    DELETE: RowMessage.Op
    BEGIN: RowMessage.Op
    COMMIT: RowMessage.Op
    DDL: RowMessage.Op
    TRUNCATE: RowMessage.Op
    READ: RowMessage.Op
    SAFEPOINT: RowMessage.Op
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    NEW_TUPLE_FIELD_NUMBER: _ClassVar[int]
    OLD_TUPLE_FIELD_NUMBER: _ClassVar[int]
    NEW_TYPEINFO_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    NEW_TABLE_NAME_FIELD_NUMBER: _ClassVar[int]
    PGSCHEMA_NAME_FIELD_NUMBER: _ClassVar[int]
    RECORD_TIME_FIELD_NUMBER: _ClassVar[int]
    PG_LSN_FIELD_NUMBER: _ClassVar[int]
    PG_TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_KEY_FIELD_NUMBER: _ClassVar[int]
    transaction_id: bytes
    commit_time: int
    table: str
    op: RowMessage.Op
    new_tuple: _containers.RepeatedCompositeFieldContainer[DatumMessagePB]
    old_tuple: _containers.RepeatedCompositeFieldContainer[DatumMessagePB]
    new_typeinfo: _containers.RepeatedCompositeFieldContainer[TypeInfo]
    schema: CDCSDKSchemaPB
    schema_version: int
    new_table_name: str
    pgschema_name: str
    record_time: int
    pg_lsn: int
    pg_transaction_id: int
    table_id: str
    primary_key: bytes
    def __init__(self, transaction_id: _Optional[bytes] = ..., commit_time: _Optional[int] = ..., table: _Optional[str] = ..., op: _Optional[_Union[RowMessage.Op, str]] = ..., new_tuple: _Optional[_Iterable[_Union[DatumMessagePB, _Mapping]]] = ..., old_tuple: _Optional[_Iterable[_Union[DatumMessagePB, _Mapping]]] = ..., new_typeinfo: _Optional[_Iterable[_Union[TypeInfo, _Mapping]]] = ..., schema: _Optional[_Union[CDCSDKSchemaPB, _Mapping]] = ..., schema_version: _Optional[int] = ..., new_table_name: _Optional[str] = ..., pgschema_name: _Optional[str] = ..., record_time: _Optional[int] = ..., pg_lsn: _Optional[int] = ..., pg_transaction_id: _Optional[int] = ..., table_id: _Optional[str] = ..., primary_key: _Optional[bytes] = ...) -> None: ...

class CDCSDKProtoRecordPB(_message.Message):
    __slots__ = ("row_message", "cdc_sdk_op_id", "from_op_id")
    ROW_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CDC_SDK_OP_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_OP_ID_FIELD_NUMBER: _ClassVar[int]
    row_message: RowMessage
    cdc_sdk_op_id: CDCSDKOpIdPB
    from_op_id: CDCSDKOpIdPB
    def __init__(self, row_message: _Optional[_Union[RowMessage, _Mapping]] = ..., cdc_sdk_op_id: _Optional[_Union[CDCSDKOpIdPB, _Mapping]] = ..., from_op_id: _Optional[_Union[CDCSDKOpIdPB, _Mapping]] = ...) -> None: ...

class GetChangesResponsePB(_message.Message):
    __slots__ = ("error", "record_type", "record_format", "checkpoint", "tserver", "cdc_sdk_proto_records", "cdc_sdk_checkpoint", "safe_hybrid_time", "wal_segment_index")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RECORD_TYPE_FIELD_NUMBER: _ClassVar[int]
    RECORD_FORMAT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    TSERVER_FIELD_NUMBER: _ClassVar[int]
    CDC_SDK_PROTO_RECORDS_FIELD_NUMBER: _ClassVar[int]
    CDC_SDK_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    SAFE_HYBRID_TIME_FIELD_NUMBER: _ClassVar[int]
    WAL_SEGMENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    error: CDCErrorPB
    record_type: CDCRecordType
    record_format: CDCRecordFormat
    checkpoint: CDCCheckpointPB
    tserver: _containers.RepeatedCompositeFieldContainer[HostPortPB]
    cdc_sdk_proto_records: _containers.RepeatedCompositeFieldContainer[CDCSDKProtoRecordPB]
    cdc_sdk_checkpoint: CDCSDKCheckpointPB
    safe_hybrid_time: int
    wal_segment_index: int
    def __init__(self, error: _Optional[_Union[CDCErrorPB, _Mapping]] = ..., record_type: _Optional[_Union[CDCRecordType, str]] = ..., record_format: _Optional[_Union[CDCRecordFormat, str]] = ..., checkpoint: _Optional[_Union[CDCCheckpointPB, _Mapping]] = ..., tserver: _Optional[_Iterable[_Union[HostPortPB, _Mapping]]] = ..., cdc_sdk_proto_records: _Optional[_Iterable[_Union[CDCSDKProtoRecordPB, _Mapping]]] = ..., cdc_sdk_checkpoint: _Optional[_Union[CDCSDKCheckpointPB, _Mapping]] = ..., safe_hybrid_time: _Optional[int] = ..., wal_segment_index: _Optional[int] = ...) -> None: ...

class GetCheckpointRequestPB(_message.Message):
    __slots__ = ("stream_id", "tablet_id", "table_id", "serve_as_proxy")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    TABLET_ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    SERVE_AS_PROXY_FIELD_NUMBER: _ClassVar[int]
    stream_id: bytes
    tablet_id: bytes
    table_id: bytes
    serve_as_proxy: bool
    def __init__(self, stream_id: _Optional[bytes] = ..., tablet_id: _Optional[bytes] = ..., table_id: _Optional[bytes] = ..., serve_as_proxy: bool = ...) -> None: ...

class GetCheckpointResponsePB(_message.Message):
    __slots__ = ("error", "checkpoint", "snapshot_key", "snapshot_time")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_KEY_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_TIME_FIELD_NUMBER: _ClassVar[int]
    error: CDCErrorPB
    checkpoint: CDCCheckpointPB
    snapshot_key: bytes
    snapshot_time: int
    def __init__(self, error: _Optional[_Union[CDCErrorPB, _Mapping]] = ..., checkpoint: _Optional[_Union[CDCCheckpointPB, _Mapping]] = ..., snapshot_key: _Optional[bytes] = ..., snapshot_time: _Optional[int] = ...) -> None: ...

class TableInfo(_message.Message):
    __slots__ = ("stream_id", "table_id")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    stream_id: bytes
    table_id: bytes
    def __init__(self, stream_id: _Optional[bytes] = ..., table_id: _Optional[bytes] = ...) -> None: ...

class GetCDCDBStreamInfoRequestPB(_message.Message):
    __slots__ = ("db_stream_id",)
    DB_STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    db_stream_id: bytes
    def __init__(self, db_stream_id: _Optional[bytes] = ...) -> None: ...

class GetCDCDBStreamInfoResponsePB(_message.Message):
    __slots__ = ("error", "namespace_id", "table_info")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_INFO_FIELD_NUMBER: _ClassVar[int]
    error: CDCErrorPB
    namespace_id: bytes
    table_info: _containers.RepeatedCompositeFieldContainer[TableInfo]
    def __init__(self, error: _Optional[_Union[CDCErrorPB, _Mapping]] = ..., namespace_id: _Optional[bytes] = ..., table_info: _Optional[_Iterable[_Union[TableInfo, _Mapping]]] = ...) -> None: ...

class SetCDCCheckpointRequestPB(_message.Message):
    __slots__ = ("checkpoint", "cdc_sdk_checkpoint", "stream_id", "tablet_id", "initial_checkpoint", "bootstrap", "cdc_sdk_safe_time", "serve_as_proxy")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    CDC_SDK_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    TABLET_ID_FIELD_NUMBER: _ClassVar[int]
    INITIAL_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_FIELD_NUMBER: _ClassVar[int]
    CDC_SDK_SAFE_TIME_FIELD_NUMBER: _ClassVar[int]
    SERVE_AS_PROXY_FIELD_NUMBER: _ClassVar[int]
    checkpoint: CDCCheckpointPB
    cdc_sdk_checkpoint: CDCSDKCheckpointPB
    stream_id: bytes
    tablet_id: bytes
    initial_checkpoint: bool
    bootstrap: bool
    cdc_sdk_safe_time: int
    serve_as_proxy: bool
    def __init__(self, checkpoint: _Optional[_Union[CDCCheckpointPB, _Mapping]] = ..., cdc_sdk_checkpoint: _Optional[_Union[CDCSDKCheckpointPB, _Mapping]] = ..., stream_id: _Optional[bytes] = ..., tablet_id: _Optional[bytes] = ..., initial_checkpoint: bool = ..., bootstrap: bool = ..., cdc_sdk_safe_time: _Optional[int] = ..., serve_as_proxy: bool = ...) -> None: ...

class SetCDCCheckpointResponsePB(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: CDCErrorPB
    def __init__(self, error: _Optional[_Union[CDCErrorPB, _Mapping]] = ...) -> None: ...

class TabletCheckpointPair(_message.Message):
    __slots__ = ("tablet_locations", "cdc_sdk_checkpoint")
    TABLET_LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    CDC_SDK_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    tablet_locations: TabletLocationsPB
    cdc_sdk_checkpoint: CDCSDKCheckpointPB
    def __init__(self, tablet_locations: _Optional[_Union[TabletLocationsPB, _Mapping]] = ..., cdc_sdk_checkpoint: _Optional[_Union[CDCSDKCheckpointPB, _Mapping]] = ...) -> None: ...

class GetTabletListToPollForCDCRequestPB(_message.Message):
    __slots__ = ("table_info", "tablet_id")
    TABLE_INFO_FIELD_NUMBER: _ClassVar[int]
    TABLET_ID_FIELD_NUMBER: _ClassVar[int]
    table_info: TableInfo
    tablet_id: bytes
    def __init__(self, table_info: _Optional[_Union[TableInfo, _Mapping]] = ..., tablet_id: _Optional[bytes] = ...) -> None: ...

class GetTabletListToPollForCDCResponsePB(_message.Message):
    __slots__ = ("error", "tablet_checkpoint_pairs")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TABLET_CHECKPOINT_PAIRS_FIELD_NUMBER: _ClassVar[int]
    error: CDCErrorPB
    tablet_checkpoint_pairs: _containers.RepeatedCompositeFieldContainer[TabletCheckpointPair]
    def __init__(self, error: _Optional[_Union[CDCErrorPB, _Mapping]] = ..., tablet_checkpoint_pairs: _Optional[_Iterable[_Union[TabletCheckpointPair, _Mapping]]] = ...) -> None: ...

class GetLatestEntryOpIdRequestPB(_message.Message):
    __slots__ = ("tablet_id", "tablet_ids")
    TABLET_ID_FIELD_NUMBER: _ClassVar[int]
    TABLET_IDS_FIELD_NUMBER: _ClassVar[int]
    tablet_id: bytes
    tablet_ids: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, tablet_id: _Optional[bytes] = ..., tablet_ids: _Optional[_Iterable[bytes]] = ...) -> None: ...

class GetLatestEntryOpIdResponsePB(_message.Message):
    __slots__ = ("error", "op_id", "op_ids", "bootstrap_time")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    OP_IDS_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_TIME_FIELD_NUMBER: _ClassVar[int]
    error: CDCErrorPB
    op_id: OpIdPB
    op_ids: _containers.RepeatedCompositeFieldContainer[OpIdPB]
    bootstrap_time: int
    def __init__(self, error: _Optional[_Union[CDCErrorPB, _Mapping]] = ..., op_id: _Optional[_Union[OpIdPB, _Mapping]] = ..., op_ids: _Optional[_Iterable[_Union[OpIdPB, _Mapping]]] = ..., bootstrap_time: _Optional[int] = ...) -> None: ...
