"""Parquet through real mounts, read by the real pyarrow and duckdb: projections, filters, row groups.

A query reads the footer, then only the column chunks it needs, so it reads
parts of the file at a few places, some of them twice; the answers must be
those of the same query on the original file, and the daemon must decode
no chunk more than once while the file fits in the cache.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import oracle
from helpers.amplification import MOST, chunk_set, decoded
from helpers.mounting import mounted
from helpers.oracle import OracleStore

pytestmark = pytest.mark.fuse

ROWS = 300_000
ROW_GROUP = 40_000


@pytest.fixture(scope="module")
def table_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[OracleStore, Path]:
    """A parquet file of 8 row groups and int64, timestamp, dictionary, float and string columns, in an
    hf_xet store; and the original file beside it."""
    rng = np.random.default_rng(7)
    table = pa.table(
        {
            "id": np.arange(ROWS, dtype=np.int64),
            "ts": pa.array(np.arange(ROWS, dtype=np.int64) * 1000, type=pa.timestamp("ms")),
            "category": pa.array(rng.choice(["ant", "bee", "cat", "dog", "eel"], ROWS)).dictionary_encode(),
            "score": rng.random(ROWS),
            "value": rng.standard_normal(ROWS).astype(np.float32),
            "flag": rng.random(ROWS) < 0.3,
            "note": [f"row {i} " + "x" * (i % 23) for i in range(ROWS)],
        }
    )
    tmp = tmp_path_factory.mktemp("parquet")
    original = tmp / "table.parquet"
    pq.write_table(table, original, row_group_size=ROW_GROUP)
    store = oracle.make_store(tmp / "store", {"table.parquet": original.read_bytes()})
    return store, original


def test_pyarrow_reads_projections_filters_and_row_groups(table_store: tuple[OracleStore, Path]) -> None:
    store, original = table_store
    f = store["table.parquet"]
    with mounted(store.path) as m:
        m.wait_for_workers()
        path = m / f.hash
        meta = pq.ParquetFile(path).metadata
        assert meta.num_row_groups == ROWS // ROW_GROUP + (ROWS % ROW_GROUP > 0)
        assert meta.to_dict() == pq.ParquetFile(original).metadata.to_dict()
        columns = ["id", "category", "score"]
        filters = [("score", ">", 0.9)]
        got = pq.read_table(path, columns=columns, filters=filters)
        assert got.num_rows > 0 and got.equals(pq.read_table(original, columns=columns, filters=filters))
        for group in (0, 3, meta.num_row_groups - 1):
            got = pq.ParquetFile(path).read_row_group(group, columns=["note", "ts"])
            assert got.equals(pq.ParquetFile(original).read_row_group(group, columns=["note", "ts"]))
        assert decoded(m) <= MOST * len(chunk_set(store, "table.parquet"))


def test_duckdb_queries_give_the_answers_of_the_original(table_store: tuple[OracleStore, Path]) -> None:
    store, original = table_store
    f = store["table.parquet"]
    query = (
        "SELECT category, count(*) AS n, round(sum(value), 3) AS total, max(ts) AS latest "
        "FROM read_parquet(?) WHERE score > 0.75 AND NOT flag GROUP BY category ORDER BY category"
    )
    with duckdb.connect() as con:
        con.execute("SET enable_progress_bar = false")
        con.execute("SET threads = 2")
        want = con.execute(query, [str(original)]).fetchall()
        with mounted(store.path) as m:
            m.wait_for_workers()
            path = str(m / f.hash)
            got = con.execute(query, [path]).fetchall()
            assert got == want and len(got) == 5
            longest = "SELECT count(*) FROM read_parquet(?) WHERE note LIKE '%xxxxxxxxxxxxxxxxxxxxxx'"
            assert con.execute(longest, [path]).fetchone() == (ROWS // 23,)
            assert decoded(m) <= MOST * len(chunk_set(store, "table.parquet"))
