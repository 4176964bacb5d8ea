"""SQL Server's part of incremental snapshots (no database): the key bounds spelled out without
row values, filters written from their parsed form with parameters, and positions against watermarks."""

from __future__ import annotations

import itertools
import re

import pyarrow as pa
import pytest
import sqlglot
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.events.settings import EventContext
from airflow_provider_cdc.cdc.planning.incremental import StagedChunk, TableProgress
from airflow_provider_cdc.cdc.reading.chunks import ChunkKeyWatch, ChunkPlan, surviving_rows
from airflow_provider_cdc.cdc.sources.sqlserver.chunks import (
    SqlServerChunkPositions,
    _bound,
    chunk_statement,
    emit_chunk,
    max_key_statement,
)
from airflow_provider_cdc.cdc.sources.sqlserver.events import SOURCE_BLOCK
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn
from airflow_provider_cdc.cdc.sources.sqlserver.tables import SqlColumn, TableInfo
from airflow_provider_cdc.cdc.sources.sqlserver.types import SqlServerType

REF = TableRef("dbo", "orders")


class _Encoder:
    def __init__(self, names):
        self.columns = [type("C", (), {"name": n})() for n in names]
        self.key_columns = ("a", "b")

    def select_list(self) -> str:
        return ", ".join(f"[{c.name}]" for c in self.columns)


def _plan(progress: TableProgress) -> ChunkPlan:
    columns = (
        SqlColumn("a", SqlServerType("int")),
        SqlColumn("b", SqlServerType("nvarchar", 40)),
        SqlColumn("c", SqlServerType("datetime2", scale=3)),
    )
    table = TableInfo(REF, columns, ("a", "b"), ())
    return ChunkPlan(table, _Encoder(["a", "b", "c"]), progress)


def _evaluate(clause: str, params: list[str], row: tuple[int, int]) -> bool:
    """The clause on a row of two integer keys, in Python."""
    values = iter(params)
    text = re.sub(r"CAST\(\? AS int\)", lambda m: repr(int(next(values))), clause)
    text = text.replace("[a]", str(row[0])).replace("[b]", str(row[1]))
    text = text.replace(" AND ", " and ").replace(" OR ", " or ").replace(" = ", " == ")
    return bool(eval(text))


@given(
    bound=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    operator=st.sampled_from(["<", ">"]),
    inclusive=st.booleans(),
)
def test_spelled_out_bounds_compare_like_row_values(bound, operator, inclusive):
    plan = _plan(TableProgress(REF, "s"))
    clause, params = _bound(plan, operator, [str(v) for v in bound], inclusive=inclusive)
    for row in itertools.product(range(4), range(4)):
        expected = row < bound if operator == "<" else row > bound
        expected = expected or (inclusive and row == bound)
        assert _evaluate(clause.replace("AS nvarchar(20))", "AS int)"), params, row) == expected, (clause, row)


def test_chunk_statements_are_t_sql_with_typed_key_bounds_and_a_locking_read():
    progress = TableProgress(REF, "s", max_key=("9", "z"), last_key=("3", "c"), condition="c > '2020-01-01'")
    statement, params = chunk_statement(_plan(progress), 100)
    assert statement.startswith("SELECT TOP (100) [a], [b], [c], CAST([a] AS nvarchar(4000)) AS [__cdc_key0]")
    assert "WITH (READCOMMITTEDLOCK) WHERE ([c] > ?)) AS [orders]" in statement
    assert "CAST(? AS nvarchar(20))" in statement and statement.endswith("ORDER BY [a], [b]")
    assert params == ["2020-01-01", "9", "9", "z", "3", "3", "c"]  # the filter's value first, as in the text
    assert len(sqlglot.parse(statement.replace("?", "1"), read="tsql")) == 1
    top, top_params = max_key_statement(_plan(progress))
    assert top.startswith("SELECT TOP (1)") and top.endswith("ORDER BY [a] DESC, [b] DESC")
    assert top_params == ["2020-01-01"]


@pytest.mark.parametrize(
    "stored",
    ["amount > 0) ; DELETE FROM x --", "c > 0; DELETE FROM x", "c > 0 /* x */", "(c > 0", "c = 'x", "x > 0"],
)
def test_a_stored_filter_that_is_not_an_accepted_filter_never_reaches_the_statement(stored):
    """An offset edited to hold T-SQL: the filter is parsed again from the stored text, and refused."""
    progress = TableProgress(REF, "s", max_key=("9", "z"), condition=stored)
    with pytest.raises(CdcConfigurationError, match=r"not an accepted filter|not one of its captured"):
        chunk_statement(_plan(progress), 10)


def _lsn(n: int) -> str:
    return str(SqlServerLsn(n))


def test_watermarks_compare_as_lsns_and_rows_changed_between_them_are_superseded():
    value = pa.struct([pa.field("id", pa.int64()), pa.field("v", pa.string())])
    chunk = StagedChunk("w-1", REF, "s", "p", 4, 1000, 2000, None, ("id",), ("id",), 1)
    rows = [("u", 1, 999), ("u", 2, 1000), ("d", 3, 1999), ("u", 4, 2000)]
    source = pa.array(
        [
            {"connector": "sqlserver", "commit_lsn": _lsn(n), "change_lsn": _lsn(n), "ts_ms": 0, "snapshot": "false"}
            for _, _, n in rows
        ],
        SOURCE_BLOCK,
    )
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([{"id": k, "v": None} for _, k, _ in rows], value),
            pa.array([None if op == "d" else {"id": k, "v": "x"} for op, k, _ in rows], value),
            source,
            pa.array([op for op, _, _ in rows]),
        ],
        names=["before", "after", "source", "op"],
    )
    watch = ChunkKeyWatch([chunk], "shop", SqlServerChunkPositions())
    watch.observe({"shop.dbo.orders": [batch]})
    chunk_rows = pa.array([{"id": i, "v": f"r{i}"} for i in (1, 2, 3, 4, 5)], value)
    assert [r["id"] for r in surviving_rows(chunk, chunk_rows, watch).to_pylist()] == [1, 4, 5]

    events = emit_chunk(chunk, chunk_rows.slice(0, 2), EventContext("shop", "db", "0000000002", 7)).to_pylist()
    assert {(e["op"], e["source"]["snapshot"], e["source"]["commit_lsn"]) for e in events} == {
        ("r", "incremental", _lsn(2000))
    }
