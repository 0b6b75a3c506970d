"""Realistic GRAX Data Lake v2 landings, messy the way the real ones are (docs/formats/grax-v2.md).

Deterministic for a seed. Written as
`parquet/v2/org=<org>/object=<Object>/batch=<9 hex>/data-<11 hex>.parquet` for Account, Contact
and Opportunity: the batch is the epoch second of a 12-hour window start (2024-03-01T00:00Z
onwards) as 9 lowercase hex digits, the file name an epoch millisecond inside that window as 11
hex digits, increasing across all files of an object; 1–3 files per batch per object. Rows carry
`Id`, `source__modified` (timestamp ms UTC), `grax__idseq` (16-digit zero-padded decimal text,
taken from one increasing sequence, so it increases per Id with every distinct write), the
optional `grax__deleted`/`grax__deletesource`/`grax__purged`/`grax__restoredfrom`, the plain
string field columns, and typed copies `<F>_b/_i/_f/_ts/_d/_t` of non-string fields. The messiness:

- every file has its own schema: only the columns with a value in that file, except that some
  files carry one extra column that is entirely null (`Fax`/`MobilePhone`/`NextStep` of Arrow
  null type, or a typed column such as `AnnualRevenue_i` with all nulls);
- duplicates: the very same row (same Id, source__modified, grax__idseq, values) written again
  in a later file of the batch or in a later batch;
- several writes of one version (same Id + source__modified, increasing grax__idseq, the later
  write with a changed value): the greatest idseq is the truth;
- out of order: a write pushed into a later file or batch, so a later file holds an older
  source__modified of an Id than an earlier file; rows are shuffled inside every file, and at
  least one file holds two writes of an Id with the greater idseq first;
- type switches over time: Opportunity.Probability is written as `Probability_i` before the
  middle batch and as `Probability_f` from then on; Account.IsActive__c as `IsActive__c_b`
  (plain "true"/"false") before the middle batch and from then on only as plain text "yes"/"no";
  the encoding follows the batch a row is first written to, a duplicate keeps its first form;
- deletes at source: the final version of some records has `grax__deleted` set and
  `grax__deletesource` "source"; archives: the same with "grax"; such rows keep their field data;
- one purge (an Account): archived, then in a later batch every one of its versions is written
  again with `grax__purged` set (and the archive columns) but no field data, while its earlier
  rows in earlier batches hold field data;
- one restore (an Account): a new Id with `grax__restoredfrom` = an archived Account's Id and
  that record's field values, written in the same (early) batch as the archive;
- a timestamp field (`LastReviewed__c_ts`), date fields (`Birthdate_d`, `CloseDate_d`), a time
  field (`PreferredCallTime__c_t`), float fields (`AnnualRevenue_f`, `Amount_f`), `IsWon_b`;
- empty values: optional fields are simply missing from some rows and files.

`GraxSample.rows[object]` holds every row in writing order (files in name order, rows in file
order), duplicates included, as python values: only the non-null columns of a row are keys.
Needs `batches >= 4` (the planted lifecycles span four batches).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import string
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lake_assets.epoch import DAY_MS
from lake_assets.errors import InvalidValue

UTC = dt.UTC
START = dt.datetime(2024, 3, 1, tzinfo=UTC)
WINDOW = dt.timedelta(hours=12)
WINDOW_MS = 12 * 3600 * 1000
ORG = "00D5e000000demoEAA"
OBJECTS = ("Account", "Contact", "Opportunity")
IDSEQ_WIDTH = 16

_TS = pa.timestamp("ms", tz="UTC")
SYSTEM_TYPES = {
    "Id": pa.string(),
    "source__modified": _TS,
    "grax__idseq": pa.string(),
    "grax__deleted": _TS,
    "grax__deletesource": pa.string(),
    "grax__purged": _TS,
    "grax__restoredfrom": pa.string(),
}
SYSTEM_COLUMNS = tuple(SYSTEM_TYPES)
SUFFIX_TYPES = {
    "_b": pa.bool_(),
    "_i": pa.int64(),
    "_f": pa.float64(),
    "_ts": _TS,
    "_d": pa.date32(),
    "_t": pa.time64("us"),
}

# Field kinds: string, boolean, float, timestamp, date, time; `percent` is an integer before the
# switch batch and a float from then on; `flag` is a boolean before it and plain text after it.
FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "Account": (
        ("Name", "string"),
        ("Industry", "string"),
        ("AnnualRevenue", "float"),
        ("IsActive__c", "flag"),
        ("LastReviewed__c", "timestamp"),
        ("Rating", "string"),
    ),
    "Contact": (
        ("FirstName", "string"),
        ("LastName", "string"),
        ("Email", "string"),
        ("AccountId", "string"),
        ("Birthdate", "date"),
        ("PreferredCallTime__c", "time"),
    ),
    "Opportunity": (
        ("Name", "string"),
        ("StageName", "string"),
        ("Amount", "float"),
        ("Probability", "percent"),
        ("CloseDate", "date"),
        ("IsWon", "boolean"),
        ("AccountId", "string"),
    ),
}
ID_PREFIX = {"Account": "001", "Contact": "003", "Opportunity": "006"}
# The column some files carry although it is null throughout: (Arrow null type, typed all-null).
EMPTY_COLUMNS = {
    "Account": ("Fax", ("AnnualRevenue_i", pa.int64())),
    "Contact": ("MobilePhone", ("Birthdate_ts", _TS)),
    "Opportunity": ("NextStep", ("Amount_i", pa.int64())),
}


@dataclasses.dataclass
class GraxSample:
    landing_dir: Path  # the folder that holds parquet/v2/...
    org: str
    objects: tuple[str, ...]
    batches: dict[str, list[str]]  # object -> sorted batch keys (9 lowercase hex digits)
    files: list[Path]
    rows: dict[str, list[dict]]  # object -> every row written, in writing order, non-null columns only


def field_columns(obj: str) -> list[str]:
    """Every field column an object's files may hold (plain and typed), in schema order."""
    out = []
    for name, _kind in FIELDS[obj]:
        out.append(name)
        out.extend(name + suffix for suffix in SUFFIX_TYPES)
    return out


def column_type(column: str) -> pa.DataType:
    if column in SYSTEM_TYPES:
        return SYSTEM_TYPES[column]
    for suffix, arrow_type in SUFFIX_TYPES.items():
        if column.endswith(suffix) and column[: -len(suffix)] in _ALL_FIELD_NAMES:
            return arrow_type
    return pa.string()


_ALL_FIELD_NAMES = {name for fields in FIELDS.values() for name, _ in fields}


def batch_key(index: int) -> str:
    return format(int((START + index * WINDOW).timestamp()), "09x")


# --- values -----------------------------------------------------------------------------------

_ADJ = [
    "Blue",
    "Northern",
    "Summit",
    "Bright",
    "Granite",
    "Silver",
    "Harbor",
    "Prairie",
    "Crescent",
    "Vertex",
]
_NOUN = ["Logistics", "Foods", "Analytics", "Dynamics", "Health", "Energy", "Textiles", "Robotics", "Media"]
_INDUSTRY = ["Banking", "Retail", "Manufacturing", "Healthcare", "Technology", "Energy", "Education"]
_FIRST = ["Ada", "Brook", "Cyd", "Dana", "Eli", "Fern", "Gus", "Hana", "Ivo", "June", "Kai", "Lena"]
_LAST = ["Smith", "Okafor", "Ng", "Diaz", "Kowalski", "Haddad", "Silva", "Berg", "Moreau", "Tanaka"]
_STAGES = ["Prospecting", "Qualification", "Proposal", "Negotiation", "Closed Won", "Closed Lost"]
_PRODUCTS = ["Renewal", "Upgrade", "Pilot", "Expansion", "Support plan", "Onboarding"]


def _ms(moment: dt.datetime) -> dt.datetime:
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def _new_values(obj: str, rng: random.Random, late: bool, account_ids: list[str]) -> dict:
    def maybe(p_empty: float, value):
        return None if rng.random() < p_empty else value

    if obj == "Account":
        return {
            "Name": f"{rng.choice(_ADJ)} {rng.choice(_NOUN)} {rng.choice(['Inc', 'LLC', 'Ltd', 'Group', 'Co'])}",
            "Industry": maybe(0.15, rng.choice(_INDUSTRY)),
            "AnnualRevenue": maybe(0.1, round(rng.uniform(50_000, 25_000_000), 2)),
            "IsActive__c": rng.random() < 0.8,
            "LastReviewed__c": maybe(0.2, START - dt.timedelta(milliseconds=rng.randrange(90 * DAY_MS))),
            "Rating": maybe(0.25, rng.choice(["Hot", "Warm", "Cold"])),
        }
    if obj == "Contact":
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        return {
            "FirstName": first,
            "LastName": last,
            "Email": maybe(0.15, f"{first}.{last}{rng.randint(1, 99)}@example.com".lower()),
            "AccountId": maybe(0.1, rng.choice(account_ids)),
            "Birthdate": maybe(0.3, dt.date(rng.randint(1950, 2002), rng.randint(1, 12), rng.randint(1, 28))),
            "PreferredCallTime__c": maybe(0.5, dt.time(rng.randint(7, 18), rng.choice([0, 15, 30, 45]))),
        }
    stage = rng.choice(_STAGES[:4])
    return {
        "Name": f"{rng.choice(_ADJ)} {rng.choice(_PRODUCTS)}",
        "StageName": stage,
        "Amount": maybe(0.1, round(rng.uniform(1_000, 500_000), 2)),
        "Probability": _probability(rng, late),
        "CloseDate": dt.date(2024, rng.randint(3, 9), rng.randint(1, 28)),
        "IsWon": False,
        "AccountId": rng.choice(account_ids),
    }


def _probability(rng: random.Random, late: bool):
    if late:
        return rng.choice([12.5, 25.0, 37.5, 55.5, 62.5, 87.5])
    return rng.choice([10, 20, 30, 40, 50, 60, 75, 90])


def _changed_values(
    obj: str, prev: dict, rng: random.Random, late: bool, moment: dt.datetime, account_ids: list[str]
) -> dict:
    """A new version: one or two fields differ from the previous one."""
    values = dict(prev)
    for _ in range(rng.randint(1, 2)):
        if obj == "Account":
            which = rng.choice(["Rating", "IsActive__c", "LastReviewed__c", "AnnualRevenue", "Industry"])
            if which == "Rating":
                values["Rating"] = rng.choice([r for r in ["Hot", "Warm", "Cold"] if r != prev.get("Rating")])
            elif which == "IsActive__c":
                values["IsActive__c"] = not prev["IsActive__c"]
            elif which == "LastReviewed__c":
                values["LastReviewed__c"] = _ms(moment - dt.timedelta(milliseconds=rng.randrange(3_600_000)))
            elif which == "AnnualRevenue":
                values["AnnualRevenue"] = round(rng.uniform(50_000, 25_000_000), 2)
            else:
                values["Industry"] = rng.choice(_INDUSTRY)
        elif obj == "Contact":
            which = rng.choice(["Email", "AccountId", "PreferredCallTime__c", "LastName"])
            if which == "Email":
                values["Email"] = (
                    f"{prev['FirstName']}.{prev['LastName']}{rng.randint(100, 999)}@example.org".lower()
                )
            elif which == "AccountId":
                values["AccountId"] = rng.choice(account_ids)
            elif which == "PreferredCallTime__c":
                values["PreferredCallTime__c"] = dt.time(
                    rng.randint(7, 18), rng.choice([0, 15, 30, 45]), rng.choice([0, 30])
                )
            else:
                values["LastName"] = rng.choice([n for n in _LAST if n != prev["LastName"]])
        else:
            which = rng.choice(["StageName", "Probability", "Amount", "CloseDate"])
            if which == "StageName":
                stage = rng.choice([s for s in _STAGES if s != prev["StageName"]])
                values["StageName"] = stage
                values["IsWon"] = stage == "Closed Won"
            elif which == "Probability":
                values["Probability"] = _probability(rng, late)
            elif which == "Amount":
                values["Amount"] = round(rng.uniform(1_000, 500_000), 2)
            else:
                values["CloseDate"] = prev["CloseDate"] + dt.timedelta(days=rng.randint(7, 45))
    return values


def _touched(obj: str, prev: dict, rng: random.Random) -> dict:
    """A re-write of the same version that captured one value differently."""
    values = dict(prev)
    if obj == "Account":
        values["Rating"] = rng.choice([r for r in ["Hot", "Warm", "Cold"] if r != prev.get("Rating")])
    elif obj == "Contact":
        values["Email"] = f"{prev['FirstName']}.{prev['LastName']}@example.net".lower()
    else:
        values["StageName"] = rng.choice([s for s in _STAGES[:4] if s != prev["StageName"]])
    return values


def _float_text(value: float) -> str:
    return repr(float(value))


def _encode(obj: str, values: dict, late: bool) -> dict:
    """Field columns of a row: the plain text column and, for non-string fields, a typed copy."""
    out: dict = {}
    for name, kind in FIELDS[obj]:
        value = values.get(name)
        if value is None:
            continue
        if kind == "string":
            out[name] = value
        elif kind in ("boolean", "flag"):
            if kind == "flag" and late:
                out[name] = "yes" if value else "no"
            else:
                out[name] = "true" if value else "false"
                out[name + "_b"] = value
        elif kind == "float":
            out[name] = _float_text(value)
            out[name + "_f"] = float(value)
        elif kind == "percent":
            if late:
                out[name] = _float_text(value)
                out[name + "_f"] = float(value)
            else:
                if value != int(value):
                    raise AssertionError(f"{obj}.{name}: a fractional value in an integer batch")
                out[name] = str(int(value))
                out[name + "_i"] = int(value)
        elif kind == "timestamp":
            out[name] = value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
            out[name + "_ts"] = value
        elif kind == "date":
            out[name] = value.isoformat()
            out[name + "_d"] = value
        elif kind == "time":
            out[name] = value.strftime("%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
            out[name + "_t"] = value
        else:  # pragma: no cover - FIELDS only holds the kinds above
            raise InvalidValue(kind)
    return out


# --- simulation -------------------------------------------------------------------------------


@dataclasses.dataclass
class _Write:
    id: str
    modified: dt.datetime
    idseq: str
    values: dict | None  # logical field values; None = no field data (purged)
    system: dict  # grax__deleted / grax__deletesource / grax__purged / grax__restoredfrom
    batch: int
    group: int  # writes of one group land in the same file
    planted: bool
    to_batch: int | None = None  # a planted write pushed into the first file of this batch


class _Simulation:
    def __init__(self, obj: str, rng: random.Random, pool: list[str], batches: int, seq: list[int]):
        self.obj = obj
        self.rng = rng
        self.batches = batches
        self.switch = batches // 2
        self.seq = seq
        self.writes: list[_Write] = []
        self.values: dict[str, dict] = {}
        self.versions: dict[str, list[dt.datetime]] = {}
        self.restored_from: dict[str, str] = {}
        self.deleted_at: dict[str, dt.datetime] = {}
        self.group = 0
        self.pool = list(pool)

    def _next_idseq(self) -> str:
        self.seq[0] += self.rng.randint(1, 9)
        return f"{self.seq[0]:0{IDSEQ_WIDTH}d}"

    def _write(self, id_, modified, values, system, batch, planted, group=None, to_batch=None) -> _Write:
        if group is None:
            self.group += 1
            group = self.group
        if id_ in self.restored_from:
            system = {**system, "grax__restoredfrom": self.restored_from[id_]}
        write = _Write(id_, modified, self._next_idseq(), values, system, batch, group, planted, to_batch)
        self.writes.append(write)
        return write

    def _version(self, id_, moment, values, batch, planted, system=None, writes=1, to_batch=None) -> None:
        self.values[id_] = values
        self.versions.setdefault(id_, []).append(moment)
        self.group += 1
        for n in range(writes):
            if n:  # a re-write of the same version that captured a value differently
                values = _touched(self.obj, values, self.rng)
                self.values[id_] = values
            self._write(id_, moment, values, dict(system or {}), batch, planted, self.group, to_batch)

    def run(self, account_ids: list[str]) -> list[_Write]:
        rng, obj = self.rng, self.obj
        pool = self.pool
        rng.shuffle(pool)
        planted = {
            "out_of_order": pool.pop(),
            "multi": pool.pop(),
            "source_delete": pool.pop(),
            "archive": pool.pop(),
        }
        if obj == "Account":
            planted.update(restore_from=pool.pop(), restored=pool.pop(), purge=pool.pop())
        reserved = set(planted.values())
        backfill = pool[: int(len(pool) * 0.6)]
        later = pool[len(backfill) :]
        created_in = {b: later[b - 1 :: self.batches - 1] for b in range(1, self.batches)}
        live: list[str] = []  # non-reserved records that may change

        for batch in range(self.batches):
            late = batch >= self.switch
            events: list[tuple] = []
            if batch == 0:
                events += [("create", i) for i in backfill]
            else:
                events += [("create", i) for i in created_in[batch]]
                picks = rng.sample(live, min(len(live), rng.randint(6, 12) + 2))
                n_updates = len(picks) - 2
                events += [("update", i) for i in picks[:n_updates]]
                if rng.random() < 0.6 and len(live) > 12:
                    events.append(("delete_source", picks[n_updates]))
                if rng.random() < 0.3 and len(live) > 12:
                    events.append(("archive", picks[n_updates + 1]))
            rng.shuffle(events)
            # The planted lifecycles keep their own order among the shuffled events.
            events = _merge_in_order(rng, events, self._planted_events(batch, planted))
            offsets = sorted(rng.sample(range(1, WINDOW_MS), len(events)))
            window = START + batch * WINDOW
            for event, offset in zip(events, offsets, strict=True):
                moment = window + dt.timedelta(milliseconds=offset)
                self._apply(event, moment, batch, late, account_ids, reserved)
            for kind, id_, *_ in events:
                if kind == "create" and id_ not in reserved:
                    live.append(id_)
                elif kind in ("delete_source", "archive") and id_ in live:
                    live.remove(id_)
                elif kind == "restore":
                    live.append(id_)
        return self.writes

    def _planted_events(self, batch: int, planted: dict) -> list[tuple]:
        if batch == 0:
            return [("create", i, True) for i in planted.values() if i != planted.get("restored")]
        out: list[tuple] = []
        if batch == 1:
            out += [
                ("update", planted["out_of_order"], True, 2),  # pushed into batch 2
                ("update", planted["out_of_order"], True),
                ("multi_update", planted["multi"], True),
                ("delete_source", planted["source_delete"], True),
            ]
            if "restore_from" in planted:
                out += [
                    ("update", planted["purge"], True),
                    ("archive", planted["restore_from"], True),
                    ("restore", planted["restored"], True, planted["restore_from"]),
                ]
        if batch == 2:
            out.append(("archive", planted["archive"], True))
            if "purge" in planted:
                out.append(("archive", planted["purge"], True))
        if batch == 3 and "purge" in planted:
            out.append(("purge", planted["purge"], True))
        return out

    def _apply(
        self, event: tuple, moment: dt.datetime, batch: int, late: bool, account_ids, reserved
    ) -> None:
        kind, id_ = event[0], event[1]
        planted = len(event) > 2 and event[2] is True
        rng, obj = self.rng, self.obj
        if kind == "create":
            self._version(id_, moment, _new_values(obj, rng, late, account_ids), batch, planted)
        elif kind == "update":
            to_batch = event[3] if len(event) > 3 else None
            writes = 2 if not planted and rng.random() < 0.1 else 1
            values = _changed_values(obj, self.values[id_], rng, late, moment, account_ids)
            self._version(id_, moment, values, batch, planted, writes=writes, to_batch=to_batch)
        elif kind == "multi_update":
            values = _changed_values(obj, self.values[id_], rng, late, moment, account_ids)
            self._version(id_, moment, values, batch, planted, writes=3)
        elif kind in ("delete_source", "archive"):
            source = "source" if kind == "delete_source" else "grax"
            self.deleted_at[id_] = moment
            system = {"grax__deleted": moment, "grax__deletesource": source}
            self._version(id_, moment, dict(self.values[id_]), batch, planted, system=system)
        elif kind == "restore":
            self.restored_from[id_] = event[3]
            self._version(id_, moment, dict(self.values[event[3]]), batch, planted)
        elif kind == "purge":
            # Every version is written again, field data gone; the latest version last.
            system = {
                "grax__deleted": self.deleted_at[id_],
                "grax__deletesource": "grax",
                "grax__purged": moment,
            }
            self.group += 1
            for modified in self.versions[id_]:
                self._write(id_, modified, None, dict(system), batch, planted, self.group)
            self.values[id_] = {}
        else:  # pragma: no cover
            raise InvalidValue(kind)


def _merge_in_order(rng: random.Random, events: list, ordered: list) -> list:
    """Insert `ordered` at random places of `events`, keeping its own order."""
    out = list(events)
    low = 0
    for event in ordered:
        position = rng.randint(low, len(out))
        out.insert(position, event)
        low = position + 1
    return out


# --- placement and writing --------------------------------------------------------------------


def _row(write: _Write, obj: str, late: bool) -> dict:
    row = {"Id": write.id, "source__modified": write.modified, "grax__idseq": write.idseq}
    for column in SYSTEM_COLUMNS[3:]:
        if write.system.get(column) is not None:
            row[column] = write.system[column]
    if write.values is not None:
        row.update(_encode(obj, write.values, late))
    return row


def _place(obj: str, writes: list[_Write], rng: random.Random, batches: int, switch: int):
    """Spread writes over 1–3 files a batch; some pushed one file later, some written twice."""
    groups_of: dict[int, list[int]] = {}
    for write in writes:
        groups_of.setdefault(write.batch, [])
        if write.group not in groups_of[write.batch]:
            groups_of[write.batch].append(write.group)
    file_batch: list[int] = []
    first_file: dict[int, int] = {}
    group_file: dict[int, int] = {}
    for batch in range(batches):
        groups = groups_of[batch]
        count = min(len(groups), rng.randint(1, 3))
        first_file[batch] = len(file_batch)
        for index, group in enumerate(groups):
            group_file[group] = first_file[batch] + index * count // len(groups)
        file_batch += [batch] * count
    last = len(file_batch) - 1
    contents: list[list[dict]] = [[] for _ in file_batch]
    forced_duplicate = next(w for w in writes if w.batch == 0 and not w.planted)
    for write in writes:
        target = group_file[write.group]
        if write.to_batch is not None:
            target = first_file[write.to_batch]
        elif not write.planted and write is not forced_duplicate and target < last and rng.random() < 0.05:
            target += 1
        row = _row(write, obj, file_batch[target] >= switch)
        contents[target].append(row)
        if write is forced_duplicate:
            contents[first_file[1]].append(dict(row))
        elif not write.planted and target < last and rng.random() < 0.05:
            contents[min(last, target + rng.randint(1, 2))].append(dict(row))
    for rows in contents:
        rng.shuffle(rows)
    _ensure_inversion(contents)
    return file_batch, contents


def _ensure_inversion(contents: list[list[dict]]) -> None:
    """Make sure some file lists two writes of an Id with the greater idseq first."""
    candidate = None
    for rows in contents:
        seen: dict[str, tuple[int, str]] = {}
        for position, row in enumerate(rows):
            before = seen.get(row["Id"])
            if before is not None:
                if before[1] > row["grax__idseq"]:
                    return
                if candidate is None and before[1] < row["grax__idseq"]:
                    candidate = (rows, before[0], position)
            seen[row["Id"]] = (position, max(row["grax__idseq"], before[1] if before else ""))
    if candidate is None:  # pragma: no cover - the planted multi-write group is in one file
        raise AssertionError("no file holds two writes of one Id")
    rows, first, second = candidate
    rows[first], rows[second] = rows[second], rows[first]


def _write_file(path: Path, obj: str, rows: list[dict], empty: tuple[str, pa.DataType] | None) -> None:
    present = [c for c in (*SYSTEM_COLUMNS, *field_columns(obj)) if any(c in r for r in rows)]
    fields = [(c, column_type(c)) for c in present]
    if empty is not None:
        fields.append(empty)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema(fields)), path)


def _make_ids(rng: random.Random, prefix: str, count: int, taken: set[str]) -> list[str]:
    alnum = string.ascii_letters + string.digits
    ids: list[str] = []
    while len(ids) < count:
        candidate = (
            prefix
            + "5e00000"
            + "".join(rng.choices(alnum, k=5))
            + "".join(rng.choices(string.ascii_uppercase, k=3))
        )
        if candidate not in taken:
            taken.add(candidate)
            ids.append(candidate)
    return ids


def _write_object(
    landing_dir: Path, obj: str, file_batch: list[int], contents: list[list[dict]], rng: random.Random
):
    """Name and write an object's files; the files' paths in writing order."""
    folder = landing_dir / "parquet" / "v2" / f"org={ORG}" / f"object={obj}"
    empty_null, empty_typed = EMPTY_COLUMNS[obj]
    names: list[str] = []
    for batch in sorted(set(file_batch)):
        start_ms = int((START + batch * WINDOW).timestamp()) * 1000
        for offset in sorted(rng.sample(range(1, WINDOW_MS), file_batch.count(batch))):
            names.append(f"batch={batch_key(batch)}/data-{format(start_ms + offset, '011x')}.parquet")
    paths: list[Path] = []
    for index, (name, file_rows) in enumerate(zip(names, contents, strict=True)):
        if index == file_batch.index(1):  # at least one file with an Arrow null-type column
            empty = (empty_null, pa.null())
        elif index == file_batch.index(2):  # and one with a typed column that is null throughout
            empty = empty_typed
        elif rng.random() < 0.25:
            empty = rng.choice([(empty_null, pa.null()), empty_typed])
        else:
            empty = None
        path = folder / name
        _write_file(path, obj, file_rows, empty)
        paths.append(path)
    return paths


def write_grax_landing(landing_dir: Path, *, seed: int = 11, batches: int = 6) -> GraxSample:
    """Write a GRAX Data Lake v2 landing for Account, Contact and Opportunity under landing_dir."""
    if batches < 4:
        raise InvalidValue("a GRAX sample needs at least 4 batches")
    landing_dir = Path(landing_dir)
    rng = random.Random(seed)
    switch = batches // 2
    taken: set[str] = set()
    pools = {obj: _make_ids(rng, ID_PREFIX[obj], rng.randint(48, 72), taken) for obj in OBJECTS}
    seq = [4_200_000_000_000 + rng.randrange(1_000_000)]
    files: list[Path] = []
    rows: dict[str, list[dict]] = {}
    batch_keys: dict[str, list[str]] = {}
    for obj in OBJECTS:
        writes = _Simulation(obj, rng, pools[obj], batches, seq).run(pools["Account"])
        file_batch, contents = _place(obj, writes, rng, batches, switch)
        files += _write_object(landing_dir, obj, file_batch, contents, rng)
        rows[obj] = [row for file_rows in contents for row in file_rows]
        batch_keys[obj] = sorted({batch_key(b) for b in file_batch})
    return GraxSample(
        landing_dir=landing_dir, org=ORG, objects=OBJECTS, batches=batch_keys, files=files, rows=rows
    )
