"""Ctrl-C while a container warms Spark up: one log line, no Java or py4j traceback.

A child process plays the container: an operator thread warms the bridge up while the
main thread waits, as the heartbeat loop does; SIGINT raises KeyboardInterrupt in the
main thread, which stops the bridge (as ``container.main`` does on the way out). Spark
runs: run these under the e2e lock.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.harness import ROOT

pytestmark = pytest.mark.timeout(180)

CONTAINER = textwrap.dedent("""
    import logging, signal, sys, threading, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started ignoring it
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    from weir.runtime.spark.bridge import SparkSessionBridge

    bridge = SparkSessionBridge(master="local[1]", shuffle_partitions=1,
                                warmup_rows=2_000_000)
    create, to_arrow = bridge._create_session, bridge.to_arrow

    def creating():
        print("JVM", flush=True)
        return create()

    def job(df):
        print("JOB", flush=True)
        return to_arrow(df)

    bridge._create_session, bridge.to_arrow = creating, job
    warm_up = threading.Thread(target=bridge.warm_up, name="operator-sql", daemon=True)
    warm_up.start()
    try:
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        logging.getLogger("weir.container").info("interrupted")
    finally:
        bridge.stop()
        warm_up.join(30)  # to see how the warm-up ends; a container does not wait for it
    logging.getLogger("weir.container").info("exits")
""")


def interrupt_at(marker: str) -> tuple[int, str]:
    """Runs the child until it prints ``marker``, sends SIGINT; returns its code and stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable}
    child = subprocess.Popen([sys.executable, "-c", CONTAINER], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        seen = ""
        while marker not in seen.split():
            assert time.monotonic() < deadline, f"no {marker} within 90 s: {seen!r}"
            ready, _, _ = select.select([child.stdout], [], [], 1.0)
            if ready:
                line = child.stdout.readline()
                assert line, f"the child ended before {marker}: {child.communicate()[1]}"
                seen += line
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
        return child.returncode, err
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)  # the child and its JVM
            child.wait(10)


@pytest.mark.slow
@pytest.mark.parametrize("marker", ["JVM", "JOB"])
def test_ctrl_c_during_the_warm_up_prints_no_traceback(marker):
    code, err = interrupt_at(marker)
    assert code == 0, err
    assert "INFO weir.container: interrupted" in err and "INFO weir.container: exits" in err, err
    interrupted = [line for line in err.splitlines()
                   if "Spark warm-up interrupted: the container is stopping" in line]
    assert len(interrupted) == 1, err
    bad = [line for line in err.splitlines() if line not in interrupted and (
        "Traceback" in line or "py4j.protocol" in line or "Py4J" in line or "ERROR" in line
        or line.lstrip().startswith(("at ", "Caused by")) or "Exception" in line)]
    assert not bad, err
