"""Schema drift: columns come and go, numeric types widen, text absorbs any type it meets (a
vendor that switches a field to text keeps every value as text); anything else is a clear clash."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lake_assets.engine import model as m
from lake_assets.engine.names import col, same_name
from lake_assets.errors import SchemaClash


def system_fields(*, ingested_at: bool) -> list[T.StructField]:
    """The change model's system columns as Spark fields (`_seq` as a long: what an empty or
    generated change log uses; a feed's own `_seq` type widens with it). `_ingested_at` is
    stamped at ingest, so frames from before that leave it out."""
    fields = [
        T.StructField(m.OP, T.StringType()),
        T.StructField(m.VERSION_AT, T.TimestampType()),
        T.StructField(m.SEQ, T.LongType()),
        T.StructField(m.UNMODIFIED, T.ArrayType(T.StringType())),
        T.StructField(m.PURGED, T.BooleanType()),
        T.StructField(m.SOURCE_FILE, T.StringType()),
    ]
    return [*fields, T.StructField(m.INGESTED_AT, T.TimestampType())] if ingested_at else fields


# Each type can widen to any type later in its chain.
_NUMERIC_CHAIN = (T.ByteType(), T.ShortType(), T.IntegerType(), T.LongType(), T.DoubleType())


def _rank(dtype: T.DataType) -> int | None:
    if isinstance(dtype, T.FloatType):
        return len(_NUMERIC_CHAIN) - 1  # float only widens to double
    for index, candidate in enumerate(_NUMERIC_CHAIN):
        if dtype == candidate:
            return index
    return None


def widen(table: str, column: str, left: T.DataType, right: T.DataType) -> T.DataType:
    """The narrowest type holding both, or SchemaClash naming table, column and both types."""
    if left == right or isinstance(right, T.NullType):
        return left
    if isinstance(left, T.NullType):
        return right
    either_text = isinstance(left, T.StringType) or isinstance(right, T.StringType)
    if either_text and isinstance(left, T.AtomicType) and isinstance(right, T.AtomicType):
        return T.StringType()
    if isinstance(left, T.TimestampNTZType) and isinstance(right, T.TimestampType):
        return right
    if isinstance(left, T.TimestampType) and isinstance(right, T.TimestampNTZType):
        return left
    left_rank, right_rank = _rank(left), _rank(right)
    if left_rank is not None and right_rank is not None:
        if isinstance(left, T.FloatType) or isinstance(right, T.FloatType):
            return T.DoubleType()
        return _NUMERIC_CHAIN[max(left_rank, right_rank)]
    if (isinstance(left, T.DecimalType) and right_rank is not None) or (
        isinstance(right, T.DecimalType) and left_rank is not None
    ):
        return T.DoubleType()
    raise SchemaClash(
        f"table {table!r}: column {column!r} has type {left.simpleString()} in one place and "
        f"{right.simpleString()} in another; these cannot be widened into one type",
        table=table,
        column=column,
    )


def unified_fields(table: str, schemas: list[T.StructType]) -> list[T.StructField]:
    """Union of columns in first-seen order, each with its widened type. Names equal ignoring
    case are one column (Spark could not tell them apart), spelled as first seen."""
    spelling: dict[str, str] = {}
    types: dict[str, T.DataType] = {}
    for schema in schemas:
        for field in schema.fields:
            name = same_name(field.name)
            if name not in types:
                spelling[name] = field.name
                types[name] = field.dataType
            else:
                types[name] = widen(table, spelling[name], types[name], field.dataType)
    return [T.StructField(spelling[name], types[name], True) for name in spelling]


def conform(df: DataFrame, fields: list[T.StructField], schema: T.StructType | None = None) -> DataFrame:
    """Select `fields` from `df`: cast to the target type, spelled as the field is, NULL where
    the column is absent. `schema` is `df`'s, when the caller has it (asking a deep plan for it
    costs an analysis)."""
    schema = schema or df.schema
    present = {same_name(f.name): f for f in schema.fields}
    if [(f.name, f.dataType) for f in schema.fields] == [(f.name, f.dataType) for f in fields]:
        return df  # already in shape: no projection of every column to build and analyse

    def select(field: T.StructField):
        found = present.get(same_name(field.name))
        if found is None:
            return F.lit(None).cast(field.dataType).alias(field.name)
        if (found.name, found.dataType) == (
            field.name,
            field.dataType,
        ):  # most columns: nothing to build and analyse
            return col(field.name)
        if found.dataType == field.dataType:
            return col(found.name).alias(field.name)
        return col(found.name).cast(field.dataType).alias(field.name)

    return df.select(*[select(f) for f in fields])


def one_column_per_name(frame: DataFrame, table: str) -> DataFrame:
    """`frame` with each set of columns whose names are equal ignoring case made one column.

    Spark's JSON reader keeps a field spelled `Status` in some documents and `status` in others
    apart, as two columns no name can select. They become one, spelled as first listed, holding
    each row's value (a document holds at most one of the spellings: one with both is refused
    before) in their widened type, or as text where they cannot widen, as that reader does with
    a field whose type clashes between documents.
    """
    groups: dict[str, list[int]] = {}
    for index, name in enumerate(frame.columns):
        groups.setdefault(same_name(name), []).append(index)
    if all(len(indexes) == 1 for indexes in groups.values()):
        return frame
    fields = frame.schema.fields
    # Positional names: the only way to tell the spellings apart in a query.
    by_position = frame.toDF(*[f"{m.INTERNAL_PREFIX}column_{index}" for index in range(len(fields))])

    def merged(indexes: list[int]):
        dtype = fields[indexes[0]].dataType
        try:
            for index in indexes[1:]:
                dtype = widen(table, fields[indexes[0]].name, dtype, fields[index].dataType)
        except SchemaClash:
            dtype = T.StringType()
        values = [by_position[f"{m.INTERNAL_PREFIX}column_{index}"].cast(dtype) for index in indexes]
        return (F.coalesce(*values) if len(values) > 1 else values[0]).alias(fields[indexes[0]].name)

    return by_position.select(*[merged(indexes) for indexes in groups.values()])


def union_all(table: str, frames: list[DataFrame]) -> DataFrame:
    """Union frames whose schemas drifted, widening types where that is lossless."""
    if len(frames) == 1:
        return frames[0]
    schemas = [f.schema for f in frames]
    fields = unified_fields(table, schemas)
    result = conform(frames[0], fields, schemas[0])
    for frame, schema in zip(frames[1:], schemas[1:], strict=True):
        result = result.unionByName(conform(frame, fields, schema))
    return result
