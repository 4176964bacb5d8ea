"""Every Airflow import of the provider, in one place (Airflow 3: the Task SDK)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook, BaseOperator, BaseSensorOperator, Context, PokeReturnValue, Variable
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowOptionalProviderFeatureException,
    AirflowSkipException,
)
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError

#: How to get the optional Spark pieces (pyspark, Airflow's Spark provider) where they are missing.
SPARK_INSTALL_LINE = "pip install 'airflow-provider-cdc[spark]'"


def airflow_conf():  # -> Airflow's configuration parser
    """Airflow's configuration as this process reads it (the Task SDK's where it has one)."""
    try:
        from airflow.sdk.configuration import conf
    except ImportError:  # before the Task SDK had its own
        from airflow.configuration import conf
    return conf


class SparkProviderNotInstalledError(CdcConfigurationError, AirflowOptionalProviderFeatureException):
    """A capture with a ``spark_conn_id`` ran where Airflow's Spark provider is not installed.

    Airflow's optional-feature error, and a configuration error for the operators: a retry cannot
    install a package, so the task fails without retries."""


def spark_submit_hook_class() -> Any:
    """Airflow's ``SparkSubmitHook`` (the ``spark`` extra), or the error naming the install line."""
    try:
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    except ImportError as exc:
        if not (exc.name or "").startswith("airflow.providers.apache"):
            raise  # the provider is there but broken: its own error says more
        raise SparkProviderNotInstalledError(
            f"spark_conn_id submits the capture's Spark jobs through Airflow's Spark provider, which is not "
            f"installed in this Python ({exc}). Install the provider's Spark extra on the workers: "
            f"{SPARK_INSTALL_LINE}; or leave spark_conn_id unset to run the jobs in the task's process"
        ) from None
    return SparkSubmitHook


__all__ = [
    "AirflowException",
    "AirflowFailException",
    "AirflowOptionalProviderFeatureException",
    "AirflowSkipException",
    "BaseHook",
    "BaseOperator",
    "BaseSensorOperator",
    "BaseTrigger",
    "Context",
    "PokeReturnValue",
    "SparkProviderNotInstalledError",
    "TriggerEvent",
    "Variable",
    "airflow_conf",
    "spark_submit_hook_class",
]
