"""The Nexmark job's settings and the three event kinds' schemas.

Why a spec object: every system runs in its own subprocess and must read exactly the
same files and check against the same answer; the spec (JSON on the command line) is
all they share.
"""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa

__all__ = ["AUCTION", "BID", "KINDS", "PERSON", "QUERIES", "SCHEMAS", "NexmarkSpec",
           "NOT_EXPRESSIBLE", "inputs_of"]

PERSON, AUCTION, BID = "person", "auction", "bid"
KINDS = (PERSON, AUCTION, BID)

QUERIES = ("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q9", "q11", "q18", "q19", "q20")
"""The queries run (each system runs those it can express: ``bench.nexmark.one``)."""

NOT_EXPRESSIBLE: dict[tuple[str, str], str] = {
    ("spark-structured-streaming", "q9"): "an aggregation after a stream-stream join "
    "with no window is not supported in append mode",
    ("flink", "q9"): "its SQL form (ROW_NUMBER over a regular join) sends updates, which the "
    "filesystem sink (the only offline one) cannot take",
    ("spark-structured-streaming", "q4"): "an aggregation after a stream-stream join "
    "with no window is not supported in append mode",
    ("flink", "q4"): "its SQL form (an average over a regular join's maxima) sends updates, "
    "which the filesystem sink (the only offline one) cannot take",
}
"""(system, query) pairs a system cannot run as its users write queries, and why: the
table shows the reason instead of a figure."""

_INPUTS = {"q3": (PERSON, AUCTION), "q4": (AUCTION, BID), "q8": (PERSON, AUCTION),
           "q9": (AUCTION, BID), "q20": (AUCTION, BID)}


def inputs_of(query: str) -> tuple[str, ...]:
    """The event kinds the query reads (most read only the bids)."""
    return _INPUTS.get(query, (BID,))


_TS = pa.timestamp("ms", tz="UTC")

SCHEMAS: dict[str, pa.Schema] = {
    PERSON: pa.schema([("id", pa.int64()), ("name", pa.string()),
                       ("email_address", pa.string()), ("credit_card", pa.string()),
                       ("city", pa.string()), ("state", pa.string()), ("date_time", _TS),
                       ("extra", pa.string())]),
    AUCTION: pa.schema([("id", pa.int64()), ("item_name", pa.string()),
                        ("description", pa.string()), ("initial_bid", pa.int64()),
                        ("reserve", pa.int64()), ("date_time", _TS), ("expires", _TS),
                        ("seller", pa.int64()), ("category", pa.int64()),
                        ("extra", pa.string())]),
    BID: pa.schema([("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
                    ("channel", pa.string()), ("url", pa.string()), ("date_time", _TS),
                    ("extra", pa.string())]),
}


@dataclasses.dataclass(frozen=True)
class NexmarkSpec:
    """The generated input and the queries' settings.

    Event ``i`` (0-based) is a person, an auction or a bid by ``i % 50`` (1:3:46, the
    spec's proportions) and is due at ``start_ms + i * 1000 // events_per_second`` of
    event time; a fraction ``out_of_order`` of the events is stamped 1..``max_disorder_ms``
    earlier, so no event is more than that behind an event before it in the files, and a
    watermark delay of ``max_disorder_ms`` makes no row late. ``events_per_file`` events
    (all kinds) make one file per kind: the files of index k of every kind hold the same
    range of event ids, so sources reading the same number of files per batch stay in
    step.
    """

    events: int = 1_000_000
    seed: int = 42
    events_per_second: int = 100_000  # of event time: 10 s windows hold 1 M events
    start_ms: int = 1_795_000_000_000  # whole 10 s
    out_of_order: float = 0.05
    max_disorder_ms: int = 2_000
    events_per_file: int = 100_000
    window_ms: int = 10_000  # q5 (size), q7, q8, q19
    slide_ms: int = 2_000  # q5
    session_gap_ms: int = 10_000  # q11
    q2_modulo: int = 123
    category: int = 10  # q3, q20: the auctions' category kept
    q3_states: tuple[str, ...] = ("OR", "ID", "CA")  # q3: the sellers' states kept
    top_n: int = 10  # q19: bids kept per auction and window

    @property
    def watermark_delay_ms(self) -> int:
        """How far each system's watermark trails the highest event time seen."""
        return self.max_disorder_ms

    @property
    def files(self) -> int:
        return -(-self.events // self.events_per_file)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> NexmarkSpec:
        fields = json.loads(text)
        if "q3_states" in fields:
            fields["q3_states"] = tuple(fields["q3_states"])
        return cls(**fields)
