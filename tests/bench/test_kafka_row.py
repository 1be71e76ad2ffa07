"""The Kafka row of ``make bench``, run small for real: a pre-filled topic through the job
(KafkaSource, the aggregation in Spark, KafkaSink) on a real broker, checked exactly."""

from __future__ import annotations

import pytest

from bench import kafka_job
from bench.common import JobSpec

pytestmark = pytest.mark.timeout(300)


def test_the_kafka_row_counts_every_event_exactly_and_names_its_broker(
        kafka_bootstrap, monkeypatch, tmp_path):
    monkeypatch.setenv(kafka_job.BOOTSTRAP_VARIABLE, kafka_bootstrap)
    spec = JobSpec(events=30_000, keys=200, batch_rows=10_000, window_ms=300)
    result = kafka_job.run(spec, app_window_count=2, timeout_s=240, work_dir=tmp_path)
    assert result.correct, result.detail
    assert result.detail == "200 keys, counts and sums exact"
    assert result.events_per_second > 0 and result.extra["application_windows"] >= 1
    assert result.extra["broker"] == kafka_bootstrap
