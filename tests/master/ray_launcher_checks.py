"""Checks of the Ray launcher on a real three-node Ray cluster, without a master or Spark,
run by ``test_ray_launcher.py`` in a pytest process of their own: a container is a
process its actor holds (and dies with it), a request no node can meet is refused, one
that must wait for room says so, an ended container's log is kept, a restarted master
adopts its actors, and kill and stop_all leave nothing behind."""

from __future__ import annotations

import queue
import sys

import psutil
import pytest

from tests.harness import poll_for
from tests.ray_cluster import WORKER_CPUS, ray_cluster  # noqa: F401 - the fixture
from weir.master.launcher import Resources, UnplaceableRequest
from weir.proto.contract import SECRET_ENV

pytestmark = pytest.mark.timeout(240)

# Stands in for `python -m weir.container`: says what it was given (the secret through its
# standard input, none in its environment), waits (or exits 3).
FAKE_CONTAINER = """
import json, os, sys, time
from weir.container.parent_death import die_with_parent
piped = json.loads(sys.stdin.read()) if "--secret-stdin" in sys.argv else {}
print("SECRET", piped.get("secret"), "IN ENV", os.environ.get("WEIR_SECRET"),
      "ID", os.environ.get("WEIR_CONTAINER_ID"), "PARENT", os.environ.get("WEIR_PARENT_PID"),
      flush=True)
assert die_with_parent()  # as the container does
if sys.argv[sys.argv.index("--id") + 1].endswith("x3"):
    sys.exit(3)
time.sleep(120)
"""


@pytest.fixture
def launcher(ray_cluster, tmp_path):  # noqa: F811 - the fixture
    import ray

    from weir.master.ray_launcher import RayLauncher

    script = tmp_path / "fake_container.py"
    script.write_text(FAKE_CONTAINER)
    made = RayLauncher("127.0.0.1:5151", address=ray_cluster.address,
                       command=[sys.executable, str(script)])
    made.set_credentials({SECRET_ENV: "s3cret"})
    try:
        yield made
    finally:
        made.stop_all(grace_s=1.0)
        ray.shutdown()


def _container_processes(container_id: str) -> list[psutil.Process]:
    """The live fake container processes of ``container_id``, wherever Ray runs them."""
    found = []
    for proc in psutil.process_iter(["cmdline", "environ", "status"]):
        info = proc.info
        if (info["status"] != psutil.STATUS_ZOMBIE
                and "fake_container.py" in " ".join(info["cmdline"] or [])
                and (info["environ"] or {}).get("WEIR_CONTAINER_ID") == container_id):
            found.append(proc)
    return found


def _log(launcher, container_id):
    return launcher.log(container_id, 4096)[0].decode()


def test_containers_in_actors_placed_by_their_requests(launcher, ray_cluster):  # noqa: F811
    told: queue.Queue[str] = queue.Queue()
    launcher.on_exit = told.put
    with pytest.raises(UnplaceableRequest, match="CONTAINER_CORES=3"):
        launcher.check_request(Resources(cores=WORKER_CPUS + 1))
    launcher.check_request(Resources(cores=WORKER_CPUS, memory_mb=64))
    for cid in ("c0", "c1"):  # a whole worker each
        launcher.launch(cid, Resources(cores=WORKER_CPUS))
    for cid in ("c0", "c1"):
        poll_for(lambda c=cid: "SECRET s3cret IN ENV None" in _log(launcher, c), 60,
                 f"{cid} to start")
    assert "ID c0" in _log(launcher, "c0") and launcher.waiting("c0") == ""
    launcher.launch("c2", Resources(cores=1))  # no room left
    assert "pending" in launcher.waiting("c2")
    # the container dies with its actor: no orphan process, no JVM left behind
    assert _container_processes("c0")
    launcher.kill("c0")
    assert told.get(timeout=60) == "c0" and launcher.exit_code("c0") == -9
    poll_for(lambda: not _container_processes("c0"), 30, "the killed actor's container to end")
    poll_for(lambda: launcher.waiting("c2") == "", 60, "c2 to be placed in the room c0 left")
    launcher.launch("x3")  # no request: it exits 3 by itself
    poll_for(lambda: launcher.exit_code("x3") is not None, 60, "x3 to end")
    assert launcher.exit_code("x3") == 3
    assert "ID x3" in _log(launcher, "x3")  # kept once its actor is released
    with pytest.raises(KeyError):
        launcher.log("nope", 10)
    # a restarted master (the same secret, so the same tag) finds its actors again
    from weir.master.ray_launcher import RayLauncher

    again = RayLauncher("127.0.0.1:5151", address=ray_cluster.address)
    try:
        again.set_credentials(launcher.credential_env)
        assert again.tag == launcher.tag
        again.adopt("c1", 0, "")  # alive
        again.adopt("c0", 0, "")  # killed above: its actor is gone
        poll_for(lambda: again.exit_code("c0") == -9, 30, "c0 known as ended")
        poll_for(lambda: "ID c1" in (_log(again, "c1") if "c1" in again._held else ""), 30,
                 "c1 adopted")
        again.kill("c1")
        poll_for(lambda: launcher.exit_code("c1") == -9, 60, "the adopted c1 killed")
    finally:
        again.stop_all(grace_s=1.0)
