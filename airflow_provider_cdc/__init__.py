"""airflow-provider-cdc: change data capture as scheduled, bounded windows.

This module must stay importable without Airflow and without Spark: the capture engine
(``airflow_provider_cdc.cdc``) runs inside Spark jobs that have neither Airflow nor its config.
"""

__version__ = "0.1.0"
