"""A DAG's attributes resolved: defaults, the DAG's own, overrides, and per operator.

Every value travels as text and is typed by ``operators.attributes``; here the layers meet
(``-D NAME=VALUE`` and ``-D <operator>.NAME=VALUE`` on top) and an override naming an
unknown operator or attribute is refused with the names that exist.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from weir.master.errors import PlanError
from weir.operators.attributes import (
    ATTRIBUTES,
    InvalidAttribute,
    Scope,
    check_together,
    parse_attributes,
    resolve,
)
from weir.proto import plan_pb2

__all__ = ["resolve_attributes"]


def _split_overrides(dag: plan_pb2.DagDescriptor, overrides: Mapping[str, str]
                     ) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Plain overrides and per-operator ones (``<operator>.<ATTR>``), checked."""
    names = [op.name for op in dag.operators]
    plain: dict[str, str] = {}
    per_operator: dict[str, dict[str, str]] = {name: {} for name in names}
    for key, value in overrides.items():
        if "." in key:
            operator, attribute = key.rsplit(".", 1)
            if operator not in per_operator:
                shown = names if len(names) <= 20 else [*names[:20], "..."]
                raise PlanError(f"attribute override {key!r} names unknown operator "
                                f"{operator!r}; the operators are {shown}")
            scope, target = Scope.OPERATOR, per_operator[operator]
        else:
            attribute, scope, target = key, Scope.BOTH, plain
        try:
            parse_attributes({attribute: value}, scope)
        except InvalidAttribute as exc:
            raise PlanError(f"attribute override {key[:200]}: {exc}") from None
        target[attribute] = str(value)
    return plain, per_operator


def resolve_attributes(dag: plan_pb2.DagDescriptor, overrides: Mapping[str, str]
                       ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Typed DAG attributes and each operator's typed context attributes.

    DAG attributes: defaults <- DAG <- plain overrides. Operator context attributes
    (every attribute): defaults <- DAG <- plain overrides <- the operator's own <-
    overrides named ``<operator>.<ATTR>``.

    Raises:
        PlanError: an override names an unknown attribute or operator, or has a bad value,
            or values do not fit together (``check_together``).
    """
    plain, per_operator = _split_overrides(dag, overrides)
    dag_layer = dict(dag.attributes)
    dag_attributes = {
        name: resolve(name, plain, dag_layer)
        for name, attribute in ATTRIBUTES.items() if attribute.scope & Scope.DAG
    }
    try:
        check_together(dag_attributes)
    except InvalidAttribute as exc:
        raise PlanError(str(exc)) from None
    operator_attributes = {}
    for op in dag.operators:
        own = dict(op.attributes)  # once per operator, not per attribute
        operator_attributes[op.name] = {
            name: resolve(name, per_operator[op.name], own, plain, dag_layer)
            for name in ATTRIBUTES}
    return dag_attributes, operator_attributes
