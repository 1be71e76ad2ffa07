"""The Weir master: it plans applications, drives containers through heartbeats, answers users.

Modules: ``physical_plan`` (logical DAG -> physical operators and containers),
``heartbeat`` (pure heartbeat and liveness rules), ``application`` (one application's
state), ``core`` (all applications, the lock and the master loop), ``stats``, ``launcher``,
the gRPC services and ``server``, ``client`` and the ``weir`` CLI (``cli``).
"""

__all__: list[str] = []
