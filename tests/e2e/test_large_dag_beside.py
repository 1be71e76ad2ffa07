"""A 10,000-operator DAG submitted to a master that runs another application (issue 51):
its planning holds no lock the running application's heartbeats wait on, so that
application loses no container (a heartbeat timeout of 3 s) and its totals are exact;
a DAG over MAX_OPERATORS is refused at once."""

from __future__ import annotations

import time

import pytest

from tests.e2e.conftest import container_logs
from tests.e2e.test_recovery import expected, final_totals, start, wait_finished
from tests.harness import poll_for
from tests.master.test_large_dags import chain
from weir.master.client import WeirClientError

pytestmark = pytest.mark.timeout(300)


def test_a_large_dag_beside_a_running_application_stops_nothing(master, tmp_path):
    client, app_id = start(master, tmp_path)
    with client:
        poll_for(lambda: client.application(app_id).committed_window_id >= 0, 90,
                 f"a first committed window\n{container_logs(master)}")
        with pytest.raises(WeirClientError, match="10,001 physical operators"):
            client.submit(chain(10_001, name="too-big"))
        started = time.monotonic()
        big = client.submit(chain(10_000, name="big"))
        print(f"a 10,000-operator DAG planned and accepted in {time.monotonic() - started:.1f} s")
        client.kill(big, "the test only plans it")
        assert len(client.operators(big)) == 10_000
        info = wait_finished(client, master, app_id)
        assert info.recoveries == 0, f"the running application lost a container: " \
                                     f"{info.last_recovery}"
        assert poll_for(lambda: client.application(big).state == "KILLED", 60,
                        "the large application to be killed")
    assert final_totals(tmp_path / "out") == expected()
