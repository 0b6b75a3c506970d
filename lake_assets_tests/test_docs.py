"""The specs live in the repository: code cites `docs/` pages that exist, never documents the
repository does not hold (the design notes and vendor pages the project was first written from).

Pure text scans: no Spark, no Dagster.
"""

from __future__ import annotations

import io
import json
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("lake_assets", "lake_assets_tests", "benchmarks")
# What the acceptance grep of issue 31 looks for (the design notes, the format notes, the seed
# pages), written so that this file does not match it.
OUTSIDE_DOCUMENTS = re.compile(rb"(DESIGN|FORMATS).md|seeds[/]")
#: a page under docs/, optionally followed by the section it points at: docs/semantics.md, "Purges"
DOCS_REFERENCE = re.compile(r"\b(docs/[\w./-]+?\.md)(?:,\s*[\"'](.+?)[\"'])?")
#: a measured time: `2.5 s`, `0.55-0.6 s`, `8.5 -> 6.7 s`
TIMING = re.compile(r"\b\d+(\.\d+)? ?s\b")
#: the pages the README lists as the specifications
SPECIFICATIONS = (
    "lake-layout.md",
    "semantics.md",
    "formats/unit-cdc.md",
    "formats/grax-v2.md",
    "formats/flow-journals.md",
)


def _files(folder: str):
    return (
        path
        for path in sorted((ROOT / folder).rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    )


def _comments_and_strings(path: Path):
    """(line, text) of every comment and string literal (docstrings included) of a Python file."""
    for token in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            yield token.start[0], token.string


def _passages(path: Path):
    """(line, text) of each docstring or string, and of each run of comment lines, of a Python file."""
    run: list[tuple[int, str]] = []
    for number, text in _comments_and_strings(path):
        if text.startswith("#") and run and run[-1][1].startswith("#") and number == run[-1][0] + 1:
            run.append((number, text))
            continue
        if run:
            yield run[0][0], "\n".join(t for _, t in run)
        run = [(number, text)]
    if run:
        yield run[0][0], "\n".join(t for _, t in run)


def _headings(page: Path) -> set[str]:
    return {
        line.lstrip("#").strip()
        for line in page.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    }


def test_no_file_cites_a_document_outside_the_repository():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.decode(errors='replace').strip()}"
        for folder in SCANNED
        for path in _files(folder)
        for number, line in enumerate(path.read_bytes().splitlines(), 1)
        if OUTSIDE_DOCUMENTS.search(line)
    ]
    assert not found, "cite a page under docs/ instead:\n" + "\n".join(found)


def test_every_docs_page_a_comment_or_docstring_cites_exists():
    cited = 0
    missing = []
    for folder in SCANNED:
        for path in _files(folder):
            if path.suffix != ".py":
                continue
            for number, text in _comments_and_strings(path):
                for match in DOCS_REFERENCE.finditer(text):
                    cited += 1
                    page, section = ROOT / match.group(1), match.group(2)
                    where = f"{path.relative_to(ROOT)}:{number}: {match.group(0)}"
                    if not page.is_file():
                        missing.append(f"{where}: no such page")
                    elif section is not None and section not in _headings(page):
                        missing.append(f"{where}: the page has no section {section!r}")
    assert cited, "the scan found no reference at all: it is broken"
    assert not missing, "\n".join(missing)


def test_readme_lists_the_specifications():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in SPECIFICATIONS:
        assert (ROOT / "docs" / page).is_file(), page
        assert f"](docs/{page})" in readme, f"README does not link docs/{page}"


def test_code_that_cites_profiling_leaves_the_timings_there():
    """Measured figures live in docs/profiling.md ("Figures behind the code"); a comment or
    docstring that cites it says why, not how many seconds."""
    quoted = [
        f"{path.relative_to(ROOT)}:{number}: {TIMING.search(text).group(0)!r}"
        for path in _files("lake_assets")
        if path.suffix == ".py"
        for number, text in _passages(path)
        if "docs/profiling.md" in text and TIMING.search(text)
    ]
    assert not quoted, "move the figure to docs/profiling.md:\n" + "\n".join(quoted)


def test_the_readme_quotes_one_full_benchmark_run_and_its_json_is_in_the_repository():
    """The status paragraph and the benchmark table name the same run, whose JSON is kept, so
    that a new run's figures cannot land in one place and leave the other quoting an older run."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    status = re.search(r"latest full run \((\w+)\)", readme)
    table = re.search(r"Latest full-size figures: `\./dev bench` on commit (\w+)", readme)
    assert status and table, "the README names the full benchmark run it quotes, twice"
    assert status[1] == table[1], f"the status quotes {status[1]}, the benchmark table {table[1]}"
    run = json.loads((ROOT / "docs" / "benchmarks" / f"full-{table[1]}.json").read_text(encoding="utf-8"))
    quoted = {**run["figures"], **run["context"]}
    rows = re.findall(r"^\| `(\w+)` \| (\d+\.\d+)(?: s)? \|", readme, flags=re.MULTILINE)
    assert {name for name, _ in rows} == set(quoted), "the table quotes every figure of the run"
    status_paragraph = readme[status.start() : readme.index("\n\n", status.start())]
    said = {
        "incremental_vs_duckdb": r"took ([\d.]+)\u00d7 DuckDB",
        "incremental_growth": r"incremental growth \(([\d.]+)\)",
        "dagster_overhead": r"\(([\d.]+) in that run",
        "full_vs_floor": r"took ([\d.]+)\u00d7 a plain Spark copy",
        "full_vs_handwritten": r"and ([\d.]+)\u00d7 a hand-written",
        "handwritten_vs_floor": r"itself takes\s+([\d.]+)\u00d7 the copy",
    }
    for name, pattern in said.items():
        found = re.search(pattern, status_paragraph)
        assert found, f"the status paragraph gives {name}"
        rows.append((name, found[1]))
    for name, value in rows:
        decimals = len(value.split(".")[1])
        assert round(quoted[name], decimals) == float(value), f"{name}: README {value}, JSON {quoted[name]}"


def test_the_pyarrow_recipe_of_lake_layout_reads_a_drifted_change_log_whole(tmp_path):
    """The recipe docs/lake-layout.md gives pyarrow and pandas readers, run as written on a
    change log whose hours disagree: a column added, a number in one hour and text in another."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    page = (ROOT / "docs" / "lake-layout.md").read_text()
    (recipe,) = [block for block in re.findall(r"```python\n(.*?)```", page, re.S) if "one_schema" in block]
    for hour, table in (
        ("2024-03-01-00", pa.table({"id": ["a"], "amount": pa.array([1], pa.int32())})),
        ("2024-03-01-01", pa.table({"id": ["b"], "amount": ["1.5"], "nick": ["x"]})),
        ("2024-03-01-02", pa.table({"id": ["c"], "amount": pa.array([2**40], pa.int64())})),
    ):
        (tmp_path / f"hour={hour}").mkdir()
        pq.write_table(table, tmp_path / f"hour={hour}" / "part-0.parquet")
    scope: dict = {}
    exec(recipe.replace("<lake>/changes/unit/accounts", str(tmp_path)), scope)  # noqa: S102 - the page's own code
    rows = scope["frame"].sort_values("id").to_dict("records")
    assert [(r["id"], r["amount"], r["nick"], r["hour"]) for r in rows] == [
        ("a", "1", None, "2024-03-01-00"),
        ("b", "1.5", "x", "2024-03-01-01"),
        ("c", str(2**40), None, "2024-03-01-02"),
    ]
