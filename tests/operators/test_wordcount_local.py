"""The word count of ``tests/e2e/test_wordcount.py``, run with the local runner instead of
a master and container processes: the same app file, the same counts. Its duration and the
real-process test's are printed at the end of the test run (``tests/conftest.py``), apart
from the start of the process's one SparkSession (fixture ``local_spark``)."""

from __future__ import annotations

import collections

import pytest

from operators.app import load_app
from operators.testing import run_local
from tests.e2e.wordcount import WORDCOUNT_DAG, WORDCOUNT_LINES, words_of, write_wordcount_app


@pytest.mark.timed("wordcount", "local runner")
def test_wordcount_with_the_local_runner(tmp_path, local_spark):
    app, lines = write_wordcount_app(tmp_path, "wordcount", WORDCOUNT_LINES, WORDCOUNT_DAG)
    run = run_local(load_app(app))
    counted: collections.Counter[str] = collections.Counter()
    for row in run.rows("files"):
        counted[row["word"]] += row["count"]
    assert counted == collections.Counter(words_of(lines))
