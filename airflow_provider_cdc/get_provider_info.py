"""Provider metadata, registered under the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from airflow_provider_cdc import __version__


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-provider-cdc",
        "name": "Change Data Capture",
        "description": "Change data capture as scheduled, bounded batches: PostgreSQL logical "
        "replication, SQL Server CDC and YugabyteDB logical replication to Debezium-compatible change "
        "events, run on Spark.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "PostgreSQL change capture",
                "external-doc-url": "https://www.postgresql.org/docs/current/logical-replication.html",
                "tags": ["software"],
            },
            {
                "integration-name": "SQL Server change capture",
                "external-doc-url": "https://learn.microsoft.com/sql/relational-databases/track-changes/about-change-data-capture-sql-server",
                "tags": ["software"],
            },
            {
                "integration-name": "YugabyteDB change capture",
                "external-doc-url": "https://docs.yugabyte.com/stable/additional-features/change-data-capture/",
                "tags": ["software"],
            },
        ],
        "hooks": [
            {
                "integration-name": "PostgreSQL change capture",
                "python-modules": ["airflow_provider_cdc.hooks.postgres_cdc"],
            },
            {
                "integration-name": "SQL Server change capture",
                "python-modules": ["airflow_provider_cdc.hooks.sqlserver_cdc"],
            },
            {
                "integration-name": "YugabyteDB change capture",
                "python-modules": ["airflow_provider_cdc.hooks.yugabyte_cdc"],
            },
        ],
        "operators": [
            {
                "integration-name": "PostgreSQL change capture",
                "python-modules": [
                    "airflow_provider_cdc.operators.cdc",
                    "airflow_provider_cdc.operators.postgres_cdc",
                    "airflow_provider_cdc.operators.slot_maintenance",
                    "airflow_provider_cdc.operators.query_extract",
                ],
            },
            {
                "integration-name": "SQL Server change capture",
                "python-modules": ["airflow_provider_cdc.operators.sqlserver_health"],
            },
            {
                "integration-name": "YugabyteDB change capture",
                "python-modules": ["airflow_provider_cdc.operators.yugabyte_health"],
            },
        ],
        "sensors": [
            {
                "integration-name": "PostgreSQL change capture",
                "python-modules": ["airflow_provider_cdc.sensors.cdc", "airflow_provider_cdc.sensors.postgres_cdc"],
            }
        ],
        "triggers": [
            {
                "integration-name": "PostgreSQL change capture",
                "python-modules": ["airflow_provider_cdc.triggers.postgres_cdc"],
            },
            {
                "integration-name": "SQL Server change capture",
                "python-modules": ["airflow_provider_cdc.triggers.sqlserver_cdc"],
            },
            {
                "integration-name": "YugabyteDB change capture",
                "python-modules": ["airflow_provider_cdc.triggers.yugabyte_cdc"],
            },
        ],
    }
