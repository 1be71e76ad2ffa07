"""DAG building and validation: every malformed DAG gets an error naming the problem."""

import pyarrow as pa
import pytest

from weir.operators import Dag, DagError, InputOperator, InputPort, Operator, OutputPort
from weir.operators.attributes import InvalidAttribute
from weir.operators.dag import topological_order, validate_descriptor


class Source(InputOperator):
    output = OutputPort(pa.schema([("word", pa.string())]))


class Pass(Operator):
    input = InputPort()
    output = OutputPort()


class Ints(Operator):
    input = InputPort(pa.schema([("word", pa.int64())]))


class TwoInputs(Operator):
    left = InputPort()
    right = InputPort()
    output = OutputPort()


def linear() -> tuple[Dag, Source, Pass, Pass]:
    dag = Dag("linear")
    src = dag.add_operator("src", Source())
    a = dag.add_operator("a", Pass())
    b = dag.add_operator("b", Pass())
    dag.add_stream("s1", src.output, a.input)
    dag.add_stream("s2", a.output, b.input)
    return dag, src, a, b


def test_valid_dag_round_trips_to_descriptor_in_topological_order():
    dag, *_ = linear()
    dag.validate()
    descriptor = dag.to_descriptor()
    assert topological_order(descriptor) == ["src", "a", "b"]
    assert all(op.payload for op in descriptor.operators)
    assert descriptor.operators[0].kind == 1  # INPUT


def test_cycle_is_rejected_naming_the_operators():
    dag = Dag("cyclic")
    src = dag.add_operator("src", Source())
    join = dag.add_operator("join", TwoInputs())
    loop = dag.add_operator("loop", Pass())
    dag.add_stream("in", src.output, join.left)
    dag.add_stream("fwd", join.output, loop.input)
    dag.add_stream("back", loop.output, join.right)
    with pytest.raises(DagError, match=r"cycle through operators \['join', 'loop'\]"):
        dag.validate()


def test_unconnected_required_input_is_rejected():
    dag = Dag("open")
    dag.add_operator("src", Source())
    dag.add_operator("a", Pass())
    with pytest.raises(DagError, match=r"input port a.input is not connected"):
        dag.validate()


def test_two_streams_into_one_input_port_are_rejected():
    dag, src, a, b = linear()
    dag.add_stream("s3", src.output, b.input)
    with pytest.raises(DagError, match=r"b.input is fed by two streams, 's2' and 's3'"):
        dag.validate()


def test_port_type_mismatch_names_both_ports():
    dag = Dag("types")
    src = dag.add_operator("src", Source())
    ints = dag.add_operator("ints", Ints())
    dag.add_stream("s", src.output, ints.input)
    with pytest.raises(DagError, match=r"port type mismatch: src.output emits \(word: string\)"):
        dag.validate()


def test_stream_from_an_input_port_is_rejected():
    dag, src, a, b = linear()
    with pytest.raises(DagError, match="is an input port but is used as an output"):
        dag.add_stream("wrong", a.input, b.input)


def test_a_mistyped_attribute_names_the_nearest_one():
    with pytest.raises(InvalidAttribute,
                       match="did you mean 'STREAMING_WINDOW_SIZE_MILLIS'"):
        Dag("x", STREAMING_WINDOW_SIZE_MILIS=500)
    dag, *_ = linear()
    with pytest.raises(InvalidAttribute, match="did you mean 'QUEUE_CAPACITY'"):
        dag.set_operator_attributes("a", QUEUE_CAPACTY=4)


def test_an_unknown_attribute_lists_them_all_only_when_none_is_close():
    with pytest.raises(InvalidAttribute) as near:
        Dag("x", STREAMING_WINDOW_SIZE_MILIS=500)
    assert str(near.value) == ("unknown attribute 'STREAMING_WINDOW_SIZE_MILIS'; did you mean "
                               "'STREAMING_WINDOW_SIZE_MILLIS'?")
    with pytest.raises(InvalidAttribute, match="known attributes: APPLICATION_WINDOW_COUNT, "):
        Dag("x", BANANA=1)


def test_an_application_files_error_names_its_line(tmp_path):
    from weir.operators.app import AppLoadError, load_app

    app = tmp_path / "app.py"
    app.write_text("from weir.operators import Dag\n\n\ndag = Dag('x', QUEUE_CAPACTY=4)\n")
    with pytest.raises(AppLoadError, match=r"app.py line 4 failed while building the DAG: "
                                           r"InvalidAttribute: .*did you mean"):
        load_app(app)


def test_a_mistyped_port_lists_the_ports_and_the_nearest_name():
    import pickle

    dag, src, a, b = linear()
    with pytest.raises(AttributeError) as raised:
        dag.add_stream("typo", a.outptu, b.input)
    message = str(raised.value)
    assert type(a).__name__ in message and "'outptu'" in message
    assert "input ports are ['input']" in message and "output ports ['output']" in message
    assert "did you mean 'output'?" in message
    assert not hasattr(a, "nothing_like_it")  # probes still see a plain AttributeError
    assert type(pickle.loads(pickle.dumps(a))) is type(a)


def test_a_property_that_fails_keeps_its_own_error():
    from weir.operators import Operator

    class Broken(Operator):
        @property
        def ready(self) -> bool:
            raise AttributeError("the property's own reason")

    with pytest.raises(AttributeError, match="the property's own reason"):
        _ = Broken().ready


def test_unknown_attribute_is_an_error():
    with pytest.raises(InvalidAttribute, match="unknown attribute 'WINDOW_SIZE'"):
        Dag("x", WINDOW_SIZE=5)
    dag, *_ = linear()
    with pytest.raises(InvalidAttribute, match="cannot be set on a DAG"):
        dag.set_attributes(APPLICATION_WINDOW_COUNT=2)
    with pytest.raises(InvalidAttribute, match="is invalid"):
        dag.set_operator_attributes("a", APPLICATION_WINDOW_COUNT=0)


def test_duplicate_and_foreign_operators_are_rejected():
    dag, src, a, b = linear()
    with pytest.raises(DagError, match="two operators are named 'a'"):
        dag.add_operator("a", Pass())
    with pytest.raises(DagError, match="not a weir Operator"):
        dag.add_operator("x", object())  # type: ignore[arg-type]
    stranger = Pass()
    with pytest.raises(DagError, match="not in DAG 'linear'"):
        dag.add_stream("s9", stranger.output, b.input)


def test_descriptor_with_unknown_port_is_rejected():
    dag, *_ = linear()
    descriptor = dag.to_descriptor(with_payload=False)
    descriptor.streams[0].sinks[0].port = "nope"
    with pytest.raises(DagError, match=r"operator 'a' has no input port 'nope'"):
        validate_descriptor(descriptor)


def test_operator_that_cannot_be_pickled_is_named():
    class Holder(Pass):
        def __init__(self):
            self.lock = __import__("threading").Lock()

    dag = Dag("pickle")
    src = dag.add_operator("src", Source())
    held = dag.add_operator("held", Holder())
    dag.add_stream("s", src.output, held.input)
    with pytest.raises(DagError, match=r"operator 'held' \(Holder\) cannot be serialized"):
        dag.to_descriptor()


class SparkUnified(Pass):
    """Plain itself, its partitions merged in Spark."""

    def unifier(self) -> Operator:
        from weir.operators.spark import SparkSql

        return SparkSql("SELECT * FROM input")


def test_the_descriptor_says_which_operators_use_spark():
    from weir.operators.spark import SparkSql

    dag = Dag("spark")
    src = dag.add_operator("src", Source())
    sql = dag.add_operator("sql", SparkSql("SELECT word FROM input"))
    merged = dag.add_operator("merged", SparkUnified())
    plain = dag.add_operator("plain", Pass())
    dag.add_stream("s1", src.output, sql.input)
    dag.add_stream("s2", sql.output, merged.input)
    dag.add_stream("s3", merged.output, plain.input)
    uses = {op.name: op.uses_spark for op in dag.to_descriptor().operators}
    assert uses == {"src": False, "sql": True, "merged": True, "plain": False}


@pytest.mark.parametrize("attribute, value", [("EVENT_TIME_COLUMN", "ts"),
                                              ("WATERMARK_DELAY_MILLIS", 2_000),
                                              ("IDLE_TIMEOUT_MILLIS", 5_000)])
def test_source_only_attributes_on_an_operator_that_is_no_source_are_refused(attribute, value):
    """Accepted, EVENT_TIME_COLUMN on a non-source did nothing: event-time windows below
    it waited for a watermark that never came (issue 33)."""
    dag = Dag("event-time")
    src = dag.add_operator("src", Source())
    a = dag.add_operator("a", Pass())
    b = dag.add_operator("b", Pass(), **{attribute: value})
    dag.add_stream("s1", src.output, a.input)
    dag.add_stream("s2", a.output, b.input)
    with pytest.raises(DagError, match=rf"operator 'b' sets {attribute}, which only a source "
                                       r"\(an InputOperator\) reads; .* set it on the source "
                                       r"upstream \('src'\)"):
        dag.validate()


class TimedSource(InputOperator):
    output = OutputPort(pa.schema([("ts", pa.timestamp("ms")), ("word", pa.string())]))


def test_source_only_attributes_on_a_source_are_accepted():
    dag = Dag("event-time")
    src = dag.add_operator("src", TimedSource(), EVENT_TIME_COLUMN="ts", WATERMARK_DELAY_MILLIS=500,
                           IDLE_TIMEOUT_MILLIS=1_000)
    a = dag.add_operator("a", Pass())
    dag.add_stream("s1", src.output, a.input)
    dag.validate()
