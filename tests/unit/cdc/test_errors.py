from __future__ import annotations

import pickle

import pytest

from airflow_provider_cdc.cdc.basics import errors
from airflow_provider_cdc.cdc.sources.postgres.types import ValueConversionError

WORKER_TRACEBACK = """An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/x/airflow_provider_cdc/cdc/sources/postgres/types.py", line 99, in cast_text
    raise ValueConversionError(
airflow_provider_cdc.cdc.sources.postgres.types.ValueConversionError: column 'n' of public.t: value 'NaN' ...
"""


def test_engine_errors_cross_spark_with_their_class():
    error = errors.from_remote_traceback(WORKER_TRACEBACK)
    assert isinstance(error, ValueConversionError) and error.terminal
    assert str(error).startswith("column 'n' of public.t: value 'NaN'")
    assert errors.from_remote_traceback("java.lang.OutOfMemoryError: Java heap space") is None


@pytest.mark.parametrize("cls", [errors.SlotMissingError, errors.CdcTransientError, errors.UnknownTableError])
def test_errors_pickle_and_say_if_retrying_helps(cls):
    error = pickle.loads(pickle.dumps(cls("message")))
    assert type(error) is cls and str(error) == "message"
    assert error.terminal is (cls is not errors.CdcTransientError)
