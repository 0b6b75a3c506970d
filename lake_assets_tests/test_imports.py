"""Every module of the package imports on its own, whatever was imported before it."""

import importlib
import pkgutil
import subprocess
import sys

import lake_assets


def test_each_module_imports_first_in_a_fresh_interpreter_state():
    names = sorted(m.name for m in pkgutil.walk_packages(lake_assets.__path__, "lake_assets."))
    # The code location too: its `@dg.definitions` loader reads the feed configuration when
    # Dagster calls it, not on import.
    assert {"lake_assets.ingest", "lake_assets.feeds.unit_cdc", "lake_assets.definitions"} <= set(names)
    # One interpreter, the package's modules forgotten before each import: a cycle that only
    # works in one import order fails here for the module that starts it.
    script = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 'lake_assets' or m.startswith('lake_assets.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        print(f'{name}: {type(exc).__name__}: {exc}')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "", done.stdout


def test_the_formats_are_registered_by_name():
    feeds = importlib.import_module("lake_assets.feeds")
    assert {name: feeds.get_format(name).name for name in ("unit_cdc", "grax_v2", "flow_journal")} == {
        "unit_cdc": "unit_cdc",
        "grax_v2": "grax_v2",
        "flow_journal": "flow_journal",
    }
