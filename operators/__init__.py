"""The Weir SDK: build a DAG of operators whose window logic runs in Spark.

>>> from operators import Dag, Operator, InputPort, OutputPort
"""

from operators.dag import Dag, DagError
from operators.metrics import metric
from operators.operator import InputOperator, Operator, OperatorContext, PermanentError
from operators.ports import InputPort, OutputPort
from operators.windows import NO_WINDOW, format_window_id, make_window_id

__all__ = [
    "NO_WINDOW",
    "Dag",
    "DagError",
    "InputOperator",
    "InputPort",
    "Operator",
    "OperatorContext",
    "OutputPort",
    "PermanentError",
    "format_window_id",
    "make_window_id",
    "metric",
]
