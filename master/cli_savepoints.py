"""``weir savepoint`` and what ``weir submit --from-savepoint`` says before it submits."""

from __future__ import annotations

import argparse
import sys

from master.cli_queries import client_for, print_json
from operators.savepoints import SavepointError, match, read_manifest
from operators.windows import format_window_id
from proto import plan_pb2

__all__ = ["cmd_savepoint", "say_savepoint_match"]


def cmd_savepoint(args: argparse.Namespace) -> int:
    """Takes a savepoint with a stop, waits for the application to finish, says where."""
    if not args.stop:
        print("weir: a savepoint is taken with a stop today: add --stop (the application "
              "finishes with it; resume with weir submit APP.py --from-savepoint PATH)",
              file=sys.stderr)
        return 2
    with client_for(args) as client:
        client.take_savepoint(args.app_id, args.path, stop=True)
        if not args.json:
            print(f"{args.app_id}: savepoint requested at {args.path}; its inputs end after "
                  "the current window", file=sys.stderr)
        info = client.wait(args.app_id, args.wait)
    if args.json:
        print_json(info)
    if info.savepoint_state != "complete":
        print(f"weir: {args.app_id} ended {info.state} and its savepoint at {args.path} is "
              f"{info.savepoint_state or 'not written'}: {info.diagnostics}", file=sys.stderr)
        return 1
    if not args.json:
        window = read_manifest(args.path).window
        print(f"{args.app_id}: savepoint complete at {args.path} (window "
              f"{format_window_id(window)}); resume with: weir submit APP.py "
              f"--from-savepoint {args.path}")
    return 0


def say_savepoint_match(dag: plan_pb2.DagDescriptor, path: str, allow_dropped: bool) -> None:
    """Prints how the DAG's operators match the savepoint's; exits 2 when they cannot
    (the master checks again)."""
    try:
        manifest = read_manifest(path)
    except SavepointError as exc:
        print(f"weir: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    matched = match(dag, manifest)
    print(f"from the savepoint of {manifest.application_id} ({manifest.app_name}) at {path}, "
          f"window {format_window_id(manifest.window)}:", file=sys.stderr)
    print("\n".join(matched.lines()), file=sys.stderr)
    refusal = matched.refusal(allow_dropped)
    if refusal is not None:
        print(f"weir: the application does not match the savepoint: "
              f"{refusal.splitlines()[0]}", file=sys.stderr)
        raise SystemExit(2)
