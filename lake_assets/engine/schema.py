"""Schema drift: columns come and go, numeric types widen, text absorbs any type it meets (a
vendor that switches a field to text keeps every value as text); anything else is a clear clash."""

from __future__ import annotations

from pyspark.sql import DataFrame, functions as F, types as T

from lake_assets.engine import model as m
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
    return fields + [T.StructField(m.INGESTED_AT, T.TimestampType())] if ingested_at else fields


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
    if isinstance(left, T.StringType) or isinstance(right, T.StringType):
        if isinstance(left, T.AtomicType) and isinstance(right, T.AtomicType):
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
    if isinstance(left, T.DecimalType) and right_rank is not None or isinstance(right, T.DecimalType) and left_rank is not None:
        return T.DoubleType()
    raise SchemaClash(
        f"table {table!r}: column {column!r} has type {left.simpleString()} in one place and "
        f"{right.simpleString()} in another; these cannot be widened into one type",
        table=table,
        column=column,
    )


def unified_fields(table: str, schemas: list[T.StructType]) -> list[T.StructField]:
    """Union of columns in first-seen order, each with its widened type."""
    order: list[str] = []
    types: dict[str, T.DataType] = {}
    for schema in schemas:
        for field in schema.fields:
            if field.name not in types:
                order.append(field.name)
                types[field.name] = field.dataType
            else:
                types[field.name] = widen(table, field.name, types[field.name], field.dataType)
    return [T.StructField(name, types[name], True) for name in order]


def conform(df: DataFrame, fields: list[T.StructField], schema: T.StructType | None = None) -> DataFrame:
    """Select `fields` from `df`: cast to the target type, NULL where the column is absent.
    `schema` is `df`'s, when the caller has it (asking a deep plan for it costs an analysis)."""
    schema = schema or df.schema
    present = {f.name: f.dataType for f in schema.fields}
    if [(f.name, f.dataType) for f in schema.fields] == [(f.name, f.dataType) for f in fields]:
        return df  # already in shape: no projection of every column to build and analyse

    def column(field: T.StructField):
        if field.name not in present:
            return F.lit(None).cast(field.dataType).alias(field.name)
        if present[field.name] == field.dataType:  # most columns: no cast to build and analyse
            return F.col(f"`{field.name}`")
        return F.col(f"`{field.name}`").cast(field.dataType).alias(field.name)

    return df.select(*[column(f) for f in fields])


def union_all(table: str, frames: list[DataFrame]) -> DataFrame:
    """Union frames whose schemas drifted, widening types where that is lossless."""
    if len(frames) == 1:
        return frames[0]
    schemas = [f.schema for f in frames]
    fields = unified_fields(table, schemas)
    result = conform(frames[0], fields, schemas[0])
    for frame, schema in zip(frames[1:], schemas[1:]):
        result = result.unionByName(conform(frame, fields, schema))
    return result
