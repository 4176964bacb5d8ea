"""Tablets and their logs: what each tablet's Raft log holds, in the stand-in's terms.

A tablet owns the rows whose hash falls in ``[start, end)``. Its log is a list of ops with
contiguous indexes and a term that grows with each leadership change (a new leader's NO_OP
comes first, as in Raft). Op kinds:

* ``txn``: one committed transaction's rows on this tablet (BEGIN, rows, COMMIT records);
* ``ddl``: the table's columns changed (one DDL record);
* ``noop``: a leader's first op (no records);
* ``split``: the parent's last op (YB's SPLIT_OP);
* ``parent_split``: the parent's split op as copied into a child's log (skipped when read).

A child's log starts with a copy of its parent's retained log up to and including the split op
(``TSTabletManager::ApplyTabletSplit`` calls ``raft_log->CopyTo(dest_wal_dir, split_op_id)``;
``Log::CopyTo`` "Copy part of the segment up to and including max_included_op_id"), so a child
read from a checkpoint before the split serves the parent's changes of its own key range again
(YB's tests count every row once across splits read late: ``cdcsdk_tablet_split-test.cc``
``TestRecordCountsAfterMultipleTabletSplits``). How YB limits a copied op to the child's range was
not located: the stand-in keeps the rows whose hash the child covers (a **guess** at the mechanism,
not at the outcome), and a copied transaction with none left is an op without records.

Ops before the retention barrier are dropped (``collect``); reading from before what is left
is ``CHECKPOINT_TOO_OLD``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from .schema import Table, TableSchema

Row = dict[str, object]  # column name -> text value (bytes), None (NULL) or UNCHANGED_TOAST


def row_key(hash_code: int, key_values: tuple) -> bytes:
    """A row's position in its tablet (YB's DocKey: hash, then the key columns), opaque to clients."""
    return json.dumps([hash_code, [v.decode() if isinstance(v, bytes) else v for v in key_values]]).encode()


def parse_row_key(key: bytes) -> tuple[int, list]:
    hash_code, values = json.loads(key)
    return hash_code, values


@dataclass(frozen=True)
class RowChange:
    op: int  # RowMessage.INSERT / UPDATE / DELETE
    old: Row | None  # the before image the real stream had (full under REPLICA IDENTITY FULL)
    new: Row | None
    key: bytes  # row_key of the row


@dataclass(frozen=True)
class Op:
    term: int
    index: int
    kind: str  # "txn" | "ddl" | "noop" | "split"
    ht: int  # commit hybrid time (txn, and the ddl it revealed); the safe time then (noop, split)
    schema: TableSchema
    txn_id: bytes = b""
    changes: tuple[RowChange, ...] = ()


@dataclass
class Tablet:
    tablet_id: str
    table: Table
    start: int
    end: int
    replicas: list[int]  # tablet-server numbers; the leader is one of them
    leader: int
    term: int
    last_index: int
    parent: str | None = None
    children: tuple[str, str] | None = None
    split_index: int | None = None  # the last op before the split op (the parent's)
    copied_through: int = 0  # a child: the parent's split op, the last op copied from the parent's log
    depth: int = 0
    ops: list[Op] = field(default_factory=list)
    dropped_through: tuple[int, int] = (0, 0)  # op id before the first op left (collected, or the split op)
    collected_through: int = 0  # the highest index garbage-collected: reading from before it is too late

    @property
    def active(self) -> bool:
        return self.children is None

    def covers(self, hash_code: int) -> bool:
        return self.start <= hash_code < self.end

    def append(self, kind: str, ht: int, schema: TableSchema, txn_id: bytes = b"", changes=()) -> Op:
        self.last_index += 1
        op = Op(self.term, self.last_index, kind, ht, schema, txn_id, tuple(changes))
        self.ops.append(op)
        return op

    def first_index(self) -> int:
        """The lowest index still readable."""
        return self.ops[0].index if self.ops else self.last_index + 1

    def position(self, index: int) -> int:
        """The list position of the first op with an index >= ``index``."""
        return max(0, min(len(self.ops), index - self.first_index()))

    def op_at(self, index: int) -> Op | None:
        pos = index - self.first_index()
        return self.ops[pos] if 0 <= pos < len(self.ops) else None

    def last_op_id(self) -> tuple[int, int]:
        return (self.ops[-1].term, self.ops[-1].index) if self.ops else self.dropped_through

    def op_id_at_or_before(self, ht: int) -> tuple[int, int]:
        """The op id of the last op whose hybrid time is <= ``ht`` (where a stream starts)."""
        chosen = self.dropped_through
        for op in self.ops:
            if op.ht > ht:
                break
            chosen = (op.term, op.index)
        return chosen

    def schema_at(self, index: int) -> TableSchema:
        """The schema in effect after op ``index`` (for the DDL record a response starts with)."""
        chosen = None
        for op in self.ops:
            if op.index > index:
                break
            chosen = op.schema
        if chosen is not None:
            return chosen
        return self.table.schema_at(self.ops[0].ht - 1) if self.ops else self.table.schema

    def collect(self, barrier: int) -> None:
        """Drops ops with an index below ``barrier`` (the slowest stream's checkpoint)."""
        while self.ops and self.ops[0].index < barrier:
            gone = self.ops.pop(0)
            self.dropped_through = (gone.term, gone.index)
            self.collected_through = gone.index

    def copy_log(self, parent: Tablet) -> None:
        """A child's log: the parent's retained ops up to and including its split op (``Log::CopyTo``),
        each limited to this child's hash range; the child's own ops follow."""
        assert parent.ops and parent.ops[-1].kind == "split", "the parent's last op is its split op"
        self.ops = [_copied(op, self) for op in parent.ops]
        self.last_index = parent.ops[-1].index
        self.copied_through = self.last_index
        self.dropped_through = parent.dropped_through
        self.collected_through = parent.collected_through


def _copied(op: Op, child: Tablet) -> Op:
    if op.kind == "split":
        return replace(op, kind="parent_split")
    if op.kind != "txn":
        return op
    mine = tuple(c for c in op.changes if child.covers(parse_row_key(c.key)[0]))
    return replace(op, changes=mine) if mine else replace(op, kind="noop", txn_id=b"", changes=())
