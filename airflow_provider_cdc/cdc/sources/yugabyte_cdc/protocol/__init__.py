"""YugabyteDB's framed-protobuf RPC (not HTTP/2 gRPC): messages, framing, typed errors, a blocking client.

``yb_cdc_pb2`` is generated from ``yb_cdc.proto`` by ``scripts/generate_yb_protocol.sh``; the
sources each piece follows are in docs/yugabytedb-cdc-service-research.md.
"""
