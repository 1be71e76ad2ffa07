"""Keyed state on local disk, so a window's cost follows the keys it touches, not history.

A ``KeyedStore`` is one sqlite file (WAL mode) under an operator's ``state_dir``: a table
``state(key, value, updated_window)`` and an undo log ``changes`` of every window's old
values. The operator's checkpoint holds only a ``StoreHandle`` (the file and the last
applied window); the data never travels through a checkpoint.

Exactly once with Weir's checkpoints: each window's changes are one sqlite transaction,
committed at the window's end (``apply``), and fsynced at each checkpoint (``sync``, from
the operator's ``checkpointed``). A recovered operator calls ``restore_to(checkpoint
window)``, which undoes every later window from the undo log, so a process crash
anywhere (between two windows' commits, between a commit and the next checkpoint) costs
nothing: a commit survives a kill, and the windows after the checkpoint are replayed onto
exactly the checkpoint's state. Only a machine crash between a checkpoint's save and its
``sync`` can leave the store behind the checkpoint; ``applied`` then says so and the
operator refuses to guess. ``committed`` drops the undo log up to the committed window,
which is never replayed.

>>> import tempfile, os
>>> store = KeyedStore(os.path.join(tempfile.mkdtemp(), "s.sqlite"))
>>> store.apply(1, ["a", "b"], [2, 3])
(['a', 'b'], [2, 3])
>>> sorted(zip(*store.apply(2, ["a"], [5])))
[('a', 7)]
>>> store.restore_to(1); store.get("a")
2
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from weir.operators.free_memory import release_free_memory
from weir.operators.sqlite_batches import insert_rows, sorted_keys

__all__ = ["KeyedStore", "StoreError", "StoreHandle", "StoreSeed"]

_LOGGER = logging.getLogger(__name__)

_CHUNK = 100_000
_TRIM_EVERY = 8
"""Windows between two returns of freed heap to the OS (``release_free_memory``)."""
_FETCH_CHUNK = 30_000  # keys per ``IN (...)`` list of ``fetch``
_SCHEMA = """
CREATE TABLE IF NOT EXISTS state (key PRIMARY KEY NOT NULL, value INTEGER NOT NULL,
                                  updated_window INTEGER) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS changes (seq INTEGER PRIMARY KEY, window_id INTEGER NOT NULL,
                                    key NOT NULL, old_value INTEGER, old_updated INTEGER);
CREATE TABLE IF NOT EXISTS windows (window_id INTEGER PRIMARY KEY, first_seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TEMP TABLE IF NOT EXISTS delta (key NOT NULL, d INTEGER NOT NULL);
CREATE TEMP TABLE IF NOT EXISTS undo (key NOT NULL, old_value INTEGER, old_updated INTEGER);
CREATE TEMP TABLE IF NOT EXISTS puts (key NOT NULL, value, expires INTEGER NOT NULL);
"""
# the state as of window ? (the first parameter twice): every key's value before the
# first change after it, else its value now
_AS_OF = """
SELECT key, value, updated_window FROM state
 WHERE key NOT IN (SELECT key FROM changes WHERE seq >= :first)
UNION ALL
SELECT key, old_value, old_updated FROM changes
 WHERE seq IN (SELECT MIN(seq) FROM changes WHERE seq >= :first GROUP BY key)
   AND old_value IS NOT NULL
"""


class StoreError(RuntimeError):
    """The store cannot give the state a checkpoint needs; says which file and why."""


@dataclasses.dataclass(frozen=True)
class StoreSeed:
    """Where a partition made by a repartition takes its keys from: the old partitions'
    stores, each as of the window its checkpoint had applied, cut to ``share`` (a
    ``PartitionFilter`` as JSON; None: every key)."""

    sources: tuple[tuple[str, int], ...]
    share: dict[str, Any] | None


@dataclasses.dataclass(frozen=True)
class StoreHandle:
    """What an operator's checkpoint holds of its store: small, whatever the state's size."""

    path: str
    applied: int = -1
    seed: StoreSeed | None = None


class KeyedStore:
    """A durable key -> value store with a per-window undo log (see the module docs):
    integer totals a window adds to (``apply``), or values a window sets (``put``).

    Without a TTL, ``updated_window`` stays NULL (smaller rows, fewer pages to write).

    Args:
        path: the sqlite file (its folder must exist; local disk: sqlite locks and fsyncs).
        ttl_windows: drop keys not updated for this many streaming windows (None: keep
            all). Expiry runs inside ``apply``, keyed by window id, so a replay expires
            exactly the same keys; the deletions are in the undo log like any change.
        cache_mib: sqlite's page cache: the store's share of the process's memory.
    """

    def __init__(self, path: str, ttl_windows: int | None = None, cache_mib: int = 32) -> None:
        self.path = path
        self.ttl_windows = ttl_windows
        self._untrimmed = 0
        self._added = 0  # keys the window being applied added (less those it dropped)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # durable at ``sync`` (checkpoints)
        # fewer, larger WAL checkpoints: each fsyncs, and a window at millions of keys
        # dirties thousands of pages (the WAL stays under ~40 MB)
        self._db.execute("PRAGMA wal_autocheckpoint=10000")
        self._db.execute(f"PRAGMA cache_size=-{int(cache_mib) * 1024}")
        self._db.execute("PRAGMA temp_store=MEMORY")
        self._db.executescript(_SCHEMA)
        if ttl_windows is not None:
            self._db.execute("CREATE INDEX IF NOT EXISTS state_updated ON state(updated_window)")

    # -- meta ------------------------------------------------------------------------
    def _meta(self, name: str, default: int) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return default if row is None else int(row[0])

    def _set_meta(self, name: str, value: int) -> None:
        self._db.execute("INSERT INTO meta(name, value) VALUES (?, ?) ON CONFLICT(name) "
                         "DO UPDATE SET value = excluded.value", (name, value))

    @property
    def applied(self) -> int:
        """The last window applied (-1: none)."""
        return self._meta("applied", -1)

    @property
    def keys(self) -> int:
        """How many keys it holds (kept as a count: no scan)."""
        return self._meta("keys", 0)

    @property
    def seeded(self) -> bool:
        """Whether ``seed_from`` filled it already (a retried seed must not add twice)."""
        return bool(self._meta("seeded", 0))

    def get(self, key: Any) -> int | None:
        row = self._db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def items(self) -> list[tuple[Any, int]]:
        """Every key and value (for tests and small stores)."""
        return [(k, int(v)) for k, v in self._db.execute("SELECT key, value FROM state")]

    # -- windows ---------------------------------------------------------------------
    def apply(self, window_id: int, keys: Sequence[Any],
              deltas: Sequence[int]) -> tuple[list[Any], list[int]]:
        """Adds ``deltas`` to ``keys``' values (absent keys start at 0) in one committed
        transaction, the old values logged first; returns the keys and their new values
        (in no particular order).

        Raises:
            StoreError: ``window_id`` is not after the last applied window.
        """
        db = self._db
        with self._window(window_id) as first:
            db.execute("DELETE FROM temp.delta")
            db.executemany("INSERT INTO temp.delta(key, d) VALUES (?, ?)", zip(keys, deltas,
                                                                              strict=True))
            db.execute("INSERT INTO changes(window_id, key, old_value, old_updated) "
                       "SELECT ?, d.key, s.value, s.updated_window FROM temp.delta d "
                       "LEFT JOIN state s ON s.key = d.key", (window_id,))
            self._added += db.execute(
                "SELECT COUNT(*) FROM changes WHERE seq >= ? AND window_id = ? "
                "AND old_value IS NULL", (first, window_id)).fetchone()[0]
            rows = db.execute(
                "INSERT INTO state(key, value, updated_window) SELECT key, d, ? FROM "
                "temp.delta WHERE true ON CONFLICT(key) DO UPDATE SET value = value + "
                "excluded.value, updated_window = excluded.updated_window RETURNING key, value",
                (None if self.ttl_windows is None else window_id,)).fetchall()
        return [r[0] for r in rows], [r[1] for r in rows]

    def put(self, window_id: int, items: Iterable[tuple[Any, Any, bool]]) -> None:
        """Sets (or, for a None value, deletes) keys' values in one committed transaction,
        the old values logged first, like ``apply``. Each item is ``(key, value, expires)``;
        a row put with ``expires`` False is never dropped by the TTL. A key at most once.

        Raises:
            StoreError: ``window_id`` is not after the last applied window.
        """
        db = self._db
        stamp = None if self.ttl_windows is None else window_id
        with self._window(window_id):
            db.execute("DELETE FROM temp.puts")  # a heap, no key: filled in the items' order
            insert_rows(db, "temp.puts(key, value, expires)", 3, items)
            mark = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM changes").fetchone()[0]
            db.execute("INSERT INTO changes(window_id, key, old_value, old_updated) "
                       "SELECT ?, p.key, s.value, s.updated_window FROM temp.puts p "
                       "LEFT JOIN state s ON s.key = p.key", (window_id,))
            # keys counted from the undo log just written (no second lookup per key): the
            # absent ones, less the deletions of absent keys, less the keys deleted
            absent = db.execute("SELECT COUNT(*) FROM changes WHERE seq >= ? AND old_value "
                                "IS NULL", (mark,)).fetchone()[0]
            deletions = db.execute("SELECT COUNT(*) FROM temp.puts WHERE value IS NULL"
                                   ).fetchone()[0]
            deleted = db.execute("DELETE FROM state WHERE key IN (SELECT key FROM temp.puts "
                                 "WHERE value IS NULL)").rowcount
            self._added += absent - (deletions - deleted) - deleted
            db.execute("INSERT INTO state(key, value, updated_window) SELECT key, value, "
                       "CASE WHEN expires THEN ? END FROM temp.puts WHERE value IS NOT NULL "
                       "ON CONFLICT(key) DO UPDATE SET value = excluded.value, "
                       "updated_window = excluded.updated_window", (stamp,))

    @contextlib.contextmanager
    def _window(self, window_id: int) -> Iterator[int]:
        """One window's transaction: opens it, expires keys past the TTL, yields the
        window's first undo-log sequence number; commits with the window applied and the
        key count moved by what the body added to ``_added``, or rolls back."""
        applied = self.applied
        if window_id <= applied:
            raise StoreError(f"{self.path}: window {window_id} is not after the last applied "
                             f"window {applied}; restore_to a checkpoint before a replay")
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            first = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM changes").fetchone()[0]
            db.execute("INSERT INTO windows(window_id, first_seq) VALUES (?, ?)",
                       (window_id, first))
            self._added = -self._expire(window_id)
            yield first
            self._set_meta("applied", window_id)
            self._set_meta("keys", self.keys + self._added)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._untrimmed += 1
        if self._untrimmed >= _TRIM_EVERY:
            self._untrimmed = 0
            release_free_memory()

    def rewrite(self, items: Iterable[tuple[Any, Any]]) -> None:
        """Replaces (or, for None, deletes) stored values in place, outside any window and
        its undo log: for finishing a seed (a new partition cutting what it copied)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            gone = 0
            for key, value in items:
                if value is None:
                    gone += db.execute("DELETE FROM state WHERE key = ?", (key,)).rowcount
                else:
                    db.execute("UPDATE state SET value = ? WHERE key = ?", (value, key))
            self._set_meta("keys", self.keys - gone)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def fetch(self, keys: Iterable[Any], window_id: int | None = None) -> dict[Any, Any]:
        """The values of those of ``keys`` it holds, as stored; with ``window_id``, without
        the keys that window's ``put`` will expire first (past the TTL). Asked in sorted
        chunks of ``IN (...)`` lists, in one read transaction: measured on 290,000 keys,
        0.58 s where a temporary table of them took 0.97."""
        db = self._db
        asked = sorted_keys(keys)
        size = min(_FETCH_CHUNK, db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))
        alive = "" if window_id is None or self.ttl_windows is None else \
            f" AND (updated_window IS NULL OR updated_window > {int(window_id - self.ttl_windows)})"
        own = not db.in_transaction
        if own:
            db.execute("BEGIN")
        try:
            found: dict[Any, Any] = {}
            for at in range(0, len(asked), size):
                chunk = asked[at:at + size]
                found.update(db.execute(
                    f"SELECT key, value FROM state WHERE key IN ({','.join('?' * len(chunk))})"
                    f"{alive}", chunk))
            return found
        finally:
            if own:
                db.execute("COMMIT")

    def scan(self, low: Any, high: Any) -> list[tuple[Any, Any]]:
        """Every key in ``[low, high)`` (SQLite's order: by type, then value) and its
        value, in key order: a range of the primary key, read without a table scan."""
        return self._db.execute("SELECT key, value FROM state WHERE key >= ? AND key < ? "
                                "ORDER BY key", (low, high)).fetchall()

    def keys_through(self, low: Any, high: Any, bound: int) -> list[Any]:
        """The keys in ``[low, high)`` whose (integer) value is at most ``bound``, in key
        order: one pass over the range inside sqlite, for an operator that ages its keys
        by the value it stored (``Deduplicate``'s first event times)."""
        return [key for (key,) in self._db.execute(
            "SELECT key FROM state WHERE key >= ? AND key < ? AND value <= ? ORDER BY key",
            (low, high, bound))]

    def _expire(self, window_id: int) -> int:
        """Drops (and logs) keys last updated ``ttl_windows`` or more windows before."""
        if self.ttl_windows is None:
            return 0
        cutoff = window_id - self.ttl_windows
        self._db.execute("INSERT INTO changes(window_id, key, old_value, old_updated) "
                         "SELECT ?, key, value, updated_window FROM state "
                         "WHERE updated_window <= ?", (window_id, cutoff))
        return self._db.execute("DELETE FROM state WHERE updated_window <= ?",
                                (cutoff,)).rowcount

    def restore_to(self, window_id: int) -> None:
        """Undoes every window after ``window_id``, as if newest first (each key gets its
        value from before its first change after ``window_id``: the same)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            first = db.execute("SELECT MIN(first_seq) FROM windows WHERE window_id > ?",
                               (window_id,)).fetchone()[0]
            if first is not None:
                db.execute("DELETE FROM temp.undo")
                db.execute("INSERT INTO temp.undo SELECT key, old_value, old_updated FROM "
                           "changes WHERE seq IN (SELECT MIN(seq) FROM changes "
                           "WHERE seq >= ? GROUP BY key)", (first,))
                gone = db.execute("DELETE FROM state WHERE key IN (SELECT key FROM temp.undo "
                                  "WHERE old_value IS NULL)").rowcount
                back = db.execute("SELECT COUNT(*) FROM temp.undo u WHERE old_value IS NOT "
                                  "NULL AND NOT EXISTS (SELECT 1 FROM state s WHERE "
                                  "s.key = u.key)").fetchone()[0]
                db.execute("INSERT INTO state(key, value, updated_window) SELECT key, "
                           "old_value, old_updated FROM temp.undo WHERE old_value IS NOT NULL "
                           "ON CONFLICT(key) DO UPDATE SET value = excluded.value, "
                           "updated_window = excluded.updated_window")
                db.execute("DELETE FROM changes WHERE seq >= ?", (first,))
                db.execute("DELETE FROM windows WHERE window_id > ?", (window_id,))
                self._set_meta("keys", self.keys - gone + back)
            last = db.execute("SELECT MAX(window_id) FROM windows").fetchone()[0]
            self._set_meta("applied", min(self.applied, window_id) if last is None
                           else int(last))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def committed(self, window_id: int) -> None:
        """Forgets the undo log up to ``window_id``: it will never be replayed."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        first = db.execute("SELECT MIN(first_seq) FROM windows WHERE window_id > ?",
                           (window_id,)).fetchone()[0]
        if first is None:
            db.execute("DELETE FROM changes")
        else:
            db.execute("DELETE FROM changes WHERE seq < ?", (first,))
        db.execute("DELETE FROM windows WHERE window_id <= ?", (window_id,))
        db.execute("COMMIT")

    def sync(self) -> None:
        """Makes every committed window durable (fsyncs the WAL and the file): call it
        before a checkpoint that counts on them is saved."""
        for name in (self.path + "-wal", self.path):
            try:
                fd = os.open(name, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    # -- bulk ------------------------------------------------------------------------
    def reset(self) -> None:
        """Empties it (a fresh operator must not see an earlier run's keys)."""
        self._db.executescript("BEGIN; DELETE FROM state; DELETE FROM changes; "
                               "DELETE FROM windows; DELETE FROM meta; COMMIT;")

    def load(self, window_id: int, rows: Iterable[tuple[Any, int]]) -> None:
        """Replaces the content with ``rows`` as of ``window_id`` (an old checkpoint's
        in-memory totals)."""
        self.reset()
        self._bulk(window_id, ((k, v, window_id) for k, v in rows))

    def seed_from(self, sources: Sequence[tuple[str, int]],
                  owns: Callable[[list[Any]], np.ndarray] | None) -> None:
        """Fills this (new partition's) store with the keys ``owns`` picks from each old
        store as of its window, once: a retried seed finds it ``seeded``.

        Raises:
            StoreError: an old store is not on this machine, or a key is in two of them.
        """
        if self.seeded:
            return
        self.reset()
        rows: list[tuple[Any, int, int]] = []
        for path, window_id in sources:
            rows.extend(_rows_as_of(path, window_id, owns))
        self._bulk(max((w for _, w in sources), default=-1), rows, seeded=True)

    def _bulk(self, window_id: int, rows: Iterable[tuple[Any, int, int]],
              seeded: bool = False) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("INSERT INTO state(key, value, updated_window) VALUES (?, ?, ?)",
                           rows)
        except sqlite3.IntegrityError as exc:
            db.execute("ROLLBACK")
            raise StoreError(f"{self.path}: a key is in two old partitions' stores ({exc}); "
                             "keyed state must be split by the partition key") from None
        self._set_meta("keys", db.execute("SELECT COUNT(*) FROM state").fetchone()[0])
        self._set_meta("applied", window_id)
        if seeded:
            self._set_meta("seeded", 1)
        db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()


def _rows_as_of(path: str, window_id: int,
                owns: Callable[[list[Any]], np.ndarray] | None) -> list[tuple[Any, int, int]]:
    """An old store's rows as of ``window_id`` (undoing later windows on the fly, without
    writing it), those ``owns`` picks."""
    if not os.path.exists(path):
        raise StoreError(f"the old partition's keyed store {path} is not on this machine; "
                         "a repartition moves keyed stores only within one host's STATE_DIR")
    source = sqlite3.connect(path, isolation_level=None)
    try:
        first = source.execute("SELECT MIN(first_seq) FROM windows WHERE window_id > ?",
                               (window_id,)).fetchone()[0]
        cursor = (source.execute("SELECT key, value, updated_window FROM state")
                  if first is None else source.execute(_AS_OF, {"first": first}))
        kept: list[tuple[Any, int, int]] = []
        while chunk := cursor.fetchmany(_CHUNK):
            if owns is not None:
                mask = owns([row[0] for row in chunk])
                chunk = [row for row, mine in zip(chunk, mask, strict=True) if mine]
            kept.extend(chunk)
        return kept
    finally:
        source.close()
