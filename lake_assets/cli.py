"""`lake-assets`: run the pipeline in-process, or try it on generated sample data."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from lake_assets.config import CollectionConfig, FeedConfig, LakeConfig, dump_config, load_config
from lake_assets.errors import LakeAssetsError
from lake_assets.runner import format_summary, run_feeds, summarise

DEFAULT_DEMO_DIR = Path(".demo")


def _say(message: str) -> None:
    print(f"lake-assets: {message}", flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.lake:
        config = config.with_lake(args.lake)
    run_feeds(config, say=_say)
    print(format_summary(summarise(config)))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from lake_assets.demo.flow_sample import write_flow_landing
    from lake_assets.demo.grax_sample import write_grax_landing
    from lake_assets.demo.unit_sample import write_unit_landing

    root = Path(args.dir).resolve()
    for sub in ("landing", "lake"):
        shutil.rmtree(root / sub, ignore_errors=True)
    unit_landing = root / "landing" / "unit"
    _say(f"writing sample Unit CDC exports to {unit_landing}")
    unit = write_unit_landing(unit_landing)
    _say(f"wrote {len(unit.files)} files for tables {', '.join(unit.tables)} ({len(unit.late_files)} late)")
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
                collections=tuple(CollectionConfig(name, tuple(key)) for name, key in flow.collections.items()),
            ),
        ),
    )
    config_file = root / "lake_assets.yaml"
    config_file.write_text(dump_config(config))
    _say(f"config written to {config_file}")
    run_feeds(config, say=_say)
    print(format_summary(summarise(config)))
    _say(f"lake at {root / 'lake'}; browse it with: LAKE_ASSETS_CONFIG={config_file} dagster dev -w workspace.yaml")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lake-assets", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="process everything landed for the configured feeds")
    run.add_argument("--config", required=True, help="feed configuration YAML")
    run.add_argument("--lake", help="override the lake root (file:///abs/path or s3a://bucket/prefix)")
    run.set_defaults(func=cmd_run)
    demo = sub.add_parser("demo", help="generate sample vendor files and process them on a local lake")
    demo.add_argument("--dir", default=str(DEFAULT_DEMO_DIR), help="where landing, lake and config go (.demo)")
    demo.set_defaults(func=cmd_demo)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except LakeAssetsError as exc:
        print(f"lake-assets: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
