"""The ``weir`` commands that call a running master: submit, and the queries and
controls of applications, containers and operators (tables, or ``--json``)."""

from __future__ import annotations

import argparse
import sys

from weir.master import live_view, tables
from weir.master.cli_config import load_app_and_overrides
from weir.master.cli_output import client_for, now_ms, print_json
from weir.master.cli_savepoints import say_savepoint_match
from weir.master.client import parse_address
from weir.proto import client_pb2

__all__ = [
    "cmd_app", "cmd_apps", "cmd_containers", "cmd_kill", "cmd_kill_container", "cmd_logs",
    "cmd_operators", "cmd_repartition", "cmd_shutdown", "cmd_stats", "cmd_submit", "cmd_top",
]


def cmd_submit(args: argparse.Namespace) -> int:
    parse_address(args.master)
    descriptor, overrides = load_app_and_overrides(args)
    from_savepoint = getattr(args, "from_savepoint", None) or ""
    if from_savepoint:
        say_savepoint_match(descriptor, from_savepoint, args.allow_dropped)
    with client_for(args) as client:
        app_id = client.submit(descriptor, overrides, from_savepoint=from_savepoint,
                               allow_dropped=getattr(args, "allow_dropped", False))
    if args.json:
        print_json(client_pb2.SubmitApplicationResponse(application_id=app_id))
    else:
        print(app_id)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    """The end of each container's log (or one's), a header line before each."""
    with client_for(args) as client:
        ids = [args.container_id] if args.container_id else [
            c.id for c in client.containers(args.app_id)]
        for container_id in ids:
            log = client.container_log(args.app_id, container_id, args.bytes)
            if args.json:
                print_json(log)
                continue
            if len(ids) > 1:
                print(f"==> {container_id} ({log.path}) <==")
            if log.truncated:
                print(f"[... the start of the log is in {log.path}]")
            sys.stdout.write(log.text if log.text.endswith("\n") or not log.text
                             else log.text + "\n")
    return 0


def cmd_apps(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        apps = client.applications()
    if args.json:
        print_json(client_pb2.ListApplicationsResponse(applications=apps))
    elif not apps:
        print("no applications; submit one with `weir submit APP.py`")
    else:
        print(tables.render_table(tables.APPLICATION_HEADERS,
                                  tables.application_rows(apps, now_ms()),
                                  tables.APPLICATION_RIGHT))
        if apps[0].dashboard_url:  # a hint for people, kept off the table's stream
            print(f"weir: dashboard on {apps[0].dashboard_url} (add ?token=TOKEN, the "
                  "http_token in the master's secret file)", file=sys.stderr)
    return 0


def cmd_app(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        info = client.application(args.app_id)
    if args.json:
        print_json(info)
    else:
        print(tables.application_details(info, now_ms()))
    return 0


def cmd_top(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise ValueError(f"--interval must be positive, not {args.interval:g}")
    with client_for(args) as client:
        client.application(args.app_id)  # an unknown application fails here, in one line

        def read() -> live_view.Snapshot:
            return live_view.Snapshot(client.application(args.app_id),
                                      client.operators(args.app_id),
                                      client.containers(args.app_id))

        return live_view.run_top(read, interval_s=args.interval, count=args.count,
                                 as_json=args.json)


def cmd_containers(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        containers = client.containers(args.app_id or args.app or "")
    if args.json:
        print_json(client_pb2.ListContainersResponse(containers=containers))
    elif not containers:
        print("no containers")
    else:
        print(tables.render_table(tables.CONTAINER_HEADERS,
                                  tables.container_rows(containers, now_ms()),
                                  tables.CONTAINER_RIGHT))
    return 0


def cmd_operators(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        operators = client.operators(args.app_id)
    if args.json:
        print_json(client_pb2.ListOperatorsResponse(operators=operators))
    else:
        print(tables.render_table(tables.OPERATOR_HEADERS, tables.operator_rows(operators),
                                  tables.OPERATOR_RIGHT))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        info = client.operator_stats(args.app_id, args.operator)
    if args.json:
        print_json(info)
    else:
        print(tables.operator_details(info, now_ms(), args.windows))
    return 0


def cmd_kill_container(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        replacement = client.kill_container(args.container_id)
    if args.json:
        print_json(client_pb2.KillContainerResponse(replacement_id=replacement))
    elif replacement:
        print(f"container {args.container_id} killed; {replacement} replaces it and its "
              "operators restart from their checkpoints")
    else:
        print(f"container {args.container_id} killed")
    return 0


def cmd_repartition(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        response = client.repartition(args.app_id, args.operator, args.partitions)
    if args.json:
        print_json(response)
    else:
        print(f"{args.app_id}: {response.message}; new partitions {list(response.partitions)}")
    return 0


def cmd_shutdown(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        client.shutdown(args.app_id)
    if args.json:
        print_json(client_pb2.ShutdownApplicationResponse())
    else:
        print(f"{args.app_id}: shutdown requested; its inputs end after the current window")
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        client.kill(args.app_id, args.reason)
    if args.json:
        print_json(client_pb2.KillApplicationResponse())
    else:
        print(f"{args.app_id} killed")
    return 0


