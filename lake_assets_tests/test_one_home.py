"""One home per concept: a rule, pattern or constant is written once in lake_assets and
imported where it is used. A second copy drifts from the first without a test noticing; these
scans of the package's source find one.

Docstrings and comments may mention a rule; only code (the literals and definitions the
interpreter sees) counts.
"""

from __future__ import annotations

import ast
import functools
import itertools
from pathlib import Path

import lake_assets

PACKAGE = Path(lake_assets.__file__).parent


@functools.cache
def _modules() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(PACKAGE.parent)): ast.parse(path.read_text(), str(path))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    owners = [
        tree,
        *(n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))),
    ]
    return {
        id(owner.body[0].value)
        for owner in owners
        if owner.body
        and isinstance(owner.body[0], ast.Expr)
        and isinstance(owner.body[0].value, ast.Constant)
    }


def _constants(value_type: type) -> list[tuple[str, int, object]]:
    """(module, line, value) of every literal of `value_type` in code (docstrings left out)."""
    found: list[tuple[str, int, object]] = []
    for module, tree in _modules().items():
        skip = _docstrings(tree)
        found += [
            (module, node.lineno, node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and type(node.value) is value_type and id(node) not in skip
        ]
    return found


def _where_text(fragment: str) -> list[str]:
    return [
        f"{module}:{line}"
        for module, line, value in _constants(str)
        if isinstance(value, str) and fragment in value
    ]


def _where_number(number: int) -> list[str]:
    return [f"{module}:{line}" for module, line, value in _constants(int) if value == number]


def _definitions(name: str) -> list[str]:
    return [
        f"{module}:{node.lineno}"
        for module, tree in _modules().items()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name
    ]


def _modules_of(places: list[str]) -> list[str]:
    """The module of each `module:line` place: a module twice when it holds two copies."""
    return [place.partition(":")[0] for place in places]


def test_the_scan_sees_code_and_not_docstrings():
    """The scans below must be able to fail: they find a literal that is there, and pass over
    one that is only in a docstring."""
    assert _where_text("parquet/v2/org=") == []  # in grax_v2's module docstring only
    assert _modules_of(_where_text("must be '<org>/<object in lower case>'")) == [
        "lake_assets/feeds/grax_v2.py"
    ]


def test_a_name_is_defined_once():
    """A feed's name and a catalog record's `where` / `what`: `paths.NAME`."""
    assert _modules_of(_where_text("a-z0-9_-")) == ["lake_assets/paths.py"]


def test_a_grax_org_and_object_are_defined_once():
    for pattern in ("[A-Za-z0-9]{1,64}", "[A-Za-z][A-Za-z0-9_]{0,79}"):
        assert len(_where_text(pattern)) == 1, _where_text(pattern)


def test_epoch_numbers_are_defined_once():
    """A day in milliseconds and the line between epoch seconds and milliseconds: `epoch`."""
    for number in (86_400_000, 100_000_000_000):
        assert _modules_of(_where_number(number)) == ["lake_assets/epoch.py"], _where_number(number)


def test_the_quarantine_folder_is_named_once():
    """Every quarantine path is built by `LakeLayout.quarantine` (and `quarantine.py` on it)."""
    places = [
        f"{module}:{line}"
        for module, line, value in _constants(str)
        if value == "_quarantine" or "/_quarantine" in value or "_quarantine/" in value
    ]
    assert _modules_of(places) == ["lake_assets/paths.py"]


def test_data_files_and_the_hidden_rule_are_defined_once():
    assert _modules_of(_definitions("data_files")) == ["lake_assets/storage.py"]
    assert _modules_of(_definitions("is_hidden")) == ["lake_assets/storage.py"]


def test_s3_settings_are_one_model_and_storage_is_made_from_it():
    """`config_model.S3Config` is the configuration file's `s3` key and what `Storage` reads;
    a Storage is made from it where a configuration is turned into one."""
    assert [n for n in ("S3Settings", "S3Config") if _definitions(n)] == ["S3Config"]
    assert len(_definitions("S3Config")) == 1
    built = sorted(
        module
        for module, tree in _modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Storage"
    )
    assert built == ["lake_assets/config.py", "lake_assets/orchestration/resources.py"]


def test_the_formats_are_listed_once():
    """The formats are listed in `feeds._formats`; every other module asks it."""
    for name in ("UnitCdcFormat", "GraxV2Format", "FlowJournalFormat"):
        home = _modules_of(_definitions(name))
        used = sorted(
            {
                module
                for module, tree in _modules().items()
                for node in ast.walk(tree)
                if isinstance(node, ast.Name) and node.id == name
            }
            - set(home)
        )
        assert used == ["lake_assets/feeds/__init__.py"], (name, used)


def test_each_concept_is_imported_from_its_home():
    """Imported through a module that happens to import it, a name hides where it is defined,
    and a module that defines a name of its own alike shadows it unnoticed (the engine's list of
    a lake folder's Parquet files once shared `data_files` with the landing's)."""
    homes = {
        "data_files": "lake_assets.storage",
        "is_hidden": "lake_assets.storage",
        "NAME": "lake_assets.paths",
        "is_name": "lake_assets.paths",
        "as_name": "lake_assets.paths",
        "DAY_MS": "lake_assets.epoch",
        "EPOCH_MS_THRESHOLD": "lake_assets.epoch",
    }
    elsewhere = []
    for folder in (PACKAGE, PACKAGE.parent / "lake_assets_tests", PACKAGE.parent / "benchmarks"):
        for path in sorted(folder.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lake_assets"):
                    elsewhere += [
                        f"{path.name}: {alias.name} from {node.module}"
                        for alias in node.names
                        if alias.name in homes and node.module != homes[alias.name]
                    ]
    assert elsewhere == []


def _imported_modules(module: str) -> set[str]:
    """The lake_assets modules `module` (a path under the package's parent) imports."""
    imported = set()
    for node in ast.walk(_modules()[module]):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
    return {name for name in imported if name.startswith("lake_assets")}


def test_each_catalog_store_has_a_module_of_its_own_over_the_shared_rules():
    """`catalog.store` holds the rules both stores keep (`CatalogStore`); each store is one module
    on it, and neither reaches into the other (what they share is written once, in the base)."""
    stores = {
        "ParquetCatalogStore": "lake_assets/catalog/parquet_store.py",
        "DynamoCatalogStore": "lake_assets/catalog/dynamodb_store.py",
    }
    assert _modules_of(_definitions("CatalogStore")) == ["lake_assets/catalog/store.py"]
    for name, module in stores.items():
        assert _modules_of(_definitions(name)) == [module], name
        assert "lake_assets.catalog.store" in _imported_modules(module), module
    for module, other in itertools.permutations(stores.values()):
        other_name = other.removesuffix(".py").replace("/", ".")
        assert other_name not in _imported_modules(module), (module, other)
