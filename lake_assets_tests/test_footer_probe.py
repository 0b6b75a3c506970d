"""A footer whose column metadata ends pyarrow's process is read first in a probe process: the
file is named damaged and the run's process goes on (docs/bad-input.md, "Footers that end the
reading process"). No Spark here."""

from __future__ import annotations

import concurrent.futures
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lake_assets.errors import DamagedLakeFile
from lake_assets.footer_probe import FooterProbe
from lake_assets.storage import Storage, parquet_footer
from lake_assets_tests.hostile_landings import contradict_a_column_chunk_type
from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event

#: what pyarrow says as it ends its process on the chunk `contradict_a_column_chunk_type` changes
_FAULT = "ColumnMetaData type does not match ColumnDescriptor physical type: INT32 vs. INT64"


def _unit_file(path: Path, rows: int = 3) -> Path:
    events = [event(f"k{i}", "I", i, at(1), name=f"n{i}", balance=i) for i in range(rows)]
    pq.write_table(pa.Table.from_pylist(events, schema=ACCOUNT_SCHEMA), path)
    return path


def _footer(path: Path) -> bytes:
    data = path.read_bytes()
    return b"PAR1" + data[len(data) - 8 - int.from_bytes(data[-8:-4], "little") :]


@pytest.fixture
def damaged(tmp_path) -> Path:
    return contradict_a_column_chunk_type(_unit_file(tmp_path / "damaged.parquet"))


def test_the_damaged_footer_ends_a_process_that_reads_it_in_place(damaged):
    """What the probe is for: read in the run's own process, the footer ends it."""
    touch = (
        "import sys, pyarrow.parquet as pq\n"
        "meta = pq.ParquetFile(sys.argv[1]).metadata\n"
        "[meta.row_group(0).column(i).statistics for i in range(meta.num_columns)]\n"
    )
    ended = subprocess.run(
        [sys.executable, "-c", touch, str(damaged)], check=False, capture_output=True, text=True
    )
    assert ended.returncode == -signal.SIGABRT
    assert _FAULT in ended.stderr


def test_a_footer_that_ends_pyarrow_s_process_is_named_damaged_and_the_run_reads_on(damaged, tmp_path):
    good = _unit_file(tmp_path / "good.parquet", rows=5)
    storage = Storage()
    with pytest.raises(
        DamagedLakeFile, match=f"ends the process that reads its footer's column metadata.*{_FAULT}"
    ):
        parquet_footer(storage, f"file://{damaged}")
    meta = parquet_footer(storage, f"file://{good}")
    assert meta.num_rows == 5
    assert meta.row_group(0).column(2).statistics.max == 4  # safe to touch in this process


def test_a_probe_that_died_of_something_else_names_no_footer(tmp_path):
    """A probe killed from outside (the OOM killer, an operator) is started again: the footer it
    would have read is read by the next, not named damaged."""
    probe = FooterProbe()
    first, second = (_footer(_unit_file(tmp_path / f"good{rows}.parquet", rows)) for rows in (1, 2))
    assert probe.why_it_ends_a_reader(first) is None
    process, _stderr = probe._running()
    process.kill()
    process.wait()
    assert probe.why_it_ends_a_reader(second) is None
    assert probe._running()[0].pid != process.pid


def test_a_footer_read_whole_once_is_not_sent_again(tmp_path):
    """The lake's own files are read again and again in a run: their footers cost one probe."""
    probe, footer = FooterProbe(), _footer(_unit_file(tmp_path / "good.parquet"))
    assert probe.why_it_ends_a_reader(footer) is None
    process, _stderr = probe._running()
    process.kill()
    process.wait()
    assert probe.why_it_ends_a_reader(footer) is None
    assert probe._process is process  # not asked: no probe was started again


def test_threads_sharing_the_probe_each_learn_of_their_own_footer(damaged, tmp_path):
    """The run reads footers from many threads at once: each answer is the footer's it asked
    about, however the probe's deaths fall among them."""
    probe = FooterProbe()
    good = _footer(_unit_file(tmp_path / "good.parquet"))
    footers = [_footer(damaged) if i % 4 == 0 else good for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(probe.why_it_ends_a_reader, footers))
    for i, answer in enumerate(answers):
        if i % 4 == 0:
            assert answer is not None and _FAULT in answer
        else:
            assert answer is None


def test_a_footer_pyarrow_refuses_with_an_error_is_left_to_the_run(tmp_path):
    """An error pyarrow raises is the run's to handle where it reads the footer (it names the
    cause better): the probe only answers for the footers that end it."""
    probe = FooterProbe()
    assert probe.why_it_ends_a_reader(b"PAR1 not a footer at all") is None
    assert probe.why_it_ends_a_reader(b"") is None
