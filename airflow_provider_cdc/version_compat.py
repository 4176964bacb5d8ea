"""Every Airflow import of the provider, in one place (Airflow 3: the Task SDK)."""

from __future__ import annotations

from airflow.sdk import BaseHook, BaseOperator, BaseSensorOperator, Context, PokeReturnValue, Variable
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException
from airflow.triggers.base import BaseTrigger, TriggerEvent

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
]
