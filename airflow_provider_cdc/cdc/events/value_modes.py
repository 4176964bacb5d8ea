"""Debezium's value handling modes, for every source, and the error for a value without a representation.

``decimal.handling.mode``, ``time.precision.mode`` (plus the Spark-native default ``spark``),
``binary.handling.mode``; ``hstore`` and ``interval`` apply to PostgreSQL only, and
``unavailable_value_placeholder`` to values a source does not send (PostgreSQL's unchanged
TOAST values). Each source's types module maps its types under these modes.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcError

MAX_DECIMAL_PRECISION = 38  # Arrow decimal128 and Spark DecimalType

DECIMAL_MODES = ("precise", "double", "string")
TIME_PRECISION_MODES = ("spark", "adaptive", "adaptive_time_microseconds", "connect")
BINARY_MODES = ("bytes", "base64", "hex")
HSTORE_MODES = ("json", "map")
INTERVAL_MODES = ("numeric", "string")
DEFAULT_PLACEHOLDER = "__debezium_unavailable_value"


class ValueConversionError(CdcError):
    """A source value has no representation in the column's mapped type."""


@dataclass(frozen=True)
class ValueModes:
    """Debezium's value handling modes (``decimal.handling.mode`` and friends)."""

    decimal: str = "precise"
    time_precision: str = "spark"
    binary: str = "bytes"
    hstore: str = "json"
    interval: str = "numeric"
    unavailable_value_placeholder: str = DEFAULT_PLACEHOLDER

    def __post_init__(self) -> None:
        for name, allowed in (
            ("decimal", DECIMAL_MODES),
            ("time_precision", TIME_PRECISION_MODES),
            ("binary", BINARY_MODES),
            ("hstore", HSTORE_MODES),
            ("interval", INTERVAL_MODES),
        ):
            if getattr(self, name) not in allowed:
                raise CdcConfigurationError(
                    f"{name} handling mode {getattr(self, name)!r} is not one of {', '.join(allowed)}"
                )

    def to_dict(self) -> dict[str, str]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict) -> ValueModes:
        return cls(**data)
