"""Listing, reading and copying files under `file://` and `s3a://` URIs (pyarrow.fs; boto3 for
S3's listings, conditional writes and keys pyarrow cannot name).

Spark does the data work; this module does the small metadata work around it that Spark has no
API for: listing a landing folder for the sensor, reading a Parquet footer to vet a file,
copying a bad file to quarantine, removing a partition folder.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import datetime as dt
import email.utils
import errno
import io
import os
import re
import stat
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pydantic

from lake_assets.config_model import S3Config, aws_credentials_from_environment
from lake_assets.errors import (
    DamagedLakeFile,
    InvalidValue,
    LakeAssetsError,
    LinkLoop,
    NotAFile,
    StorageRequestError,
    first_line,
)
from lake_assets.footer_probe import FooterProbe
from lake_assets.paths import is_s3

#: small file requests (footers and notes read, notes written) made at once: on S3 each is a
#: request, whose latency, not its size, is the cost
PARALLEL_SMALL_REQUESTS = 16

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")
_Note = TypeVar("_Note")


def _age_by_store_clock(response: dict) -> float:
    """Seconds from an S3 object's `Last-Modified` to the response's `Date`: both the store's
    clock. A store that sends no `Date` is compared with this machine's clock instead."""
    sent = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    now = email.utils.parsedate_to_datetime(sent) if sent else dt.datetime.now(dt.UTC)
    return (now - response["LastModified"]).total_seconds()


def _text_of_local_name(name: str) -> tuple[str, str | None]:
    """A local file name as text, and why it cannot be read when its bytes are not UTF-8. The
    system passes such bytes on as lone surrogates, which no URI, Hadoop path, log line or JSON
    note can carry: the name is shown with the bytes escaped (`data-\\xff.parquet`), and the
    entry is reported, never read."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(name).decode("utf-8", "backslashreplace")
        return shown, "its name is not UTF-8 text (rename it to read it)"
    return name, None


def _why_not_readable(path: str, mode: int) -> str | None:
    """Why a local file cannot be read by this process, or None. One the run's user may not
    read (another owner's mode 600) would fail the table's catalog step on every run: it is
    reported instead, and the files beside it are read."""
    if not stat.S_ISREG(mode):
        return "not a regular file"
    if not os.access(path, os.R_OK):
        return "this process may not read it (permission denied)"
    return None


def _path_in_bytes(shown: str) -> bytes:
    """The local path whose file name `_text_of_local_name` showed with its bytes escaped
    (`data-\\xff.parquet`), as the system names it: each escape of the name back to its byte.
    (Only a file's own name can be so shown: a folder so named is never entered.)"""
    folder, _, name = shown.encode("utf-8").rpartition(b"/")
    return folder + b"/" + re.sub(rb"\\x([0-9a-f]{2})", lambda found: bytes([int(found[1], 16)]), name)


def _refuse_to_copy_what_is_not_a_file(path: str | bytes) -> None:
    """Copying a named pipe would wait for a writer for ever, and a device (`/dev/zero`) would
    fill the disk: only a regular file (or a link to one) is copied to quarantine."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return  # the copy says it is gone
    if not stat.S_ISREG(mode):
        raise NotAFile(errno.EINVAL, "not a regular file, so not copied", os.fsdecode(path))


#: what pyarrow's S3 client says of a request the store did not answer at all: no connection
#: made (refused, no route, a name that does not resolve), or one that timed out
_NO_ANSWER_MARKS = ("AWS Error NETWORK_CONNECTION", "curlCode: 28")


def store_out_of_reach(error: BaseException | None) -> bool:
    """Whether `error` (or an error it was raised from or while handling) says S3 did not answer
    at all, as against refusing one request: every other request would wait for the same
    answer. One object that is slow to read counts too (a read that timed out): the requests
    left are then not made, and the step fails and is run again, as in an outage."""
    import botocore.exceptions

    no_answer = (
        botocore.exceptions.EndpointConnectionError,
        botocore.exceptions.ConnectTimeoutError,
        botocore.exceptions.ReadTimeoutError,
        botocore.exceptions.ConnectionClosedError,
    )
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, no_answer):
            return True
        if isinstance(error, OSError) and any(mark in str(error) for mark in _NO_ANSWER_MARKS):
            return True
        # as a traceback tells it: `raise ... from None` hides the error being handled
        error = (
            error.__cause__
            if error.__cause__ is not None
            else (None if error.__suppress_context__ else error.__context__)
        )
    return False


@dataclasses.dataclass(frozen=True)
class _LocalWalk:
    """What a walk of a local folder (`Storage.walk_files`) leaves out and which links it follows."""

    root: str
    skip: Callable[[str], bool]
    follow_link: Callable[[list[str]], bool] | None

    def holds_back(self, uri: str, path: str) -> bool:
        """Whether the folder at `uri` is a symbolic link the walk does not follow."""
        if self.follow_link is None or not os.path.islink(path):
            return False
        return not self.follow_link(uri[len(self.root.rstrip("/")) + 1 :].split("/"))


def _leads_back_up(path: str) -> bool:
    """Whether `path` is a symbolic link to the folder holding it or to one above that: listed
    through, it holds the same folders again, one level deeper each time, up to the system's
    limit on links (`region=eu -> .` lists every journal forty times; `hour=05 -> ..` is a day)."""
    path = path.rstrip("/") or path
    if not os.path.islink(path):
        return False
    target = os.path.realpath(path)
    holder = os.path.realpath(os.path.dirname(path))
    return holder == target or holder.startswith(target.rstrip("/") + "/")


def _loop_link(path: str) -> str:
    return f"a symbolic link back into its own folder {os.path.realpath(path)} (a loop; not followed)"


def _link_not_followed(path: str) -> str:
    return (
        f"a symbolic link to the folder {os.path.realpath(path)}, where the layout reads no "
        "partition's files (not followed)"
    )


def each_outcome(
    request: Callable[[_Item], _Result], items: Iterable[_Item], at_once: int = PARALLEL_SMALL_REQUESTS
) -> list[_Result | Exception]:
    """`request` applied to every item, `at_once` at a time: per item, in the order of `items`,
    its result or the exception it raised, for a caller that deals with each file's failure on
    its own (`catalog.files.record`). When the store is out of reach (`store_out_of_reach`) the
    requests not yet begun are not made: their outcome is that failure. In an outage each
    request waits through its retries and timeouts, and a thousand notes would have kept a run
    (or a sensor's tick) waiting for each of them in turn. An interrupt (Dagster's termination,
    Ctrl-C), whether the caller's or a request's, makes no further request: the requests under
    way end, and it is raised."""
    items = list(items)
    outage: list[Exception] = []
    interrupted: list[BaseException] = []
    # the requests under way: an interrupt is raised only once they have ended
    under_way, running = threading.Condition(), [0]

    def unless_out_of_reach(item: _Item) -> _Result | Exception:
        with under_way:
            if interrupted:
                return _NotBegun()
            running[0] += 1
        try:
            if outage:
                return outage[0]
            return request(item)
        except Exception as error:  # noqa: BLE001 - handed back as the item's outcome
            if store_out_of_reach(error):
                outage.append(error)
            return error
        except BaseException as interrupt:
            with under_way:
                interrupted.append(interrupt)
            raise
        finally:
            with under_way:
                running[0] -= 1
                under_way.notify_all()

    if len(items) < 2 or at_once < 2:
        return [unless_out_of_reach(item) for item in items]
    pool = ThreadPoolExecutor(max_workers=min(at_once, len(items)))
    try:
        # Not `pool.map`: its first failure cancels the requests not yet started, so some notes
        # of a run would be written and the rest not even tried. Each `result()` waits under
        # its future's lock, which an interrupt releases (`concurrent.futures.wait` would not).
        requests = [pool.submit(unless_out_of_reach, item) for item in items]
        return [done.result() for done in requests]
    except BaseException as interrupt:
        with under_way:
            interrupted.append(interrupt)  # no queued request begins: a step stopped stops writing
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        with under_way:
            under_way.wait_for(lambda: running[0] == 0)


class _NotBegun(Exception):
    """The outcome of a request `each_outcome` did not begin after an interrupt (never seen: the
    interrupt is raised)."""


def each_request(
    request: Callable[[_Item], _Result], items: Iterable[_Item], at_once: int = PARALLEL_SMALL_REQUESTS
) -> list[_Result]:
    """`request` applied to every item as `each_outcome` does; results in the order of `items`.
    Every item is tried before the first failure is raised (the outage's, if the store went
    out of reach: then the requests not yet begun were not made)."""
    outcomes = each_outcome(request, items, at_once)
    failures = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
    if failures:
        out_of_reach = [failure for failure in failures if store_out_of_reach(failure)]
        raise (out_of_reach or failures)[0]
    return outcomes  # type: ignore[return-value]  # no outcome is a failure


@dataclasses.dataclass(frozen=True)
class Entry:
    uri: str
    name: str
    is_dir: bool
    size: int
    mtime_ms: int | None
    #: why the entry cannot be read or entered (a symbolic link that leads nowhere or back into
    #: its own folders, a folder that cannot be listed), else None
    unreadable: str | None = None


@dataclasses.dataclass(frozen=True)
class Tagged:
    """An S3 object as `Storage.read_tagged` found it."""

    data: bytes
    #: its ETag, which `Storage.write_if_tag` compares
    tag: str
    #: seconds since it was last written, by the store's own clock (the response's `Date`
    #: against the object's `Last-Modified`; whole seconds), so no two machines' clocks meet
    age_seconds: float


#: the end of the name of a file being written aside (`Storage.write_bytes`); one that a kill
#: left behind is never read
PARTIAL_SUFFIX = ".partial"


#: what reading, writing or decoding a file through pyarrow raises: OSError, or pyarrow's own
#: errors (`ArrowInvalid` for an S3 path with an empty segment, for a footer that does not decode)
FILE_ERRORS = (OSError, pa.ArrowException)

#: how a walk (`Storage.walk_files`) tells of a folder it could not list
UNLISTABLE_FOLDER = "a folder that cannot be listed"

#: S3 key segments that no Hadoop path can name
_UNNAMEABLE_SEGMENTS = ("", ".", "..")


@contextlib.contextmanager
def _s3_request(what: str, storage: Storage, *, absent_is_empty: bool = False) -> Iterator[None]:
    """boto3's errors, the client's making included, as OSErrors (`StorageRequestError`: what
    every caller of `Storage` handles, as pyarrow's S3 client raises them), saying when the
    request went unsigned for want of credentials; with `absent_is_empty`, a bucket that does
    not exist ends the block quietly."""
    import botocore.exceptions

    try:
        yield
    except botocore.exceptions.ClientError as error:
        if absent_is_empty and error.response.get("Error", {}).get("Code") == "NoSuchBucket":
            return
        unsigned = " (sent unsigned: no AWS credentials were found)" if storage._s3_unsigned else ""
        raise StorageRequestError(f"{what}{unsigned}: {first_line(error)}") from error
    except botocore.exceptions.BotoCoreError as error:
        raise StorageRequestError(f"{what}: {first_line(error)}") from error


def _names_no_object(error: Exception) -> bool:
    """Whether a request failed because its object does not exist (S3's `NoSuchKey`)."""
    import botocore.exceptions

    cause = error.__cause__
    return isinstance(error, FileNotFoundError) or (
        isinstance(cause, botocore.exceptions.ClientError)
        and cause.response.get("Error", {}).get("Code") in ("NoSuchKey", "404")
    )


#: S3's 4xx answers that may pass, or that concern every request rather than the object (the
#: credentials, the clock): raised, never taken for the object's refusal
_PASSING_CODES = frozenset(
    {
        "SlowDown",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "Throttling",
        "ThrottlingException",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
    }
)


def _refuses_for_good(error: Exception) -> bool:
    """Whether a read failed because the store will not hand over this object's bytes until
    someone acts (a 4xx about the object: access denied, archived to Glacier, a KMS key or an
    SSE-C key the run does not have), not because the request did not get through (a 5xx, a
    timeout, throttling) or the credentials or clock are wrong for every object."""
    import botocore.exceptions

    cause = error.__cause__
    if isinstance(cause, botocore.exceptions.ClientError):
        code = str(cause.response.get("Error", {}).get("Code"))
        status = int(cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        return 400 <= status < 500 and code not in _PASSING_CODES
    return isinstance(error, PermissionError)


def _nameable(path: str) -> bool:
    """Whether pyarrow (and Hadoop) can name the object at `path` (bucket/key) as it is."""
    return not any(s in _UNNAMEABLE_SEGMENTS for s in path.split("/")[1:])


def _unnameable_key(segments: list[str], size: int) -> str | None:
    """Why an S3 object whose key below the listed folder is `segments` cannot be read, or None."""
    if segments[-1] == "":
        return (
            f"an S3 object whose key ends in '/' but holds {size} bytes: s3a and Spark take such a key "
            "for a folder marker, so it cannot be read"
        )
    if any(s in _UNNAMEABLE_SEGMENTS for s in segments):
        return (
            "an S3 key with an empty, '.' or '..' path segment: a Hadoop path cannot name it, so Spark "
            "cannot read it (copy it to a plain key)"
        )
    return None


#: why an S3 object cannot be read when other keys begin with its key and a `/` (`x.parquet`
#: beside `x.parquet/_SUCCESS`): s3a and Spark take the path for that folder and read its files
_KEY_THAT_IS_A_FOLDER = (
    "an S3 object whose key is also a folder (other keys begin with it and '/'): s3a and Spark read "
    "that folder's files in its place, so it cannot be read as itself (copy it to a key no other key "
    "begins with)"
)


def _listed_object(listed: dict, uri: str, name: str) -> Entry:
    """The entry of an object as a ListObjectsV2 page gives it."""
    return Entry(uri, name, False, int(listed["Size"]), int(listed["LastModified"].timestamp() * 1000))


#: how the name of an S3 directory bucket (S3 Express One Zone) ends, and of an access point's
#: alias for one
_DIRECTORY_BUCKET_SUFFIXES = ("--x-s3", "--xa-s3")


def _folder_marker(name: str, size: int) -> bool:
    """Whether an S3 object is a folder's marker, not data: empty, and named like a folder
    (`x/`) or as Hadoop's older S3 connectors and EMR mark one (`x_$folder$`)."""
    return size == 0 and (name == "" or name.endswith(("/", "_$folder$")))


def is_hidden(name: str) -> bool:
    """Hidden and marker files and folders (`_SUCCESS`, `.crc`, `_temporary/`) are not data:
    the Hadoop convention Spark, Hive and Athena follow too. As for Spark, a `_` name holding
    `=` is a partition folder (`_region=eu`), not hidden."""
    return name.startswith(".") or (name.startswith("_") and "=" not in name)


class Storage:
    """Files under `file://` and `s3a://` URIs. S3's endpoint and region come from the
    configuration (`S3Config`); access keys from the environment, when a client is made."""

    def __init__(self, s3: S3Config | None = None):
        self._s3_settings = s3 or S3Config()
        self._s3: pafs.FileSystem | None = None
        self._boto3_client: Any = None  # boto3 (exact listings, conditional writes), made on first use
        self._clients_made = threading.Lock()
        self._s3_unsigned = False  # it found no credentials, and asks unsigned (a public bucket)
        self._local = pafs.LocalFileSystem()

    def _s3_fs(self) -> pafs.FileSystem:
        with self._clients_made:  # the first use may come from several threads (`each_request`)
            return self._made_s3_fs()

    def _made_s3_fs(self) -> pafs.FileSystem:
        if self._s3 is None:
            settings = self._s3_settings
            kwargs: dict = {"region": settings.region}
            credentials = aws_credentials_from_environment()
            if credentials is not None:
                kwargs.update(
                    access_key=credentials.key, secret_key=credentials.secret, session_token=credentials.token
                )
            if settings.endpoint_url:
                scheme, _, host = settings.endpoint_url.partition("://")
                kwargs.update(endpoint_override=host or scheme, scheme=scheme if host else "https")
                kwargs["force_virtual_addressing"] = False
            self._s3 = pafs.S3FileSystem(**kwargs)
        return self._s3

    def requests_at_once(self, uri: str) -> int:
        """How many requests of `uri`'s store to make at once (`each_request`) where each is mostly
        Python's work (catalog parts built and read, a footer's statistics, a hash): on S3 each
        waits out a round trip, so `PARALLEL_SMALL_REQUESTS`; a local file's takes well under a
        millisecond, and threads sharing the interpreter only slowed them (docs/profiling.md,
        "Requests one after another")."""
        return PARALLEL_SMALL_REQUESTS if is_s3(uri) else 1

    def requests_at_once_for(self, uris: Iterable[str]) -> int:
        """`requests_at_once` for requests of all of `uris` (a landing's strays and the lake's
        copies of them may be in different stores): the most any of them takes; 1 for none."""
        return max((self.requests_at_once(uri) for uri in uris), default=1)

    def resolve(self, uri: str) -> tuple[pafs.FileSystem, str]:
        if is_s3(uri):
            return self._s3_fs(), uri.split("://", 1)[1]
        if uri.startswith("file://"):
            return self._local, uri[len("file://") :]
        raise InvalidValue(f"unsupported URI {uri!r}")

    @staticmethod
    def _uri(prefix_uri: str, name: str) -> str:
        return prefix_uri.rstrip("/") + "/" + name

    def list(self, uri: str) -> list[Entry]:
        """Immediate children of a folder, in name order; an absent folder lists as empty."""
        fs, path = self.resolve(uri)
        if fs is self._local:
            return self._list_local(uri, path)
        return self._list_s3(uri, path)

    def _list_s3(self, uri: str, path: str) -> builtins.list[Entry]:
        """A folder's children from the bucket's listing of the keys below it, cut at the next
        `/`, as the walk (`_walk_s3`) lists them: boto3 asks for the keys URL-encoded, so a
        key holding a carriage return keeps it (pyarrow's listing, parsed from the XML as sent,
        made it a line feed: a name no one could open, which failed the table's catalog step).
        A key with an empty, `.` or `..` segment is left to the walk, which reports it; a key
        that is also a folder cannot be read as itself (`_KEY_THAT_IS_A_FOLDER`)."""
        bucket, _, prefix = path.partition("/")
        prefix = f"{prefix.rstrip('/')}/" if prefix.strip("/") else ""
        files: builtins.list[Entry] = []
        folders: set[str] = set()
        for page in self._listing(f"listing {uri}", bucket, Prefix=prefix, Delimiter="/"):
            folders.update(p["Prefix"][len(prefix) : -1] for p in page.get("CommonPrefixes", []))
            files += [
                _listed_object(
                    listed, self._uri(uri, listed["Key"][len(prefix) :]), listed["Key"][len(prefix) :]
                )
                for listed in page.get("Contents", [])
                if not _folder_marker(listed["Key"][len(prefix) :], int(listed["Size"]))
            ]
        named = [
            *(
                dataclasses.replace(e, unreadable=_KEY_THAT_IS_A_FOLDER) if e.name in folders else e
                for e in files
            ),
            *(Entry(self._uri(uri, name), name, True, 0, None) for name in folders),
        ]
        return sorted((e for e in named if e.name not in _UNNAMEABLE_SEGMENTS), key=lambda e: e.name)

    def _list_local(self, uri: str, path: str) -> builtins.list[Entry]:
        """A local folder's children, symbolic links followed. pyarrow leaves out a link that
        leads nowhere (to a missing target, or round a loop); listed here, it can be reported.
        A link back up to a folder that holds it (`_leads_back_up`) is such a loop too: listed,
        it is no folder; asked to list, it raises as a link to itself does (`ELOOP`)."""
        if _leads_back_up(path):
            raise LinkLoop(errno.ELOOP, _loop_link(path), path)
        try:
            children = list(os.scandir(path))
        except FileNotFoundError:
            return []
        out = []
        for child in children:
            name, not_utf8 = _text_of_local_name(child.name)
            child_uri = self._uri(uri, name)
            if not_utf8:
                out.append(Entry(child_uri, name, False, 0, None, not_utf8))
                continue
            try:
                info = child.stat()
            except OSError as exc:
                out.append(
                    Entry(
                        child_uri,
                        child.name,
                        False,
                        0,
                        None,
                        f"a symbolic link that leads nowhere ({exc.strerror})",
                    )
                )
                continue
            is_dir = stat.S_ISDIR(info.st_mode)
            if is_dir and child.is_symlink() and _leads_back_up(child.path):
                out.append(Entry(child_uri, child.name, False, 0, None, _loop_link(child.path)))
                continue
            odd = None if is_dir else _why_not_readable(child.path, info.st_mode)
            out.append(
                Entry(
                    child_uri,
                    child.name,
                    is_dir,
                    0 if is_dir else info.st_size,
                    info.st_mtime_ns // 1_000_000,
                    odd,
                )
            )
        return sorted(out, key=lambda e: e.name)

    def walk_files(
        self,
        uri: str,
        skip: Callable[[str], bool] = lambda name: False,
        levels: int | None = None,
        follow_link: Callable[[builtins.list[str]], bool] | None = None,
    ) -> Iterator[Entry]:
        """Every file under a folder, depth first, leaving out entries (and what they hold)
        whose name `skip` accepts. With `levels`, a local folder deeper than that many levels
        below `uri` is not entered but comes out as a folder entry: a link in an hour folder to
        a large tree is not walked through when only the hours' own files are wanted. With
        `follow_link`, a symbolic link to a folder (`uri` itself included) is followed only
        where `follow_link` accepts the folders below `uri` that lead to it (its own name last;
        none for `uri`); elsewhere it comes out as one entry with `unreadable` set. A stray
        walk so reports a link to a share's root once, where the layout reads no files, rather
        than every file of the tree it leads to, while a real folder there still has each of
        its files reported.

        The walk neither loops nor stops on one bad entry: a folder that a symbolic link leads
        back into one of its own ancestors is not entered again, nor is a folder that cannot be
        listed; each comes out as an entry with `unreadable` set, as does a link to nothing.
        On S3 (no links) it is one listing of every key under the prefix.
        """
        fs, path = self.resolve(uri)
        if fs is not self._local:
            yield from self._walk_s3(uri, path, skip)
            return
        try:
            top = os.stat(path)
        except FileNotFoundError:
            return
        if (
            follow_link is not None
            and stat.S_ISDIR(top.st_mode)
            and os.path.islink(path.rstrip("/") or path)
            and not follow_link([])
        ):
            name = uri.rstrip("/").rsplit("/", 1)[-1]
            yield Entry(uri, name, True, 0, top.st_mtime_ns // 1_000_000, _link_not_followed(path))
            return
        walk = _LocalWalk(uri, skip, follow_link)
        yield from self._walk_local(self._list_local(uri, path), {(top.st_dev, top.st_ino)}, walk, levels)

    def _walk_s3(self, uri: str, path: str, skip: Callable[[str], bool]) -> Iterator[Entry]:
        """Every object under the prefix, from the bucket's own listing of its keys.

        An S3 key is any text, and some cannot be a Hadoop path: a key with an empty, `.` or `..`
        segment (`hour=00//x`, `hour=00/./x`), or one that ends in `/` yet holds data (s3a and
        Spark take it for a folder marker). pyarrow's listing passes them on as if they were
        plain files (or, for `.` and `..`, as hidden folders), so the keys are listed here as
        they are, and such an object comes out with `unreadable` set: reported, never read as
        something else or passed over. An empty key ending in `/` is a folder marker, not data.
        A bucket that does not exist lists as empty, as pyarrow's listing does."""
        bucket, _, prefix = path.partition("/")
        prefix = f"{prefix.rstrip('/')}/" if prefix.strip("/") else ""
        found: dict[str, Entry] = {}
        folders: set[str] = set()  # every key's parent folders, below the prefix
        for page in self._listing(f"listing {uri}", bucket, Prefix=prefix):
            for listed in page.get("Contents", []):
                relative = listed["Key"][len(prefix) :]
                segments = relative.split("/")
                folders.update("/".join(segments[:end]) for end in range(1, len(segments)))
                if any(skip(s) for s in segments if s not in _UNNAMEABLE_SEGMENTS):
                    continue
                size = int(listed["Size"])
                if _folder_marker(segments[-1], size):
                    continue
                found[relative] = dataclasses.replace(
                    _listed_object(
                        listed,
                        f"{uri.rstrip('/')}/{relative}",
                        next((s for s in reversed(segments) if s), relative),
                    ),
                    unreadable=_unnameable_key(segments, size),
                )
        for relative, entry in found.items():
            shadowed = relative in folders and entry.unreadable is None
            yield dataclasses.replace(entry, unreadable=_KEY_THAT_IS_A_FOLDER) if shadowed else entry

    def _s3_client(self):
        """A boto3 S3 client on the configured endpoint (path-style there, as for pyarrow): the
        environment's credentials, else boto3's own chain (a profile, an instance role), else
        none at all (a public bucket), as pyarrow's client finds them."""
        with self._clients_made:  # the first use may come from several threads (`each_request`)
            return self._made_s3_client()

    def _made_s3_client(self):
        if self._boto3_client is None:
            import boto3
            import botocore
            import botocore.config

            settings = self._s3_settings
            credentials = aws_credentials_from_environment()
            session = (
                boto3.Session()
                if credentials is None
                else boto3.Session(
                    aws_access_key_id=credentials.key,
                    aws_secret_access_key=credentials.secret,
                    aws_session_token=credentials.token,
                )
            )
            self._s3_unsigned = session.get_credentials() is None
            signing = {"signature_version": botocore.UNSIGNED} if self._s3_unsigned else {}
            style = {"addressing_style": "path"} if settings.endpoint_url else {}
            self._boto3_client = session.client(
                "s3",
                endpoint_url=settings.endpoint_url,
                region_name=settings.region,
                # one connection for each request `each_request` makes at once (botocore keeps 10)
                config=botocore.config.Config(
                    s3=style, max_pool_connections=PARALLEL_SMALL_REQUESTS, **signing
                ),
            )
        return self._boto3_client

    def _walk_local(
        self, entries: builtins.list[Entry], ancestors: set, walk: _LocalWalk, levels: int | None
    ) -> Iterator[Entry]:
        for entry in entries:
            if walk.skip(entry.name):
                continue
            if not entry.is_dir or entry.unreadable or levels == 0:
                yield entry
                continue
            _, path = self.resolve(entry.uri)
            try:
                info = os.stat(path)
                loop = (info.st_dev, info.st_ino) in ancestors
                link_held_back = not loop and walk.holds_back(entry.uri, path)
                children = [] if loop or link_held_back else self._list_local(entry.uri, path)
            except OSError as exc:
                yield dataclasses.replace(entry, unreadable=f"{UNLISTABLE_FOLDER} ({exc.strerror})")
                continue
            if loop:
                yield dataclasses.replace(entry, unreadable=_loop_link(path))
                continue
            if link_held_back:
                yield dataclasses.replace(entry, unreadable=_link_not_followed(path))
                continue
            yield from self._walk_local(
                children,
                ancestors | {(info.st_dev, info.st_ino)},
                walk,
                None if levels is None else levels - 1,
            )

    def files_now(self, uris: Iterable[str]) -> dict[str, Entry]:
        """The entries of these files as the store holds them now, by URI; a file gone, or no
        longer a file, is left out. On S3 it is one listing of the key range the files span
        (a page per thousand keys), not a request per file or per folder: a run asks this of
        every file it read, which can be a week of hours."""
        found: dict[str, Entry] = {}
        by_bucket: dict[str, dict[str, builtins.list[str]]] = {}
        for uri in uris:
            if is_s3(uri):
                bucket, _, key = uri.split("://", 1)[1].partition("/")
                by_bucket.setdefault(bucket, {}).setdefault(key, []).append(uri)  # s3:// and s3a://
            elif (entry := self._local_file_now(uri, self.resolve(uri)[1])) is not None:
                found[uri] = entry
        for bucket, uris_of in by_bucket.items():
            found.update(self._s3_files_now(bucket, uris_of))
        return found

    @staticmethod
    def _local_file_now(uri: str, path: str) -> Entry | None:
        try:
            info = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(info.st_mode):
            return None
        return Entry(uri, os.path.basename(path), False, info.st_size, info.st_mtime_ns // 1_000_000)

    def _s3_files_now(self, bucket: str, uris_of: dict[str, builtins.list[str]]) -> dict[str, Entry]:
        """The keys of `uris_of` found in one listing from the first to the last of them: a
        general purpose bucket lists keys in order, so the range holds every one (and whatever
        lies between). A directory bucket (S3 Express) lists them in no order and takes no
        `StartAfter`: the whole common prefix is listed."""
        first, last = min(uris_of), max(uris_of)
        prefix = os.path.commonprefix([first, last])  # noqa: RUF071 - an S3 prefix is any string
        ordered = not bucket.endswith(_DIRECTORY_BUCKET_SUFFIXES)
        # StartAfter is exclusive: a prefix of the first key sorts just before it
        start = {"StartAfter": first[:-1]} if ordered and first[:-1] else {}
        if not ordered:  # a directory bucket lists only prefixes that end in '/'
            prefix = prefix[: prefix.rfind("/") + 1]
        found: dict[str, Entry] = {}
        looking = f"looking up landed files again: listing {bucket}/{prefix}"
        for page in self._listing(looking, bucket, Prefix=prefix, **start):
            for listed in page.get("Contents", []):
                key = listed["Key"]
                if ordered and key > last:
                    return found
                for uri in uris_of.get(key, ()):
                    found[uri] = _listed_object(listed, uri, key.rsplit("/", 1)[-1])
        return found

    def _listing(self, what: str, bucket: str, **asked: str) -> Iterator[dict]:
        """The pages of the bucket's listing of its keys (`list_objects_v2` with `asked`), boto3's
        failures raised as `StorageRequestError` naming `what`; a bucket that does not exist
        lists as empty, as pyarrow's listing does."""
        with _s3_request(what, self, absent_is_empty=True):
            yield from self._s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, **asked)

    def exists(self, uri: str) -> bool:
        return self.file_info(uri).type != pafs.FileType.NotFound

    def file_info(self, uri: str) -> pafs.FileInfo:
        """What the store says of `uri` now (kind, size, modification time); a file that is not
        there has the kind `NotFound`."""
        fs, path = self.resolve(uri)
        return fs.get_file_info(path)

    def read_bytes(self, uri: str) -> bytes:
        fs, path = self.resolve(uri)
        if fs is not self._local and not _nameable(path):  # pyarrow would refuse or alter the key
            bucket, _, key = path.partition("/")
            with _s3_request(f"reading {uri}", self):
                return self._s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()
        with fs.open_input_stream(path) as handle:
            return handle.read()

    def open_input_file(self, uri: str):
        fs, path = self.resolve(uri)
        return fs.open_input_file(path)

    def refusal_to_read(self, uri: str) -> Exception | None:
        """Whether the file's store refuses its bytes for good: None when it hands them over, the
        refusal when it will not until someone acts (an S3 object archived to Glacier, one the
        run may not read: listed like any other), `FileNotFoundError` when the file is gone. Any
        other failure (a timeout, a 5xx) is raised: it may pass, and must not set a file aside.
        (S3 is asked through boto3, whose error names S3's code; pyarrow's names its own failure
        to read the answer.)"""
        fs, path = self.resolve(uri)
        try:
            if fs is self._local:
                with fs.open_input_file(path) as handle:
                    handle.read(1)
            else:
                bucket, _, key = path.partition("/")
                with _s3_request(f"reading {uri}", self):
                    self._s3_client().get_object(Bucket=bucket, Key=key)["Body"].close()
        except FILE_ERRORS as exc:
            if _names_no_object(exc):
                return FileNotFoundError(uri)
            if _refuses_for_good(exc):
                return exc
            raise
        return None

    def write_bytes(self, uri: str, data: bytes) -> None:
        """Write a whole file: a reader, or a process killed mid-write, leaves the old file or
        the new one, never part of it. An S3 PUT is so already; on a file system the bytes go
        to a hidden file beside it (ignored by every listing of data), renamed over it."""
        fs, path = self.resolve(uri)
        parent, name = path.rsplit("/", 1)
        fs.create_dir(parent, recursive=True)
        if is_s3(uri):
            with fs.open_output_stream(path) as handle:
                handle.write(data)
            return
        aside = f"{parent}/.{name}.{uuid.uuid4().hex[:12]}{PARTIAL_SUFFIX}"
        try:
            with fs.open_output_stream(aside) as handle:
                handle.write(data)
            fs.move(aside, path)
        except BaseException:
            with contextlib.suppress(OSError):
                fs.delete_file(aside)
            raise

    def read_tagged(self, uri: str) -> Tagged | None:
        """An S3 object with its ETag and age (`Tagged`); None when absent."""
        bucket, key = self._s3_key(uri)
        with _s3_request(f"reading {uri}", self):
            import botocore.exceptions

            try:
                found = self._s3_client().get_object(Bucket=bucket, Key=key)
            except botocore.exceptions.ClientError as error:
                if error.response.get("Error", {}).get("Code") == "NoSuchKey":
                    return None
                raise
            return Tagged(found["Body"].read(), found["ETag"], _age_by_store_clock(found))

    def write_if_tag(self, uri: str, data: bytes, tag: str | None) -> str | None:
        """Put `data` at `uri` only if the object is still as read (its ETag is `tag`), or, with
        no `tag`, still absent (S3's conditional writes): its new ETag, or None when another
        writer changed it first."""
        bucket, key = self._s3_key(uri)
        condition = {"IfNoneMatch": "*"} if tag is None else {"IfMatch": tag}
        with _s3_request(f"writing {uri}", self):
            import botocore.exceptions

            try:
                return self._s3_client().put_object(Bucket=bucket, Key=key, Body=data, **condition)["ETag"]
            except botocore.exceptions.ClientError as error:
                code = error.response.get("Error", {}).get("Code")
                if code in ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey"):
                    return None
                raise

    def _s3_key(self, uri: str) -> tuple[str, str]:
        fs, path = self.resolve(uri)
        if fs is self._local:
            raise InvalidValue(f"{uri} is not an S3 object")
        bucket, _, key = path.partition("/")
        return bucket, key

    def copy(self, src: str, dst: str) -> None:
        src_fs, src_path = self.resolve(src)
        dst_fs, dst_path = self.resolve(dst)
        if src_fs is self._local:
            local = src_path if os.path.lexists(src_path) else _path_in_bytes(src_path)
            _refuse_to_copy_what_is_not_a_file(local)
            if local != src_path:  # a name that is not UTF-8, shown with escapes
                with open(local, "rb") as source:
                    self.write_bytes(dst, source.read())
                return
        if src_fs is dst_fs and _nameable(src_path):
            dst_fs.create_dir(dst_path.rsplit("/", 1)[0], recursive=True)
            dst_fs.copy_file(src_path, dst_path)
        else:
            self.write_bytes(dst, self.read_bytes(src))

    def delete_tree(self, uri: str) -> None:
        fs, path = self.resolve(uri)
        if fs.get_file_info(path).type == pafs.FileType.Directory:
            fs.delete_dir(path)

    def delete_file(self, uri: str) -> None:
        fs, path = self.resolve(uri)
        if fs.get_file_info(path).type == pafs.FileType.File:
            fs.delete_file(path)

    def move_file(self, src: str, dst: str) -> None:
        """Make `dst` appear whole: a rename on a file system, a server-side copy on S3."""
        fs, src_path = self.resolve(src)
        _, dst_path = self.resolve(dst)
        fs.create_dir(dst_path.rsplit("/", 1)[0], recursive=True)
        if is_s3(src):
            fs.copy_file(src_path, dst_path)
            fs.delete_file(src_path)
        else:
            fs.move(src_path, dst_path)


def data_files(storage: Storage, folder_uri: str) -> list[Entry]:
    """The data files directly in a folder: not hidden (`is_hidden`), and readable (a link that
    leads nowhere is not data; a landing reports it as a stray)."""
    return [
        e for e in storage.list(folder_uri) if not e.is_dir and not is_hidden(e.name) and e.unreadable is None
    ]


def read_lake_json(storage: Storage, uri: str, shape: type[_Note]) -> _Note:
    """One of the lake's own JSON notes, read strictly as `shape` (a dataclass, TypedDict or any
    type pydantic validates). Bytes that are not JSON, or JSON not of that shape, raise
    `DamagedLakeFile` naming the note and the first thing wrong; a failure to read it (gone, the
    network) is raised as it is."""
    data = storage.read_bytes(uri)
    try:
        return _note_reader(shape).validate_json(data, strict=True)
    except pydantic.ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise DamagedLakeFile(
            uri, f"not the note it should be: {where + ': ' if where else ''}{first_line(first['msg'])}"
        ) from exc


#: shape -> its reader: a reader is built once (a race in the pool's threads only builds two)
_note_readers: dict[object, pydantic.TypeAdapter[Any]] = {}


def _note_reader(shape: type[_Note]) -> pydantic.TypeAdapter[_Note]:
    if shape not in _note_readers:
        _note_readers[shape] = pydantic.TypeAdapter(shape)
    return _note_readers[shape]


#: the process that reads each footer whole before this one touches it (`footer_probe`)
FOOTER_PROBE = FooterProbe()

#: bytes first read from a Parquet file's end: its footer and the 8 bytes after it, nearly always
_FOOTER_GUESS = 64 * 1024
_PARQUET_MAGIC = b"PAR1"


def parquet_footer(storage: Storage, uri: str) -> pq.FileMetaData:
    """The footer of a Parquet file, in one ranged read (two for a footer over 64 KiB), safe to
    read in this process. Bytes that are not a footer, a footer that ends the process reading
    it (`FOOTER_PROBE` reads each whole first) and one whose row groups lack column chunks raise
    `DamagedLakeFile` (of a landed file, its caller says what that means); a failure to read
    them (a file gone since it was listed, the network) is raised as it is, so that it is never
    taken for damage, which asks for a rebuild, and so is a probe that cannot run
    (`FooterProbeFailed`)."""
    with storage.open_input_file(uri) as handle:
        size = handle.size()
        end = _read_exactly(handle, uri, min(size, _FOOTER_GUESS), size - min(size, _FOOTER_GUESS))
        if size < 12 or end[-4:] != _PARQUET_MAGIC:
            raise DamagedLakeFile(uri, f"not Parquet: its {size} bytes do not end in PAR1")
        length = int.from_bytes(end[-8:-4], "little")
        if length > size - 12:
            raise DamagedLakeFile(uri, f"its footer claims {length} bytes, more than the file holds")
        if length + 8 > len(end):
            end = _read_exactly(handle, uri, length + 8, size - length - 8)
    footer = _PARQUET_MAGIC + end[-length - 8 :]  # the footer alone: all a footer's decoding reads
    try:
        meta = pq.ParquetFile(pa.BufferReader(footer)).metadata
    except FILE_ERRORS as exc:
        raise DamagedLakeFile(uri, first_line(exc)) from exc
    except UnicodeDecodeError as exc:  # pyarrow decodes the column names it lists
        around = exc.object[max(0, exc.start - 30) : exc.end + 10]
        raise DamagedLakeFile(uri, f"a column name is not UTF-8 text (...{around!r}...)") from exc
    if (fault := FOOTER_PROBE.why_it_ends_a_reader(footer) or _chunks_missing(meta)) is not None:
        raise DamagedLakeFile(uri, fault)
    return meta


def _chunks_missing(meta: pq.FileMetaData) -> str | None:
    """Why a footer's row groups do not each hold a column chunk per column of its schema (a
    reader asking for a column past a group's chunks gets an error, not the column), or None."""
    for group in range(meta.num_row_groups):
        if (chunks := meta.row_group(group).num_columns) != meta.num_columns:
            return f"row group {group} holds {chunks} column chunks for the {meta.num_columns} columns of its schema"
    return None


def parquet_column(storage: Storage, uri: str, name: str) -> pa.ChunkedArray:
    """One column of a Parquet file, its bytes read apart from their decoding as
    `parquet_footer`'s are: bytes that do not decode raise `DamagedLakeFile`, a failure to read
    them is raised as it is."""
    with storage.open_input_file(uri) as handle:
        stored = _StoredBytes(handle, uri)  # asks the store for the size: a failure is raised as it is
        try:
            return pq.ParquetFile(pa.PythonFile(stored, mode="r")).read(columns=[name]).column(0)
        except _ByteReadFailed as failed:
            raise failed.cause from None
        except MemoryError:  # the process's limit (pyarrow's too), not the file's damage
            raise
        except Exception as exc:  # pyarrow raises several types for bytes it cannot decode
            raise DamagedLakeFile(uri, first_line(exc)) from exc


class _ByteReadFailed(LakeAssetsError):
    """A failed read of a file's bytes, carried through pyarrow's decoding (which hands a Python
    reader's exception back as it was raised) so it is not taken for the bytes' fault."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


class _StoredBytes(io.RawIOBase):
    """A store's file as the Python file pyarrow decodes from, each read exact (`_read_exactly`)
    and its failure marked as the store's (`_ByteReadFailed`)."""

    def __init__(self, handle, uri: str):
        super().__init__()
        self._handle, self._uri, self._at = handle, uri, 0
        self._size = handle.size()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._at = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._size}[whence] + offset
        return self._at

    def tell(self) -> int:
        return self._at

    def readinto(self, buffer) -> int:
        wanted = max(0, min(len(buffer), self._size - self._at))
        if wanted:
            try:
                buffer[:wanted] = _read_exactly(self._handle, self._uri, wanted, self._at)
            except Exception as exc:
                raise _ByteReadFailed(exc) from exc
            self._at += wanted
        return wanted


def _read_exactly(handle, uri: str, length: int, offset: int) -> bytes:
    """`length` bytes at `offset`. Fewer is a failed read (a connection closed before its last
    byte), raised as one: taken for the file's bytes, it would read as damage."""
    data = handle.read_at(length, offset)
    if len(data) != length:
        raise StorageRequestError(f"reading {uri}: {len(data)} of the {length} bytes asked at {offset} came")
    return data
