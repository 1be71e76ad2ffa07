"""The Prometheus collector: the known application's figures, parsed back by the official
parser."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.master.monitoring import WINDOWS, monitored_core
from weir.master.metrics import master_registry

pytestmark = pytest.mark.timeout(30)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: dict, name: str, **labels: str) -> float:
    matches = [v for (n, ls), v in found.items()
               if n == name and all((k, v) in ls for k, v in labels.items())]
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]


def test_scrape_has_labelled_figures_of_apps_operators_ports_and_containers():
    core, app_id = monitored_core()
    found = samples(generate_latest(master_registry(core)).decode())
    assert value(found, "weir_application_state", app=app_id, state="RUNNING") == 1
    assert value(found, "weir_application_tuples_processed_total", app=app_id) == WINDOWS * 150
    assert value(found, "weir_application_latency_seconds", app=app_id) == pytest.approx(0.05)
    assert value(found, "weir_operator_tuples_emitted_total", app=app_id,
                 operator="source") == WINDOWS * 100
    assert round(value(found, "weir_operator_tuples_emitted_per_second", app=app_id,
                       operator="source")) == 200
    assert value(found, "weir_operator_latency_seconds", operator="relay1") == pytest.approx(0.02)
    assert value(found, "weir_operator_current_window", operator="sink") == WINDOWS - 1
    assert value(found, "weir_operator_committed_window", operator="sink") == -1
    assert value(found, "weir_operator_user_metric", operator="relay1",
                 metric="dropped") == 50.0 * WINDOWS
    assert round(value(found, "weir_port_buffer_server_bytes_per_second", operator="relay1",
                       type="output")) == 800
    assert value(found, "weir_port_queue_size", operator="sink", port="input") == 0
    container = f"{app_id}-c0"
    assert value(found, "weir_container_state", container=container, state="ACTIVE") == 1
    assert value(found, "weir_container_memory_rss_bytes", container=container,
                 host="testhost") == 123 * 1024 * 1024
    assert value(found, "weir_container_gc_collections_total", container=container) == 3
    assert any(name.startswith("process_") for name, _ in found)  # the master's own


def test_a_killed_container_keeps_its_state_but_no_stale_figures():
    core, app_id = monitored_core()
    core.kill_container(f"{app_id}-c0")
    found = samples(generate_latest(master_registry(core)).decode())
    container = f"{app_id}-c0"
    assert value(found, "weir_container_state", container=container, state="KILLED") == 1
    assert not [n for n, ls in found if n == "weir_container_cpu_percent"
                and ("container", container) in ls]
