"""The current-state fold: each captured table rebuilt from its committed change events.

For one table, events apply in order ``(window, snapshot rows first, commit LSN, total_order)``:

- incremental snapshot rows (``op = r``, ``source.snapshot = "incremental"``) apply at their
  chunk's high watermark like any change, and reset nothing;
- the last snapshot window or ``TRUNCATE`` resets the table (a snapshot window is a complete
  image; a truncate empties it), so only what follows counts;
- per key the last event wins: ``d`` removes the row, ``r``/``c``/``u`` set it; a primary-key
  change is a ``d`` of the old key and a ``c`` of the new one;
- columns listed in ``unchanged_toast_columns`` keep the value they had before that event (for a
  key change, the old key's value);
- tables without a key (``REPLICA IDENTITY FULL``) are multisets: creates add a row, deletes
  remove one equal row, updates do both.

The fold, in Spark (window functions partitioned by key), so tables larger than memory work;
:mod:`.arrow_fold` is the same fold in Arrow. Where the folded rows go: :mod:`.apply` (a Parquet
sink's state versions, :mod:`.versions`) and :mod:`.merge` (an Iceberg or Delta state table). On an
object store Spark's tasks read and write with Arrow (:mod:`.sinks.spark_files`).
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_provider_cdc.cdc.sinks import spark_files
from airflow_provider_cdc.cdc.sinks.schemas import merge_schemas

log = logging.getLogger(__name__)

_PASSES = 3  # resolves chains of up to three key changes of one row with unchanged TOAST columns


def _write_version(spark: Any, folded: Any, uri: str) -> int:
    """Write a state version's rows at ``uri``; how many. On an object store Spark's tasks write
    the files with Arrow (Spark has no S3 connector here) and report their rows."""
    if spark_files.bridged(uri):
        return sum(file.rows for file in spark_files.write_parquet(folded, uri, mode="overwrite"))
    folded.write.mode("overwrite").parquet(uri)
    return spark.read.parquet(uri).count()


def fold(spark: Any, events: Any, base: Any) -> Any:
    """Apply ``events`` (a DataFrame in the event schema) to ``base`` (state rows, or None)."""
    from pyspark.sql import functions as F

    if events is None:
        return base
    fields = events.schema.fieldNames()
    keys = list(events.schema["__debezium_oldkey"].dataType.fieldNames()) if "__debezium_oldkey" in fields else []
    value_type = events.schema["after"].dataType
    if base is not None:
        merged = merge_schemas([_arrow(value_type), _arrow(base.schema)])
        value_type = _spark(merged)
    position = _position(
        F.col("window_id").cast("long"),
        # Initial snapshot rows come first in their window; incremental snapshot rows sit at their
        # chunk's high watermark (source.commit_lsn), between the stream's transactions.
        F.when((F.col("op") == "r") & (F.col("source.snapshot") != "incremental"), 0).otherwise(1),
        F.coalesce(_sortable_commit(events), F.lit("")),
        F.coalesce(F.col("transaction.total_order"), F.lit(0)),
    )
    events = events.withColumn("_pos", position)
    reset = events.filter(F.col("op") == "t").agg(F.max("_pos").alias("p")).collect()[0]["p"]
    if reset is not None:
        events = events.filter(F.col("_pos") > _position(*(F.lit(v) for v in reset)))
        base = None
    events = events.filter(F.col("op") != "t")
    if not keys:
        return _fold_multiset(events, base, value_type)
    return _fold_keyed(events, base, keys, value_type)


def _fold_keyed(events: Any, base: Any, keys: list[str], value_type: Any) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    columns = value_type.fieldNames()
    rows = events.select(
        F.col("_pos"),
        F.col("op"),
        *[F.coalesce(F.col(f"after.`{k}`"), F.col(f"before.`{k}`")).alias(f"_k{i}") for i, k in enumerate(keys)],
        _conform_struct(F.col("after"), events.schema["after"].dataType, value_type).alias("_v"),
        F.coalesce(F.col("unchanged_toast_columns"), F.array().cast("array<string>")).alias("_u"),
        F.col("__debezium_oldkey").alias("_oldkey"),
    )
    if base is not None:
        rows = rows.unionByName(
            base.select(
                _position(F.lit(-1), F.lit(0), F.lit(0), F.lit(0)).alias("_pos"),
                F.lit("r").alias("op"),
                *[F.col(f"`{k}`").alias(f"_k{i}") for i, k in enumerate(keys)],
                _conform_struct(F.struct(*[F.col(f"`{c}`") for c in base.columns]), base.schema, value_type).alias(
                    "_v"
                ),
                F.array().cast("array<string>").alias("_u"),
                F.lit(None).cast(rows.schema["_oldkey"].dataType).alias("_oldkey"),
            )
        )
    key_cols = [f"_k{i}" for i in range(len(keys))]
    window = Window.partitionBy(*key_cols).orderBy("_pos").rowsBetween(Window.unboundedPreceding, 0)

    def resolve(frame: Any) -> Any:
        resolved = [
            F.last(
                F.when(
                    (F.col("op") != "d") & ~F.array_contains(F.col("_u"), c),
                    F.struct(F.lit(True).alias("set"), F.col(f"_v.`{c}`").alias("value")),
                ),
                ignorenulls=True,
            )
            .over(window)
            .getField("value")
            .alias(c)
            for c in columns
        ]
        return frame.select("*", F.struct(*resolved).alias("_r"))

    for _ in range(_PASSES):
        resolved = resolve(rows)
        # A create that moved a row to a new key takes unchanged TOAST values from the old key,
        # as they were when that key was deleted in the same transaction.
        moved = resolved.filter((F.col("op") == "c") & F.col("_oldkey").isNotNull() & (F.size("_u") > 0))
        if moved.limit(1).count() == 0:
            break
        deleted = resolved.filter(F.col("op") == "d").select(
            F.col("_pos.seq").alias("_dseq"),
            F.col("_pos.lsn").alias("_dlsn"),
            F.col("_pos.order").alias("_dorder"),
            *[F.col(k).alias(f"_d{k}") for k in key_cols],
            F.col("_r").alias("_prior"),
        )
        condition = (
            (F.col("_pos.seq") == F.col("_dseq"))
            & (F.col("_pos.lsn") == F.col("_dlsn"))
            & (F.col("_pos.order") == F.col("_dorder") + 1)
        )
        for i, key in enumerate(keys):
            condition = condition & (F.col(f"_oldkey.`{key}`") == F.col(f"_d_k{i}"))
        patched = (
            rows.join(deleted, condition, "left")
            .withColumn(
                "_v",
                F.when(
                    F.col("_prior").isNotNull() & (F.col("op") == "c") & F.col("_oldkey").isNotNull(),
                    F.struct(
                        *[
                            F.when(F.array_contains(F.col("_u"), c), F.col(f"_prior.`{c}`"))
                            .otherwise(F.col(f"_v.`{c}`"))
                            .alias(c)
                            for c in columns
                        ]
                    ),
                ).otherwise(F.col("_v")),
            )
            .withColumn(
                "_u",
                F.when(F.col("_prior").isNotNull(), F.array().cast("array<string>")).otherwise(F.col("_u")),
            )
            .select(*rows.columns)
        )
        rows = patched
    resolved = resolve(rows)
    latest = Window.partitionBy(*key_cols).orderBy(F.col("_pos").desc())
    final = resolved.withColumn("_n", F.row_number().over(latest)).filter((F.col("_n") == 1) & (F.col("op") != "d"))
    return final.select(*[F.col(f"_r.`{c}`").alias(c) for c in columns])


def _fold_multiset(events: Any, base: Any, value_type: Any) -> Any:
    from pyspark.sql import functions as F

    columns = value_type.fieldNames()
    after = _conform_struct(F.col("after"), events.schema["after"].dataType, value_type)
    before = _conform_struct(F.col("before"), events.schema["before"].dataType, value_type)
    unchanged = F.coalesce(F.col("unchanged_toast_columns"), F.array().cast("array<string>"))
    # Under REPLICA IDENTITY FULL the before image is complete: unchanged TOAST values come from it.
    completed_after = F.struct(
        *[
            F.when(F.array_contains(unchanged, c), before.getField(c)).otherwise(after.getField(c)).alias(c)
            for c in columns
        ]
    )
    signed = events.select(
        F.explode(
            F.when(F.col("op").isin("r", "c"), F.array(F.struct(completed_after.alias("row"), F.lit(1).alias("n"))))
            .when(
                F.col("op") == "u",
                F.array(
                    F.struct(before.alias("row"), F.lit(-1).alias("n")),
                    F.struct(completed_after.alias("row"), F.lit(1).alias("n")),
                ),
            )
            .otherwise(F.array(F.struct(before.alias("row"), F.lit(-1).alias("n"))))
        ).alias("_e")
    ).select("_e.row", "_e.n")
    if base is not None:
        signed = signed.unionByName(
            base.select(
                _conform_struct(F.struct(*[F.col(f"`{c}`") for c in base.columns]), base.schema, value_type).alias(
                    "row"
                ),
                F.lit(1).alias("n"),
            )
        )
    counted = signed.groupBy("row").agg(F.sum("n").alias("n")).filter(F.col("n") > 0)
    return counted.select(F.explode(F.array_repeat(F.col("row"), F.col("n").cast("int"))).alias("_row")).select(
        *[F.col(f"_row.`{c}`").alias(c) for c in columns]
    )


def _position(seq: Any, phase: Any, lsn: Any, order: Any) -> Any:
    """The apply order of an event: (window, snapshot rows first, commit LSN, total_order)."""
    from pyspark.sql import functions as F

    return F.struct(
        seq.cast("long").alias("seq"),
        phase.cast("int").alias("phase"),
        lsn.cast("string").alias("lsn"),
        order.cast("long").alias("order"),
    )


def _sortable_commit(events: Any) -> Any:
    """The commit position as text that sorts like the position: PostgreSQL's ``commit_lsn`` is a
    number (padded to 20 digits), SQL Server's Debezium's fixed-width ``vlf:block:slot``
    hexadecimal text; the YugabyteDB gRPC connector's block names it ``commit_time`` (a hybrid time)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    names = events.schema["source"].dataType.fieldNames()
    name = "commit_lsn" if "commit_lsn" in names else "commit_time"
    column = F.col(f"source.{name}")
    if isinstance(events.schema["source"].dataType[name].dataType, StringType):
        return column
    return F.lpad(column.cast("string"), 20, "0")


def _conform_struct(column: Any, source_type: Any, target_type: Any) -> Any:
    """``column`` (a struct of ``source_type``) as a struct of ``target_type`` (by field name)."""
    from pyspark.sql import functions as F

    present = set(source_type.fieldNames())
    return F.when(column.isNull(), F.lit(None).cast(target_type)).otherwise(
        F.struct(
            *[
                (column.getField(f.name).cast(f.dataType) if f.name in present else F.lit(None).cast(f.dataType)).alias(
                    f.name
                )
                for f in target_type.fields
            ]
        )
    )


def _arrow(spark_type: Any):
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_type, timezone="UTC")


def _spark(arrow_schema: Any) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema, prefer_timestamp_ntz=True)
