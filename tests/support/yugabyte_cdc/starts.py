"""A stream's snapshot-less start, as a client of the stand-in sees it (tests and benchmarks)."""

from __future__ import annotations

from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import (
    Checkpoint,
    TabletCheckpoints,
    TabletPosition,
    TabletState,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import methods
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.client import RpcConnection

from .standin import YugabyteCdcStandIn


def start_streaming(yb: YugabyteCdcStandIn, stream: str, table: str) -> TabletCheckpoints:
    """Snapshot mode "never": each tablet of ``table`` checkpointed at its latest op
    (``SetCDCCheckpoint(bootstrap)``, then ``GetCheckpoint``), as a stream window's start."""
    tablets: dict[str, TabletState] = {}
    for tablet in yb.tablets(table):
        with RpcConnection(*yb.tserver_addresses[tablet["leader"]], connect_timeout=5, tls=None) as connection:
            stream_id, tablet_id = stream.encode(), tablet["tablet_id"].encode()
            connection.invoke(
                methods.SET_CDC_CHECKPOINT,
                pb.SetCDCCheckpointRequestPB(stream_id=stream_id, tablet_id=tablet_id, bootstrap=True),
                timeout=20,
            )
            op = connection.invoke(
                methods.GET_CHECKPOINT, pb.GetCheckpointRequestPB(stream_id=stream_id, tablet_id=tablet_id), timeout=20
            ).checkpoint.op_id
        assert op.term > 0 and op.index > 0, op
        tablets[tablet["tablet_id"]] = TabletState(
            TabletPosition(Checkpoint(op.term, op.index)), table_ids=(tablet["table_id"],)
        )
    return TabletCheckpoints(tablets)
