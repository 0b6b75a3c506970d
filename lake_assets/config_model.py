"""Typed building blocks of the feed configuration (pydantic v2).

The base model every configuration piece derives from, the checked value types the pieces are
made of, the options every feed shares (`FeedConfig`; each format's model extends it beside its
feed module), and the translation of a validation failure into lines a person reads: one line
per mistake, `<key path>: expected <what>, got <value>`. Values that may be credentials are never
echoed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, TypeAlias, TypeVar, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from lake_assets.errors import ConfigError, InvalidValue
from lake_assets.paths import is_name, normalise_root_uri, parse_hour_key

#: where credentials go instead of the configuration file
CREDENTIALS_COME_FROM_THE_ENVIRONMENT = (
    "credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optionally "
    "AWS_SESSION_TOKEN), never from the configuration file"
)
#: the environment variables S3 credentials come from: key, secret, and a session's token
AWS_CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
#: the AWS region of S3 (and of a DynamoDB catalog) when none is configured
DEFAULT_REGION = "us-east-1"


@dataclasses.dataclass(frozen=True)
class AwsCredentials:
    """S3 credentials from the environment; never shown (no value in its repr)."""

    key: str = dataclasses.field(repr=False)
    secret: str = dataclasses.field(repr=False)
    token: str | None = dataclasses.field(repr=False, default=None)


def aws_credentials_from_environment() -> AwsCredentials | None:
    """The S3 credentials the environment holds, or None without both a key and a secret (boto3
    then finds credentials its own way, an instance profile or a role; Spark's connector only
    when `spark.conf` names a provider that does: README, "S3 credentials")."""
    key, secret, token = (os.environ.get(name) for name in AWS_CREDENTIAL_VARIABLES)
    return AwsCredentials(key, secret, token or None) if key and secret else None


#: a setting name that looks like it holds a credential
SECRET_NAME = re.compile(
    r"secret|passw(or)?d|token|credential"
    # a key, not a setting about keys (`spark.io.encryption.keySizeBits`)
    r"|(^|[._-])(access|account|api|private|session|encryption|signing)[._-]?key([._-]|$)"
    # an AWS key id, however spelt (`fs.s3a.awsAccessKeyId`, `aws.accessKeyId`, `access_key_id`)
    r"|access[._-]?key[._-]?id",
    re.IGNORECASE,
)
#: ... unless it only names a mechanism (a credentials provider class, a token binding, a switch)
MECHANISM_NAME = re.compile(r"[._-](provider|binding|enabled)$", re.IGNORECASE)


def looks_secret(name: str) -> bool:
    """Whether a setting named `name` would hold a credential (key, secret, password, token)."""
    return bool(SECRET_NAME.search(name)) and not MECHANISM_NAME.search(name)


def expected(what: str) -> PydanticCustomError:
    """A validation error saying what was expected; the value given is added when shown."""
    return PydanticCustomError("expected", "expected {expected}", {"expected": what})


def refused(reason: str, at: tuple[str | int, ...] = ()) -> PydanticCustomError:
    """A validation error that never echoes the value (it may be a credential); `at` extends the
    key path of a check made on a whole model down to the key it is about."""
    return PydanticCustomError("refused", "{reason}", {"reason": reason, "at": at})


def checked(
    what: str, accept: Callable[[Any], bool], convert: Callable[[Any], Any] = lambda v: v
) -> PlainValidator:
    """A value `accept` takes (converted by `convert`), or the error `expected <what>`. Plain:
    pydantic's lax coercions (true -> 1, 1 -> '1') never apply."""

    def validate(value: Any) -> Any:
        if not accept(value):
            raise expected(what)
        return convert(value)

    return PlainValidator(validate)


def _text(pattern: str) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str) and re.fullmatch(pattern, v) is not None


def _hour(value: Any) -> bool:
    try:
        parse_hour_key(value)
    except InvalidValue:
        return False
    return True


#: a URL with a user (and password) before its host, anywhere in a value: a list of URLs, or a
#: URL inside another (`k8s://https://user:password@host`)
_URL_WITH_CREDENTIALS = re.compile(
    r"[A-Za-z][A-Za-z0-9+.-]*://("
    # a user (`scheme://user@host`): not `host,other@…`, nor `host;user=a@b` (JDBC's parameters)
    r"[^/\s@:;,?#]*"
    # or a user and a password, which may hold '/' (AWS secret keys do) and ',' or ';' (RFC 3986
    # allows them), unless what follows the ':' is a port (`host:5432/db?user=a@b`,
    # `host:8020/user/alice@REALM`, `host:1433;user=a@b`)
    r"|[^/\s@:]*:(?!\d{1,5}(?:[/?#;,]|$))[^\s@?#]*"
    r")@"
    # an S3 URL has no port: whatever follows the ':' is a secret (one may start `2049/`)
    r"|s3[an]?://[^/\s@:]*:[^\s@]*@"
)
#: the name of a URL's query parameter (`?X-Amz-Security-Token=…`, `&sig=…`)
_URL_PARAMETER = re.compile(r"://[^\s?#]*\?([^\s#]*)")
#: a query parameter that signs a request: a presigned URL's or a shared access signature's
_SIGNATURE_NAME = re.compile(r"(x-amz-)?signature|sig", re.IGNORECASE)


def without_credentials_in_url(value: str) -> str:
    """`value`, unless a URL in it has a user or password, or a query parameter that holds a
    credential or signs a request (refused, without echoing it)."""
    if _URL_WITH_CREDENTIALS.search(value) or any(
        looks_secret(name) or _SIGNATURE_NAME.fullmatch(name)
        for query in _URL_PARAMETER.findall(value)
        for name in (pair.partition("=")[0] for pair in re.split(r"[&;,]", query))
    ):
        raise refused(f"credentials in a URL are refused: {CREDENTIALS_COME_FROM_THE_ENVIRONMENT}")
    return value


def _root_uri(value: Any) -> str:
    if not isinstance(value, str):
        raise expected(ROOT_URI)
    without_credentials_in_url(value)
    try:
        return normalise_root_uri(value, "uri")
    except ConfigError:
        raise expected(ROOT_URI) from None


def _endpoint(value: Any) -> str:
    if isinstance(value, str):  # before its shape, so that no error repeats a credential
        without_credentials_in_url(value)
    if not _text(r"https?://[^\s/]+(/\S*)?")(value):
        raise expected("an http:// or https:// URL")
    return value


ROOT_URI = (
    "file:///absolute/path, /absolute/path or s3a://bucket/prefix (without '..', '.' or empty segments)"
)
RootUri = Annotated[str, PlainValidator(_root_uri)]
EndpointUrl = Annotated[str, PlainValidator(_endpoint)]
Text = Annotated[str, checked("text", lambda v: isinstance(v, str) and v.strip() != "")]
#: the longest feed name: it is a folder of every layer and part of Dagster's names (a folder's
#: name is 255 bytes at most)
MAX_FEED_NAME = 64
FeedName = Annotated[
    str,
    checked(
        f"a name of lower-case letters, digits, '_' and '-', {MAX_FEED_NAME} at most",
        lambda v: is_name(v) and len(v) <= MAX_FEED_NAME,
    ),
]
#: a table name a feed's configuration may give (and a Unit table folder has)
TABLE_NAME = r"[a-z0-9_]+"
TableName = Annotated[str, checked("a table name of lower-case letters, digits and '_'", _text(TABLE_NAME))]
HourKey = Annotated[str, checked("an hour like 2024-01-31-00 (year-month-day-hour, UTC)", _hour)]

#: hours an hour folder may still gain files: ten years at most (further back, the sensor's look
#: back would pass the first year a date can hold)
LateHours = Annotated[
    int, checked("an integer from 0 to 87,600 (ten years)", lambda v: type(v) is int and 0 <= v <= 87_600)
]
#: seconds between two looks at a landing: a day at most
SensorInterval = Annotated[
    int, checked("an integer from 1 to 86,400 (a day)", lambda v: type(v) is int and 1 <= v <= 86_400)
]
#: seconds a run waits for another writer of a table to finish: a day at most
LeaseWait = Annotated[
    int, checked("an integer from 0 to 86,400 (a day)", lambda v: type(v) is int and 0 <= v <= 86_400)
]
#: how long a run waits for a table's lease by default: a backfill's steps take minutes
DEFAULT_LEASE_WAIT_SECONDS = 1800
Flag = Annotated[bool, checked("true or false", lambda v: isinstance(v, bool))]


_Item = TypeVar("_Item")


def _each_once(items: tuple) -> tuple:
    """A list that names each item once: a table listed twice would be two sets of assets with
    one name, which Dagster refuses only when the definitions load."""
    repeated = next((item for index, item in enumerate(items) if item in items[:index]), None)
    if repeated is not None:
        raise refused(f"{show(repeated)} is listed more than once")
    return items


#: A non-empty list of items, each once (read as a tuple): `Names[TableName]`.
Names = Annotated[tuple[_Item, ...], Field(min_length=1), AfterValidator(_each_once)]


def only_for(formats: str) -> PlainValidator:
    """An option of other feed formats: absent (None) on this one, and refused when given."""
    return PlainValidator(lambda v: _absent(v, formats))


def _absent(value: Any, formats: str) -> None:
    if value is not None:
        raise expected(f"nothing: this key applies to {formats} feeds only")


if TYPE_CHECKING:
    # What code reads from any feed: the option of its own format, or None on the others.
    GraxOnly: TypeAlias = tuple[str, ...] | None
    FlowOnly: TypeAlias = tuple[Any, ...] | None
else:
    # Never part of another format's keys or of its dump.
    GraxOnly = Annotated[None, only_for("grax_v2"), Field(exclude=True)]
    FlowOnly = Annotated[None, only_for("flow_journal"), Field(exclude=True)]


class Model(BaseModel):
    """A frozen configuration piece that refuses unknown keys. It may be built with its leading
    fields given in order (`_positional`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)
    _positional: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *args: Any, **data: Any):
        if len(args) > len(self._positional):
            raise TypeError(f"{type(self).__name__} takes at most {len(self._positional)} values in order")
        # Fewer values than positional fields is fine: the rest come by name or default.
        super().__init__(**dict(zip(self._positional, args, strict=False)), **data)


class S3Config(Model):
    """Where S3 lives (the `s3` key, and what `storage.Storage` reads); credentials come from the
    environment, never from this file."""

    endpoint_url: EndpointUrl | None = None
    region: Text = DEFAULT_REGION


class FeedConfig(Model):
    """What every feed has, whatever its format; each format's model (beside its feed module)
    extends it. `FeedConfig(name, format, landing, ...)` builds the model of that format."""

    _positional = ("name", "format", "landing")

    name: FeedName
    format: str
    landing: RootUri
    #: tables to process; discovered from the landing layout when omitted
    tables: Names[TableName] | None = None
    #: first hourly partition; discovered when omitted
    start: HourKey | None = None
    #: how long an hour folder may still gain files
    late_hours: LateHours = 4
    #: how often the daemon looks for new files
    sensor_interval_seconds: SensorInterval = 30
    #: false: the landing sensor starts stopped (backfills only)
    watch: Flag = True
    #: true: a run may empty the partitions of a table whose landing went blank (none of the
    #: files read from it listed any more: `processed.refusal_for_a_blank_landing`)
    allow_empty_landing: Flag = False
    # Options of other formats, None here so that code may ask any feed for them.
    orgs: GraxOnly = None
    objects: GraxOnly = None
    collections: FlowOnly = None

    def clash_with_sibling(self, sibling: FeedConfig) -> tuple[str, tuple[str | int, ...]] | None:
        """Why this feed and `sibling`, of its format over its landing, cannot both be read
        (and the key of this feed it is about), or None: each format says, where it can clash."""
        return None

    def __new__(cls, *args: Any, **data: Any):
        if cls is FeedConfig:
            from lake_assets.feeds import get_format

            model = get_format(data.get("format", args[1] if len(args) > 1 else None)).config_model
            return super().__new__(model)
        return super().__new__(cls)


def explain(error: ValidationError, model: type[BaseModel]) -> list[str]:
    """One line per mistake: the key path, what was expected and the value given (unless it may
    be a credential)."""
    details = error.errors(include_url=False)
    # A list with a bad item is also reported too short (its good items are counted): say only
    # what is wrong with the item.
    inner = [detail["loc"] for detail in details]
    return [
        _line(detail, model)
        for detail in details
        if not (
            detail["type"] == "too_short"
            and any(
                len(loc) > len(detail["loc"]) and loc[: len(detail["loc"])] == detail["loc"] for loc in inner
            )
        )
    ]


def _line(detail: ErrorDetails, model: type[BaseModel]) -> str:
    kind, loc, ctx = detail["type"], detail["loc"], detail.get("ctx") or {}
    # a value under a key that looks like a credential's is never repeated, whatever is wrong with it
    got = (
        ""
        if any(isinstance(part, str) and looks_secret(part) for part in loc)
        else f", got {show(detail.get('input'))}"
    )
    if kind == "refused":
        return f"{key_path(loc + tuple(ctx['at']))}: {ctx['reason']}"
    if kind == "expected":
        return f"{key_path(loc)}: expected {ctx['expected']}{got}"
    if kind == "missing":
        return f"{key_path(loc)}: required"
    if kind == "extra_forbidden":
        key = str(loc[-1])
        if looks_secret(key):
            return f"{key_path(loc)}: {CREDENTIALS_COME_FROM_THE_ENVIRONMENT}"
        return (
            f"{key_path(loc)}: unknown key; expected one of {', '.join(keys_of(_model_at(model, loc[:-1])))}"
        )
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        tags = ", ".join(_feed_formats())
        if kind == "union_tag_not_found":
            return f"{key_path((*loc, 'format'))}: required, one of {tags}"
        return (
            f"{key_path((*loc, 'format'))}: expected one of {tags}, got {show(detail['input'].get('format'))}"
        )
    what = _EXPECTED.get(kind)
    if what is None:
        return f"{key_path(loc)}: {detail['msg']}{got}"
    return f"{key_path(loc)}: expected {what}{got}"


_EXPECTED = {
    "model_type": "a mapping (key: value)",
    "model_attributes_type": "a mapping (key: value)",
    "dict_type": "a mapping (key: value)",
    "tuple_type": "a list",
    "list_type": "a list",
    "too_short": "a non-empty list",
    "string_type": "text",
}


def key_path(loc: tuple) -> str:
    """`feeds[1].late_hours`, `spark.conf['fs.s3a.endpoint']`: a location as the YAML spells it
    (the format tag pydantic adds to a feed's location is left out)."""
    out = ""
    previous = None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]" or (isinstance(previous, int) and part in _feed_formats()):
            pass
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
        previous = part
    return out or "top level"


#: what an error shows in place of a value that may hold a credential
NOT_REPEATED = "(a value not repeated here: it may hold a credential)"
#: a setting's name in a text (`;token=…`, `password: …`)
_NAME_IN_TEXT = re.compile(r"([A-Za-z][A-Za-z0-9_.-]*)\s*[=:]")
#: a user and password before a host, with no scheme (`KEY:SECRET@bucket/lake`)
_USER_AND_PASSWORD = re.compile(r"(?:^|[\s,;])[^\s/@:,;]+:(?!//)(?:(?!://)[^\s@])+@")


def may_hold_credential(text: str) -> bool:
    """Whether a text holds a URL with credentials (`without_credentials_in_url`) or sets
    something whose name looks like a credential's (`sc://h/;token=…`)."""
    try:
        without_credentials_in_url(text)
    except PydanticCustomError:
        return True
    return bool(_USER_AND_PASSWORD.search(text)) or any(
        looks_secret(name) for name in _NAME_IN_TEXT.findall(text)
    )


def _redacted(value: Any) -> Any:
    """`value` with each text that may hold a credential, and each value under a key that looks
    like a credential's, replaced by `NOT_REPEATED`."""
    if isinstance(value, str):
        return NOT_REPEATED if may_hold_credential(value) else value
    if isinstance(value, dict):
        return {
            key: NOT_REPEATED if isinstance(key, str) and looks_secret(key) else _redacted(item)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_redacted(item) for item in value]
    return value


def show(value: Any) -> str:
    """A value as YAML writes it, cut short, and never a credential it may hold (`_redacted`)."""
    value = _redacted(value)
    if value == NOT_REPEATED:
        return value
    if isinstance(value, bool) or value is None:
        text = {True: "true", False: "false", None: "null"}[value]
    elif isinstance(value, str):
        text = repr(value)
    else:
        text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def keys_of(model: type[BaseModel] | None) -> list[str]:
    if model is None:
        return []
    return [name for name, field in model.model_fields.items() if not field.exclude]


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The configuration piece at a location (to name the keys it takes)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None:
            return None
        if isinstance(part, int):
            continue
        if part in _feed_formats():
            current = _feed_formats()[part]
            continue
        field = current.model_fields.get(part)
        current = _model_in(field.annotation) if field else None
    return current


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for m in map(_model_in, get_args(annotation)) if m is not None), None)


def _feed_formats() -> dict[str, type[FeedConfig]]:
    from lake_assets.feeds import feed_config_models

    return {format_of(m): m for m in feed_config_models()}


def format_of(model: type[FeedConfig]) -> str:
    """The `format` a feed model stands for (its discriminator's one value)."""
    return get_args(model.model_fields["format"].annotation)[0]
