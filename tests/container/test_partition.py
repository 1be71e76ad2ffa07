"""The key-hash partition filter: every row in exactly one partition, the same hash in every
process, and the buffer server serving one partition's rows to its subscriber."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading

import pyarrow as pa
import pytest

from weir.container.buffer_client import PartitionKeyMissing, subscribe
from weir.container.buffer_server import BufferServer
from weir.container.operator_errors import is_fatal
from weir.container.port_input import InputClosed, PortInput
from weir.container.stream_messages import Kind
from weir.operators.partitioning import PartitionFilter, hash_column, partition_keys

pytestmark = pytest.mark.timeout(60)

_COLUMNS = {
    "word": pa.array([f"w{i % 97}" for i in range(2000)] + ["", None, "ünïcode"]),
    "number": pa.array([i % 89 for i in range(2000)] + [None, -1, 2**62], pa.int64()),
    "real": pa.array([i / 7 for i in range(2000)] + [None, -0.0, 0.0]),
}


def _filters(column: str, count: int) -> list[PartitionFilter]:
    mask, keys = partition_keys(count)
    return [PartitionFilter(column, mask, part) for part in keys]


@pytest.mark.parametrize("column", sorted(_COLUMNS))
@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_every_row_is_in_exactly_one_partition_and_keys_stay_together(column, count):
    batch = pa.record_batch({column: _COLUMNS[column], "row": pa.array(range(2003))})
    parts = [f.select(batch) for f in _filters(column, count)]
    rows = sorted(r for p in parts for r in p.column("row").to_pylist())
    assert rows == list(range(2003))
    owner: dict[object, int] = {}
    for index, part in enumerate(parts):
        for value in part.column(column).to_pylist():
            assert owner.setdefault(value, index) == index, f"{value!r} in two partitions"


def test_partitions_share_the_rows_evenly():
    batch = pa.record_batch({"word": [f"word{i}" for i in range(30_000)]})
    sizes = [f.select(batch).num_rows for f in _filters("word", 3)]
    assert min(sizes) > 0.9 * max(sizes), sizes


def test_mask_and_keys_cover_every_bucket_once():
    mask, keys = partition_keys(3)
    assert mask == 63
    assert sorted(k for part in keys for k in part) == list(range(64))


def test_sliced_dictionary_and_chunked_columns_hash_like_plain_ones():
    words = pa.array(["a", "bb", "a", None, "ccc", ""])
    plain = hash_column(words)
    assert (hash_column(words.slice(2)) == plain[2:]).all()
    assert (hash_column(words.dictionary_encode()) == plain).all()
    assert (hash_column(words.cast(pa.large_string())) == plain).all()
    assert (hash_column(pa.chunked_array([words[:2], words[2:]])) == plain).all()
    assert plain[0] == plain[2] and len(set(plain.tolist())) == 5


def test_unhashable_type_and_missing_column_say_what_to_do():
    with pytest.raises(TypeError, match="partition on a string"):
        hash_column(pa.array([[1], [2]]))
    with pytest.raises(KeyError, match="PARTITION_KEY"):
        PartitionFilter("nope", 3, frozenset({0})).select(pa.record_batch({"word": ["a"]}))


def test_the_hash_is_the_same_in_another_process():
    """Python's hash() is salted per process; ours must not be (the subprocess gets its own
    PYTHONHASHSEED)."""
    here = {name: hash_column(values).tolist() for name, values in _COLUMNS.items()}
    script = (
        "import json, sys, pyarrow as pa\n"
        "from weir.operators.partitioning import hash_column\n"
        "sys.path.insert(0, '.')\n"
        "from tests.container.test_partition import _COLUMNS\n"
        "print(json.dumps({n: hash_column(v).tolist() for n, v in _COLUMNS.items()}))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60, check=True, env={"PYTHONHASHSEED": "12345"})
    assert json.loads(result.stdout) == here


def test_buffer_server_serves_each_subscriber_its_partition_and_every_marker():
    words = [f"w{i}" for i in range(500)]
    with BufferServer() as server:
        publisher = server.publisher("1.output")
        for window in (1, 2):
            publisher.begin_window(window)
            publisher.data(window, pa.record_batch({"word": words, "n": [window] * 500}))
            publisher.data(window, pa.record_batch({"word": ["only"], "n": [window]}))
            publisher.end_window(window)
        publisher.end_stream()
        host, port = server.address
        seen: collections.Counter[tuple[str, int]] = collections.Counter()
        for partition in _filters("word", 3):
            messages = list(subscribe(host, port, "1.output", timeout_s=10,
                                      partition=partition))
            markers = [(m.kind, m.window_id) for m in messages if m.kind != Kind.DATA]
            assert markers == [(Kind.BEGIN_WINDOW, 1), (Kind.END_WINDOW, 1),
                               (Kind.BEGIN_WINDOW, 2), (Kind.END_WINDOW, 2),
                               (Kind.END_STREAM, 2)]
            for message in messages:
                if message.kind == Kind.DATA:
                    batch = message.batch()
                    assert batch.num_rows == message.rows > 0  # empty batches are dropped
                    seen.update(zip(batch.column("word").to_pylist(),
                                    batch.column("n").to_pylist(), strict=True))
        assert seen == collections.Counter([(w, n) for n in (1, 2) for w in [*words, "only"]])


def test_subscribers_of_two_splits_of_one_stream_each_get_their_own_rows():
    """The buffer server hashes a batch once per key column and mask: subscribers of a
    2-way and a 3-way split of the same stream must not share buckets."""
    words = [f"w{i}" for i in range(300)]
    with BufferServer() as server:
        publisher = server.publisher("1.output")
        publisher.begin_window(1)
        publisher.data(1, pa.record_batch({"word": words}))
        publisher.end_window(1)
        publisher.end_stream()
        host, port = server.address
        for count in (2, 3, 2):
            got = []
            for partition in _filters("word", count):
                rows = [w for m in subscribe(host, port, "1.output", timeout_s=10,
                                             partition=partition) if m.kind == Kind.DATA
                        for w in m.batch().column("word").to_pylist()]
                assert rows == partition.select(pa.record_batch({"word": words}))[
                    "word"].to_pylist()
                got += rows
            assert sorted(got) == sorted(words)


def test_a_subscriber_whose_key_column_is_missing_gets_an_error():
    with BufferServer() as server:
        publisher = server.publisher("1.output")
        publisher.begin_window(1)
        publisher.data(1, pa.record_batch({"word": ["a"]}))
        publisher.end_window(1)
        publisher.end_stream()
        host, port = server.address
        partition = PartitionFilter("missing", 3, frozenset({0}))
        with pytest.raises(PartitionKeyMissing, match="partition key column 'missing'"):
            list(subscribe(host, port, "1.output", timeout_s=10, partition=partition))

        # an operator's input gives up at once (no retry can help) and fails for good
        stopped = threading.Event()
        port_input = PortInput(
            "input", lambda w: (subscribe(host, port, "1.output", from_window=w,
                                          timeout_s=10, partition=partition), lambda: None),
            8, stopped, retry_s=600)
        port_input.start()
        # a retry would wait the 600 s a lost upstream gets, past this test's timeout
        with pytest.raises(InputClosed, match="partition key column 'missing'") as caught:
            port_input.get()
        assert is_fatal(caught.value)
        stopped.set()
        port_input.close()


def test_partition_filter_round_trips_as_json_and_checks_its_keys():
    partition = PartitionFilter("word", 63, frozenset({1, 4}))
    assert PartitionFilter.from_json(json.loads(json.dumps(partition.to_json()))) == partition
    with pytest.raises(ValueError, match="do not fit"):
        PartitionFilter("word", 3, frozenset({4}))
