"""``weir savepoint`` and what ``weir submit --from-savepoint`` says before it submits."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from weir.master.cli_output import client_for, print_json
from weir.master.client import WeirClient, WeirClientError, default_master
from weir.operators.windows import format_window_id
from weir.proto import client_pb2, plan_pb2
from weir.storage.locations import redact_location
from weir.storage.savepoints import SavepointError, match, read_manifest

__all__ = ["across_restarts", "cmd_savepoint", "say_savepoint_match"]

_T = TypeVar("_T")


def cmd_savepoint(args: argparse.Namespace) -> int:
    """Takes a savepoint (with --stop: and finishes the application), waits for it, says
    where it is and how to resume from it. ``args.path`` is absolute (``weir`` made it so)
    or a URI, shown without its keys."""
    shown = redact_location(args.path)
    across_restarts(args, savepoint_request(args))  # a master that dies first: asked again
    if not args.json:
        print(f"{args.app_id}: savepoint requested at {shown}"
              + ("; its inputs end after the current window" if args.stop else ""),
              file=sys.stderr)
    info = wait_across_restarts(args, lambda c, s: _wait_written(c, args.app_id, s,
                                                                  stop=args.stop))
    if args.json:
        print_json(info)
    if info.savepoint_state != "complete":
        print(f"weir: {args.app_id} is {info.state} and its savepoint at {shown} is "
              f"{info.savepoint_state or 'not written'} {info.diagnostics}".rstrip(),
              file=sys.stderr)
        return 1
    if not args.json:
        window = read_manifest(args.path).window
        print(f"{args.app_id}: savepoint complete at {shown} (window "
              f"{format_window_id(window)}); resume with: weir submit APP.py "
              f"--from-savepoint {shown}")
    return 0


def savepoint_request(args: argparse.Namespace) -> Callable[[WeirClient, float], None]:
    """The savepoint's request, as ``across_restarts`` calls it: asked again of a master
    that came back, "already taking a savepoint at" this path is its first asking that
    arrived (its answer lost with the master), not an error."""
    shown = redact_location(args.path)

    def request(client: WeirClient, _left_s: float) -> None:
        try:
            client.take_savepoint(args.app_id, args.path, stop=args.stop)
        except WeirClientError as exc:
            if exc.code != grpc.StatusCode.FAILED_PRECONDITION \
                    or f"already taking a savepoint at {shown!r}" not in str(exc):
                raise

    return request


def wait_across_restarts(args: argparse.Namespace,
                         wait: Callable[[WeirClient, float], client_pb2.ApplicationInfo]
                         ) -> client_pb2.ApplicationInfo:
    """``across_restarts`` for a wait that ends with the application's information."""
    return across_restarts(args, wait)


def across_restarts(args: argparse.Namespace, call: Callable[[WeirClient, float], _T]) -> _T:
    """``call(client, seconds left)`` within ``args.wait`` seconds, through a restart of the
    master: while no master answers, it is looked for again (where the other commands look,
    when ``--master`` and $WEIR_MASTER named none: a restarted master may listen on another
    port) and the call goes on with the one found, the master it was talking to named. A
    master that took the application back answers for it (its journal); one that never
    comes back ends the call with its error at the deadline."""
    deadline = time.monotonic() + args.wait
    said = False
    while True:
        try:
            with client_for(args) as client:
                return call(client, max(0.0, deadline - time.monotonic()))
        except WeirClientError as exc:
            if exc.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() >= deadline:
                raise
            if not said:
                print(f"weir: the master at {args.master} does not answer; waiting up to "
                      f"{deadline - time.monotonic():.0f} s for it (or a restarted one) to "
                      "come back", file=sys.stderr)
                said = True
        time.sleep(0.5)
        if getattr(args, "master_found", False):
            args.master = default_master()


def _wait_written(client: WeirClient, app_id: str, timeout_s: float, *, stop: bool = False
                  ) -> client_pb2.ApplicationInfo:
    """Polls until the savepoint is no longer being written: complete (its manifest is
    written, by a thread of the master's, which may be after the application ended) or
    failed. ``stop``: a complete one also waits for the application to end."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = client.application(app_id)
        ended = info.state not in ("ACCEPTED", "RUNNING")
        state = info.savepoint_state
        if state != "writing" and (ended or not stop or state != "complete"):
            return info
        if time.monotonic() > deadline:
            raise TimeoutError(f"the savepoint of {app_id} was still being written after "
                               f"{timeout_s:.0f} s")
        time.sleep(0.2)


def say_savepoint_match(dag: plan_pb2.DagDescriptor, path: str, allow_dropped: bool) -> None:
    """Prints how the DAG's operators match the savepoint's; exits 2 when they cannot
    (the master checks again)."""
    try:
        manifest = read_manifest(path)
    except SavepointError as exc:
        print(f"weir: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    matched = match(dag, manifest)
    print(f"from the savepoint of {manifest.application_id} ({manifest.app_name}) at "
          f"{redact_location(path)}, "
          f"window {format_window_id(manifest.window)}:", file=sys.stderr)
    print("\n".join(matched.lines()), file=sys.stderr)
    refusal = matched.refusal(allow_dropped)
    if refusal is not None:
        print(f"weir: the application does not match the savepoint: "
              f"{refusal.splitlines()[0]}", file=sys.stderr)
        raise SystemExit(2)
