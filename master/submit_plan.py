"""What a submit does before the master's lock is taken: the DAG checked, its stats
listeners loaded, the application planned, its request checked against the launcher and
matched with a savepoint. None of it touches what other applications' calls read, so a
large DAG planned here holds up no heartbeat (``MasterCore.submit`` adds the result)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from weir.master import savepoints
from weir.master.errors import InvalidArgument
from weir.master.launcher import UnplaceableRequest
from weir.master.launches import Launches
from weir.master.physical_plan import PhysicalPlan, PlanError
from weir.master.planner import build_physical_plan
from weir.master.stats_listeners import StatsListenerError, load_listeners
from weir.operators.dag import DagError, validate_descriptor
from weir.proto import plan_pb2
from weir.storage.savepoints import SavepointError

__all__ = ["checked_listeners", "planned"]


def checked_listeners(dag: plan_pb2.DagDescriptor) -> Any:
    """Validates ``dag``; returns its stats listeners, loaded.

    Raises:
        InvalidArgument: the DAG is malformed, or a listener cannot be loaded.
    """
    try:
        validate_descriptor(dag)
        return load_listeners(dag)
    except (DagError, StatsListenerError) as exc:
        raise InvalidArgument(str(exc)) from None


def planned(dag: plan_pb2.DagDescriptor, overrides: Mapping[str, str], app_id: str,
            run_id: str, launches: Launches, from_savepoint: str, allow_dropped: bool,
            manifest: Any) -> tuple[PhysicalPlan, Any]:
    """The application's plan, and how it is seeded from ``manifest`` (None: no savepoint).

    Raises:
        InvalidArgument: bad overrides or placement, a request no node can run, or a DAG
            that does not match the savepoint.
    """
    try:
        plan = build_physical_plan(dag, dict(overrides), app_id, run_id)
        launches.check_request(plan.attributes, dag)
        seeded = (savepoints.plan_from_savepoint(dag, plan, from_savepoint, allow_dropped,
                                                 manifest)
                  if manifest is not None else None)
    except (PlanError, DagError, SavepointError, UnplaceableRequest) as exc:
        raise InvalidArgument(str(exc)) from None
    return plan, seeded
