"""Provider metadata, registered under the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from airflow_provider_cdc import __version__


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-provider-cdc",
        "name": "Change Data Capture",
        "description": "Change data capture as scheduled, bounded batches: PostgreSQL logical "
        "replication to Debezium-compatible change events, run on Spark.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "PostgreSQL change capture",
                "external-doc-url": "https://www.postgresql.org/docs/current/logical-replication.html",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {
                "integration-name": "PostgreSQL change capture",
                "python-modules": ["airflow_provider_cdc.hooks.postgres_cdc"],
            }
        ],
        "operators": [
            {
                "integration-name": "PostgreSQL change capture",
                "python-modules": [
                    "airflow_provider_cdc.operators.postgres_cdc",
                    "airflow_provider_cdc.operators.slot_maintenance",
                    "airflow_provider_cdc.operators.query_extract",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "PostgreSQL change capture",
                "python-modules": ["airflow_provider_cdc.sensors.postgres_cdc"],
            }
        ],
        "triggers": [
            {
                "integration-name": "PostgreSQL change capture",
                "python-modules": ["airflow_provider_cdc.triggers.postgres_cdc"],
            }
        ],
    }
