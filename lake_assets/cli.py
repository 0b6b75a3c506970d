"""`lake-assets`: run the pipeline in-process, or try it on generated sample data."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import select
import shutil
import sys
import time
from pathlib import Path

from lake_assets.catalog.metadata import datetime_to_ms
from lake_assets.config import (
    CollectionConfig,
    FeedConfig,
    LakeConfig,
    check_landings,
    dump_config,
    load_config,
    parse_config,
    resolved_config,
)
from lake_assets.console import (
    RunDisplay,
    format_records,
    format_status,
    format_summary,
    new_log_path,
    output_to,
)
from lake_assets.discovery import (
    describe,
    discover,
    each_unread,
    feed_tables,
    load_pins,
    tables_of_every_feed,
)
from lake_assets.errors import ConfigError, LakeAssetsError, LandingEmptied
from lake_assets.feeds import format_for
from lake_assets.feeds.base import parse_hour_key
from lake_assets.feeds.grax_v2 import batch_order, is_batch_key
from lake_assets.runner import Progress, RunFailed, run_feeds
from lake_assets.status import summarise

DEFAULT_DEMO_DIR = Path(".demo")


def _say(message: str) -> None:
    print(f"lake-assets: {message}", flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    config = _config_of(args)
    return _run_and_report(config, args, first=args.first, last=args.last, everything=args.all)


def _config_of(args: argparse.Namespace) -> LakeConfig:
    """The configuration file's, its lake replaced by `--lake` when given; a mistake in that
    lake is said as the option's, not as a key of the file."""
    config = load_config(args.config)
    if not args.lake:
        return config
    try:
        return config.with_lake(args.lake)
    except ConfigError as exc:
        lines = [
            f"--lake{line.removeprefix('lake')}" if line.startswith("lake: ") else line
            for line in str(exc).splitlines()
        ]
        raise ConfigError("\n".join(lines)) from None


def _run_and_report(config: LakeConfig, args: argparse.Namespace, **selection) -> int:
    """Run the feeds with a line per finished step (and a progress bar on a terminal), Dagster's
    and Spark's output in a log file (on the console with `-v`), then the summary, the total
    time, each failure in one line and where the log is."""
    started = time.perf_counter()
    log_path = None if args.verbose else new_log_path(args.command)
    failures = []
    with output_to(log_path) as stream:
        display = RunDisplay(stream)
        try:
            run_feeds(
                config, say=display.say, progress=Progress(display.planned, display.step_done), **selection
            )
        except RunFailed as failed:  # the other feeds and tables ran: summarise them, then the failures
            failures = failed.failures
        finally:
            display.close()
    print(format_summary(summarise(config)))
    print(
        f"lake-assets: {'failed' if failures else 'done'} in {time.perf_counter() - started:.1f} s"
        + (f"; Dagster's and Spark's output: {log_path}" if log_path else "")
    )
    for line in failures:
        print(f"lake-assets: failed: {line}" + (f" (log: {log_path})" if log_path else ""), file=sys.stderr)
    return 1 if failures else 0


def cmd_status(args: argparse.Namespace) -> int:
    from lake_assets.orchestration.execution import instance_for_cli, lake_status

    config = _config_of(args)
    instance = instance_for_cli()
    tables = lake_status(config, instance)
    if args.json:
        print(json.dumps([table.to_json() for table in tables], indent=1))
    else:
        print(format_status(tables, keeps_runs=not instance.is_ephemeral))
    return 0


def cmd_discover(args: argparse.Namespace) -> int:
    """List every feed's landing, pin its tables and first hour in the lake, say what is pinned."""
    config = _config_of(args)
    failed = False
    discovered = discover(config, config.storage())
    for found in discovered:
        print(describe(found))
        for unread in each_unread(found):
            print(f"lake-assets: warning: {unread}", file=sys.stderr)
        for line in ([found.problem] if found.problem else []) + list(found.unlisted):
            print(f"lake-assets: failed: {found.feed.name}: {line}", file=sys.stderr)
            failed = True
    _, left_out = tables_of_every_feed(config.feeds, {found.feed.name: found.pin for found in discovered})
    for line in left_out.values():
        print(f"lake-assets: failed: {line}", file=sys.stderr)
        failed = True
    return 1 if failed else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from lake_assets.demo.damaged import add_truncated_copy
    from lake_assets.demo.flow_sample import write_flow_landing
    from lake_assets.demo.grax_sample import write_grax_landing
    from lake_assets.demo.unit_sample import write_unit_landing

    root = Path(args.dir).resolve()
    # checked before any file is written: a mistake here is one line, not a half-made demo
    spark = (
        parse_config({"lake": f"file://{root / 'lake'}"})
        .replace(spark={"master": args.master, "remote": args.remote, "conf": dict(args.spark_conf or [])})
        .spark
    )
    for sub in ("landing", "lake"):
        shutil.rmtree(root / sub, ignore_errors=True)
    unit_landing = root / "landing" / "unit"
    _say(f"writing sample Unit CDC exports to {unit_landing}")
    unit = write_unit_landing(unit_landing)
    _say(f"wrote {len(unit.files)} files for tables {', '.join(unit.tables)} ({len(unit.late_files)} late)")
    damaged = add_truncated_copy(unit.files[0])
    _say(f"added {damaged}, cut off halfway like a broken upload: the run quarantines it and reads the rest")
    grax_landing = root / "landing" / "grax"
    _say(f"writing a sample GRAX Data Lake v2 landing to {grax_landing}")
    grax = write_grax_landing(grax_landing)
    _say(f"wrote {len(grax.files)} files for objects {', '.join(grax.objects)} of org {grax.org}")
    flow_landing = root / "landing" / "flow"
    _say(f"writing sample Estuary Flow journals to {flow_landing}")
    flow = write_flow_landing(flow_landing)
    _say(f"wrote {len(flow.files)} fragments for collections {', '.join(flow.collections)}")
    config = LakeConfig(
        lake=f"file://{root / 'lake'}",
        feeds=(
            FeedConfig(name="unit", format="unit_cdc", landing=f"file://{unit_landing}"),
            FeedConfig(name="grax", format="grax_v2", landing=f"file://{grax.landing_dir}"),
            FeedConfig(
                name="flow",
                format="flow_journal",
                landing=f"file://{flow.landing_dir}",
                collections=tuple(
                    CollectionConfig(name=name, key=tuple(key)) for name, key in flow.collections.items()
                ),
            ),
        ),
        spark=spark,
    )
    config_file = root / "lake_assets.yaml"
    config_file.write_text(dump_config(config))
    _say(f"config written to {config_file}")
    code = _run_and_report(config, args, everything=True)
    _say(
        f"lake at {root / 'lake'}; to browse it in the Dagster UI, see README.md, 'The Dagster UI' "
        f"(LAKE_ASSETS_CONFIG={config_file})"
    )
    return code


def cmd_config_check(args: argparse.Namespace) -> int:
    config = load_config(args.file)
    check_landings(config, config.storage())
    print(resolved_config(config), end="")
    return 0


def _moment_ms(text: str) -> int:
    """A time argument: ISO date/time (UTC when naive) or epoch milliseconds."""
    if re.fullmatch(r"[0-9]+", text):
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO date/time (2024-03-02, 2024-03-02T05:00:00Z) nor epoch milliseconds"
        ) from None
    return datetime_to_ms(moment)


def _reversed_range(args: argparse.Namespace) -> str | None:
    """A range whose start comes after its end (partition keys, or times), or whose ends name
    different kinds of partitions."""
    for low, high, names in (("first", "last", "--from/--to"), ("start", "end", "--start/--end")):
        a, b = getattr(args, low, None), getattr(args, high, None)
        if a is None or b is None:
            continue
        if isinstance(a, str) and is_batch_key(a) != is_batch_key(b):
            return f"{names}: {a} and {b} name different kinds of partitions (an hour and a GRAX batch)"
        if (batch_order(a) > batch_order(b)) if isinstance(a, str) and is_batch_key(a) else a > b:
            return f"{names}: {a} comes after {b}"
    return None


def _spark_setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. spark.executor.memory=2g)")
    return key.strip(), value


def _not_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty value names nothing")
    return text


def _partition_key(text: str) -> str:
    """A partition argument: an hour key, or a batch id (hex digits)."""
    if is_batch_key(text):
        return text
    try:
        parse_hour_key(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an hour like 2024-03-01-05 nor a batch id (hex digits)"
        ) from None
    return text


def _catalog_store(config: LakeConfig):
    """The catalog store the configuration names, opened without Dagster."""
    from lake_assets.catalog.opening import open_store
    from lake_assets.paths import LakeLayout

    catalog = config.catalog
    return open_store(
        catalog.store,
        LakeLayout(config.lake).catalog(),
        config.storage(),
        table=catalog.table,
        latest_table=catalog.latest_table,
        endpoint_url=catalog.endpoint_url,
        region=config.s3.region,
    )


def cmd_catalog_query(args: argparse.Namespace) -> int:
    from lake_assets.catalog.files import catalog_what, catalog_where

    config = load_config(args.config)
    store = _catalog_store(config)
    what = catalog_what(args.what)
    where = catalog_where(args.where) if args.where else None
    if args.work_id:
        records = store.query_by_work_id(args.work_id, what, where)
    else:
        if args.start is None or args.end is None:
            raise ConfigError("give --start and --end (a time range), or --work-id")
        records = store.query_by_time(args.start, args.end, what, where)
    if args.json:
        print(json.dumps(records, indent=1, default=str))
        return 0
    print(format_records(records))
    return 0


def cmd_rebuild(args: argparse.Namespace) -> int:
    """Forget one table (its purge ledger kept) so that the next run rebuilds it from its landing."""
    from lake_assets import lease
    from lake_assets.paths import LakeLayout
    from lake_assets.pipeline import forget_table
    from lake_assets.processed import blank_landing_refusal, landing_vouched_for

    config = _config_of(args)
    feed_name, _, table = args.table.partition("/")
    feed = config.feed(feed_name)
    fmt = format_for(feed)
    pins = load_pins(config, config.storage())
    if table not in feed_tables(feed, fmt, pins[feed.name]):
        raise ConfigError(f"feed {feed.name!r} has no table {table!r}; `lake-assets status` lists its tables")
    clash = tables_of_every_feed(config.feeds, pins)[1].get(f"{feed.name}/{table}")
    if clash:  # forgotten, it would not be run again
        raise ConfigError(f"{clash}; until then no run rebuilds it")
    store = _catalog_store(config)
    storage, layout = config.storage(), LakeLayout(config.lake)
    if not feed.allow_empty_landing and not landing_vouched_for(
        storage, layout, fmt, feed.landing, feed.name, table
    ):
        raise LandingEmptied(
            blank_landing_refusal(
                feed.name, table, feed.landing, "the table, which a rebuild would leave empty"
            )
        )
    with lease.writing_table(
        storage, layout, feed.name, table, None, "rebuild", config.lease_wait_seconds, _say
    ):
        forgotten = forget_table(storage, layout, store, feed.name, table)
    for uri in forgotten.removed:
        _say(f"removed {uri}")
    if forgotten.unfinished_commit:
        _say(
            f"warning: a killed fold's commit could not be finished and was removed: {forgotten.unfinished_commit}"
        )
    for uri in forgotten.still_catalogued:
        _say(
            f"warning: the catalog may still list {uri}: the damaged file's span, which places its record, is unknown"
        )
    _say(
        f"{feed.name}/{table}: forgotten but its purge ledger; `lake-assets run` rebuilds it from the landing"
    )
    return 0


def _shared_options() -> dict[str, argparse.ArgumentParser]:
    """The options several commands take, each defined once (argparse parents)."""
    config = argparse.ArgumentParser(add_help=False)
    config.add_argument("--config", required=True, help="feed configuration YAML")
    lake = argparse.ArgumentParser(add_help=False)
    lake.add_argument(
        "--lake", type=_not_empty, help="override the lake root (file:///abs/path or s3a://bucket/prefix)"
    )
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show Dagster's and Spark's output instead of logging it to a file",
    )
    return {"config": config, "lake": lake, "verbose": verbose}


def _add_run(sub, shared: dict[str, argparse.ArgumentParser]) -> None:
    run = sub.add_parser(
        "run",
        parents=[shared["config"], shared["lake"], shared["verbose"]],
        help="process what landed since the last run for the configured feeds",
    )
    run.add_argument(
        "--all",
        action="store_true",
        help="process every landed partition again, not only those whose files changed",
    )
    run.add_argument(
        "--from",
        dest="first",
        type=_partition_key,
        help="process every landed partition from this one (hour 2024-03-01-05 or batch)",
    )
    run.add_argument(
        "--to", dest="last", type=_partition_key, help="process every landed partition up to this one"
    )
    run.set_defaults(func=cmd_run)


def _add_demo(sub, shared: dict[str, argparse.ArgumentParser]) -> None:
    demo = sub.add_parser(
        "demo",
        parents=[shared["verbose"]],
        help="generate sample vendor files and process them on a local lake",
    )
    demo.add_argument(
        "--dir", default=str(DEFAULT_DEMO_DIR), help="where landing, lake and config go (.demo)"
    )
    where = demo.add_mutually_exclusive_group()
    where.add_argument(
        "--master", help="run on this Spark master (spark://host:7077) instead of the embedded local driver"
    )
    where.add_argument(
        "--remote",
        help="run on this Spark Connect server (sc://host:15002; token from SPARK_CONNECT_AUTHENTICATE_TOKEN)",
    )
    demo.add_argument(
        "--conf",
        dest="spark_conf",
        action="append",
        type=_spark_setting,
        metavar="KEY=VALUE",
        help="an extra Spark setting (repeatable), e.g. spark.pyspark.python=/path/to/python",
    )
    demo.set_defaults(func=cmd_demo)


def _add_catalog(sub, shared: dict[str, argparse.ArgumentParser]) -> None:
    catalog = sub.add_parser("catalog", help="the file catalog").add_subparsers(
        dest="catalog_command", required=True
    )
    query = catalog.add_parser(
        "query", parents=[shared["config"]], help="files of a table by time range or by work id (run)"
    )
    query.add_argument("--what", required=True, help="table, e.g. accounts or 00Dxx/account")
    query.add_argument("--where", help="feed instance, e.g. unit")
    query.add_argument("--start", type=_moment_ms, help="ISO time or epoch ms")
    query.add_argument("--end", type=_moment_ms, help="ISO time or epoch ms")
    query.add_argument("--work-id", help="the Dagster run id that read or wrote the files")
    query.add_argument("--json", action="store_true", help="print the records as JSON")
    query.set_defaults(func=cmd_catalog_query)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lake-assets", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    shared = _shared_options()
    _add_run(sub, shared)
    status = sub.add_parser(
        "status",
        parents=[shared["config"], shared["lake"]],
        help="per table: last processed partition, what waits, quarantined files, rows, last run",
    )
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.set_defaults(func=cmd_status)
    sub.add_parser(
        "discover",
        parents=[shared["config"], shared["lake"]],
        help="list the landings and pin their tables and first hour in the lake",
    ).set_defaults(func=cmd_discover)
    _add_demo(sub, shared)
    rebuild = sub.add_parser(
        "rebuild",
        parents=[shared["config"], shared["lake"]],
        help="forget one table (its purge ledger kept) so that the next run rebuilds it from its landing",
    )
    rebuild.add_argument(
        "--table", required=True, help="feed/table, e.g. unit/accounts or grax/00Dxx/account"
    )
    rebuild.set_defaults(func=cmd_rebuild)
    _add_catalog(sub, shared)
    config = sub.add_parser("config", help="the feed configuration").add_subparsers(
        dest="config_command", required=True
    )
    check = config.add_parser(
        "check", help="check a configuration file; print it with every default filled in"
    )
    check.add_argument("file", help="feed configuration YAML")
    check.set_defaults(func=cmd_config_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    reversed_range = _reversed_range(args)
    if reversed_range:
        parser.error(reversed_range)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a pipe's buffer is written here, while a closed reader can be told
        return code
    except LakeAssetsError as exc:
        for line in str(exc).splitlines():  # a configuration error has a line per mistake
            print(f"lake-assets: error: {line}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # another pipe or socket broke: a failure of its own
        return 141  # what a shell reports for a command ended by SIGPIPE


def _stdout_reader_gone() -> bool:
    """Whether standard output's reader went away (`| head`): its pipe reports an error to a
    poll whatever was buffered or written. Then the rest of the output has nowhere to go, and
    stdout is pointed at nothing: Python flushes it once more at exit, which would raise again."""
    try:
        descriptor = sys.stdout.fileno()
        poller = select.poll()
        poller.register(descriptor, select.POLLOUT)
        gone = any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no descriptor, or no poll on this system
        return False
    if gone:
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), descriptor)
    return gone


if __name__ == "__main__":
    sys.exit(main())
