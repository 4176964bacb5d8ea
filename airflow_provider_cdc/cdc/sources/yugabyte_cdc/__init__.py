"""YugabyteDB CDC-service source: per-tablet change streams polled with a DB stream id (``GetChanges``).

The path YB's "gRPC" Debezium connector takes, for streams made with ``yb-admin
create_change_data_stream`` (or ``yb_grpc`` slots). ``protocol`` speaks YB's own RPC framing.
"""
