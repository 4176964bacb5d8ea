"""What the window merge yields: a transaction's key in commit order (:class:`TxKey`) and its items
(:class:`TxBegin`, :class:`Change` … :class:`TxEnd`), as :mod:`.merge` builds them from the tablets'
records and :mod:`.collector` turns them into events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

Op = pb.RowMessage
ROW_OPS = frozenset((Op.INSERT, Op.UPDATE, Op.DELETE))
SINGLE_SHARD, MULTI_SHARD = 0, 1


@dataclass(frozen=True, order=True)
class TxKey:
    """A transaction's identity and place in commit order: ``(commit_time, kind, ident)`` with
    ``ident`` = ``(transaction id,)`` (multi-shard) or ``(tablet id, term, index)`` of its WAL
    write (single-shard: YB gives those no transaction id)."""

    commit_time: int
    kind: int
    ident: tuple[str | int, ...]

    @property
    def txid(self) -> str:
        """YB's transaction id (``source.txId``); empty for a single-shard write, as Debezium's."""
        return str(self.ident[0]) if self.kind == MULTI_SHARD else ""

    @property
    def id(self) -> str:
        """A unique transaction id for the transaction side table: ``<txid>:<commit ht>``, or
        ``<tablet>.<term>.<index>:<commit ht>`` for a single-shard write."""
        base = self.txid if self.kind == MULTI_SHARD else ".".join(str(p) for p in self.ident)
        return f"{base}:{self.commit_time}"


@dataclass(frozen=True)
class TxBegin:
    key: TxKey
    tablets: tuple[str, ...]  # the tablets with a part of it, in the order their changes follow


@dataclass(frozen=True)
class Change:
    """One row change of a transaction, numbered across its tablets."""

    key: TxKey
    tablet_id: str
    record: pb.CDCSDKProtoRecordPB
    schema: pb.RowMessage | None  # the table's DDL record last seen on this tablet (None: none yet)
    data_collection: str
    total_order: int
    data_collection_order: int


@dataclass(frozen=True)
class TxEnd:
    key: TxKey
    tablets: tuple[str, ...]
    event_count: int
    counts: Mapping[str, int]  # data collection → events


Item = TxBegin | Change | TxEnd


__all__ = ["MULTI_SHARD", "ROW_OPS", "SINGLE_SHARD", "Change", "Item", "TxBegin", "TxEnd", "TxKey"]
