"""Shared fixtures: Spark kept small, every process started by a test stopped by it."""

from __future__ import annotations

import atexit
import collections
import logging
import os
import shutil
import sys
import tempfile
import time

import pytest

from tests.spark_jvm import SparkJvmOptions

# PySpark logs a failed query's context through loggers of its own class that do not
# propagate; pytest attaches its capture handler to every non-propagating logger, and that
# class's addHandler swaps the handler's formatter for JSON, so every later test's caplog
# would read JSON. Made first here as plain loggers, PySpark takes them as they are.
for _name in ("DataFrameQueryContextLogger", "SQLQueryContextLogger"):
    logging.getLogger(_name)

# Spark's Python workers must run this interpreter (it has pyarrow); tests keep Spark small.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

# Masters write their secret files here, not in ~/.weir; `weir` subprocesses and WeirClient
# find them there. A secret or TLS setting of the shell must not leak into the tests.
_WEIR_HOME = tempfile.mkdtemp(prefix="weir-test-home-")
os.environ["WEIR_HOME"] = _WEIR_HOME
atexit.register(shutil.rmtree, _WEIR_HOME, ignore_errors=True)
for _name in ("WEIR_SECRET", "WEIR_TLS_CERT", "WEIR_TLS_KEY", "WEIR_TLS_CA"):
    os.environ.pop(_name, None)


_TIMED: dict[str, dict[str, float]] = collections.defaultdict(dict)
_SPARK_STARTS: list[float] = []  # seconds the local runner's SparkSession took to start
_SPARK_SEEN: list[float] = []  # those seconds as the timed tests' reports said them
_STARTED = pytest.StashKey[tuple[float, float]]()


_SPARK_JVMS = SparkJvmOptions()  # SPARK_SUBMIT_OPTS for the session (tests/spark_jvm.py)


def pytest_configure(config):
    config.addinivalue_line("markers", "timed(group[, label]): print the test's duration "
                            "(setup, call and teardown) beside the others of its group at the "
                            "end of the run; without a label, a run_dag test's driver names it")
    config.addinivalue_line("markers", "processes: runs real masters, containers or "
                            "clusters (left out by `make test-fast`)")
    config.addinivalue_line("markers", "slow: takes seconds on its own (a broker's timeout, "
                            "a JVM, the docs' samples; left out by `make test-fast`)")
    _SPARK_JVMS.start()


def pytest_collection_modifyitems(config, items):
    """``processes``: the tests that run real masters and containers (``tests/e2e``, a
    ``run_dag`` test's containers driver, the Ray and Kubernetes launchers' own);
    ``make test-fast`` leaves them out, ``make test`` runs everything."""
    processes = pytest.mark.processes
    for item in items:
        path = item.path.as_posix()
        driver = getattr(item, "callspec", None) and item.callspec.params.get("run_dag")
        if "/tests/e2e/" in path or driver == "containers" or any(
                name in path for name in _PROCESS_MODULES):
            item.add_marker(processes)


_PROCESS_MODULES = ("test_ray_launcher", "test_kubernetes_api", "test_kubernetes_launcher",
                    "/tests/bench/")


def pytest_unconfigure(config):
    _SPARK_JVMS.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Notes when a test marked ``timed`` starts (``pytest_runtest_makereport`` ends it)."""
    item.stash[_STARTED] = (time.perf_counter(), sum(_SPARK_STARTS))
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Times tests marked ``timed`` (measured and printed, never asserted), setup to
    teardown, less the once-per-process start of the local runner's SparkSession (printed
    apart). The figure travels in the teardown report, so a run split over worker
    processes (pytest-xdist) prints it too."""
    outcome = yield
    marker = item.get_closest_marker("timed")
    if marker is None or call.when != "teardown" or _STARTED not in item.stash:
        return
    started, spark_before = item.stash[_STARTED]
    spark_start = sum(_SPARK_STARTS) - spark_before
    group, *named = marker.args  # without a label: the driver of a ``run_dag`` test
    label = named[0] if named else _driver_label(item)
    outcome.get_result().user_properties.append(
        ("weir_timed", (group, label, time.perf_counter() - started - spark_start,
                        sum(_SPARK_STARTS))))


def _driver_label(item) -> str:
    driver = getattr(item, "callspec", None) and item.callspec.params.get("run_dag")
    return {"local": "local runner", "containers": "real processes"}.get(driver, item.name)


def pytest_runtest_logreport(report):
    for name, value in report.user_properties:
        if name == "weir_timed":
            group, label, seconds, spark_started = value
            _TIMED[group][label] = seconds
            _SPARK_SEEN.append(spark_started)


def pytest_terminal_summary(terminalreporter):
    """One line per group: each test's seconds (by label), and the first over the second;
    then how Spark's JVMs were started."""
    if _SPARK_JVMS.note:
        terminalreporter.write_line(_SPARK_JVMS.note)
    for group, by_label in _TIMED.items():
        seconds = dict(sorted(by_label.items()))
        parts = [f"{label} {s:.1f} s" for label, s in seconds.items()]
        values = list(seconds.values())
        ratio = f" ({values[0] / values[1]:.2f}x)" if len(values) == 2 and values[1] else ""
        terminalreporter.write_line(f"{group}: {', '.join(parts)}{ratio}")
    if _TIMED and _SPARK_SEEN:
        started = max(_SPARK_SEEN)
        terminalreporter.write_line(
            f"(the local runner's SparkSession started and warmed up once in this process in "
            f"{started:.1f} s, before the tests that use it: not counted above)"
            if started >= 0.1 else "(the local runner's SparkSession was already up: earlier "
            "tests in this process started it)")


@pytest.fixture(scope="session")
def local_spark():
    """The local runner's shared Spark bridge (``runtime.spark.shared``), started and
    warmed up once per test process, as a test suite of an application would."""
    from weir.runtime.spark.shared import shared_bridge

    started = time.perf_counter()
    bridge = shared_bridge("local[1]")
    bridge.warm_up()
    _SPARK_STARTS.append(time.perf_counter() - started)
    return bridge


@pytest.fixture
def state_dir(tmp_path):
    path = tmp_path / "state"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def bridge():
    """One small Spark session (``local[1]``, one shuffle partition) for all unit tests."""
    from weir.runtime.spark.bridge import SparkSessionBridge

    bridge = SparkSessionBridge(master="local[1]", shuffle_partitions=1)
    yield bridge
    bridge.stop()


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    """A real Spark standalone master and worker on loopback (``tests/spark_cluster.py``):
    1 core, 1 GB for executors, shared by a module's tests (starting one takes seconds);
    stopped, with nothing left, after them."""
    from tests.spark_cluster import standalone_cluster

    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def postgres_dsn():
    """A DSN to a real PostgreSQL server for the session (``tests/postgres.py``)."""
    from tests.postgres import postgres_dsn_for_session

    yield from postgres_dsn_for_session()


@pytest.fixture(scope="session")
def s3_server():
    """An S3-protocol server for the session (``tests/s3_server.py``: moto's server mode)."""
    from tests.s3_server import s3_server_for_session

    yield from s3_server_for_session()


@pytest.fixture(scope="session")
def kafka_bootstrap():
    """A real Kafka-protocol broker's bootstrap address for the session
    (``tests/kafka_broker.py``)."""
    from tests.kafka_broker import broker_for_session

    yield from broker_for_session()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory):
    """A user's own certificate: self-signed for 127.0.0.1 and localhost (checked by host,
    not pinned by name), and its key (PEM paths)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256()))
    folder = tmp_path_factory.mktemp("tls")
    cert, key_file = folder / "cert.pem", folder / "key.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert, key_file


@pytest.fixture
def shared_dir():
    """A world-writable folder (as /tmp is), where another local user can make things:
    ``tests.users.as_other_user`` acts there as ``nobody``. Removed afterwards."""
    import shutil
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp(prefix="weir-shared-", dir="/tmp"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A master with real container processes, shared by a module's ``run_dag`` runs (each
    application gets containers of its own); stopped after the module, so that no other
    test finds a second master of this user."""
    from tests.drivers import started_cluster

    with started_cluster(tmp_path_factory.mktemp("cluster")) as master:
        yield master


class _Driver:
    """``run_dag(dag)``: the DAG run to its end by one driver (``tests/drivers.py``)."""

    def __init__(self, driver: str, request, tmp_path) -> None:
        self.driver = driver
        self._request = request
        self._state_dirs = (tmp_path / f"state-{i}" for i in range(1_000))

    def __call__(self, dag, *, during=None):
        """``during(client, app_id)``: what the test samples from the master while the
        application runs (containers only: the local runner has no master)."""
        from tests.drivers import run_here, run_in_containers

        if self.driver == "local":
            return run_here(dag)
        master = self._request.getfixturevalue("cluster")
        return run_in_containers(master, dag, next(self._state_dirs), during)


@pytest.fixture(params=["local", "containers"])
def run_dag(request, tmp_path):
    """Runs a DAG to its end through each driver of the window engine in turn: the local
    runner, then a real master and container processes; a difference between the two
    fails the test."""
    return _Driver(request.param, request, tmp_path)
