"""python -m benchmarks [--quick]: print the benchmark figures as one JSON document."""

from __future__ import annotations

import argparse
import json
import os
import platform

from lake_assets import spark as spark_settings

from benchmarks import incremental

SIZES = {
    "quick": {"keys": 20_000, "rate": 2_000, "samples": 3},
    "full": {"keys": 200_000, "rate": 20_000, "samples": 5},
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes that finish in a few minutes")
    args = parser.parse_args()
    size = SIZES["quick" if args.quick else "full"]
    session = spark_settings.build_session(spark_settings.session_conf(app_name="lake_assets_benchmarks"))
    session.sparkContext.setLogLevel("ERROR")
    figures = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "spark": session.version, "platform": platform.platform()},
        "size": "quick" if args.quick else "full",
        "incremental": incremental.run(session, **size),
    }
    print(json.dumps(figures, indent=2))
    inc = figures["incremental"]
    print(f"\nfold one more hour: 1 day of history {inc['1d']['fold_one_hour_median']} s, "
          f"7 days {inc['7d']['fold_one_hour_median']} s, ratio {inc['ratio_7d_over_1d']} (goal <= 1.3)")


if __name__ == "__main__":
    main()
