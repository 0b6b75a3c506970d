"""Property: a purge is forever, whatever is re-run (issue #28 acceptance).

Hypothesis lands a few GRAX batches with random writes and random purges of a few records, then
processes them in random ranges, each through the CLI (`run_feeds` with first/last) or a
Dagster range backfill (the table's job over a range of batches), first covering every batch in
a random order, then re-running random ranges. After every run, no key whose purge was
processed has field data in `changes`, `current` or `history`; once every batch was processed,
each layer equals a clean run over the same landed data.
"""

import dagster as dg
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from lake_assets_tests.grax_lake import (
    backfill,
    clean_run,
    cli,
    config_for,
    land,
    leaks,
    purge,
    tables,
    version,
)

BATCHES = ["00000000a", "00000000b", "00000000c", "00000000d"]
KEYS = ["K0", "K1", "K2", "K3"]


@st.composite
def landing_and_runs(draw):
    writes = []  # (batch index, row)
    for index in range(len(BATCHES)):
        for _ in range(draw(st.integers(1, 4))):
            key, hour = draw(st.sampled_from(KEYS)), draw(st.integers(1, 20))
            idseq = f"{len(writes):04d}"  # GRAX's sequence: text, increasing
            if draw(st.integers(0, 4)) == 0:
                row = purge(key, hour, idseq)
            else:
                row = version(
                    key,
                    hour,
                    idseq,
                    draw(st.sampled_from(["Ann", "Bob", None])),
                    draw(st.sampled_from(["555", None])),
                )
            writes.append((index, row))
    # First every batch, in random ranges of a random order; then re-runs of random ranges.
    order = draw(st.permutations(range(len(BATCHES))))
    cut = draw(st.integers(1, len(BATCHES)))
    runs = [
        (draw(st.sampled_from(["cli", "backfill"])), chunk) for chunk in (order[:cut], order[cut:]) if chunk
    ]
    for _ in range(draw(st.integers(1, 2))):
        first = draw(st.integers(0, len(BATCHES) - 1))
        runs.append(
            (
                draw(st.sampled_from(["cli", "backfill"])),
                list(range(first, draw(st.integers(first, len(BATCHES) - 1)) + 1)),
            )
        )
    return writes, runs


def _process(how, config, instance, batches):
    """One run over the range of batches from the least to the greatest of `batches`."""
    first, last = BATCHES[min(batches)], BATCHES[max(batches)]
    if how == "cli":
        cli(config, instance, first, last)
    else:
        backfill(config, instance, first, last)
    return set(range(min(batches), max(batches) + 1))


# No shrinking: each step is a Dagster run, and a failure already names the landing and the runs.
@settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(case=landing_and_runs())
def test_no_run_brings_a_purge_back_and_every_lake_equals_a_clean_run(spark, tmp_path_factory, case):
    writes, runs = case
    root = tmp_path_factory.mktemp("purge-property")
    landing = root / "landing"
    for index, batch in enumerate(BATCHES):
        land(landing, batch, "data-00000000001.parquet", [row for i, row in writes if i == index])
    clean = clean_run(landing, root / "clean")
    purged = {row["Id"] for _, row in writes if row.get("grax__purged")}
    assert leaks(root / "clean", purged) == []

    config, lake, instance = config_for(landing, root / "lake"), root / "lake", dg.DagsterInstance.ephemeral()
    processed: set[int] = set()
    for how, batches in runs:
        processed |= _process(how, config, instance, batches)
        seen_purged = {row["Id"] for i, row in writes if i in processed and row.get("grax__purged")}
        assert leaks(lake, seen_purged) == [], (how, batches, writes, runs)
        if processed == set(range(len(BATCHES))):
            assert tables(lake) == clean, (how, batches, writes, runs)
    assert processed == set(range(len(BATCHES)))
