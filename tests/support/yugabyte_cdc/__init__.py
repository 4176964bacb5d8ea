"""A YugabyteDB CDC-service ("gRPC" connector) stand-in for the tests: masters and tablet servers
speaking YB's framed-protobuf RPC on loopback, serving real changes of a real PostgreSQL 15
database cut into hash-partitioned tablets. See docs/yugabytedb-cdc-standin.md.
"""

from .standin import StandInError, YugabyteCdcStandIn, airflow_connection, standin_for

__all__ = ["StandInError", "YugabyteCdcStandIn", "airflow_connection", "standin_for"]
