"""Column names: what a vendor's column is called in the lake, and how Spark is handed a name.

The rules, the same in every feed (docs/bad-input.md, "Column names"):

- **Reserved names are kept, renamed.** A vendor column named like one of the lake's own
  (`model.is_reserved`: `_op`, `_source_file`, `_fivetran_start`, the partition columns `hour`
  and `batch`, anything starting with `__`, all ignoring case) becomes `_src_<name>`: `_op` ->
  `_src__op`, `hour` -> `_src_hour`. A vendor name that already starts with `_src_` is renamed
  the same way (`_src_x` -> `_src__src_x`), so two vendor columns never end up with one name
  and a renamed one never shadows another. The readers apply it before anything is written.
- **Names equal ignoring case are one name.** Spark (like most SQL engines) compares names
  ignoring case, so it cannot tell `Id` from `id`: a file (or Flow document) holding two such
  columns is quarantined with a reason naming both. The same column spelled differently in
  different files (`Balance`, `balance`) is one column, spelled as the table first met it.
- **Any other character is kept.** Backticks, dots, spaces, `=`, `;`, braces, newlines, unicode:
  Spark 4 reads and writes them in Parquet as they are; every reference to a column by name goes
  through `col`, which quotes it.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F

from lake_assets.engine.model import case_folded, is_reserved

RENAMED_PREFIX = "_src_"


def lake_name(vendor_name: str) -> str:
    """The name a vendor's column has in the lake (see the module's rules). The empty name, which
    Spark's JSON reader drops, is renamed too (to the prefix alone)."""
    renamed = (
        is_reserved(vendor_name) or case_folded(vendor_name).startswith(RENAMED_PREFIX) or not vendor_name
    )
    return RENAMED_PREFIX + vendor_name if renamed else vendor_name


def vendor_name(name: str) -> str:
    """The vendor's name of a lake column (`lake_name` undone)."""
    return name[len(RENAMED_PREFIX) :] if case_folded(name).startswith(RENAMED_PREFIX) else name


def quoted(name: str) -> str:
    """A name as a Spark SQL identifier: in backticks, a backtick inside doubled."""
    return "`" + name.replace("`", "``") + "`"


def col(name: str) -> Column:
    """The column of that exact name (`F.col` reads dots as struct fields and chokes on backticks)."""
    return F.col(quoted(name))


def same_name(name: str) -> str:
    """What two names that Spark takes for the same column have in common (`model.case_folded`)."""
    return case_folded(name)


def case_clash(names: Iterable[str]) -> str | None:
    """Why columns with these names cannot be read together (two equal ignoring case), or None;
    a phrase naming both (a file "has" it)."""
    seen: dict[str, str] = {}
    for name in names:
        if same_name(name) in seen:
            return (
                f"columns {seen[same_name(name)]!r} and {name!r}, whose names are equal ignoring case: "
                "Spark cannot tell them apart"
            )
        seen[same_name(name)] = name
    return None


def schema_case_clash(fields: Iterable[pa.Field], parent: str = "") -> str | None:
    """`case_clash` of a Parquet file's columns, and of the fields of every struct among them
    (named by their path, `address.City`): Spark refuses to read a file with either."""
    fields = list(fields)
    clash = case_clash(parent + field.name for field in fields)
    for field in fields:
        clash = clash or schema_case_clash(_struct_fields(field.type), f"{parent}{field.name}.")
    return clash


def _struct_fields(dtype: pa.DataType) -> list[pa.Field]:
    """The fields of a struct type, or of the structs a list or map type holds."""
    if pa.types.is_struct(dtype):
        return [dtype.field(index) for index in range(dtype.num_fields)]
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype):
        return _struct_fields(dtype.value_type)
    if pa.types.is_map(dtype):
        return _struct_fields(dtype.item_type)
    return []
