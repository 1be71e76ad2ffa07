"""What the README claims, read from the README itself, and the targets a run missed.

A missed target is listed at the end of ``make bench``'s output with the README's claim
beside the measured figure, so a run on a slower or busier machine says at once which
published figure it does not reproduce (the README is never copied into the bench: a
claim changed there is the claim compared here).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["README", "missed_targets", "readme_ratios"]

README = Path(__file__).resolve().parent.parent / "README.md"

_ROW = re.compile(r"^\|\s*(q\d+)\b[^|]*\|(.*)$")
_BOLD_RATIO = re.compile(r"\*\*([0-9.]+)×\*\*")


def readme_ratios(readme: Path = README) -> dict[str, str]:
    """Query -> the README's Weir ÷ Spark SS ratio from outside (its bold cell), e.g.
    ``{"q1": "1.33×"}``; empty when the README has no such table."""
    ratios: dict[str, str] = {}
    try:
        lines = readme.read_text(encoding="utf-8").splitlines()
    except OSError:
        return ratios
    for line in lines:
        row, bold = _ROW.match(line), _BOLD_RATIO.search(line)
        if row and bold and row.group(1) not in ratios:
            ratios[row.group(1)] = f"{bold.group(1)}×"
    return ratios


def _nexmark_missed(section: dict[str, Any], claims: dict[str, str]) -> list[str]:
    """Queries where Weir, from launch to its last result, was not ahead of Spark SS."""
    missed = []
    for query, results in section.get("queries", {}).items():
        by = {r.get("system"): r for r in results}
        weir, spark = by.get("weir"), by.get("spark-structured-streaming")
        key = "launch_to_last_result_s"
        if not (weir and spark and weir.get("correct") and spark.get("correct")
                and weir.get(key) and spark.get(key)):
            continue
        ratio = float(spark[key]) / float(weir[key])
        if ratio < 1.0:
            claim = claims.get(query)
            missed.append(f"nexmark {query}: Weir {ratio:.2f}x Spark SS from launch to last "
                          f"result ({float(weir[key]):.1f} s against {float(spark[key]):.1f} "
                          f"s; target: ahead) - README claims "
                          + (claim if claim else "no figure for it"))
    return missed


def _control_plane_missed(name: str, result: dict[str, Any]) -> list[str]:
    if result.get("meets_targets", True) or result.get("error"):
        return []
    return [f"{name}: round trip p99 {result.get('rtt_p99_ms')} ms, "
            f"{result.get('heartbeats_per_s')} of {result.get('target_heartbeats_per_s')} "
            "heartbeats/s answered (target: p99 < 100 ms, every heartbeat answered) - "
            "README claims no figure for it (docs/benchmarks.md has the measured ones)"]


def missed_targets(report: dict[str, Any], readme: Path = README) -> list[str]:
    """Every target ``report`` missed, each with the README's claim beside its figure
    (Weir behind Spark SS on a Nexmark query from outside; the control plane's p99 and
    rate)."""
    missed = _nexmark_missed(report.get("nexmark", {}), readme_ratios(readme))
    for key, name in (("control_plane", "control plane"),
                      ("control_plane_application_masters",
                       "control plane, a master per application")):
        if key in report:
            missed += _control_plane_missed(name, report[key])
    return missed
