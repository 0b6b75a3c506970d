"""Which tables a feed has and where its hours start: found in the landing by discovery, pinned
in the lake, read when the definitions load.

Loading the definitions never lists a landing, so the code location does not depend on what
happened to be landed when a process loaded it, and loading costs no listing. A feed's tables
are its configured `tables` (a Flow feed's `collections`), else the tables discovery pinned in
`_state/<feed>/tables.json`, narrowed by `orgs` / `objects`; an hourly feed's partitions start
at its configured `start`, else at the pinned first hour. `lake-assets discover` lists the
landing and pins what it found; `lake-assets run` does the same before it plans.

A pin only grows: a table stays once pinned and the first hour only moves earlier, so partitions
already materialised never fall out of the definitions when old landed files are cleaned up.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Sequence

from lake_assets.catalog.files import catalog_what
from lake_assets.config import FeedConfig, LakeConfig
from lake_assets.errors import InvalidValue, LakeAssetsError, first_line
from lake_assets.feeds import format_for
from lake_assets.feeds.base import FeedFormat, LandingSurvey, hour_key, parse_hour_key
from lake_assets.paths import LakeLayout, identifier, table_segments
from lake_assets.storage import Storage

log = logging.getLogger(__name__)

DISCOVER_HINT = "run `lake-assets discover --config FILE` (or `lake-assets run`) to pin what has landed"


class PinError(LakeAssetsError):
    """A pin file that cannot be read or does not hold what discovery writes."""


@dataclasses.dataclass(frozen=True)
class Pin:
    """What discovery pinned for a feed: every table it found (before `orgs` / `objects` narrow
    them) and, for an hourly feed, the earliest hour it saw landed."""

    tables: tuple[str, ...] = ()
    first_hour: str | None = None

    def to_json(self) -> bytes:
        return json.dumps({"tables": list(self.tables), "first_hour": self.first_hour}, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Pin:
        """The pin a file holds; ValueError naming what is wrong (its table names become paths)."""
        raw = json.loads(data.decode("utf-8"))
        if (
            not isinstance(raw, dict)
            or set(raw) != {"tables", "first_hour"}
            or not isinstance(raw["tables"], list)
        ):
            raise InvalidValue('expected {"tables": [...], "first_hour": ...}')
        for table in raw["tables"]:
            table_segments(table)
        if raw["first_hour"] is not None:
            parse_hour_key(raw["first_hour"])
        return cls(tables=tuple(sorted(set(raw["tables"]))), first_hour=raw["first_hour"])


def read_pin(storage: Storage, layout: LakeLayout, feed: str) -> Pin:
    """A feed's pin (empty when nothing is pinned): one small file, never a listing."""
    uri = layout.pins(feed)
    try:
        if not storage.exists(uri):
            return Pin()
        return Pin.from_json(storage.read_bytes(uri))
    except Exception as exc:
        raise PinError(f"{uri}: {exc}") from exc


def write_pin(storage: Storage, layout: LakeLayout, feed: str, pin: Pin) -> None:
    uri = layout.pins(feed)
    storage.write_bytes(uri, pin.to_json())  # a reader finds the old pin or the new one


def load_pins(config: LakeConfig, storage: Storage) -> dict[str, Pin]:
    """Every feed's pin, as loading reads it. A pin that cannot be read is logged and taken as
    nothing pinned, so one feed's file never stops the others from loading."""
    layout = LakeLayout(config.lake)
    pins = {}
    for feed in config.feeds:
        try:
            pins[feed.name] = read_pin(storage, layout, feed.name)
        except PinError as exc:
            log.warning(
                "feed %s: its pinned tables cannot be read (%s): it loads without them; %s",
                feed.name,
                exc,
                DISCOVER_HINT,
            )
            pins[feed.name] = Pin()
    return pins


def feed_tables(feed: FeedConfig, fmt: FeedFormat, pin: Pin) -> list[str]:
    """The feed's tables: configured, else pinned, narrowed by the feed's `orgs` / `objects`."""
    configured = fmt.configured_tables(feed)
    if configured is not None:
        return configured
    tables = list(pin.tables)
    if feed.orgs:
        tables = [t for t in tables if t.split("/")[0] in feed.orgs]
    if feed.objects:
        wanted = {o.lower() for o in feed.objects}
        tables = [t for t in tables if t.split("/")[-1] in wanted]
    return tables


def tables_of_every_feed(
    feeds: Sequence[FeedConfig], pins: dict[str, Pin]
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Each feed's tables (`feed_tables`), less those that share a Dagster name or a catalog name
    with another table (`_names_of`), and a line for each table left out, by `feed/table`. Every
    table of a clash is left out, not all but the first: a table landed later that sorts first
    would otherwise take over the names, and the catalog records, of a table that has run for
    months."""
    tables = {feed.name: feed_tables(feed, format_for(feed), pins.get(feed.name, Pin())) for feed in feeds}
    holders: dict[tuple[str, ...], list[str]] = {}
    for feed in feeds:
        for table in tables[feed.name]:
            for name in dict.fromkeys(_names_of(feed.name, table)):  # a one-segment table's two are one
                holders.setdefault(name, []).append(f"{feed.name}/{table}")
    clashes: dict[str, str] = {}
    for key, labels in holders.items():
        for label in labels if len(labels) > 1 else ():
            others = ", ".join(other for other in labels if other != label)
            clashes.setdefault(label, _CLASH_REMEDY[key[0]].format(name=key[-1], others=others))
    labels = [f"{feed.name}/{table}" for feed in feeds for table in tables[feed.name]]
    left_out = {label: f"{label}: not loaded: {clashes[label]}" for label in labels if label in clashes}
    return {feed: [t for t in ts if f"{feed}/{t}" not in clashes] for feed, ts in tables.items()}, left_out


def _names_of(feed: str, table: str) -> list[tuple[str, ...]]:
    """The names a table is known by that another table must not have: its Dagster names (its
    jobs, state op and pool `identifier(feed, table)`; its assets' ops, from the asset key
    `feed/<table's segments>/layer`), and its catalog name within its feed. `__` joins the parts
    of a Dagster name as a name may hold it: feed `a` with table `b__c` and feed `a__b` with table
    `c` are both `a__b__c`, and Dagster refused the whole code location over it. The catalog
    names a table in lower case (`catalog_what`): GRAX orgs `00DABC` and `00Dabc` (two orgs, as
    15-character IDs) shared their records, and each table read the other's files."""
    return [
        ("dagster", identifier(feed, table)),
        ("dagster", identifier(feed, *table.split("/"))),
        ("catalog", feed, catalog_what(table)),
    ]


_CLASH_REMEDY = {
    "dagster": "its Dagster names ({name}…) are also those of {others}; rename one of the feeds",
    "catalog": "its catalog name ({name}) is also that of {others} (the catalog names tables in lower "
    "case); give the two their own feeds (a GRAX feed's `orgs`)",
}


def pins_anything(feed: FeedConfig, fmt: FeedFormat) -> bool:
    """Whether discovery has something to pin for the feed: tables it does not configure, or the
    first hour of an hourly feed without `start`."""
    return fmt.configured_tables(feed) is None or (fmt.partitioning == "hourly" and not feed.start)


def first_hour(feed: FeedConfig, pin: Pin) -> str:
    """An hourly feed's first partition: configured, else pinned.

    With neither (nothing landed yet, or never discovered) the partitions start today, so a fresh
    deployment still loads; discovery pins the first landed hour and `start` pins it for good.
    """
    if feed.start:
        return feed.start
    if pin.first_hour:
        return pin.first_hour
    today = hour_key(dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0))
    log.warning(
        "feed %s: no `start` configured and no first hour pinned: its hours start today (%s); %s",
        feed.name,
        today,
        DISCOVER_HINT,
    )
    return today


@dataclasses.dataclass(frozen=True)
class Discovery:
    """What discovering one feed found and pinned."""

    feed: FeedConfig
    pin: Pin
    tables: list[str]  # the feed's tables as the definitions now load them
    new: list[str]  # those that were not pinned before
    earlier: bool = False  # the first hour moved earlier (or was pinned for the first time)
    replaced: str | None = None  # why the pin that was there could not be read
    problem: str | None = None  # the landing's tables could not be listed: the pin keeps its own
    unlisted: tuple[str, ...] = ()  # tables whose hours could not be listed, with the reason
    #: what discovery met in the landing that no table reads, with the reason (`FeedFormat.survey`),
    #: landed tables the configuration leaves out among them
    unread: tuple[str, ...] = ()
    #: configured tables with no folder in the landing (nothing landed yet, or a misspelt name)
    absent: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.new) or self.earlier or self.replaced is not None


def discover(config: LakeConfig, storage: Storage) -> list[Discovery]:
    """List every feed's landing and pin its tables and first landed hour. One feed's listing
    failing is reported in its Discovery; the others are discovered."""
    layout = LakeLayout(config.lake)
    return [
        discover_feed(storage, layout, feed, siblings=sharing_landing(config, feed)) for feed in config.feeds
    ]


def sharing_landing(config: LakeConfig, feed: FeedConfig) -> tuple[FeedConfig, ...]:
    """The configuration's other feeds of the same format over the same landing (a GRAX landing
    split by org between feeds, say): the tables they take are read, by them."""
    return tuple(
        other
        for other in config.feeds
        if other is not feed and other.format == feed.format and other.landing == feed.landing
    )


def discover_feed(
    storage: Storage,
    layout: LakeLayout,
    feed: FeedConfig,
    every_table: bool = True,
    siblings: tuple[FeedConfig, ...] = (),
) -> Discovery:
    """Discover one feed. `every_table=False` (the sensor's ticks) looks for the first hour only in
    the tables not pinned before, unless none is pinned yet: a tick with nothing new then costs
    the survey's listings (the landing's top; a Flow feed's folders of collections, down to the
    journals of a collection with a `partitions` selection), not one of every table's hours. The tables `siblings`
    (`sharing_landing`) take are not named as left out."""
    fmt = format_for(feed)
    replaced = problem = None
    unlisted: list[str] = []
    survey = LandingSurvey([])
    try:
        before = read_pin(storage, layout, feed.name)
    except PinError as exc:  # our own file, damaged or hand-edited: discovery writes it anew
        replaced, before = str(exc), Pin()
    configured = fmt.configured_tables(feed) is not None
    surveyed = False
    try:
        survey, surveyed = fmt.surveying_with(siblings).survey(storage, feed.landing), True
    except Exception as exc:  # noqa: BLE001 - reported with the feed; the pin keeps its tables
        if not configured:
            problem = f"listing its tables under {feed.landing}: {first_line(exc)}"
        else:
            log.info("feed %s: its landing could not be surveyed (%s)", feed.name, first_line(exc))
        # Configured tables are known without it (credentials may reach only their folders):
        # what lies beside them goes unsaid, and the runs go on.
    pinned = before.tables if configured else tuple(sorted({*before.tables, *survey.tables}))
    pin = Pin(tables=pinned, first_hour=before.first_hour)
    tables = feed_tables(feed, fmt, pin)
    # The configuration names the tables, or narrows them to orgs and objects: what landed beside
    # them is not read, and is said so; a configured table with no folder may be a misspelling.
    everything_landed = Pin(tables=tuple(survey.tables))
    taken = {t for sibling in siblings for t in feed_tables(sibling, format_for(sibling), everything_landed)}
    left_out = [
        f"table {t}: landed, but the feed's configuration does not take it"
        for t in survey.tables
        if t not in tables and t not in taken
    ]
    absent = tuple(t for t in tables if configured and surveyed and t not in survey.tables)
    old = set(feed_tables(feed, fmt, before))
    if fmt.partitioning == "hourly" and not feed.start:
        searched = tables if every_table or before.first_hour is None else [t for t in tables if t not in old]
        landed, unlisted = _first_landed_hour(storage, feed, fmt, searched)
        pin = dataclasses.replace(
            pin, first_hour=min(filter(None, [landed, before.first_hour]), default=None)
        )
    if pin != before or replaced:
        write_pin(storage, layout, feed.name, pin)
    return Discovery(
        feed=feed,
        pin=pin,
        tables=tables,
        new=[t for t in tables if t not in old],
        earlier=pin.first_hour != before.first_hour,
        replaced=replaced,
        problem=problem,
        unlisted=tuple(unlisted),
        unread=tuple(survey.unread + left_out),
        absent=absent,
    )


def _first_landed_hour(
    storage: Storage, feed: FeedConfig, fmt: FeedFormat, tables: list[str]
) -> tuple[str | None, list[str]]:
    """The earliest hour with files among `tables`, and a line per table whose hours could not be
    listed (the others are still looked at)."""
    firsts, unlisted = [], []
    for table in tables:
        try:
            firsts += fmt.partition_keys(storage, feed.landing, table)[:1]
        except Exception as exc:  # noqa: BLE001 - reported; the other tables are still listed
            unlisted.append(f"{table}: listing its hours: {first_line(exc)}")
    return min(firsts, default=None), unlisted


def describe(found: Discovery) -> str:
    """One line saying what a feed's definitions hold now, new tables marked (what could not be
    listed is not in it: each caller reports it as it reports failures)."""
    feed, fmt = found.feed, format_for(found.feed)
    source = "configured" if fmt.configured_tables(feed) is not None else "pinned"
    if found.tables:
        names = ", ".join(_marked(t, found) for t in found.tables)
        line = f"{feed.name}: {len(found.tables)} table(s) {source}: {names}"
    else:
        line = f"{feed.name}: no tables found under {feed.landing}"
    if fmt.partitioning == "hourly":
        if feed.start:
            line += f"; hours from {feed.start} (configured start)"
        elif found.pin.first_hour:
            line += f"; hours from {found.pin.first_hour} (first landed hour{', pinned now' if found.earlier else ''})"
    if found.replaced:
        line += f" (the pin could not be read, so it was written anew: {found.replaced})"
    return line


def _marked(table: str, found: Discovery) -> str:
    marks = [
        m for m, holds in (("new", table in found.new), ("nothing landed", table in found.absent)) if holds
    ]
    return f"{table} ({', '.join(marks)})" if marks else table


def describe_absent(found: Discovery) -> str | None:
    """One line naming the configured tables with no folder in the landing, or None."""
    if not found.absent:
        return None
    return (
        f"{found.feed.name}: nothing landed under {found.feed.landing} for configured table(s) "
        f"{', '.join(found.absent)}"
    )


#: how many entries no table reads a report names before summing up the rest
NAMED_UNREAD = 5


def describe_unread(found: Discovery) -> str | None:
    """One line naming what no table of the feed reads in its landing (the first few entries),
    or None when nothing."""
    if not found.unread:
        return None
    more = len(found.unread) - NAMED_UNREAD
    return _not_read(found, "; ".join(found.unread[:NAMED_UNREAD])) + (
        f"; and {more} more (`lake-assets discover` names each)" if more > 0 else ""
    )


def each_unread(found: Discovery) -> list[str]:
    """A line per entry no table of the feed reads in its landing."""
    return [_not_read(found, entry) for entry in found.unread]


def _not_read(found: Discovery, named: str) -> str:
    return f"{found.feed.name}: not read, no table's: {named}"
