"""The Weir SDK: build a DAG of operators whose window logic runs in Spark.

>>> from weir.operators import Dag, Operator, InputPort, OutputPort
"""

from weir.operators.dag import Dag, DagError
from weir.operators.metrics import metric
from weir.operators.operator import InputOperator, Operator, OperatorContext, PermanentError
from weir.operators.ports import InputPort, OutputPort
from weir.operators.windows import NO_WINDOW, format_window_id, make_window_id

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
