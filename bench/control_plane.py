"""Control-plane capacity: can one master keep N containers' heartbeats on time, losing none?"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench.common import PeakMemory, percentile
from bench.master_process import MasterProcess, master_process
from bench.played_containers import WINDOW_MS, LoadGenerator, PlayedContainer, chain_dag
from weir.master.client import WeirClient
from weir.proto import plan_pb2

__all__ = ["main", "run"]

_LOGGER = logging.getLogger(__name__)


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _runqueue_wait_s(pid: int) -> float:
    """Time the process's threads spent runnable but waiting for a CPU (Linux schedstat)."""
    total = 0
    with contextlib.suppress(OSError):
        for task in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"{task.path}/schedstat") as file:
                    total += int(file.read().split()[1])
    return total / 1e9


def _busy_s() -> float:
    """CPU time the whole machine spent busy, all cores."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def _ms(values_s: list[float], q: float) -> float:
    return round(percentile(values_s, q) * 1000.0, 2)


@dataclasses.dataclass(frozen=True)
class _Settings:
    """One run's parameters (see ``run``)."""

    containers: int
    operators_per_container: int
    interval_s: float
    duration_s: float
    warmup_s: float
    containers_per_app: int
    heartbeat_timeout_ms: int
    channels: int
    rpc_timeout_s: float
    profile_path: str | None
    gc_path: str | None
    application_masters: bool = False
    journal: bool = False

    @property
    def interval_ms(self) -> int:
        return max(1, round(self.interval_s * 1000))


def _submit(address: str, settings: _Settings,
            accepted: Callable[[str, list[PlayedContainer]], None] = lambda *_: None
            ) -> list[PlayedContainer]:
    """Submits the applications; returns their containers in launch order (an app's
    together), each application's told to ``accepted`` as soon as it is planned (its
    containers must call in within twice the heartbeat timeout, as launched ones do)."""
    containers, per_app = settings.containers, settings.containers_per_app
    operators_per_container, interval_ms = settings.operators_per_container, settings.interval_ms
    sizes = [per_app] * (containers // per_app) + ([containers % per_app]
                                                    if containers % per_app else [])
    descriptors: dict[int, plan_pb2.DagDescriptor] = {}
    windows = max(1, round(interval_ms / WINDOW_MS))
    free_mb = psutil.virtual_memory().available // (1024 * 1024)
    played: list[PlayedContainer] = []
    with WeirClient(address, timeout_s=60.0) as client:
        for size in sizes:
            if size not in descriptors:
                descriptors[size] = chain_dag("bench-control-plane", size, operators_per_container,
                                         interval_ms, settings.heartbeat_timeout_ms)
            app_id = client.submit(descriptors[size])
            planned = client.containers(app_id)
            if len(planned) != size or any(len(c.operator_ids) != operators_per_container
                                           for c in planned):
                raise RuntimeError(f"{app_id}: planned {len(planned)} containers of "
                                   f"{[len(c.operator_ids) for c in planned]} operators, "
                                   f"expected {size} of {operators_per_container}")
            mine = []
            for info in sorted(planned, key=lambda c: int(c.id.rsplit("-c", 1)[1])):
                mine.append(PlayedContainer(info.id, len(played) + len(mine), windows,
                                            free_mb))
            played += mine
            accepted(app_id, mine)
    return played


def _application_master(state_dir: str, app_id: str) -> tuple[str, bytes, str]:
    """The application master's address, certificate and secret, from its folder (the
    dispatcher's ``apps/<id>``): the containers of its application heartbeat to it."""
    folder = Path(state_dir, "apps", app_id)
    address = json.loads((folder / "master.json").read_text())["address"]
    return (address, (folder / "tls" / "cert.pem").read_bytes(),
            (folder / "secret").read_text().strip())


def _tree(process: psutil.Process) -> list[psutil.Process]:
    """The master and every process it started (a dispatcher's application masters)."""
    with contextlib.suppress(psutil.Error):
        return [process, *process.children(recursive=True)]
    return [process]


def _rss(process: psutil.Process) -> int:
    with contextlib.suppress(psutil.Error):
        return process.memory_info().rss
    return 0


def _tree_cpu_s(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            total += _cpu_s(process)
    return total


async def _drive(master: MasterProcess, settings: _Settings, state_dir: str | None
                 ) -> dict[str, Any]:
    """Submits the applications and plays each one's containers as soon as it is
    accepted (``state_dir``: a dispatcher's, each application's containers heartbeating
    to its own master), for ``duration_s`` after the last is accepted; measures after
    ``warmup_s``. The master's figures are of its whole process tree (with application
    masters: all of them)."""
    loop = asyncio.get_running_loop()
    interval_s, duration_s = settings.interval_s, settings.duration_s
    generator = LoadGenerator(master.address, [], interval_s, settings.channels,
                              settings.rpc_timeout_s, {} if state_dir else None)
    own = psutil.Process()
    tasks: list[asyncio.Task[None]] = []
    result: dict[str, Any] = {}
    accepted: asyncio.Queue[tuple[str, list[PlayedContainer]]] = asyncio.Queue()
    began = time.monotonic()
    submitting = asyncio.ensure_future(asyncio.to_thread(
        _submit, master.address, settings,
        lambda app_id, mine: loop.call_soon_threadsafe(accepted.put_nowait, (app_id, mine))))
    generator.started = loop.time()
    try:
        while not (submitting.done() and accepted.empty()):
            getter = asyncio.ensure_future(accepted.get())
            await asyncio.wait({getter, submitting}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                continue
            app_id, mine = getter.result()
            if state_dir is not None:
                generator.add_master(app_id, *_application_master(state_dir, app_id))
            await asyncio.wait_for(generator.init(mine), timeout=120.0)
            now = loop.time()
            for position, container in enumerate(mine):  # spread over one interval
                tasks.append(asyncio.create_task(generator.play(
                    container, now + interval_s * position / len(mine))))
        played = generator.containers = submitting.result()
        count = len(played)
        result["submit_s"] = round(time.monotonic() - began, 2)
        started = loop.time()  # every application accepted: the run's clock starts
        tree = _tree(master.process)
        await asyncio.sleep(settings.warmup_s)
        master_cpu0, own_cpu0, wall0 = _tree_cpu_s(tree), _cpu_s(own), loop.time()
        wait0, busy0 = sum(_runqueue_wait_s(p.pid) for p in tree), _busy_s()
        rss_start_mb = sum(_rss(p) for p in tree) / 2**20
        generator.tally.measure_from = wall0
        epoch0 = time.time()
        with PeakMemory(master.popen.pid, interval_s=0.25) as memory:
            await asyncio.sleep(max(0.0, started + duration_s - loop.time()))
            generator.tally.measure_to = wall1 = loop.time()
            epoch1 = time.time()
            master_cpu1, own_cpu1 = _tree_cpu_s(tree), _cpu_s(own)
            wait1, busy1 = sum(_runqueue_wait_s(p.pid) for p in tree), _busy_s()
            rss_end_mb = memory.sample_mb()
        measured_s = wall1 - wall0
        crashed = [t.exception() for t in tasks if t.done() and not t.cancelled()
                   and t.exception() is not None]
        if crashed:  # a silent container would be blamed on the master
            raise RuntimeError(f"{len(crashed)} played containers crashed") from crashed[0]
        # Asked while the containers still heartbeat: anything not ACTIVE was given up on.
        with WeirClient(master.address, timeout_s=60.0) as client:
            listed, apps = await asyncio.wait_for(asyncio.gather(
                asyncio.to_thread(client.containers), asyncio.to_thread(client.applications)),
                timeout=90.0)
            operator_states = await asyncio.wait_for(
                asyncio.to_thread(_operator_states, client, [a.id for a in apps]), timeout=120.0)
        tally = generator.tally
        deployed = [c.deployed_at for c in played if c.deployed_at]
        states = collections.Counter(c.state for c in listed)
        app_states = collections.Counter(a.state for a in apps)
        result = {
            **result,
            "master_processes": len(tree),
            "heartbeats_sent": tally.sent,
            "heartbeats_answered": tally.answered,
            "heartbeats_measured": tally.measured,
            "measured_s": round(measured_s, 2),
            "heartbeats_per_s": round(tally.measured / measured_s, 1),
            "target_heartbeats_per_s": round(len(played) / interval_s, 1),
            "rtt_p50_ms": _ms(tally.rtts_s, 50),
            "rtt_p99_ms": _ms(tally.rtts_s, 99),
            "rtt_max_ms": round(max(tally.rtts_s, default=0.0) * 1000.0, 2),
            "rtts_over_100ms": sum(rtt > 0.1 for rtt in tally.rtts_s),
            "send_lag_p99_ms": _ms(tally.lags_s, 99),
            "max_heartbeat_gap_s": round(max((c.max_gap_s for c in played), default=0.0), 2),
            "rpc_errors": dict(tally.errors),
            "rpc_errors_measured": tally.measured_errors,
            "master_cpu_percent": round(100.0 * (master_cpu1 - master_cpu0) / measured_s, 1),
            # the master's whole cost of one heartbeat (gRPC, parsing, the rules, journal)
            "master_cpu_ms_per_heartbeat": round(
                1000.0 * (master_cpu1 - master_cpu0) / max(1, tally.measured), 3),
            "master_peak_rss_mb": round(max(memory.peak_mb, rss_end_mb), 1),
            "master_rss_growth_mb_per_min": round((rss_end_mb - rss_start_mb) * 60 / measured_s,
                                                  1),
            "master_runqueue_wait_percent": round(100.0 * (wait1 - wait0) / measured_s, 1),
            "generator_cpu_percent": round(100.0 * (own_cpu1 - own_cpu0) / measured_s, 1),
            "machine_busy_percent": round(100.0 * (busy1 - busy0) / measured_s, 1),
            "others_cpu_percent": round(max(0.0, 100.0 * (
                (busy1 - busy0) - (master_cpu1 - master_cpu0) - (own_cpu1 - own_cpu0))
                / measured_s), 1),
            "all_deployed_after_s": round(max(deployed), 2) if len(deployed) == count else None,
            "containers_deployed": len(deployed),
            "operators_reported": sum(len(c.operators) for c in played),
            "containers_listed": len(listed),
            "container_states": dict(states),
            "containers_not_active": len(listed) - states.get("ACTIVE", 0),
            "containers_killed": states.get("KILLED", 0),
            "applications": len(apps),
            "application_states": dict(app_states),
            "applications_not_running": len(apps) - app_states.get("RUNNING", 0),
            "applications_committing": sum(a.committed_window_id >= 0 for a in apps),
            "operator_states": dict(operator_states),
            "operators_not_active": (sum(operator_states.values())
                                     - operator_states.get("ACTIVE", 0)),
            "aborts": tally.aborts,
            "killed_diagnostics": sorted({c.diagnostics for c in listed
                                          if c.state == "KILLED"})[:5],
            "_measured_epoch": (epoch0, epoch1),
        }
    finally:
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=10.0)
        await asyncio.wait_for(generator.close(), timeout=10.0)
    return result


def _operator_states(client: WeirClient, app_ids: list[str]) -> collections.Counter[str]:
    """How many operators of the applications are in each state, as the master sees them."""
    return collections.Counter(op.state for app_id in app_ids
                               for op in client.operators(app_id))


def _gc_figures(path: str, measured: tuple[float, float]) -> dict[str, Any]:
    """The master's garbage collections in the measured period, per generation."""
    with open(path) as file:
        events = [e for e in json.load(file) if measured[0] <= e[0] < measured[1]]
    figures: dict[str, Any] = {}
    for generation in (0, 1, 2):
        pauses = [pause for _, gen, pause in events if gen == generation]
        figures[f"gen{generation}"] = {
            "collections": len(pauses),
            "pause_total_ms": round(sum(pauses) * 1000, 1),
            "pause_max_ms": round(max(pauses, default=0.0) * 1000, 1)}
    return figures


def _profile_top(path: str, heartbeats: int, limit: int = 25) -> list[dict[str, Any]]:
    """The master's functions by own time, with µs per heartbeat answered."""
    stats = pstats.Stats(path)
    rows = []
    entries = stats.stats.items()  # type: ignore[attr-defined]
    for (file, line, name), (_, calls, tottime, cumtime, _) in entries:
        if tottime < 0 or cumtime < 0:  # a call cut short by the dump
            continue
        rows.append({"function": f"{Path(file).name}:{line}({name})", "calls": calls,
                     "tottime_s": round(tottime, 3), "cumtime_s": round(cumtime, 3),
                     "tottime_us_per_heartbeat": round(tottime * 1e6 / max(1, heartbeats), 1),
                     "cumtime_us_per_heartbeat": round(cumtime * 1e6 / max(1, heartbeats), 1)})
    rows.sort(key=lambda row: row["tottime_s"], reverse=True)
    return rows[:limit]


def run(containers: int = 1000, operators_per_container: int = 10, interval_s: float = 1.0,
        duration_s: float = 30.0, *, warmup_s: float = 5.0, containers_per_app: int = 10,
        heartbeat_timeout_ms: int = 10_000, channels: int = 4, rpc_timeout_s: float = 10.0,
        profile_path: str | None = None, gc_log: bool = False,
        application_masters: bool = False, journal: bool = False) -> dict[str, Any]:
    """Plays ``containers`` containers against a real master and measures its control plane.

    The master is a ``weir master --launcher recording`` subprocess on 127.0.0.1 (its CPU
    and memory measured alone); applications of ``containers_per_app`` containers with
    ``operators_per_container`` operators each are submitted through the client API, and
    this process plays every container over grpc.aio: GetInitContext, then a heartbeat
    every ``interval_s`` (starts spread over one interval) with process figures and, once
    deployed, every operator ACTIVE with its windows' port stats. Figures cover the
    heartbeats sent after ``warmup_s``, until ``duration_s`` after the first.

    Args:
        profile_path: if set (or ``$WEIR_BENCH_PROFILE``), the master runs under cProfile
            (every thread) and its top functions are returned under ``profile``; its
            figures are then the profiler's, not the master's.
        gc_log: time the master's garbage collections (a ``gc.callbacks`` hook) and
            return them under ``master_gc``.
        application_masters: the master is a dispatcher (``--application-masters``):
            each application's containers heartbeat to its own master process, and the
            master's figures (CPU, memory, run-queue waits) are of every process. Each
            application master journals (it has a folder); ``journal`` gives a single
            master a ``--state-dir`` too, to compare like with like.

    Returns:
        A JSON-serialisable dict: the parameters; ``heartbeats_*`` (sent, answered,
        measured, achieved per second against ``target_heartbeats_per_s``); ``rtt_*_ms``
        (round trips as this process saw them; ``send_lag_p99_ms`` tells how late this
        process sent, i.e. whether it was itself the bottleneck); ``master_cpu_percent``
        (100 = one core), ``master_peak_rss_mb``, ``master_runqueue_wait_percent`` (its
        threads runnable but without a CPU), ``generator_cpu_percent``,
        ``others_cpu_percent`` (the rest of the machine); the false losses as the master
        lists them after the run (``containers_not_active``, ``applications_not_running``,
        ``operators_not_active``) and ``aborts`` (heartbeats answered ABORT); and
        ``meets_targets``: p99 < 100 ms, the target rate reached, no false loss.
    """
    if containers < 1 or operators_per_container < 1 or containers_per_app < 1:
        raise ValueError("containers, operators_per_container and containers_per_app must "
                         "be at least 1")
    if not 0 <= warmup_s < duration_s:
        raise ValueError(f"warmup_s ({warmup_s}) must be below duration_s ({duration_s})")
    profile_path = profile_path or os.environ.get("WEIR_BENCH_PROFILE") or None
    figures: dict[str, Any] = {
        "benchmark": "control_plane", "containers": containers,
        "operators_per_container": operators_per_container,
        "operators": containers * operators_per_container,
        "containers_per_app": containers_per_app, "interval_s": interval_s,
        "duration_s": duration_s, "warmup_s": warmup_s,
        "heartbeat_timeout_ms": heartbeat_timeout_ms, "channels": channels,
        "windows_per_heartbeat": max(1, round(interval_s * 1000 / WINDOW_MS)),
        "profiled": bool(profile_path), "cpus": os.cpu_count(),
        "application_masters": application_masters,
        "journal": journal or application_masters,
    }
    gc_path = ""
    if gc_log:
        descriptor, gc_path = tempfile.mkstemp(prefix="weir-bench-gc-", suffix=".json")
        os.close(descriptor)
    settings = _Settings(containers, operators_per_container, interval_s, duration_s, warmup_s,
                         containers_per_app, heartbeat_timeout_ms, channels, rpc_timeout_s,
                         profile_path, gc_path or None, application_masters, journal)
    try:
        figures.update(_measure(settings))
    finally:
        if gc_path:
            with contextlib.suppress(OSError):
                os.unlink(gc_path)
    figures["false_losses"] = (figures["containers_not_active"]
                               + figures["applications_not_running"] + figures["aborts"])
    figures["meets_targets"] = (figures["rtt_p99_ms"] < 100.0
                                and figures["heartbeats_per_s"]
                                >= 0.98 * figures["target_heartbeats_per_s"]
                                and figures["false_losses"] == 0
                                and figures["operators_not_active"] == 0
                                and figures["rpc_errors_measured"] == 0)
    return figures


def _measure(settings: _Settings) -> dict[str, Any]:
    """Starts the master, submits, plays the containers; returns the figures."""
    figures: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        state_dir = (stack.enter_context(tempfile.TemporaryDirectory(prefix="weir-bench-cp-"))
                     if settings.application_masters or settings.journal else None)
        master = stack.enter_context(master_process(
            settings.profile_path, settings.gc_path, state_dir=state_dir,
            application_masters=settings.application_masters))
        figures["master_idle_rss_mb"] = round(master.process.memory_info().rss / 2**20, 1)
        try:
            figures.update(asyncio.run(_drive(
                master, settings, state_dir if settings.application_masters else None)))
        except BaseException:
            _LOGGER.error("master stderr: %s", master.stderr_tail())
            raise
        figures["master_log_tail"] = master.stderr_tail(5)
    measured = figures.pop("_measured_epoch")
    profile_path, gc_path = settings.profile_path, settings.gc_path
    if profile_path and Path(profile_path).exists():
        figures["profile"] = _profile_top(profile_path, figures.get("heartbeats_answered", 0))
    if gc_path and Path(gc_path).exists() and Path(gc_path).stat().st_size:
        figures["master_gc"] = _gc_figures(gc_path, measured)
    return figures


_PER_APP = "; a master process per application (its figures: all of them)"


def _summary(figures: dict[str, Any]) -> str:
    f = figures
    lines = [
        f"control plane: {f['containers']} containers x {f['operators_per_container']} "
        f"operators ({f['operators']} operators, {f['applications']} applications), "
        f"a heartbeat every {f['interval_s']:g} s, measured {f['measured_s']:g} s after a "
        f"{f['warmup_s']:g} s warm-up{' (master under cProfile)' if f['profiled'] else ''}"
        f"{_PER_APP if f.get('application_masters') else ''}",
        f"  heartbeats    {f['heartbeats_sent']} sent, {f['heartbeats_measured']} measured: "
        f"{f['heartbeats_per_s']:g}/s of {f['target_heartbeats_per_s']:g}/s target; "
        f"errors {f['rpc_errors'] or 'none'}",
        f"  round trip    p50 {f['rtt_p50_ms']:g} ms, p99 {f['rtt_p99_ms']:g} ms, "
        f"max {f['rtt_max_ms']:g} ms, {f['rtts_over_100ms']} over 100 ms (send lag p99 "
        f"{f['send_lag_p99_ms']:g} ms, longest silence {f['max_heartbeat_gap_s']:g} s)",
        f"  master        {f['master_cpu_ms_per_heartbeat']:g} ms of CPU per heartbeat, "
        f"{f['master_cpu_percent']:g} % of one core, peak RSS "
        f"{f['master_peak_rss_mb']:g} MB (idle {f['master_idle_rss_mb']:g} MB, growing "
        f"{f['master_rss_growth_mb_per_min']:g} MB/min); its threads waited for a CPU "
        f"{f['master_runqueue_wait_percent']:g} % of the time",
        f"  generator     {f['generator_cpu_percent']:g} % of one core; the machine "
        f"({f['cpus']} cores) was busy {f['machine_busy_percent']:g} %, "
        f"{f['others_cpu_percent']:g} % of it other processes",
        f"  startup       submit {f['submit_s']:g} s; all deployed "
        f"{f['all_deployed_after_s'] if f['all_deployed_after_s'] is not None else 'NEVER'} "
        f"s after the first heartbeat",
        f"  false losses  {f['containers_not_active']} containers not ACTIVE "
        f"{f['container_states']}, {f['applications_not_running']} applications not RUNNING "
        f"{f['application_states']}, {f['aborts']} ABORT answers; "
        f"{f['operators_not_active']} operators not ACTIVE {f['operator_states']}",
        f"  targets       {'met' if f['meets_targets'] else 'NOT met'} "
        "(p99 < 100 ms, target rate, no false loss)",
    ]
    for generation, gc in f.get("master_gc", {}).items():
        lines.append(f"  master gc     {generation}: {gc['collections']} collections, pauses "
                     f"{gc['pause_total_ms']:g} ms in all, longest {gc['pause_max_ms']:g} ms")
    if f.get("killed_diagnostics"):
        lines.append(f"  killed because {f['killed_diagnostics']}")
    for row in f.get("profile", [])[:15]:
        lines.append(f"  profile  {row['tottime_us_per_heartbeat']:8.1f} us/hb own "
                     f"{row['cumtime_us_per_heartbeat']:9.1f} us/hb cum  {row['calls']:>9} "
                     f"calls  {row['function']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.control_plane``: runs once, prints the summary (or JSON)."""
    parser = argparse.ArgumentParser(prog="python -m bench.control_plane",
                                     description=__doc__)
    parser.add_argument("--containers", type=int, default=1000)
    parser.add_argument("--operators", type=int, default=10, help="operators per container")
    parser.add_argument("--interval", type=float, default=1.0, help="heartbeat interval, s")
    parser.add_argument("--duration", type=float, default=30.0,
                        help="heartbeating time, warm-up included, s")
    parser.add_argument("--warmup", type=float, default=5.0, help="excluded from figures, s")
    parser.add_argument("--containers-per-app", type=int, default=10,
                        help="containers of each submitted application")
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--profile", metavar="FILE",
                        help="run the master under cProfile, write its stats to FILE")
    parser.add_argument("--gc", action="store_true",
                        help="time the master's garbage collections (a gc callback)")
    parser.add_argument("--application-masters", action="store_true",
                        help="a dispatcher with a master process per application")
    parser.add_argument("--journal", action="store_true",
                        help="the master journals (--state-dir), as application masters do")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    figures = run(args.containers, args.operators, args.interval, args.duration,
                  warmup_s=args.warmup, containers_per_app=args.containers_per_app,
                  channels=args.channels, profile_path=args.profile,
                  gc_log=args.gc, application_masters=args.application_masters,
                  journal=args.journal)
    print(json.dumps(figures, indent=2) if args.json else _summary(figures))
    return 0 if figures["meets_targets"] else 1


if __name__ == "__main__":
    sys.exit(main())
