"""A real Spark standalone cluster for tests: one master and one worker on loopback.

Started from the PySpark distribution in the venv (``<pyspark>/bin/spark-class``), so the
tests exercise exactly the cluster code a user's ``spark://`` master runs, with nothing
installed by hand. Every process carries a test tag in its environment; stopping the
cluster checks that none of them (executors included) is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.harness import free_port, poll_for, tagged_env, tagged_processes

__all__ = ["SparkCluster", "standalone_cluster"]

_STOP_GRACE_S = 10.0


class SparkCluster:
    """A running standalone master and worker (see ``standalone_cluster``).

    Attributes:
        master_url: what ``SPARK_MASTER`` is set to (``spark://127.0.0.1:PORT``).
        web_url: the master's web UI, whose ``/json/`` lists workers and applications.
        work_dir: the worker's folder: one ``app-*`` folder per application it ran
            executors for, with the executors' logs.
        log_dir: the master's and the worker's own logs.
    """

    def __init__(self, master_url: str, web_url: str, work_dir: Path, log_dir: Path) -> None:
        self.master_url = master_url
        self.web_url = web_url
        self.work_dir = work_dir
        self.log_dir = log_dir

    def status(self) -> dict[str, Any]:
        """The master's JSON status: ``workers``, ``activeapps``, ``completedapps``..."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as response:
            return json.load(response)

    def applications(self) -> list[dict[str, Any]]:
        """Every application the master has seen, running or completed."""
        status = self.status()
        return [*status.get("activeapps", []), *status.get("completedapps", [])]

    def logs(self, tail: int = 4000) -> str:
        """The master's, the worker's and the executors' logs, for failure messages."""
        files = sorted(self.log_dir.glob("*.log")) + sorted(self.work_dir.glob("app-*/*/stderr"))
        return "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-tail:]}" for p in files)


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _registered(cluster: SparkCluster, procs: list[subprocess.Popen[bytes]]) -> bool:
    for proc in procs:
        if proc.poll() is not None:
            raise AssertionError(f"a Spark daemon exited with {proc.returncode} while "
                                 f"starting:\n{cluster.logs()}")
    try:
        return cluster.status().get("aliveworkers", 0) >= 1
    except (OSError, ValueError):  # the web UI is not up yet
        return False


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process group (executors live in the worker's), SIGKILL after a bound."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # also what the daemon left in its group
        proc.wait(timeout=10)


@contextlib.contextmanager
def standalone_cluster(folder: Path, *, cores: int = 1, memory: str = "1g",
                  timeout_s: float = 90.0) -> Iterator[SparkCluster]:
    """Starts a master and one worker on 127.0.0.1, waits until the worker registered,
    yields the cluster, then stops both and checks no process of theirs is left.

    Args:
        folder: where the logs, the worker's work folder and an empty Spark conf folder go.
        cores: cores the worker offers.
        memory: memory the worker offers to executors.
        timeout_s: bound on the start (two JVMs; seconds on a busy machine).
    """
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise AssertionError("a Spark cluster needs Java 17: java on PATH or JAVA_HOME")
    spark_home = _spark_home()
    log_dir, work_dir, conf_dir = folder / "logs", folder / "work", folder / "conf"
    for path in (log_dir, work_dir, conf_dir):
        path.mkdir(parents=True, exist_ok=True)
    port, web_port, worker_web_port = free_port(), free_port(), free_port()
    env, tag = tagged_env(
        SPARK_HOME=str(spark_home),
        SPARK_CONF_DIR=str(conf_dir),  # the user's spark-env.sh and defaults stay out
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_DAEMON_MEMORY="256m",
        # The REST submission server would take the fixed port 6066: not needed here.
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
    )
    spark_class = str(spark_home / "bin" / "spark-class")
    master_url = f"spark://127.0.0.1:{port}"
    commands = {
        "master": [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                   "--port", str(port), "--webui-port", str(web_port)],
        "worker": [spark_class, "org.apache.spark.deploy.worker.Worker", master_url,
                   "--host", "127.0.0.1", "--cores", str(cores), "--memory", memory,
                   "--webui-port", str(worker_web_port), "--work-dir", str(work_dir)],
    }
    cluster = SparkCluster(master_url, f"http://127.0.0.1:{web_port}", work_dir, log_dir)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, command in commands.items():
            with open(log_dir / f"{name}.log", "wb") as log:
                procs.append(subprocess.Popen(command, env=env, cwd=folder, stdout=log,
                                              stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL,
                                              start_new_session=True))
        try:
            poll_for(lambda: _registered(cluster, procs), timeout_s,
                     "the Spark worker to register with the master", interval_s=0.25)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{cluster.logs()}") from None
        yield cluster
    finally:
        _stop(procs)
        poll_for(lambda: not tagged_processes(tag), 15,
                 "every Spark daemon and executor to exit")
