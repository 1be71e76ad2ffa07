"""What every ``weir`` command that talks to a master shares: the client made from the
command line's options, and JSON output."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from weir.master.client import WeirClient

__all__ = ["client_for", "now_ms", "print_json", "to_dict"]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def to_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


def print_json(value: Message | dict[str, Any]) -> None:
    data = to_dict(value) if isinstance(value, Message) else value
    print(json.dumps(data, indent=2, sort_keys=False))


def client_for(args: argparse.Namespace) -> WeirClient:
    return WeirClient(args.master, timeout_s=args.timeout, secret_file=args.secret_file,
                      tls_ca=args.tls_ca, on_loading=_say_loading)


def _say_loading(message: str) -> None:
    print(f"weir: {message} (retrying)", file=sys.stderr)
