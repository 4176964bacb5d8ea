"""Which of a table's columns an event carries, how each is typed and masked: for every source.

Debezium's ``column.include.list`` / ``column.exclude.list`` / ``column.mask.*`` /
``column.text`` options (:class:`cdc.columns.ColumnRules`) applied to one table version: the
kept columns (key columns are always kept), the codec of each (the source supplies how a column
of a type becomes Arrow), the masks (character columns only, never a key), and the resulting
event layout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pyarrow as pa

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.tables import POSTGRES_NAMES, NameRules, TableRef
from airflow_provider_cdc.cdc.events.columns import ColumnRules, MaskRule
from airflow_provider_cdc.cdc.events.envelope import EventLayout

C = TypeVar("C")  # a source's column description
K = TypeVar("K")  # a source's codec (has ``arrow_type`` and ``description``)


@dataclass(frozen=True)
class ColumnPlan(Generic[C, K]):
    positions: tuple[int, ...]  # of the kept columns among the table version's columns
    columns: tuple[C, ...]
    codecs: tuple[K, ...]
    masks: tuple[MaskRule | None, ...]
    key_columns: tuple[str, ...]
    key_indexes: tuple[int, ...]  # of the key columns among the kept columns
    layout: EventLayout

    @classmethod
    def build(
        cls,
        ref: TableRef,
        columns: Sequence[C],
        key_columns: Sequence[str],
        rules: ColumnRules,
        *,
        name: Callable[[C], str],
        codec: Callable[[C, bool], K],
        source_type: pa.StructType,
        names: NameRules = POSTGRES_NAMES,
    ) -> ColumnPlan[C, K]:
        """``codec(column, as_text)``: the source's codec of a column (``as_text``: listed in
        ``column_text_list``)."""
        keys = set(key_columns)
        table = ref.quoted(names)
        qualified = [f"{ref.schema}.{ref.name}.{name(c)}" for c in columns]
        positions = tuple(i for i, c in enumerate(columns) if rules.keeps(qualified[i], is_key=name(c) in keys))
        kept = tuple(columns[i] for i in positions)
        if not kept:
            raise CdcConfigurationError(f"the column filters leave no column of {table} to capture")
        codecs = tuple(codec(columns[i], rules.keeps_text(qualified[i])) for i in positions)
        masks: list[MaskRule | None] = []
        for i, column_codec in zip(positions, codecs):
            mask = rules.mask_for(qualified[i])
            column = name(columns[i])
            if mask is not None and column in keys:
                raise CdcConfigurationError(
                    f"{table}.{column} is a key column: key columns are never masked (merges need them)"
                )
            arrow_type: Any = column_codec.arrow_type
            if mask is not None and not pa.types.is_string(arrow_type):
                raise CdcConfigurationError(
                    f"masking rule {mask.pattern!r} matches {table}.{column}, which is captured as "
                    f"{column_codec.description}; masks apply to character columns only"
                )
            masks.append(mask)
        names = [name(c) for c in kept]
        kept_keys = tuple(k for k in key_columns if k in names)
        layout = EventLayout(
            value_fields=tuple(pa.field(n, k.arrow_type) for n, k in zip(names, codecs)),
            key_columns=kept_keys,
            source_type=source_type,
        )
        return cls(
            positions=positions,
            columns=kept,
            codecs=codecs,
            masks=tuple(masks),
            key_columns=kept_keys,
            key_indexes=tuple(names.index(k) for k in kept_keys),
            layout=layout,
        )
