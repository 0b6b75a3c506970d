"""Flow documents as rows of a table: the columns a document becomes, the kinds of its key
values, and the rules a document must meet to be data (docs/formats/flow-journals.md). Plain
Python, no Spark job (Spark's types only describe a stored schema): run inside the Spark tasks
that read the journals (`flow_tasks`) and by the driver.
"""

from __future__ import annotations

import functools
import json
import reprlib
from typing import Any, NamedTuple

from pyspark.sql import types as T

from lake_assets.engine import model as m
from lake_assets.engine.names import case_clash, lake_name, same_name
from lake_assets.engine.schema import DECIMAL_DIGITS
from lake_assets.feeds import flow_fragments as ff
from lake_assets.ingest import TEXT_REPAIRED

_OPS = {"c": m.INSERT, "u": m.UPDATE, "d": m.DELETE}
#: the longest field name Spark's JSON reader (Jackson's read constraints) takes, in UTF-16 units;
#: no option of the reader raises it, as `maxStringLen` does for values (`flow_journal._parsed`)
SPARK_JSON_MAX_NAME = 50_000


def _utf16_length(text: str) -> int:
    return len(text) + sum(1 for char in text if ord(char) > 0xFFFF)


def key_column(pointer: str) -> str:
    """The column a key pointer becomes: `/id` -> `id`, `/a/b` -> `a_b` (by its lake name)."""
    return lake_name(pointer.strip("/").replace("/", "_"))


def resolve(document: dict, pointer: str):
    """The value a JSON pointer (`/a/b`, `~1` for `/`, `~0` for `~`) names in `document`, or
    None where the path does not lead to one."""
    value = document
    for escaped in pointer.strip("/").split("/"):
        token = escaped.replace("~1", "/").replace("~0", "~")
        if not isinstance(value, dict) or token not in value:
            return None
        value = value[token]
    return value


def _columns_of(document: dict, key: tuple[str, ...]) -> list[str]:
    """The columns a document becomes (`document_row`), each once."""
    return list(
        dict.fromkeys([*(lake_name(name) for name in document if name != "_meta"), *map(key_column, key)])
    )


def _column_value(value: Any) -> Any:
    """A top-level field's value as its column takes it: objects and arrays as JSON text, and an
    integer with more digits than a decimal holds as its digits (Spark would read it as a
    double, which rounds), so that its column becomes text and no value changes."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**DECIMAL_DIGITS:
        return str(value)
    return value


class DocumentRow(NamedTuple):
    """A committed document as `FlowJournalFormat._parsed` reads it."""

    #: a flat JSON object: key columns, top-level fields and the change-model fields the feed
    #: derives, each column under its name folded to one case (`names.same_name`)
    json: str
    #: the folded columns holding empty text: Spark's reading of JSON takes `""` for a value of
    #: any type, and would then refuse it in a column of numbers or booleans
    empty_text: list[str]
    #: folded column -> its spelling in this document. Spark's reading of JSON merges fields
    #: spelled alike but for case into one column, then reads the values of one spelling only
    spellings: dict[str, str]


def document_row(doc: ff.Doc, key: tuple[str, ...], hour: str) -> DocumentRow:
    """One committed document as the row `FlowJournalFormat._parsed` reads."""
    body, repaired = ff.valid_text_fields(doc.doc) if doc.garbled else (doc.doc, 0)
    meta = body.get("_meta") or {}
    try:
        fields = {lake_name(name): _column_value(value) for name, value in body.items() if name != "_meta"}
    except RecursionError:  # read at the edge of the parser's depth, too deep to write out again
        raise ff.FragmentError(doc.uri, "document nests too deeply to be written out", doc.offset) from None
    for pointer in key:
        fields[key_column(pointer)] = resolve(body, pointer)
    # One spelling per folded name: a document spelling two alike is refused (`vet_document`).
    row = {same_name(column): value for column, value in fields.items()}
    spellings = {same_name(column): column for column in fields}
    empty_text = [column for column, value in row.items() if value == ""]
    row.update(
        {
            "__op": _OPS.get(meta.get("op", ""), m.UPDATE),  # a document without an op is an upsert
            "__clock": doc.uuid.order,
            "__at": doc.uuid.timestamp.isoformat(),
            "__uri": doc.uri,
            "__offset": doc.offset,
            "__hour": hour,
            **({TEXT_REPAIRED: repaired} if repaired else {}),
        }
    )
    return DocumentRow(json.dumps(row, separators=(",", ":")), empty_text, spellings)


def _exact_key_number(value: object) -> bool:
    """Whether a key value that is a number reaches Spark as that number: JSON numbers with a
    fraction or beyond 64 bits are inferred as doubles, which round (2^53 + 1 reads as 2^53)."""
    if isinstance(value, ff.NumberText):
        return False  # a number no double holds
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True  # not a number: text and booleans keep their values
    return isinstance(value, int) and -(2**63) <= value < 2**63


#: the JSON kinds a key value may have, as `key_kind` names them; of kinds equally common in a
#: batch, the first here stands (`flow_journal._PassNotes.mixed_key_kinds`)
KEY_KINDS = ("boolean", "number", "text")


def key_kind(value: object) -> str:
    """The JSON kind of a scalar key value: boolean, number or text."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float, ff.NumberText)):
        return "number"
    return "text"


def stored_key_kinds(stored: T.StructType | None, key: tuple[str, ...]) -> dict[str, str]:
    """pointer -> the kind of the key's column in the table as stored (none for a new table, or
    a column of another type)."""
    if stored is None:
        return {}
    types = {same_name(field.name): field.dataType for field in stored.fields}
    kinds = {}
    for pointer in key:
        kind = types.get(same_name(key_column(pointer)))
        if isinstance(kind, T.StringType):
            kinds[pointer] = "text"
        elif isinstance(kind, T.BooleanType):
            kinds[pointer] = "boolean"
        elif isinstance(kind, T.NumericType):
            kinds[pointer] = "number"
    return kinds


def vet_document(doc: ff.Doc, key: tuple[str, ...], kinds: dict[str, str] | None = None) -> None:
    """FragmentError (naming the document's offset) unless the document is data the change model
    can take: a known op, every key pointer resolving to a scalar (string, number, boolean) whose
    text is valid UTF-8 and whose kind is the one `kinds` gives the key (if it gives one), and no
    two fields whose names are equal ignoring case (Spark would take them for one column)."""
    op = doc.doc["_meta"].get("op")
    if op is not None and (not isinstance(op, str) or op not in _OPS):
        raise ff.FragmentError(doc.uri, f"document has an unknown _meta.op {reprlib.repr(op)}", doc.offset)
    values = {pointer: resolve(doc.doc, pointer) for pointer in key}
    missing = [pointer for pointer, value in values.items() if value is None]
    if missing:
        raise ff.FragmentError(doc.uri, f"document has no key {missing}", doc.offset)
    for pointer, value in values.items():
        if isinstance(value, (dict, list)):
            kind = "object" if isinstance(value, dict) else "array"
            raise ff.FragmentError(
                doc.uri,
                f"document key {pointer} is a JSON {kind}, not a string, number or boolean",
                doc.offset,
            )
        if not _exact_key_number(value):
            number = value if isinstance(value, ff.NumberText) else reprlib.repr(value)  # as written
            raise ff.FragmentError(
                doc.uri,
                f"document key {pointer} is the number {number}: a key number must be a whole "
                "number of 64 bits, as other numbers are read as doubles and two keys could become one",
                doc.offset,
            )
    for pointer, value in values.items():
        wanted = (kinds or {}).get(pointer)
        if wanted is not None and key_kind(value) != wanted:
            raise ff.FragmentError(
                doc.uri,
                f"document key {pointer} is {key_kind(value)} ({reprlib.repr(value)}) where the collection's "
                f'key is {wanted}: read together, both become text and two keys (1 and "1") could become one',
                doc.offset,
            )
    garbled = [pointer for pointer, value in values.items() if doc.garbled and ff.holds_invalid_text(value)]
    if garbled:  # a key is an identity: repaired, two keys could become one
        raise ff.FragmentError(
            doc.uri, f"document key {garbled} holds text that is not valid UTF-8", doc.offset
        )
    long_name = next(
        (
            name
            for name in doc.doc
            if len(name) > SPARK_JSON_MAX_NAME // 2 and _utf16_length(name) > SPARK_JSON_MAX_NAME
        ),
        None,
    )
    if long_name is not None:
        raise ff.FragmentError(
            doc.uri,
            f"document has a field name of {len(long_name):,} characters ({reprlib.repr(long_name)}), "
            f"longer than Spark's JSON reader takes ({SPARK_JSON_MAX_NAME:,})",
            doc.offset,
        )
    # `_meta` is the journal's: only its op is read, and nothing of it is written
    fields = {name: value for name, value in doc.doc.items() if name != "_meta"}
    merged = ff.names_one_once_repaired(fields) if doc.garbled else None
    if merged:
        first, second = (f"'{shown}'" for shown in _where_they_differ(*merged))
        raise ff.FragmentError(
            doc.uri,
            f"document has the field names {first} and {second}, which are one name once the text "
            "in them that is not valid UTF-8 is repaired: one of their values would be dropped",
            doc.offset,
        )
    # as the row is written: with its text repaired
    body = ff.valid_text_fields(doc.doc)[0] if doc.garbled else doc.doc
    clash = case_clash(_columns_of(body, key)) or _field_named_like_a_key(body, key)
    if clash:
        raise ff.FragmentError(doc.uri, f"document has {clash}", doc.offset)


def _where_they_differ(first: str, second: str, shown: int = 60) -> tuple[str, str]:
    """Two names of a garbled document as a reason shows them (`flow_fragments.as_written`),
    clipped to `shown` characters around where they first differ."""
    at = next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), 0)
    start = max(0, at - shown // 3)

    def clipped(name: str) -> str:
        window = ff.as_written(name[start : start + shown])
        return ("..." if start else "") + window + ("..." if start + shown < len(name) else "")

    return clipped(first), clipped(second)


def _field_named_like_a_key(document: dict, key: tuple[str, ...]) -> str | None:
    """A top-level field whose column is a key's column without being that key's field (`a_b`
    beside the key `/a/b`, `a~1b` beside the key `/a~1b`): the key's value takes the column, and
    the field's value would be dropped without a word."""
    taken = _key_columns_taken(key)
    for name in document:
        pointer = taken.get(same_name(lake_name(name)))
        if name != "_meta" and pointer is not None and name != _field_of(pointer):
            return f"a field '{name}' whose column is the column of the key {pointer}"
    return None


@functools.lru_cache(maxsize=64)
def _key_columns_taken(key: tuple[str, ...]) -> dict[str, str]:
    """The key's columns (as Spark compares names) -> their pointers."""
    return {same_name(key_column(pointer)): pointer for pointer in key}


def _field_of(pointer: str) -> str | None:
    """The top-level field a one-token pointer names (`/a~1b` -> `a/b`), else None."""
    tokens = pointer.strip("/").split("/")
    return tokens[0].replace("~1", "/").replace("~0", "~") if len(tokens) == 1 else None


def keep_first_spellings(kept: dict[str, str], found: dict[str, str]) -> None:
    """Merge `found` spellings into `kept`, keeping of two the first in sort order: the one
    Spark's reading of JSON listed first when the spellings were columns apart."""
    for folded, spelling in found.items():
        if folded not in kept or spelling < kept[folded]:
            kept[folded] = spelling
