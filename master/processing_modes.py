"""The window counts and processing modes a plan may have: only those that can do what
they say (Apex's rules, checked at submit so that recovery never has to break a promise)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from weir.master.errors import PlanError
from weir.operators.attributes import ProcessingMode
from weir.proto import plan_pb2

__all__ = ["check_processing_modes"]


def check_processing_modes(dag: plan_pb2.DagDescriptor, order: list[str],
                           operator_attributes: Mapping[str, Mapping[str, Any]]) -> None:
    """Window counts and processing modes that can do what they say (Apex's rules).

    - A checkpoint is taken at the end of an application window, so
      CHECKPOINT_WINDOW_COUNT must be a multiple of APPLICATION_WINDOW_COUNT.
    - EXACTLY_ONCE restarts from the newest checkpoint, so it needs a checkpoint after
      every application window (CHECKPOINT_WINDOW_COUNT = APPLICATION_WINDOW_COUNT).
    - An AT_MOST_ONCE operator skips the windows it missed, so an operator reading it
      cannot have them replayed: it must be AT_MOST_ONCE too.

    Raises:
        PlanError: naming the operator, the values and the setting that fixes it.
    """
    for name in order:
        attributes = operator_attributes[name]
        checkpoint = attributes["CHECKPOINT_WINDOW_COUNT"]
        application = attributes["APPLICATION_WINDOW_COUNT"]
        if checkpoint % application:
            fixed = -(-checkpoint // application) * application
            raise PlanError(
                f"operator {name!r} has CHECKPOINT_WINDOW_COUNT={checkpoint}, not a multiple "
                f"of its APPLICATION_WINDOW_COUNT={application}: a checkpoint can only be "
                "taken at the end of an application window; set "
                f"-D {name}.CHECKPOINT_WINDOW_COUNT={fixed}")
        if attributes["PROCESSING_MODE"] == ProcessingMode.EXACTLY_ONCE \
                and checkpoint != application:
            raise PlanError(
                f"operator {name!r} has PROCESSING_MODE=EXACTLY_ONCE but "
                f"CHECKPOINT_WINDOW_COUNT={checkpoint}; exactly-once needs a checkpoint "
                f"after every application window: set -D {name}.CHECKPOINT_WINDOW_COUNT="
                f"{application} (its APPLICATION_WINDOW_COUNT), or use AT_LEAST_ONCE")
    for stream in dag.streams:
        source_mode = operator_attributes[stream.source_operator]["PROCESSING_MODE"]
        if source_mode != ProcessingMode.AT_MOST_ONCE:
            continue
        for sink in stream.sinks:
            mode = operator_attributes[sink.operator]["PROCESSING_MODE"]
            if mode != ProcessingMode.AT_MOST_ONCE:
                raise PlanError(
                    f"operator {sink.operator!r} ({mode}) reads stream {stream.name!r} of "
                    f"AT_MOST_ONCE operator {stream.source_operator!r}, which skips the "
                    f"windows it missed after a failure, so {sink.operator!r} could not have "
                    f"them replayed; set -D {sink.operator}.PROCESSING_MODE=AT_MOST_ONCE, or "
                    f"make {stream.source_operator!r} {mode}")
