"""Loading an application file: a Python file that builds a ``Dag``.

The file is run as a fresh module whose classes and functions are pickled by value, so a
container can rebuild operators defined in the file without having the file itself.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import sys
from pathlib import Path

import cloudpickle

from operators.dag import Dag, DagError

__all__ = ["AppLoadError", "load_app"]

_LOGGER = logging.getLogger(__name__)


class AppLoadError(ValueError):
    """The application file is missing, fails to run, or defines no DAG."""


def load_app(path: str | Path) -> Dag:
    """Runs the application file and returns its DAG, validated.

    The DAG is the module-level variable ``dag``, or what a module-level function
    ``build_dag()`` returns.

    Raises:
        AppLoadError: the file is missing, raises, or defines no DAG.
        DagError: the DAG is malformed.
    """
    file = Path(path)
    if not file.is_file():
        raise AppLoadError(f"application file {str(path)!r} does not exist")
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:10]
    module_name = f"weir_app_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise AppLoadError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except (DagError, AppLoadError):
        raise
    except Exception as exc:  # noqa: BLE001 - the user's file may raise anything
        raise AppLoadError(f"{path} failed while building the DAG: "
                           f"{type(exc).__name__}: {exc}") from None
    cloudpickle.register_pickle_by_value(module)
    dag = getattr(module, "dag", None)
    if dag is None and callable(getattr(module, "build_dag", None)):
        dag = module.build_dag()
    if not isinstance(dag, Dag):
        raise AppLoadError(
            f"{path} defines no DAG: assign a weir Dag to a module-level variable named "
            "'dag' (or define build_dag() returning one)"
        )
    dag.validate()
    return dag
