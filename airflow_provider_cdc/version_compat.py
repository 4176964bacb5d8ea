"""Every Airflow import of the provider, in one place (Airflow 3: the Task SDK)."""

from __future__ import annotations

from airflow.sdk import BaseHook, BaseOperator, BaseSensorOperator, Context, PokeReturnValue, Variable
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException
from airflow.triggers.base import BaseTrigger, TriggerEvent


def airflow_conf():  # -> Airflow's configuration parser
    """Airflow's configuration as this process reads it (the Task SDK's where it has one)."""
    try:
        from airflow.sdk.configuration import conf
    except ImportError:  # before the Task SDK had its own
        from airflow.configuration import conf
    return conf


__all__ = [
    "AirflowException",
    "AirflowFailException",
    "AirflowSkipException",
    "BaseHook",
    "BaseOperator",
    "BaseSensorOperator",
    "BaseTrigger",
    "Context",
    "PokeReturnValue",
    "TriggerEvent",
    "Variable",
    "airflow_conf",
]
