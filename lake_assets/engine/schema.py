"""Schema drift: columns come and go, numeric types widen, text absorbs any scalar it meets (a
vendor that switches a field's type keeps every value, spelled as text); what text cannot hold
(a struct beside a number) and key types whose values widening would change are a clear clash."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lake_assets.engine import model as m
from lake_assets.engine.names import col, same_name
from lake_assets.errors import SchemaClash


def change_columns(
    *,
    op: Column,
    version_at: Column,
    seq: Column,
    source_file: Column,
    partition: Column,
    partition_column: str,
    purged: Column | None = None,
) -> list[Column]:
    """A feed's normalised rows' system columns, in the change model's order (`system_fields`),
    then its partition: every feed's rows are whole images (no column left unmodified), and
    none but GRAX's marks a purge."""
    return [
        op.alias(m.OP),
        version_at.alias(m.VERSION_AT),
        seq.alias(m.SEQ),
        F.lit(None).cast("array<string>").alias(m.UNMODIFIED),
        (F.lit(False) if purged is None else purged).alias(m.PURGED),
        source_file.alias(m.SOURCE_FILE),
        partition.alias(partition_column),
    ]


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
_INTEGER_CHAIN = (T.ByteType(), T.ShortType(), T.IntegerType(), T.LongType())
#: decimal digits that hold every value of an integer type (Spark's own mapping)
_INTEGER_DIGITS: dict[T.DataType, int] = {
    T.ByteType(): 3,
    T.ShortType(): 5,
    T.IntegerType(): 10,
    T.LongType(): 20,
}
_FLOATING = (T.FloatType(), T.DoubleType())
DECIMAL_DIGITS = 38  # the most a Spark decimal holds


def _exact_decimal(left: T.DataType, right: T.DataType) -> T.DataType | None:
    """The decimal type holding every value of two decimal or integer types, or None when no
    decimal can (more than 38 digits)."""

    def digits(dtype: T.DataType) -> tuple[int, int]:  # (integer digits, scale)
        if isinstance(dtype, T.DecimalType):
            return dtype.precision - dtype.scale, dtype.scale
        return _INTEGER_DIGITS[dtype], 0

    (left_whole, left_scale), (right_whole, right_scale) = digits(left), digits(right)
    scale = max(left_scale, right_scale)
    precision = max(left_whole, right_whole) + scale
    return T.DecimalType(precision, scale) if precision <= DECIMAL_DIGITS else None


def widen(table: str, column: str, left: T.DataType, right: T.DataType, *, exact: bool = False) -> T.DataType:
    """The narrowest type holding both, or SchemaClash naming table, column and both types.

    Integers widen along their chain, and integers and decimals into a decimal with room for
    both. A 64-bit integer or a decimal meeting a floating-point number becomes a double, which
    rounds beyond 15 significant digits: `exact` (a key column, where two values rounded alike
    would be one record) refuses that instead. Decimals needing more than 38 digits become text,
    or, `exact`, are refused. A date meeting a timestamp becomes the timestamp (the day's first
    instant). Any other two scalar types (a boolean beside a number or a date) become text, which
    spells every value; `exact` refuses them. A struct, array or map meeting another type stays
    a clash: text would not spell its values back."""
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
    pair = {left, right}
    decimal = any(isinstance(t, T.DecimalType) for t in pair)
    if pair <= set(_INTEGER_CHAIN):
        return _INTEGER_CHAIN[max(_INTEGER_CHAIN.index(left), _INTEGER_CHAIN.index(right))]
    if pair <= set(_FLOATING):
        return T.DoubleType()
    if pair & set(_FLOATING) and (pair & set(_INTEGER_CHAIN) or decimal):
        # A double holds every 32-bit integer exactly, not every 64-bit one or every decimal.
        if exact and (T.LongType() in pair or decimal):
            raise _clash(table, column, left, right, "without changing values")
        return T.DoubleType()
    if decimal and all(isinstance(t, T.DecimalType) or t in _INTEGER_CHAIN for t in pair):
        wide = _exact_decimal(left, right)
        if wide is None and exact:
            raise _clash(table, column, left, right, "within 38 digits")
        return wide or T.StringType()
    if exact or not (isinstance(left, T.AtomicType) and isinstance(right, T.AtomicType)):
        raise _clash(table, column, left, right, "without changing values" if exact else "")
    timestamps = [t for t in pair if isinstance(t, (T.TimestampType, T.TimestampNTZType))]
    if T.DateType() in pair and timestamps:
        return timestamps[0]
    return T.StringType()


def _clash(table: str, column: str, left: T.DataType, right: T.DataType, how: str = "") -> SchemaClash:
    return SchemaClash(
        f"table {table!r}: column {column!r} has type {left.simpleString()} in one place and "
        f"{right.simpleString()} in another; these cannot be widened into one type{' ' + how if how else ''}",
        table=table,
        column=column,
    )


def unified_fields(
    table: str, schemas: list[T.StructType], keys: tuple[str, ...] = ()
) -> list[T.StructField]:
    """Union of columns in first-seen order, each with its widened type (`keys` exactly, see
    `widen`). Names equal ignoring case are one column (Spark could not tell them apart),
    spelled as first seen."""
    exact = {same_name(k) for k in keys}
    spelling: dict[str, str] = {}
    types: dict[str, T.DataType] = {}
    for schema in schemas:
        for field in schema.fields:
            name = same_name(field.name)
            if name not in types:
                spelling[name] = field.name
                types[name] = field.dataType
            else:
                types[name] = widen(table, spelling[name], types[name], field.dataType, exact=name in exact)
    return [T.StructField(spelling[name], types[name], True) for name in spelling]


def text_where_bound_for_text(
    fields: list[T.StructField], schemas: list[T.StructType], bound_for: T.StructType
) -> list[T.StructField]:
    """`fields` (the union of `schemas`) with text for each scalar column the schemas disagree
    on that the table they are bound for holds as text: each frame's values then become text
    from their own type. Widened among themselves first, a 64-bit integer beside a fraction
    would become a double, and lose digits, on its way to the table's text; and a key, though
    its widening changes no value, would change its spelling (`5` beside a decimal key becomes
    `5.00`), and so its record, where one run over both files keeps each as it landed."""
    text_there = {same_name(f.name) for f in bound_for.fields if isinstance(f.dataType, T.StringType)}

    def disagreed(name: str) -> bool:
        kinds = {f.dataType for schema in schemas for f in schema.fields if same_name(f.name) == name}
        return len(kinds) > 1

    return [
        T.StructField(field.name, T.StringType(), True)
        if same_name(field.name) in text_there
        and isinstance(field.dataType, T.AtomicType)
        and not isinstance(field.dataType, T.StringType)
        and disagreed(same_name(field.name))
        else field
        for field in fields
    ]


def conform(
    df: DataFrame,
    fields: list[T.StructField],
    schema: T.StructType | None = None,
    *,
    keys: tuple[str, ...] = (),
    repair_text: bool = True,
) -> DataFrame:
    """Select `fields` from `df`: cast to the target type, spelled as the field is, NULL where
    the column is absent. `schema` is `df`'s, when the caller has it (asking a deep plan for it
    costs an analysis).

    Bytes cast to text are cast as they are, UTF-8 or not; with `repair_text` those of a column
    other than `keys` are repaired, as a batch's text is (docs/bad-input.md), or other engines
    could not read the table. A key's bytes are never repaired: two keys could become one."""
    schema = schema or df.schema
    present = {same_name(f.name): f for f in schema.fields}
    if [(f.name, f.dataType) for f in schema.fields] == [(f.name, f.dataType) for f in fields]:
        return df  # already in shape: no projection of every column to build and analyse
    key_names = {same_name(k) for k in keys}

    def repairable(field: T.StructField) -> bool:
        return repair_text and same_name(field.name) not in key_names

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
        cast = col(found.name).cast(field.dataType)
        if repairable(field) and holds(found.dataType, T.BinaryType) and holds_text(field.dataType):
            cast = valid_text(cast, field.dataType)[0]
        return cast.alias(field.name)

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


def union_all(
    table: str,
    frames: list[DataFrame],
    keys: tuple[str, ...] = (),
    *,
    repair_text: bool = True,
    bound_for: T.StructType | None = None,
) -> DataFrame:
    """Union frames whose schemas drifted, widening their types (`widen`; the `keys` exactly);
    `repair_text`: as for `conform`. `bound_for` is the schema of the table the union is to be
    merged into, when there is one (`text_where_bound_for_text`)."""
    if len(frames) == 1:
        return frames[0]
    schemas = [f.schema for f in frames]
    fields = unified_fields(table, schemas, keys)
    if bound_for is not None:
        fields = text_where_bound_for_text(fields, schemas, bound_for)
    result = conform(frames[0], fields, schemas[0], keys=keys, repair_text=repair_text)
    for frame, schema in zip(frames[1:], schemas[1:], strict=True):
        result = result.unionByName(conform(frame, fields, schema, keys=keys, repair_text=repair_text))
    return result


# --- text that other engines can read -----------------------------------------------------------


def holds(kind: T.DataType, leaf: type[T.DataType]) -> bool:
    """Whether a value of type `kind` holds a `leaf` value, at its top or nested."""
    if isinstance(kind, leaf):
        return True
    if isinstance(kind, T.StructType):
        return any(holds(f.dataType, leaf) for f in kind.fields)
    if isinstance(kind, T.ArrayType):
        return holds(kind.elementType, leaf)
    if isinstance(kind, T.MapType):
        return holds(kind.keyType, leaf) or holds(kind.valueType, leaf)
    return False


def holds_text(kind: T.DataType) -> bool:
    return holds(kind, T.StringType)


def _any(flags: list[Column]) -> Column:
    found = F.lit(False)
    for flag in flags:
        found = found | F.coalesce(flag, F.lit(False))
    return found


def valid_text(value: Column, kind: T.DataType) -> tuple[Column, Column]:
    """`value` (of type `kind`) with all text in it valid UTF-8, each invalid sequence replaced by
    U+FFFD; and whether anything in it had to be."""
    if isinstance(kind, T.StringType):
        return F.make_valid_utf8(value), F.coalesce(~F.is_valid_utf8(value), F.lit(False))
    if isinstance(kind, T.StructType):
        fields = {
            f.name: valid_text(value.getField(f.name), f.dataType)
            if holds_text(f.dataType)
            else (value.getField(f.name), None)
            for f in kind.fields
        }
        rebuilt = F.struct(*[repaired.alias(name) for name, (repaired, _) in fields.items()])
        return F.when(value.isNotNull(), rebuilt), _any(
            [flag for _, flag in fields.values() if flag is not None]
        )
    if isinstance(kind, T.ArrayType):
        return (
            F.transform(value, lambda item: valid_text(item, kind.elementType)[0]),
            F.coalesce(F.exists(value, lambda item: valid_text(item, kind.elementType)[1]), F.lit(False)),
        )
    if isinstance(kind, T.MapType):
        # A repaired key may equal another key of the map: Spark then fails the read of that
        # file, and the file is quarantined with Spark's reason.
        keys, values = kind.keyType, kind.valueType
        repaired, flags = value, []
        if holds_text(keys):
            repaired = F.transform_keys(repaired, lambda k, _: valid_text(k, keys)[0])
            flags.append(F.exists(F.map_keys(value), lambda k: valid_text(k, keys)[1]))
        if holds_text(values):
            repaired = F.transform_values(repaired, lambda _, v: valid_text(v, values)[0])
            flags.append(F.exists(F.map_values(value), lambda v: valid_text(v, values)[1]))
        return repaired, _any(flags)
    return value, F.lit(False)
