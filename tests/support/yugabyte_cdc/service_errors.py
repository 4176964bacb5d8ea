"""Service-level errors (CDCErrorPB / MasterErrorPB in a successful RPC response), with YB's texts.

The message texts are YugabyteDB's own (``cdc_service.cc``, the master's catalog manager), so
clients that must recognise a condition by its text (expiry, a missing stream) can.
"""

from __future__ import annotations

from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

CDC = pb.CDCErrorPB
MASTER = pb.MasterErrorPB
STATUS = pb.AppStatusPB


class ServiceError(Exception):
    """Answered as the response's ``error`` field, not as an RPC failure."""

    def __init__(self, code: int, status_code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.status_code = status_code
        self.message = message

    def fill(self, error) -> None:
        error.code = self.code
        error.status.code = self.status_code
        error.status.message = self.message


def stream_not_found(stream_id: str, code: int = CDC.INTERNAL_ERROR) -> ServiceError:
    return ServiceError(code, STATUS.NOT_FOUND, f'Could not find CDC stream: stream_id: "{stream_id}"')


def not_in_stream(tablet_id: str, stream_id: str) -> ServiceError:
    return ServiceError(
        CDC.INVALID_REQUEST, STATUS.INVALID_ARGUMENT, f"Tablet ID {tablet_id} is not part of stream ID {stream_id}"
    )


def expired(stream_id: str, tablet_id: str) -> ServiceError:
    # CheckStreamActive (cdc_service.cc @ 4c48938b): STATUS_FORMAT(InternalError, "Stream ID $0 is
    # expired for Tablet ID $1", ...); older releases wrote "stream ID" (lower case).
    return ServiceError(
        CDC.INTERNAL_ERROR, STATUS.INTERNAL_ERROR, f"Stream ID {stream_id} is expired for Tablet ID {tablet_id}"
    )


def tablet_split(tablet_id: str) -> ServiceError:
    return ServiceError(CDC.TABLET_SPLIT, STATUS.TABLET_SPLIT, f"Tablet Split detected on {tablet_id}")


def invalid(message: str) -> ServiceError:
    return ServiceError(CDC.INVALID_REQUEST, STATUS.INVALID_ARGUMENT, message)
