"""Errors of the master core, one class per gRPC status code the services answer with."""

from __future__ import annotations

import logging

__all__ = ["DeadlineExceeded", "FailedPrecondition", "InvalidArgument", "InvalidTransition",
           "MasterError", "NotFound", "PlanError", "Unavailable", "shown"]

_LOGGER = logging.getLogger(__name__)


def shown(name: str, limit: int = 80) -> str:
    """A name from a request as an error echoes it: quoted, and cut if long (an id of
    3 MB would make the reply unreadable).

    >>> shown("app-0001"), shown("x" * 100, limit=5)
    ("'app-0001'", "'xxxxx…' (100 characters)")
    """
    if len(name) <= limit:
        return repr(name)
    return f"{name[:limit]!r}"[:-1] + f"…' ({len(name):,} characters)"


class MasterError(Exception):
    """A request the master refuses; the message is one line naming the cause and the fix."""


class NotFound(MasterError):
    """An unknown application, container or operator (gRPC NOT_FOUND)."""


class InvalidArgument(MasterError):
    """A malformed request, e.g. a DAG that does not validate (gRPC INVALID_ARGUMENT)."""


class FailedPrecondition(MasterError):
    """A request that does not fit the current state (gRPC FAILED_PRECONDITION)."""


class Unavailable(MasterError):
    """The master cannot serve (gRPC UNAVAILABLE): it stopped because it could not write
    its journal; containers keep retrying and are taken back by the next master."""


class DeadlineExceeded(MasterError):
    """A store the request needs (a savepoint or state folder, local or remote) did not
    answer in time (gRPC DEADLINE_EXCEEDED); nothing was changed."""


class InvalidTransition(RuntimeError):
    """An entity was asked to move between two states that are not connected.

    A programming error in the master, not a user error.
    """

    def __init__(self, entity: str, from_state: object, to_state: object) -> None:
        super().__init__(f"{entity}: illegal transition {_name(from_state)} -> {_name(to_state)}")
        self.entity = entity
        self.from_state = from_state
        self.to_state = to_state


def _name(state: object) -> str:
    return getattr(state, "name", str(state))


class PlanError(ValueError):
    """The DAG and its attribute overrides cannot be turned into a physical plan."""
