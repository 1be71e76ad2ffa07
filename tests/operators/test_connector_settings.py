"""Connector settings are the deployment's, never state: a checkpoint (so a savepoint)
holds no credential, and a restore keeps the new deployment's brokers, config and DSN.
No broker or database: the connectors are never set up."""

from __future__ import annotations

import cloudpickle
import pytest

from weir.operators.library import KafkaSink, KafkaSource, PostgresSink
from weir.operators.operator import Operator
from weir.runtime.operator_state import capture, restore

OLD, NEW = "old-secret-4711", "new-secret-0815"


def kafka_source(secret: str, servers: str = "old:9092") -> KafkaSource:
    return KafkaSource("orders", servers, config={"security.protocol": "SASL_SSL",
                                                  "sasl.password": secret})


def kafka_sink(secret: str, servers: str = "old:9092") -> KafkaSink:
    return KafkaSink("counts", servers, config={"sasl.password": secret})


def postgres_sink(secret: str, servers: str = "old") -> PostgresSink:
    return PostgresSink(f"host={servers} dbname=app password={secret}", "counts")


MAKERS = [kafka_source, kafka_sink, postgres_sink]


def settings(op: Operator) -> dict:
    names = ("dsn",) if isinstance(op, PostgresSink) else ("bootstrap_servers", "config")
    return {name: getattr(op, name) for name in names}


def count(op: Operator, value: int | None = None) -> int:
    """A counter of the operator's state: set to ``value`` if given."""
    name = "records_read" if isinstance(op, KafkaSource) else "windows_written"
    if value is not None:
        setattr(op, name, value)
    return getattr(op, name)


@pytest.mark.parametrize("make", MAKERS)
def test_a_checkpoint_holds_no_credential_but_the_deploy_payload_does(make):
    op = make(OLD)
    count(op, 7)
    data = capture(op)
    assert OLD.encode() not in data and count(restore(make(NEW), data)) == 7
    deployed = cloudpickle.loads(cloudpickle.dumps(op))  # the payload a container gets
    assert settings(deployed) == settings(op) and OLD in str(settings(deployed))


@pytest.mark.parametrize("make", MAKERS)
def test_a_restore_keeps_the_new_deployments_settings_and_takes_the_state(make):
    old = make(OLD)
    count(old, 7)
    new = make(NEW, "new:9092" if make is not postgres_sink else "new")
    expected = settings(new)
    restored = restore(new, capture(old))
    assert settings(restored) == expected and OLD not in str(vars(restored))
    assert count(restored) == 7


@pytest.mark.parametrize("make", MAKERS)
def test_a_checkpoint_taken_before_settings_left_the_state_does_not_restore_them(make):
    """Older checkpoints and savepoints still hold the settings: they are not restored."""
    old = make(OLD)
    saved = cloudpickle.dumps({"format": "weir-operator-state/1",
                               "class": type(old).__qualname__, "state": dict(vars(old))})
    assert OLD.encode() in saved
    restored = restore(make(NEW), saved)
    assert NEW in str(settings(restored)) and OLD not in str(vars(restored))
