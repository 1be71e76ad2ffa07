"""A handed-off file's Spark schema is inferred once per column types, not per names.

Inference reads the file's footer on the driver (50-60 ms a window); a warm spare's
first window after a recovery paid it because its columns were named otherwise than the
warm-up's, though Spark takes a column's type from its Parquet type alone.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.readwriter import DataFrameReader

pytestmark = pytest.mark.timeout(300)


def test_a_file_of_known_column_types_is_read_with_the_schema_under_its_own_names(
        fresh_bridge, monkeypatch) -> None:
    given: list[list[str]] = []
    schema_of = DataFrameReader.schema

    def spy(self, schema):
        given.append(list(schema.names))
        return schema_of(self, schema)

    monkeypatch.setattr(DataFrameReader, "schema", spy)
    first = pa.record_batch({"k": pa.array([1, 2, 1], pa.int32()),
                             "v": pa.array([10, 20, 30], pa.int64())})
    renamed = pa.record_batch({"key": pa.array([7, 7], pa.int32()),
                               "value": pa.array([1, 2], pa.int64())})
    other_types = pa.record_batch({"key": pa.array(["a"]), "value": pa.array([1.5])})

    assert fresh_bridge.to_arrow(fresh_bridge.to_dataframe([first], first.schema)).num_rows == 3
    assert given == []  # the first file of these types: inferred
    df = fresh_bridge.to_dataframe([renamed], renamed.schema)
    assert given == [["key", "value"]]  # the same types under other names: given
    assert df.columns == ["key", "value"]
    assert fresh_bridge.to_arrow(df.groupBy("key").sum("value")).to_pylist() == [
        {"key": 7, "sum(value)": 3}]
    df = fresh_bridge.to_dataframe([other_types], other_types.schema)
    assert given == [["key", "value"]]  # other types: inferred
    assert fresh_bridge.to_arrow(df).to_pylist() == [{"key": "a", "value": 1.5}]
