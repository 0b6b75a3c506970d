"""A footer whose column metadata ends pyarrow's process is read first in a probe process: the
file is named damaged and the run's process goes on (docs/bad-input.md, "Footers that end the
reading process"). No Spark here."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lake_assets import footer_probe, lake_io
from lake_assets import storage as storage_module
from lake_assets.errors import DamagedLakeFile
from lake_assets.feeds.unit_cdc import UnitCdcFormat
from lake_assets.footer_probe import FooterProbe, FooterProbeFailed
from lake_assets.ingest import _vet
from lake_assets.storage import Entry, Storage, parquet_footer
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
def new_probe():
    """Makes probes, each ended with the test (an idle probe is a Python process)."""
    made: list[FooterProbe] = []

    def make(command=None) -> FooterProbe:
        made.append(FooterProbe(command))
        return made[-1]

    yield make
    for probe in made:
        probe.close()


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


def test_a_footer_that_ends_pyarrow_s_process_is_named_damaged_and_the_run_reads_on(
    damaged, tmp_path, new_probe
):
    good = _unit_file(tmp_path / "good.parquet", rows=5)
    storage = Storage()
    with pytest.raises(
        DamagedLakeFile, match=f"ends the process that reads its footer's column metadata.*{_FAULT}"
    ):
        parquet_footer(storage, f"file://{damaged}")
    meta = parquet_footer(storage, f"file://{good}")
    assert meta.num_rows == 5
    assert meta.row_group(0).column(2).statistics.max == 4  # safe to touch in this process


#: a stand-in probe: the first one started (no marker yet) says it is ready, takes a footer's
#: length and then fails as told; every later one is the real probe
_ONCE_THEN_REAL = """
import os, signal, sys, time
from pathlib import Path
from lake_assets import footer_probe, lake_io
marker, how = Path(sys.argv[1]), sys.argv[2]
if marker.exists():
    footer_probe._serve(sys.stdin.buffer, sys.stdout.buffer)
    sys.exit(0)
sys.stdout.buffer.write(b"ready\\n")
sys.stdout.buffer.flush()
sys.stdin.buffer.read(4)
marker.touch()  # a footer was sent to it
if how == "abort":
    os.abort()
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


#: a stand-in probe's start: it says it is ready and takes a footer's length, then does as told
_GREET_THEN = (
    "import os, signal, sys, time\n"
    "sys.stdout.buffer.write(b'ready\\n'); sys.stdout.buffer.flush(); sys.stdin.buffer.read(4)\n"
)


def _stand_in(new_probe, tmp_path: Path, how: str) -> FooterProbe:
    script = tmp_path / "stand_in.py"
    script.write_text(_ONCE_THEN_REAL)
    return new_probe([sys.executable, str(script), str(tmp_path / "started"), how])


@pytest.mark.parametrize("how", ["kill", "abort"])
def test_a_probe_that_dies_once_on_a_footer_names_no_file(how, tmp_path, new_probe):
    """A probe killed from outside (the OOM killer, an operator) or crashing once is followed by
    a fresh one, which reads the footer: only a footer that crashes two probes is named."""
    probe = _stand_in(new_probe, tmp_path, how)
    assert probe.why_it_ends_a_reader(_footer(_unit_file(tmp_path / "good.parquet"))) is None
    assert (tmp_path / "started").exists()  # the stand-in did die on it first


def test_a_footer_two_probes_never_finish_is_named_and_asked_about_again_next_time(
    tmp_path, monkeypatch, new_probe
):
    """Too slow twice is named (a real footer takes milliseconds), but not remembered: a
    loaded machine may have been the cause."""
    monkeypatch.setattr(footer_probe, "FOOTER_SECONDS", 0.5)
    probe = new_probe([sys.executable, "-c", _GREET_THEN + "time.sleep(60)"])
    footer = _footer(_unit_file(tmp_path / "good.parquet"))
    verdict = probe.why_it_ends_a_reader(footer)
    assert verdict is not None and "did not finish reading its footer's metadata in 0 s" in verdict
    assert probe._verdicts == {}


def test_a_probe_that_cannot_be_started_blames_no_file(tmp_path, new_probe):
    """No interpreter where the probe's command names one (or no file handles left): the
    probe's plumbing, never the footer's damage."""
    probe = new_probe([str(tmp_path / "no-such-python")])
    with pytest.raises(FooterProbeFailed, match="cannot run: FileNotFoundError"):
        probe.why_it_ends_a_reader(_footer(_unit_file(tmp_path / "good.parquet")))


def test_a_probe_killed_on_a_footer_twice_blames_no_file(tmp_path, new_probe):
    """Killed from outside (SIGKILL: the OOM killer, an operator), not crashed: no file's fault."""
    probe = new_probe([sys.executable, "-c", _GREET_THEN + "os.kill(os.getpid(), signal.SIGKILL)"])
    with pytest.raises(FooterProbeFailed, match="cannot run: exit status -9"):
        probe.why_it_ends_a_reader(_footer(_unit_file(tmp_path / "good.parquet")))


def test_a_footer_larger_than_a_pipe_holds_is_read(tmp_path, new_probe):
    path = tmp_path / "wide.parquet"
    pq.write_table(pa.table({f"column_{i:04d}": [i] for i in range(1500)}), path)
    footer = _footer(path)
    assert len(footer) > 256 * 1024
    assert new_probe().why_it_ends_a_reader(footer) is None


def test_a_row_group_missing_column_chunks_makes_the_footer_damaged(tmp_path, monkeypatch):
    """The check runs on every footer `parquet_footer` gives (the footer here is sound; its
    metadata is replaced by one whose row group lacks a chunk, as hunt 131 built)."""
    from lake_assets import storage as storage_module

    class Group:
        num_columns = 5

    class Meta:
        num_row_groups, num_columns = 1, 6

        def row_group(self, index):
            return Group()

    class Opened:
        metadata = Meta()

    monkeypatch.setattr(storage_module.pq, "ParquetFile", lambda *args, **kwargs: Opened())
    with pytest.raises(DamagedLakeFile, match="row group 0 holds 5 column chunks for the 6 columns"):
        parquet_footer(Storage(), f"file://{_unit_file(tmp_path / 'good.parquet')}")


@pytest.mark.parametrize(
    "command",
    [[sys.executable, "-c", "pass"], [sys.executable, "-c", "print('hello')"], ["/bin/true"]],
    ids=["exits", "says_something_else", "not_python"],
)
def test_a_probe_that_cannot_run_blames_no_file(command, tmp_path, new_probe):
    """A probe that cannot run (a broken interpreter, an import that fails) is no footer's fault:
    the step fails, and nothing is set aside for it."""
    with pytest.raises(FooterProbeFailed, match="cannot run: it did not start"):
        new_probe(command).why_it_ends_a_reader(_footer(_unit_file(tmp_path / "good.parquet")))


def test_an_exchange_stopped_midway_leaves_no_answer_for_the_next_footer(
    damaged, tmp_path, monkeypatch, new_probe
):
    """An interrupt between a footer sent and its answer read ends the probe: otherwise that
    answer would be read as the next footer's, and a damaged one taken for read."""
    probe = new_probe()
    good = _footer(_unit_file(tmp_path / "good.parquet"))
    real_line = footer_probe._line
    calls = []

    def interrupted_once(process, seconds):
        calls.append(seconds)
        if len(calls) == 2:  # after the greeting, as the answer is awaited
            raise KeyboardInterrupt
        return real_line(process, seconds)

    monkeypatch.setattr(footer_probe, "_line", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        probe.why_it_ends_a_reader(good)
    verdict = probe.why_it_ends_a_reader(_footer(damaged))
    assert verdict is not None and _FAULT in verdict


def test_a_footer_whose_whole_read_stops_early_is_still_read_part_by_part(damaged, new_probe):
    """A footer whose `created_by` is not UTF-8 makes `to_dict` raise before it reaches a row
    group: the probe reads on, part by part, and meets the chunk that ends it."""
    data = damaged.read_bytes()
    assert b"parquet-cpp-arrow" in data
    damaged.write_bytes(data.replace(b"parquet-cpp-arrow", b"parqu\xc1t-cpp-arrow"))
    footer = _footer(damaged)
    with pytest.raises(UnicodeDecodeError):
        pq.ParquetFile(pa.BufferReader(footer)).metadata.to_dict()
    verdict = new_probe().why_it_ends_a_reader(footer)
    assert verdict is not None and _FAULT in verdict


def test_a_footer_read_whole_once_is_not_sent_again(tmp_path, new_probe):
    """The lake's own files are read again and again in a run: their footers cost one probe."""
    probe, footer = new_probe(), _footer(_unit_file(tmp_path / "good.parquet"))
    assert probe.why_it_ends_a_reader(footer) is None
    process, _stderr = probe._running()
    process.kill()
    process.wait()
    assert probe.why_it_ends_a_reader(footer) is None
    assert probe._process is process  # not asked: no probe was started again


def test_threads_sharing_the_probe_each_learn_of_their_own_footer(damaged, tmp_path, new_probe):
    """The run reads footers from many threads at once: each answer is the footer's it asked
    about, however the probe's deaths fall among them."""
    probe = new_probe()
    good = _footer(_unit_file(tmp_path / "good.parquet"))
    footers = [_footer(damaged) if i % 4 == 0 else good for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(probe.why_it_ends_a_reader, footers))
    for i, answer in enumerate(answers):
        if i % 4 == 0:
            assert answer is not None and _FAULT in answer
        else:
            assert answer is None


def test_a_footer_pyarrow_refuses_with_an_error_is_left_to_the_run(tmp_path, new_probe):
    """An error pyarrow raises is the run's to handle where it reads the footer (it names the
    cause better): the probe only answers for the footers that end it."""
    probe = new_probe()
    assert probe.why_it_ends_a_reader(b"PAR1 not a footer at all") is None
    assert probe.why_it_ends_a_reader(b"") is None


def test_a_probe_that_cannot_run_fails_the_read_and_sets_no_landed_file_aside(
    tmp_path, monkeypatch, new_probe
):
    """The vetting of a landed file takes most errors for the file's: a probe that cannot run is
    not, so the step fails and the file stays for the next run."""
    monkeypatch.setattr(storage_module, "FOOTER_PROBE", new_probe([sys.executable, "-c", "pass"]))
    path = _unit_file(tmp_path / "good.parquet")
    entry = Entry(f"file://{path}", path.name, False, path.stat().st_size, 0)
    with pytest.raises(FooterProbeFailed):
        _vet(Storage(), UnitCdcFormat(), entry, ("id",))


# --- what a footer the probe read may still hold (hunt 131) --------------------------------------


def test_a_time_statistic_past_any_date_counts_as_none_and_the_file_as_reaching(tmp_path):
    """A damaged footer's largest time beyond the year 9999 is no value pyarrow can give: the
    row group counts as having no statistic, so the file is read (never left out unread)."""
    latest = dt.datetime(2024, 1, 1, 5, tzinfo=dt.UTC)
    path = tmp_path / "times.parquet"
    pq.write_table(pa.table({"t": pa.array([latest], pa.timestamp("us", tz="UTC"))}), path)
    data = path.read_bytes()
    footer_start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    stored = int(latest.timestamp() * 1_000_000).to_bytes(8, "little", signed=True)
    assert stored in data[footer_start:]
    path.write_bytes(data[:footer_start] + data[footer_start:].replace(stored, (2**62).to_bytes(8, "little")))
    uri = f"file://{path}"
    with pytest.raises(OverflowError):
        parquet_footer(Storage(), uri).row_group(0).column(0).statistics.max  # noqa: B018
    assert lake_io.files_reaching(Storage(), [uri], "t", latest + dt.timedelta(days=1)) == [uri]
