"""Spark ML vector columns, as pyarrow and pandas see them (no Spark session needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cerebro_spark.data import _vectors as vectors
from cerebro_spark.data import (
    decode_vectors,
    prepare_dataset,
    read_partition,
    read_table,
)
from cerebro_spark.errors import DataError

VECTOR = pa.struct(
    [
        pa.field("type", pa.int8(), nullable=False),
        ("size", pa.int32()),
        ("indices", pa.list_(pa.field("element", pa.int32(), nullable=False))),
        ("values", pa.list_(pa.field("element", pa.float64(), nullable=False))),
    ]
)


def dense(values: list[float]) -> dict[str, Any]:
    return {"type": 1, "size": None, "indices": None, "values": values}


def sparse(size: int, entries: dict[int, float]) -> dict[str, Any]:
    keys = sorted(entries)
    return {"type": 0, "size": size, "indices": keys, "values": [entries[k] for k in keys]}


def vector_table(rows: int = 40, seed: int = 0) -> tuple[pa.Table, np.ndarray]:
    """A table like Spark's Parquet of VectorAssembler output, and the dense matrix."""
    rng = np.random.default_rng(seed)
    matrix = rng.standard_normal((rows, 5))
    matrix[rng.random((rows, 5)) < 0.6] = 0.0
    cells = []
    for i, row in enumerate(matrix):
        if i % 2:
            cells.append(sparse(5, {j: float(x) for j, x in enumerate(row) if x != 0.0}))
        else:
            cells.append(dense([float(x) for x in row]))
    labels = rng.integers(0, 2, rows)
    labels[:2] = [0, 1]
    table = pa.table({"features": pa.array(cells, type=VECTOR), "label": pa.array(labels)})
    metadata = {b"org.apache.spark.sql.parquet.row.metadata": b"{...VectorUDT...}"}
    return table.replace_schema_metadata(metadata), matrix


def test_dense_and_sparse_rows_decode_to_the_same_values() -> None:
    table, matrix = vector_table()
    decoded = decode_vectors(table)
    column = decoded.column("features")
    assert column.type == pa.list_(pa.float64(), 5)
    np.testing.assert_array_equal(np.array(column.to_pylist()), matrix)
    assert decoded.column("label") == table.column("label")
    assert decoded.schema.metadata is None  # Spark's schema (VectorUDT) no longer applies


def test_chunked_and_sliced_columns() -> None:
    table, matrix = vector_table(30)
    chunked = pa.concat_tables([table.slice(0, 7), table.slice(7, 11), table.slice(18)])
    assert chunked.column("features").num_chunks == 3
    np.testing.assert_array_equal(
        np.array(decode_vectors(chunked).column("features").to_pylist()), matrix
    )
    sliced = table.slice(5, 9)
    np.testing.assert_array_equal(
        np.array(decode_vectors(sliced).column("features").to_pylist()), matrix[5:14]
    )


def test_json_style_structs_and_other_columns() -> None:
    """Spark's JSON keeps only the set fields ({type, values} for dense vectors)."""
    only_dense = pa.table(
        {
            "v": pa.array([{"type": 1, "values": [1, 2]}, {"type": 1, "values": [3, 4]}]),
            "s": pa.array([{"type": 1, "name": "x"}, {"type": 1, "name": "y"}]),
        }
    )
    decoded = decode_vectors(only_dense)
    assert decoded.column("v").to_pylist() == [[1.0, 2.0], [3.0, 4.0]]
    assert decoded.column("s") == only_dense.column("s")  # not a vector: untouched
    assert vectors.is_vector_type(only_dense.column("v").type)
    assert not vectors.is_vector_type(only_dense.column("s").type)
    assert not vectors.is_vector_type(pa.list_(pa.float64()))


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        ([dense([1.0, 2.0]), None], "1 null values of 2 rows"),
        ([dense([1.0, 2.0]), dense([1.0, 2.0, 3.0])], "different lengths: 2, 3"),
        ([dense([1.0, 2.0]), sparse(3, {0: 1.0})], "different lengths: 2, 3"),
        ([{"type": 2, "size": None, "indices": None, "values": [1.0]}], "type(s) [2]"),
        ([{"type": 0, "size": 3, "indices": [5], "values": [1.0]}], "outside 0..2"),
        ([{"type": 0, "size": 3, "indices": [0, 1], "values": [1.0]}], "differ in length"),
        ([dense([]), dense([])], "empty vectors"),
    ],
)
def test_bad_vectors_are_refused_naming_the_column(cells: list[Any], message: str) -> None:
    table = pa.table({"feats": pa.array(cells, type=VECTOR)})
    with pytest.raises(DataError, match="'feats'") as error:
        decode_vectors(table)
    assert message in str(error.value)


def test_a_sparse_column_too_large_to_densify_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vectors, "MAX_DENSE_BYTES", 1000)
    table = pa.table({"f": pa.array([sparse(1000, {3: 1.0})] * 2, type=VECTOR)})
    with pytest.raises(DataError, match="sparse vectors of size 1000") as error:
        decode_vectors(table)
    assert "--engine spark" in str(error.value) and "HashingTF" in str(error.value)


def test_prepare_dataset_gives_a_vector_column_the_id_of_the_same_array_column(
    tmp_path: Path,
) -> None:
    table, matrix = vector_table(60)
    kw: dict[str, Any] = {"features": ["features"], "label": "label", "num_partitions": 2}
    from_vectors = prepare_dataset(table, str(tmp_path / "a"), seed=1, **kw)
    arrays = pa.table(
        {
            "features": pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), 5),
            "label": table.column("label"),
        }
    )
    from_arrays = prepare_dataset(arrays, str(tmp_path / "b"), seed=1, **kw)
    assert from_vectors.dataset_id == from_arrays.dataset_id
    assert from_vectors.features[0].shape == (5,)


def test_read_table_decodes_vectors_of_a_spark_style_directory(tmp_path: Path) -> None:
    table, matrix = vector_table(20)
    folder = tmp_path / "va.parquet"
    folder.mkdir()
    pq.write_table(table.slice(0, 12), folder / "part-00000-x.snappy.parquet")
    pq.write_table(table.slice(12), folder / "part-00001-x.snappy.parquet")
    (folder / "_SUCCESS").write_text("")
    (folder / "_temporary").mkdir()
    (folder / "_temporary" / "stale.json").write_text("{}")  # a dead job's leftovers
    (folder / ".part-00000-x.snappy.parquet.crc").write_bytes(b"crc")
    read = read_table(str(folder))
    np.testing.assert_array_equal(np.array(read.column("features").to_pylist()), matrix)


def test_read_table_refuses_a_delta_table_with_the_command_that_reads_it(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "events"
    (folder / "_delta_log").mkdir(parents=True)
    (folder / "_delta_log" / "00000000000000000000.json").write_text("{}")
    pq.write_table(pa.table({"x": [1.0]}), folder / "part-0.parquet")
    with pytest.raises(DataError, match="is a Delta table") as error:
        read_table(str(folder))
    assert "--format delta --name NAME" in str(error.value)


def test_pandas_frames_of_spark_vector_objects(tmp_path: Path) -> None:
    """``DataFrame.toPandas()`` of a vector column holds DenseVector / SparseVector objects."""
    pd = pytest.importorskip("pandas")
    linalg = pytest.importorskip("pyspark.ml.linalg")
    table, matrix = vector_table(30)
    objects = [
        linalg.Vectors.sparse(5, {j: x for j, x in enumerate(row) if x})
        if i % 2
        else linalg.Vectors.dense(row)
        for i, row in enumerate(matrix)
    ]
    frame = pd.DataFrame({"features": objects, "label": table.column("label").to_pylist()})
    manifest = prepare_dataset(
        frame, str(tmp_path), features=["features"], label="label", num_partitions=1, seed=0
    )
    again = prepare_dataset(
        table, str(tmp_path / "t"), features=["features"], label="label", num_partitions=1, seed=0
    )
    assert manifest.dataset_id == again.dataset_id
    part = read_partition(str(tmp_path / "datasets" / manifest.dataset_id), "train", 0)
    assert part.features.shape[1:] == (5,)
    assert isinstance(frame["features"][0], linalg.DenseVector)  # the input is not modified


def test_a_struct_that_is_not_a_vector_is_refused_with_advice(tmp_path: Path) -> None:
    table = pa.table({"point": [{"x": 1.0, "y": 2.0}] * 4, "label": [0, 1, 0, 1]})
    with pytest.raises(DataError, match="feature column 'point' has type struct") as error:
        prepare_dataset(
            table, str(tmp_path), features=["point"], label="label", num_partitions=1, seed=0
        )
    assert "read only as a Spark ML vector" in str(error.value)
