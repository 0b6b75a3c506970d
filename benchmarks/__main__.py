"""python -m benchmarks [--quick | --scale]: side-by-side figures as one JSON document, then a
short table. `--scale` measures only the ten-times-the-data figures (`benchmarks.scale`)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from pathlib import Path

from benchmarks import scale, side_by_side
from benchmarks.unit_landing import LandingShape
from lake_assets import spark as spark_settings

# `samples`: hourly folds measured on each side (and DuckDB recomputes); their median is the
# figure. Three could not tell a 0.3 s change from this VM's run-to-run noise at full size.
SIZES = {
    "quick": {**side_by_side.QUICK, "samples": 3},
    "full": {"keys": 100_000, "rate": 10_000, "samples": 7},
}


def _machine(session) -> dict:
    memory_gib = None
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        total_kib = int(meminfo.read_text().split("MemTotal:")[1].split()[0])
        memory_gib = round(total_kib / 1024 / 1024, 1)
    return {
        "cpus": os.cpu_count(),
        "memory_gib": memory_gib,
        "python": platform.python_version(),
        "spark": session.version,
        "spark_master": session.sparkContext.master,
        # what the driver's JIT, collector and class archive were: a figure depends on them
        "driver_java_options": session.conf.get("spark.driver.extraJavaOptions", None),
        "platform": platform.platform(),
    }


def table(figures: dict) -> str:
    lines = [f"{'figure':<24} {'value':>9}  {'goal':<8} met"]
    for name, value in figures["figures"].items():
        lines.append(
            f"{name:<24} {value:>9}  {figures['goals'][name]:<8} {'yes' if figures['met'][name] else 'NO'}"
        )
    for name, value in figures["context"].items():
        lines.append(f"{name:<24} {value:>9}  (no goal)")
    memory = figures.get("peak_driver_rss_mb")
    if memory:
        lines.append(f"{'peak driver RSS 1d/30d':<24} {memory['1d']:>5.0f} / {memory['30d']:.0f} MB")
    lines.append(f"{'equal to DuckDB':<24} {'yes' if figures['correct'] else 'NO':>9}")
    if "handwritten_correct" in figures:
        lines.append(f"{'hand-written equal':<24} {'yes' if figures['handwritten_correct'] else 'NO':>9}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="small sizes that finish in a few minutes")
    sizes.add_argument(
        "--scale",
        action="store_true",
        help=f"the full size against {scale.FACTOR}x the rows: cost per row of a backfill and an hourly fold (long)",
    )
    parser.add_argument(
        "--workdir", type=Path, help="where the generated data goes (default: the system temp dir)"
    )
    parser.add_argument(
        "--only",
        choices=sorted(side_by_side.PARTS),
        help="measure one part and print its timings (no goals checked)",
    )
    args = parser.parse_args()
    if args.scale and args.only:
        parser.error("--scale measures its own figures: it does not take --only")
    size = "quick" if args.quick else "full"
    memory = {"spark.driver.memory": scale.DRIVER_MEMORY} if args.scale else {}
    session = spark_settings.build_session(
        spark_settings.session_conf(app_name="lake_assets_benchmarks", extra=memory)
    )
    session.sparkContext.setLogLevel("ERROR")
    if args.scale:
        full = SIZES["full"]
        base = LandingShape(
            keys=full["keys"], events_per_hour=full["rate"], hours=1, start=side_by_side.START
        )
        with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
            figures = {"machine": _machine(session), "size": f"1x and {scale.FACTOR}x full"}
            figures.update(scale.run(session, Path(tmp), base, samples=full["samples"]))
        print(json.dumps(figures, indent=2, default=str))
        print()
        print(table(figures))
        return
    if args.only:
        part = side_by_side.run_part(args.only, session, workdir=args.workdir, **SIZES[size])
        print(json.dumps({"machine": _machine(session), "size": size, **part}, indent=2, default=str))
        return
    figures = {
        "machine": _machine(session),
        "size": size,
        **side_by_side.run(session, workdir=args.workdir, **SIZES[size]),
    }
    print(json.dumps(figures, indent=2, default=str))
    print()
    print(table(figures))


if __name__ == "__main__":
    main()
