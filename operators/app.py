"""Loading an application file: a Python file that builds a ``Dag``.

The file is run as a fresh module whose classes and functions are pickled by value, so a
container can rebuild operators defined in the file without having the file itself.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import cloudpickle

from weir.operators.dag import Dag, DagError

__all__ = ["AppLoadError", "load_app"]

_LOGGER = logging.getLogger(__name__)
_T = TypeVar("_T")


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
    _run_user_code(path, lambda: spec.loader.exec_module(module))  # type: ignore[union-attr]
    cloudpickle.register_pickle_by_value(module)
    dag = getattr(module, "dag", None)
    if dag is None and callable(getattr(module, "build_dag", None)):
        dag = _run_user_code(path, module.build_dag)
    if not isinstance(dag, Dag):
        raise AppLoadError(
            f"{path} defines no DAG: assign a weir Dag to a module-level variable named "
            "'dag' (or define build_dag() returning one)"
        )
    dag.validate()
    return dag


def _run_user_code(path: str | Path, call: Callable[[], _T]) -> _T:
    """``call()`` (the application file's code); what it raises is an ``AppLoadError``
    naming the file. ``SystemExit`` too (a script's ``sys.exit()`` at import): it would end
    ``weir submit`` with that status and nothing submitted. Ctrl-C stays Ctrl-C."""
    try:
        return call()
    except (DagError, AppLoadError, KeyboardInterrupt):
        raise
    except SystemExit as exc:
        raise AppLoadError(
            f"{path} exited (SystemExit({exc.code!r})) while building the DAG: an application "
            "file defines `dag` or build_dag() and must not exit; put script code under "
            "`if __name__ == \"__main__\":`") from None
    except BaseException as exc:  # noqa: BLE001 - the user's file may raise anything
        raise AppLoadError(f"{path}{_line_in(path, exc)} failed while building the DAG: "
                           f"{type(exc).__name__}: {exc}") from None


def _line_in(path: str | Path, exc: BaseException) -> str:
    """`` line N``: the last line of the application file ``exc`` passed through ("" if
    none: the error came from elsewhere before the file ran)."""
    wanted = Path(path).resolve()
    lines = [line for frame, line in traceback.walk_tb(exc.__traceback__)
             if Path(frame.f_code.co_filename).resolve() == wanted]
    return f" line {lines[-1]}" if lines else ""
