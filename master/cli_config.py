"""Attribute overrides for ``weir submit`` and ``weir run``: ``--config FILE`` and
``-D NAME=VALUE`` (which wins), checked by planning the application once before it is sent.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from weir.master.planner import build_physical_plan
from weir.operators.app import load_app
from weir.proto import plan_pb2

__all__ = ["ConfigError", "load_app_and_overrides", "parse_defines", "read_config"]


class ConfigError(ValueError):
    """A malformed ``-D`` value or config file."""


def read_config(path: str | Path) -> dict[str, str]:
    """``NAME=VALUE`` lines; blank lines and ``#`` comments are skipped."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].split("\t#", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"{path}:{number}: expected NAME=VALUE, got {raw.strip()!r}")
        values[name.strip()] = value.strip()
    return values


def parse_defines(defines: Sequence[str]) -> dict[str, str]:
    """``-D NAME=VALUE`` options as a dict."""
    values: dict[str, str] = {}
    for define in defines:
        name, sep, value = define.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"bad -D {define!r}: expected NAME=VALUE")
        values[name.strip()] = value.strip()
    return values


def overrides_of(args: argparse.Namespace) -> dict[str, str]:
    values = read_config(args.config) if args.config else {}
    values.update(parse_defines(args.define))
    return values


def load_app_and_overrides(args: argparse.Namespace
                           ) -> tuple[plan_pb2.DagDescriptor, dict[str, str]]:
    """The app's DAG descriptor and overrides, planned once here to fail early."""
    overrides = overrides_of(args)
    descriptor = load_app(args.app).to_descriptor()
    build_physical_plan(descriptor, overrides, "check")
    return descriptor, overrides


