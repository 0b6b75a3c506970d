"""Loading the definitions never lists a landing: a feed's tables and first hour come from the
configuration or from what `lake-assets discover` (or `lake-assets run`) pinned in the lake, so
the code location is the same whatever has landed since, and loading costs no listing."""

import json
import logging
import re
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lake_assets.cli import main
from lake_assets.config import CollectionConfig, FeedConfig, LakeConfig, dump_config
from lake_assets.demo.flow_sample import write_flow_landing
from lake_assets.demo.grax_sample import write_grax_landing
from lake_assets.demo.unit_sample import write_unit_landing
from lake_assets.discovery import NAMED_UNREAD, Pin, describe_unread, discover, tables_of_every_feed
from lake_assets.orchestration.definitions import build_definitions
from lake_assets.orchestration.resources import LakeResource
from lake_assets.runner import _Selection, plan_runs
from lake_assets_tests.storage_spy import spy_on_every_storage
from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, write_events

UNIT_TABLES = ("accounts", "customers", "transactions")


@pytest.fixture
def lake(tmp_path):
    """Three feeds as the demo lands them (Unit hourly, GRAX batches, Flow journals); nothing
    discovered yet."""
    unit = tmp_path / "landing" / "unit"
    write_unit_landing(unit, hours=4)
    grax = write_grax_landing(tmp_path / "landing" / "grax")
    flow = write_flow_landing(tmp_path / "landing" / "flow")
    config = LakeConfig(
        lake=f"file://{tmp_path / 'lake'}",
        feeds=(
            FeedConfig("unit", "unit_cdc", f"file://{unit}"),
            FeedConfig("grax", "grax_v2", f"file://{grax.landing_dir}"),
            FeedConfig(
                "flow",
                "flow_journal",
                f"file://{flow.landing_dir}",
                collections=tuple(
                    CollectionConfig(name, tuple(key)) for name, key in flow.collections.items()
                ),
            ),
        ),
    )
    config_file = tmp_path / "lake_assets.yaml"
    config_file.write_text(dump_config(config))
    return config, config_file, unit


def shape(defs: dg.Definitions) -> dict:
    """What a code location offers: its assets with their first partition, sensors and jobs."""
    graph = defs.resolve_asset_graph()
    assets = {}
    for key in graph.get_all_asset_keys():
        partitions = graph.get(key).partitions_def
        first = (
            partitions.get_first_partition_key()
            if isinstance(partitions, dg.TimeWindowPartitionsDefinition)
            else None
        )
        assets[key.to_user_string()] = first
    return {
        "assets": assets,
        "sensors": sorted(s.name for s in defs.sensors or ()),
        "jobs": sorted(j.name for j in defs.resolve_all_job_defs() if not j.name.startswith("__")),
    }


def tables_of(defs: dg.Definitions, feed: str) -> set[str]:
    keys = defs.resolve_asset_graph().get_all_asset_keys()
    return {"/".join(k.path[1:-1]) for k in keys if k.path[0] == feed}


def test_loading_reads_the_pins_and_lists_no_landing(lake, monkeypatch):
    config, _, _ = lake
    discover(config, config.storage())
    touched = spy_on_every_storage(monkeypatch)

    defs = build_definitions(config)

    assert tables_of(defs, "unit") == set(UNIT_TABLES)
    assert tables_of(defs, "grax") == {
        "00D5e000000demoEAA/account",
        "00D5e000000demoEAA/contact",
        "00D5e000000demoEAA/opportunity",
    }
    assert tables_of(defs, "flow") == {"acmeco_customers", "acmeco_orders"}
    landings = tuple(feed.landing for feed in config.feeds)
    assert [uri for _, uri in touched if uri.startswith(landings)] == []
    assert not [call for call in touched if call[0] in ("list", "walk_files")]
    # One small file per feed, nothing else.
    assert sorted(uri for _, uri in touched if uri.endswith("tables.json")) == sorted(
        f"{config.lake}/_state/{feed}/tables.json" for feed in ("unit", "grax", "flow") for _ in (1, 2)
    )  # exists, then read


def test_definitions_stay_the_same_whatever_lands_until_discover_runs_again(lake, capsys):
    config, config_file, unit = lake
    assert main(["discover", "--config", str(config_file)]) == 0
    pinned = shape(build_definitions(config))
    assert pinned["assets"]["unit/accounts/changes"] == "2024-03-01-00"

    # A new table, an hour earlier than any landed, and folder names that are no table.
    write_events(
        unit, "cards", 5, "part-0.parquet", [event("c", "I", 1, at(5), name="x", balance=1)], ACCOUNT_SCHEMA
    )
    early = unit / "accounts" / "year=2024" / "month=02" / "day=29" / "hour=23"
    early.mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist([event("e", "I", 1, at(0), name="x", balance=1)], schema=ACCOUNT_SCHEMA),
        early / "part-early.parquet",
    )
    (unit / "Not A Table!").mkdir()
    (unit / "..odd").mkdir()
    assert shape(build_definitions(config)) == pinned

    capsys.readouterr()
    assert main(["discover", "--config", str(config_file)]) == 0
    said = capsys.readouterr().out
    assert (
        "unit: 4 table(s) pinned: accounts, cards (new), customers, transactions; "
        "hours from 2024-02-29-23 (first landed hour, pinned now)" in said
    ), said
    again = shape(build_definitions(config))
    assert (
        again["assets"]["unit/cards/changes"] == again["assets"]["unit/accounts/changes"] == "2024-02-29-23"
    )
    assert set(again["assets"]) - set(pinned["assets"]) == {
        f"unit/cards/{layer}" for layer in ("raw", "catalog", "changes", "current", "history")
    }


def test_discover_pins_tables_and_first_hour_and_marks_the_new_ones(lake, capsys):
    config, config_file, _ = lake
    assert main(["discover", "--config", str(config_file)]) == 0
    first = capsys.readouterr().out.splitlines()
    assert first == [
        "unit: 3 table(s) pinned: accounts (new), customers (new), transactions (new); "
        "hours from 2024-03-01-00 (first landed hour, pinned now)",
        "grax: 3 table(s) pinned: 00D5e000000demoEAA/account (new), 00D5e000000demoEAA/contact (new), "
        "00D5e000000demoEAA/opportunity (new)",
        "flow: 2 table(s) configured: acmeco_customers, acmeco_orders; "
        "hours from 2024-06-01-10 (first landed hour, pinned now)",
    ], first
    lake_root = config.lake[len("file://") :]
    assert json.loads(Path(lake_root, "_state/unit/tables.json").read_text()) == {
        "tables": list(UNIT_TABLES),
        "first_hour": "2024-03-01-00",
    }
    assert json.loads(Path(lake_root, "_state/flow/tables.json").read_text()) == {
        "tables": [],
        "first_hour": "2024-06-01-10",
    }
    assert (
        json.loads(Path(lake_root, "_state/grax/tables.json").read_text())["first_hour"] is None
    )  # batches, not hours

    assert main(["discover", "--config", str(config_file)]) == 0
    assert "(new)" not in capsys.readouterr().out


def test_discover_names_what_in_a_landing_no_table_reads(lake, capsys):
    """A folder whose name no table has (`Accounts`, `accounts-v2`) or a file outside every
    table's folder was skipped without a word: discovery (and so every run) now names each with
    the reason, and pins the tables as before. Hidden entries (`_SUCCESS`) are not data."""
    config, config_file, unit = lake
    for folder in ("Accounts", "accounts-v2"):
        write_events(unit, folder, 0, "part-0.parquet", [event("x", "I", 1, at(0))], ACCOUNT_SCHEMA)
    (unit / "stray.parquet").write_bytes(b"PAR1")
    (unit / "_SUCCESS").write_text("")
    (unit / "again").symlink_to(".", target_is_directory=True)  # the whole landing, once more
    grax_root = Path(config.feeds[1].landing[len("file://") :])
    v2 = next(p for p in [grax_root / "parquet" / "v2", grax_root] if p.is_dir())
    (v2 / "README.txt").write_text("batches below")
    org = next(v2.glob("org=*"))
    (org / "objects.json").write_text("{}")
    (org / "object=bad name").mkdir()
    (org / "object=again").symlink_to(".", target_is_directory=True)

    assert main(["discover", "--config", str(config_file)]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("lake-assets: warning: ")]
    by_feed = {
        feed: [
            line
            for line in warnings
            if line.startswith(f"lake-assets: warning: {feed}: not read, no table's: ")
        ]
        for feed in ("unit", "grax")
    }
    assert len(by_feed["unit"]) + len(by_feed["grax"]) == len(warnings), captured.err
    assert len(by_feed["unit"]) == 4, by_feed  # one line for each entry
    unit_line, grax_line = "\n".join(by_feed["unit"]), "\n".join(by_feed["grax"])
    for name in ("Accounts/", "accounts-v2/"):
        assert f"{config.feeds[0].landing}/{name}: no table has this name" in unit_line
    assert "stray.parquet: a file outside every table's folder" in unit_line and "_SUCCESS" not in unit_line
    assert f"again: a symbolic link back into its own folder {unit.resolve()} (a loop" in unit_line
    assert f"object=again (a symbolic link back into its own folder {org.resolve()}" in grax_line
    for name in (
        "README.txt: not an org=",
        "objects.json: not an object=",
        "object=bad name/: not an object=",
    ):
        assert name in grax_line, grax_line
    assert "unit: 3 table(s) pinned: accounts (new), customers (new), transactions (new)" in captured.out


def test_a_run_names_the_first_entries_no_table_reads_and_discover_names_each(lake, capsys):
    """A landing with many entries no table reads: a run's line names the first few and says
    how many more, and that `lake-assets discover` names each, which it does, one per line."""
    config, config_file, unit = lake
    for n in range(NAMED_UNREAD + 3):
        (unit / f"notes-{n}.txt").write_text("not data")
    found = next(f for f in discover(config, config.storage()) if f.feed.name == "unit")

    line = describe_unread(found)

    assert line is not None and line.endswith("; and 3 more (`lake-assets discover` names each)")
    assert main(["discover", "--config", str(config_file)]) == 0
    named = [line for line in capsys.readouterr().err.splitlines() if "unit: not read, no table's:" in line]
    assert sorted(name.rsplit("/", 1)[-1].split(":")[0] for name in named) == sorted(
        f"notes-{n}.txt" for n in range(NAMED_UNREAD + 3)
    )


def test_a_pin_only_grows(lake, capsys):
    """Partitions already materialised never fall out of the definitions when old landed files
    are cleaned up: a table stays pinned and the first hour only moves earlier."""
    config, config_file, unit = lake
    assert main(["discover", "--config", str(config_file)]) == 0
    before = shape(build_definitions(config))
    for path in sorted((unit / "customers").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    for path in sorted((unit / "accounts").rglob("hour=00"), reverse=True):
        for file in path.iterdir():
            file.unlink()
        path.rmdir()
    assert main(["discover", "--config", str(config_file)]) == 0
    assert shape(build_definitions(config)) == before


def test_with_nothing_pinned_a_feed_loads_without_tables_and_says_how_to_pin_them(lake, caplog):
    config, _, _ = lake
    with caplog.at_level(logging.WARNING):
        defs = build_definitions(config)
    assert tables_of(defs, "unit") == tables_of(defs, "grax") == set()
    assert tables_of(defs, "flow") == {"acmeco_customers", "acmeco_orders"}  # its collections are configured
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for feed in ("unit", "grax"):
        assert any(
            m.startswith(f"feed {feed}: no tables configured or pinned") and "lake-assets discover" in m
            for m in warnings
        ), warnings
    # Flow's first hour is not pinned yet: its hours start today, and it says so.
    assert any(m.startswith("feed flow: no `start` configured and no first hour pinned") for m in warnings), (
        warnings
    )


@pytest.mark.parametrize("bad", ["../../etc", "tables.json"])
def test_a_damaged_pin_never_breaks_loading_and_discover_writes_it_anew(lake, caplog, capsys, bad):
    """A hand edit that would climb out of the lake, or give a table's state folder the pin's
    own name (no table of any feed has a `.` in its name)."""
    config, config_file, _ = lake
    discover(config, config.storage())
    lake_root = config.lake[len("file://") :]
    pins = f"{lake_root}/_state/unit/tables.json"
    with open(pins, "w") as handle:
        json.dump({"tables": ["accounts", bad], "first_hour": "2024-03-01-00"}, handle)
    with caplog.at_level(logging.WARNING):
        defs = build_definitions(config)
    assert tables_of(defs, "unit") == set()
    assert len(tables_of(defs, "grax")) == 3  # the other feeds load as pinned
    assert any(
        re.match(
            rf"feed unit: its pinned tables cannot be read \(.*tables.json: .*{re.escape(repr(bad))}",
            r.getMessage(),
        )
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]

    assert main(["discover", "--config", str(config_file)]) == 0
    assert "the pin could not be read, so it was written anew" in capsys.readouterr().out
    assert tables_of(build_definitions(config), "unit") == set(UNIT_TABLES)


def test_discover_names_the_landed_tables_a_configuration_leaves_out_and_marks_a_table_with_no_folder(
    lake, capsys
):
    """A feed that lists its tables (or narrows them to objects) reads only those: the tables
    that landed beside them are named as not read, and a configured table with no folder (a
    misspelt `acounts`) is marked, instead of a run saying only that nothing landed."""
    config, _, _ = lake
    unit = FeedConfig("unit", "unit_cdc", config.feeds[0].landing, tables=("acounts", "customers"))
    grax = FeedConfig("grax", "grax_v2", config.feeds[1].landing, objects=("Contact",))
    # a second feed over the same landing takes another object: its table is read, by it
    accounts = FeedConfig("grax_accounts", "grax_v2", config.feeds[1].landing, objects=("Account",))
    narrowed = LakeConfig(lake=config.lake, feeds=(unit, grax, accounts))
    found = {d.feed.name: d for d in discover(narrowed, narrowed.storage())}

    assert found["unit"].absent == ("acounts",)
    assert found["unit"].unread == (
        "table accounts: landed, but the feed's configuration does not take it",
        "table transactions: landed, but the feed's configuration does not take it",
    )
    assert found["grax"].tables == ["00D5e000000demoEAA/contact"] and found["grax"].absent == ()
    assert [line.split(":")[0] for line in found["grax"].unread] == ["table 00D5e000000demoEAA/opportunity"]
    said: list[str] = []
    plan_runs(narrowed, _Selection(None, None, forced=False), said.append, [])
    assert f"unit: nothing landed under {unit.landing} for configured table(s) acounts" in said
    config_file = Path(str(narrowed.lake)[len("file://") :]).parent / "narrowed.yaml"
    config_file.write_text(dump_config(narrowed))
    assert main(["discover", "--config", str(config_file)]) == 0
    captured = capsys.readouterr()
    assert "unit: 2 table(s) configured: acounts (nothing landed), customers" in captured.out
    assert "lake-assets: warning: unit: not read, no table's: table accounts: landed" in captured.err


def test_a_flow_feed_names_as_landed_only_the_collections_with_a_folder(lake):
    """A Flow feed's collections are named in its configuration, not listed: a collection its
    `tables:` leaves out is said to have landed only when its folder is there, and a configured
    collection with no folder (a misspelt name) is marked as having landed nothing."""
    config, _, _ = lake
    flow = config.feeds[2]
    misspelt = CollectionConfig(f"{flow.collections[0].name}s", flow.collections[0].key)
    collections = (*flow.collections, misspelt)
    tables = sorted(c.table for c in flow.collections)

    def discovered(**narrowing):
        feed = FeedConfig("flow", "flow_journal", flow.landing, collections=collections, **narrowing)
        [found] = discover(LakeConfig(lake=config.lake, feeds=(feed,)), config.storage())
        return found

    found = {"flow": discovered(tables=(tables[0],)), "flow_all": discovered()}
    assert found["flow"].unread == tuple(
        f"table {table}: landed, but the feed's configuration does not take it" for table in tables[1:]
    )
    assert found["flow"].absent == ()
    assert found["flow_all"].absent == (misspelt.table,) and found["flow_all"].unread == ()


def test_a_configured_feed_whose_landing_top_cannot_be_listed_is_discovered_all_the_same(lake, monkeypatch):
    """Credentials may reach only the configured tables' folders: the landing's top cannot be
    listed, so what lies beside the tables goes unsaid, but nothing fails."""
    from lake_assets.storage import Storage

    config, _, _ = lake
    unit = FeedConfig("unit", "unit_cdc", config.feeds[0].landing, tables=("accounts",))
    listing = Storage.list

    def refusing_the_top(self, uri):
        if uri.rstrip("/") == unit.landing.rstrip("/"):
            raise PermissionError(13, "Permission denied", uri)
        return listing(self, uri)

    monkeypatch.setattr(Storage, "list", refusing_the_top)
    (found,) = discover(LakeConfig(lake=config.lake, feeds=(unit,)), Storage())
    assert found.problem is None and found.tables == ["accounts"]
    assert found.absent == () and found.unread == ()
    assert found.pin.first_hour is not None


def test_loading_narrows_the_pinned_tables_by_orgs_and_objects(lake):
    config, _, _ = lake
    discover(config, config.storage())
    grax = FeedConfig("grax", "grax_v2", config.feeds[1].landing, objects=("Contact",))
    defs = build_definitions(LakeConfig(lake=config.lake, feeds=(grax,)))
    assert tables_of(defs, "grax") == {"00D5e000000demoEAA/contact"}


def test_discover_reports_a_landing_it_cannot_list(tmp_path, capsys):
    config_file = tmp_path / "lake_assets.yaml"
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the landing folder should be")
    config_file.write_text(
        dump_config(
            LakeConfig(
                lake=f"file://{tmp_path / 'lake'}",
                feeds=(FeedConfig("unit", "unit_cdc", f"file://{blocked}"),),
            )
        )
    )
    assert main(["discover", "--config", str(config_file)]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("unit: no tables found under")
    assert f"lake-assets: failed: unit: listing its tables under file://{blocked}: " in captured.err


def test_a_run_on_a_fresh_lake_pins_and_processes_every_table(tmp_path, spark, capsys):
    """`lake-assets run` discovers first, so a first run needs no `discover`; a table that lands
    later is pinned and processed by the next run."""
    landing = tmp_path / "landing"
    write_events(
        landing,
        "accounts",
        1,
        "part-0.parquet",
        [event("a", "I", 1, at(1), name="x", balance=1)],
        ACCOUNT_SCHEMA,
    )
    config_file = tmp_path / "lake_assets.yaml"
    config = LakeConfig(
        lake=f"file://{tmp_path / 'lake'}", feeds=(FeedConfig("unit", "unit_cdc", f"file://{landing}"),)
    )
    config_file.write_text(dump_config(config))
    assert main(["run", "--config", str(config_file)]) == 0
    out = capsys.readouterr().out
    assert (
        "unit: 1 table(s) pinned: accounts (new); hours from 2024-03-01-01 (first landed hour, pinned now)"
        in out
    )
    assert re.search(r"unit\s+accounts\s+1\s+1\s+1\s+0", out), out

    write_events(
        landing,
        "cards",
        3,
        "part-0.parquet",
        [event("c", "I", 2, at(3), name="y", balance=2)],
        ACCOUNT_SCHEMA,
    )
    assert main(["run", "--config", str(config_file)]) == 0
    out = capsys.readouterr().out
    assert "unit: 2 table(s) pinned: accounts, cards (new)" in out
    assert re.search(r"unit\s+cards\s+1\s+1\s+1\s+0", out), out
    assert tables_of(build_definitions(config), "unit") == {"accounts", "cards"}


def test_the_tables_sensor_pins_a_new_table_and_asks_for_a_reload(lake):
    """Sensors run in the daemon, not at load: the tables sensor may list the landing. It pins a
    table that landed after the code location loaded; the reloaded location has its assets."""
    config, _, unit = lake
    discover(config, config.storage())
    defs = build_definitions(config)
    sensor = defs.resolve_sensor_def("unit_tables_sensor")
    resources = {"lake": LakeResource(root=config.lake)}
    with dg.build_sensor_context(resources=resources, definitions=defs) as context:
        quiet = sensor(context)
    assert quiet.skip_message == f"no new table under {config.feeds[0].landing}"

    write_events(
        unit, "cards", 5, "part-0.parquet", [event("c", "I", 1, at(5), name="x", balance=1)], ACCOUNT_SCHEMA
    )
    for _ in range(2):  # pinned by the first tick, still not loaded at the second
        with dg.build_sensor_context(resources=resources, definitions=defs) as context:
            tick = sensor(context)
        assert (
            tick.skip_message == "table(s) cards pinned since the code location loaded: reload it to add them"
        )
    assert tables_of(build_definitions(config), "unit") == {*UNIT_TABLES, "cards"}
    assert {s.name for s in defs.sensors} >= {
        "unit_tables_sensor",
        "grax_tables_sensor",
        "flow_tables_sensor",
    }


def test_the_tables_sensor_warns_of_what_no_table_reads_once_for_each_new_set(lake, capfd):
    """The daemon's discovery names a folder no table reads, as `lake-assets run` does, but once
    while it stays the same, not on every tick."""
    config, _, unit = lake
    discover(config, config.storage())
    defs = build_definitions(config)
    sensor = defs.resolve_sensor_def("unit_tables_sensor")
    resources = {"lake": LakeResource(root=config.lake)}

    def tick(cursor: str | None) -> tuple[str | None, list[str]]:
        capfd.readouterr()
        with dg.build_sensor_context(resources=resources, definitions=defs, cursor=cursor) as context:
            sensor(context)
        # A sensor context's log writes to the process's stderr.
        said = capfd.readouterr().err.splitlines()
        return context.cursor, [line for line in said if "WARNING" in line and "not read" in line]

    quiet_cursor, warned = tick(None)
    assert warned == []
    write_events(unit, "Accounts", 0, "part-0.parquet", [event("x", "I", 1, at(0))], ACCOUNT_SCHEMA)
    cursor, warned = tick(quiet_cursor)
    assert len(warned) == 1 and "Accounts/: no table has this name" in warned[0], warned
    assert tick(cursor) == (cursor, [])
    for n in range(NAMED_UNREAD):  # past the few a note names: a change there is new as well
        (unit / f"z-notes-{n}.txt").write_text("not data")
    cursor, warned = tick(cursor)
    assert len(warned) == 1 and warned[0].endswith("and 1 more (`lake-assets discover` names each)")
    (unit / f"z-notes-{NAMED_UNREAD - 1}.txt").rename(unit / "z-renamed.txt")
    assert len(tick(cursor)[1]) == 1


def test_a_table_whose_dagster_names_another_feeds_table_has_is_left_out_and_the_rest_loads(tmp_path, capsys):
    """Feed `a` with the landed folder `b__c`, and feed `a__b` with `c`: both tables' jobs, ops
    and pools are named `a__b__c`, and Dagster refused the code location whole: one folder a
    vendor landed stopped every feed. Both are left out, and named as failures by discovery and
    by planning a run; every other table loads and runs."""
    for landing, table in (("one", "b__c"), ("one", "ok"), ("two", "c")):
        write_events(
            tmp_path / landing, table, 0, "part-0.parquet", [event("x", "I", 1, at(0))], ACCOUNT_SCHEMA
        )
    config = LakeConfig(
        lake=f"file://{tmp_path / 'lake'}",
        feeds=(
            FeedConfig("a", "unit_cdc", f"file://{tmp_path / 'one'}"),
            FeedConfig("a__b", "unit_cdc", f"file://{tmp_path / 'two'}"),
        ),
    )
    config_file = tmp_path / "lake_assets.yaml"
    config_file.write_text(dump_config(config))

    assert main(["discover", "--config", str(config_file)]) == 1
    failed = [line for line in capsys.readouterr().err.splitlines() if "failed" in line]
    assert failed == [
        "lake-assets: failed: a/b__c: not loaded: its Dagster names (a__b__c…) are also those of a__b/c; "
        "rename one of the feeds",
        "lake-assets: failed: a__b/c: not loaded: its Dagster names (a__b__c…) are also those of a/b__c; "
        "rename one of the feeds",
    ]
    defs = build_definitions(config)
    defs.resolve_all_job_defs()
    keys = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    # both are left out: one landed later must not take over the names of one that has run
    assert "a/ok/changes" in keys and not any(k.startswith(("a__b/", "a/b__c/")) for k in keys)
    failures: list[str] = []
    planned = plan_runs(config, _Selection(None, None, forced=True), lambda _: None, failures)
    assert failures == [line.removeprefix("lake-assets: failed: ") for line in failed]
    assert [(run.feed, run.tables) for run in planned] == [("a", None)]  # all it has: ok
    # the status says why its landed hours wait, and for how long they will
    capsys.readouterr()
    assert main(["status", "--config", str(config_file), "--json"]) == 0
    said = {(s["feed"], s["table"]): s["not_loaded"] for s in json.loads(capsys.readouterr().out)}
    assert said == {("a", "b__c"): failures[0], ("a", "ok"): None, ("a__b", "c"): failures[1]}
    assert main(["status", "--config", str(config_file)]) == 0
    assert set(failures) <= set(capsys.readouterr().out.splitlines())
    # forgotten, a table left out would never be rebuilt
    capsys.readouterr()
    assert main(["rebuild", "--config", str(config_file), "--table", "a__b/c"]) == 1
    assert "a__b/c: not loaded: " in capsys.readouterr().err


def test_grax_orgs_that_differ_only_in_case_are_one_table_in_the_catalog_so_both_are_left_out(
    tmp_path, capfd
):
    """Two 15-character org IDs that differ only in case are two orgs, and two tables; the
    catalog names tables in lower case, so they shared their records: each table's catalog step
    retired the other's files, and its run read them. Both are left out and named."""
    for org in ("00D5g000004FrOA", "00D5g000004Froa"):
        batch = tmp_path / "grax" / "parquet" / "v2" / f"org={org}" / "object=Account" / "batch=01"
        batch.mkdir(parents=True)
        (batch / "data-1.parquet").write_bytes(b"PAR1")
    config = LakeConfig(
        lake=f"file://{tmp_path / 'lake'}",
        feeds=(FeedConfig("grax", "grax_v2", f"file://{tmp_path / 'grax'}"),),
    )
    [found] = discover(config, config.storage())

    tables, left_out = tables_of_every_feed(config.feeds, {"grax": found.pin})

    assert tables == {"grax": []}  # both: the one landed later must not take the other's records
    assert list(left_out.values()) == [
        f"grax/00D5g000004Fr{a}/account: not loaded: its catalog name (00d5g000004froa-account) is also "
        f"that of grax/00D5g000004Fr{b}/account (the catalog names tables in lower case); give the two "
        "their own feeds (a GRAX feed's `orgs`)"
        for a, b in (("OA", "oa"), ("oa", "OA"))
    ]
    # the daemon's tables sensor says so too, once
    defs = build_definitions(config)
    with dg.build_sensor_context(
        resources={"lake": LakeResource(root=config.lake)}, definitions=defs
    ) as context:
        capfd.readouterr()
        defs.resolve_sensor_def("grax_tables_sensor")(context)
    warned = [line for line in capfd.readouterr().err.splitlines() if "WARNING" in line]
    assert [line.split(" - ")[-1] for line in warned] == list(left_out.values())


def test_a_clash_of_asset_op_names_is_found_as_the_jobs_names_are():
    """An asset's op is named from its key, `feed/<table's segments>/layer`, joined by `__`:
    GRAX feed `g`'s table `00dabc/account` and Unit feed `g__00dabc`'s table `account` share
    their ops' names, though not their jobs'."""
    config = LakeConfig(
        lake="/lake",
        feeds=(FeedConfig("g", "grax_v2", "/landing/g"), FeedConfig("g__00dabc", "unit_cdc", "/landing/u")),
    )
    pins = {"g": Pin(tables=("00dabc/account", "00dabc/contact")), "g__00dabc": Pin(tables=("account",))}

    tables, left_out = tables_of_every_feed(config.feeds, pins)

    assert tables == {"g": ["00dabc/contact"], "g__00dabc": []}
    assert list(left_out) == ["g/00dabc/account", "g__00dabc/account"]
