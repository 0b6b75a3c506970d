"""lake_assets.catalog.metadata: validation order and rules, JSON, hashes, buckets, records."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lake_assets.catalog.metadata import (
    BUCKET_MS,
    FIRST_INDEXED_MS,
    LAST_INDEXED_MS,
    MAX_BUCKETS,
    MetadataError,
    buckets,
    build_records,
    content_hash,
    document_time,
    from_json,
    hash_stream,
    query_buckets,
    time_bucket,
    to_json,
    validate,
)

DAY = BUCKET_MS
MARCH_20_2015_MS = 1426809600000  # 2015-03-20T00:00:00Z
B0 = 16636  # the day bucket of 2015-07-20
T0 = B0 * DAY  # its first millisecond; realistic ms values stay ms through validate()


def good(**changes) -> dict:
    doc = {
        "version": 0,
        "start": 1426809920345,
        "end": 1426895999114,
        "path": "/var/log/syslog.1",
        "work_id": None,
        "where": "webserver02",
        "what": "syslog",
        "id": "6309e115c2914d0f8622973422626954",
        "hash": "a3e75ee4f45f676422e038f2c116d000",
    }
    doc.update(changes)
    return doc


def without(*keys) -> dict:
    doc = good()
    for key in keys:
        del doc[key]
    return doc


def refused(doc, field: str) -> MetadataError:
    with pytest.raises(MetadataError) as info:
        validate(doc)
    assert info.value.field == field, info.value
    assert str(info.value).startswith(f"metadata field '{field}': ")
    assert info.value.reason
    return info.value


# --- the error --------------------------------------------------------------------------------


def test_metadata_error_carries_field_and_reason():
    err = MetadataError("where", "is bad")
    assert isinstance(err, ValueError)
    assert (err.field, err.reason) == ("where", "is bad")
    assert str(err) == "metadata field 'where': is bad"


def test_a_good_document_passes_unchanged():
    assert validate(good()) == good()


def test_validate_returns_a_new_dict_and_keeps_unknown_keys():
    source = good(extra={"nested": [1, 2]}, other="x")
    before = copy.deepcopy(source)
    result = validate(source)
    assert result is not source
    assert source == before
    assert result["extra"] == {"nested": [1, 2]}
    assert result["other"] == "x"


# --- 1. id ------------------------------------------------------------------------------------


def test_missing_id_is_assigned_a_uuid4_hex_without_touching_the_input():
    source = without("id")
    result = validate(source)
    assert re.fullmatch(r"[0-9a-f]{32}", result["id"])
    assert "id" not in source
    assert validate(without("id"))["id"] != result["id"]


def test_null_id_is_refused():
    refused(good(id=None), "id")


# --- 2. version -------------------------------------------------------------------------------


def test_version_zero_accepted():
    assert validate(good(version=0))["version"] == 0


@pytest.mark.parametrize("version", ["0", 1, -1, 0.0, False, True, None, [0]])
def test_version_other_than_int_zero_refused(version):
    refused(good(version=version), "version")


def test_missing_version_is_version_zero_as_upstream():
    # datalake-common's Metadata sets a missing version to 0 before validating it
    source = without("version")
    result = validate(source)
    assert result["version"] == 0 and "version" not in source
    assert to_json(source) == to_json(good())


# --- 3. required fields -----------------------------------------------------------------------


@pytest.mark.parametrize("field", ["start", "where", "what", "hash", "path"])
def test_required_field_missing_refused(field):
    refused(without(field), field)


@pytest.mark.parametrize("field", ["start", "where", "what", "id", "hash", "path"])
def test_required_field_null_refused(field):
    refused(good(**{field: None}), field)


def test_required_fields_checked_in_order():
    # start comes before where, which comes before hash
    refused(without("start", "where", "hash"), "start")
    refused(without("where", "hash"), "where")


# --- 4. where / what --------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["where", "what"])
@pytest.mark.parametrize("value", ["Webserver", "web server", "syslog.log", "a#b", "", "é", "x\n", 7])
def test_where_and_what_refuse_bad_names(field, value):
    refused(good(**{field: value}), field)


@pytest.mark.parametrize("value", ["a", "whirlyweb02-prod", "rawfood_ingester", "0-_9"])
def test_where_and_what_accept_good_names(value):
    result = validate(good(where=value, what=value))
    assert (result["where"], result["what"]) == (value, value)


# --- 5. work_id -------------------------------------------------------------------------------


def test_work_id_key_missing_refused():
    refused(without("work_id"), "work_id")


def test_work_id_null_accepted():
    assert validate(good(work_id=None))["work_id"] is None


def test_work_id_string_null_refused():
    err = refused(good(work_id="null"), "work_id")
    assert "null" in err.reason


@pytest.mark.parametrize("value", ["Job-1", "job 1", "job.1", "job#1", "", 12])
def test_work_id_bad_names_refused(value):
    refused(good(work_id=value), "work_id")


def test_work_id_good_name_accepted():
    assert validate(good(work_id="balyhoo-job_42"))["work_id"] == "balyhoo-job_42"


# --- 6. path ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/var/log/syslog.1", "/", "Z:\\foo\\bar.txt", "c:/x", "C:\\"])
def test_absolute_paths_accepted(path):
    assert validate(good(path=path))["path"] == path


@pytest.mark.parametrize("path", ["var/log/syslog", "./x", "../x", "x", "", "Z:foo", "~/x", 5])
def test_relative_or_bad_paths_refused(path):
    refused(good(path=path), "path")


# --- 7. dates ---------------------------------------------------------------------------------


def test_iso_date_string_becomes_utc_midnight_ms():
    assert validate(good(start="2015-03-20", end=None))["start"] == MARCH_20_2015_MS


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2015-03-20T00:00:00", MARCH_20_2015_MS),
        ("2015-03-20T00:00:00Z", MARCH_20_2015_MS),
        ("2015-03-20T01:00:00+01:00", MARCH_20_2015_MS),
        ("2015-03-20T00:00:00.123Z", MARCH_20_2015_MS + 123),
    ],
)
def test_iso_datetime_strings(text, expected):
    assert validate(good(start=text, end=None))["start"] == expected


def test_numeric_string_with_fraction_keeps_ms():
    assert validate(good(start="1426809600.123", end=None))["start"] == 1426809600123


def test_float_seconds_keep_ms():
    assert validate(good(start=1426809600.123, end=None))["start"] == 1426809600123


def test_seconds_and_ms_agree():
    seconds = validate(good(start=1426809600, end=None))["start"]
    millis = validate(good(start=1426809600000, end=None))["start"]
    assert seconds == millis == MARCH_20_2015_MS
    assert isinstance(seconds, int) and isinstance(millis, int)


def test_a_number_is_read_as_ms_by_its_magnitude_before_the_epoch_too():
    # as upstream, beyond 1e11 a number is ms; below -1e11 too (as seconds it would be before the year 1)
    first_year = -62_135_596_800_000
    assert validate(good(start=first_year, end=None))["start"] == first_year
    assert validate(good(start=str(-(10**12)), end=None))["start"] == -(10**12)
    assert validate(good(start=-86_400, end=None))["start"] == -86_400_000  # small: seconds, as upstream


@settings(max_examples=300, deadline=None)
@given(
    ms=st.one_of(
        st.integers(FIRST_INDEXED_MS, LAST_INDEXED_MS),
        st.integers(-(2**63), 2**63 - 1),
        st.integers(-200_000_000_000, 200_000_000_000),
    )
)
def test_a_time_given_as_document_time_is_read_back_exactly(ms):
    # a file's span read from its statistics may be any ms, 1970-01-01T00:00:05 (5000) included
    assert validate(good(start=document_time(ms), end=document_time(ms)))["start"] == ms


def test_numeric_string_ms_and_seconds():
    assert validate(good(start="1426809600000", end=None))["start"] == MARCH_20_2015_MS
    assert validate(good(start="1426809600", end=None))["start"] == MARCH_20_2015_MS


def test_end_is_normalised_too():
    result = validate(good(start="2015-03-20", end="1426809601"))
    assert (result["start"], result["end"]) == (MARCH_20_2015_MS, MARCH_20_2015_MS + 1000)


def test_now_is_current_time():
    before = int(time.time() * 1000) - 1
    value = validate(good(start="now", end=None))["start"]
    after = int(time.time() * 1000) + 1
    assert before <= value <= after
    assert isinstance(value, int)


@pytest.mark.parametrize(
    "value", ["yesterday", "2015-13-45", "", "nan", "inf", float("nan"), float("inf"), True, [1], {}]
)
def test_unreadable_start_refused(value):
    refused(good(start=value, end=None), "start")


def test_unreadable_end_refused():
    refused(good(end="soon"), "end")


# --- 8. end -----------------------------------------------------------------------------------


def test_end_missing_is_kept_as_null():
    # as upstream: the normalised document always has `end`, null when the file gave none
    source = without("end")
    result = validate(source)
    assert "end" in result and result["end"] is None and "end" not in source
    assert json.loads(to_json(source))["end"] is None


def test_records_of_a_document_without_end_carry_end_null():
    for record in build_records(without("end"), url="s3://b/k", size=1, create_time=1):
        assert "end" in record["metadata"] and record["metadata"]["end"] is None


def test_end_null_accepted():
    assert validate(good(end=None))["end"] is None


def test_end_equal_to_start_accepted():
    result = validate(good(start=MARCH_20_2015_MS, end=MARCH_20_2015_MS))
    assert result["end"] == result["start"]


def test_end_before_start_refused():
    refused(good(start=MARCH_20_2015_MS, end=MARCH_20_2015_MS - 1), "end")


def test_end_before_start_compared_after_normalising():
    # 1426809599 seconds is one second before 2015-03-20 in ms
    refused(good(start="2015-03-20", end=1426809599), "end")


# --- order of checks --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "doc, field",
    [
        (good(version="0", where="Bad Where"), "version"),
        (good(version=1, start=None), "version"),
        (good(start=None, where="Bad"), "start"),
        (good(where="Bad", work_id="null"), "where"),
        (good(what="x.log", path="rel"), "what"),
        (without("work_id") | {"path": "rel"}, "work_id"),
        (good(work_id="Bad", path="rel"), "work_id"),
        (good(path="rel", start="garbage"), "path"),
        (good(start="garbage", end=0), "start"),
        (good(end="garbage", start=5, where="ok"), "end"),
    ],
)
def test_checks_run_in_the_documented_order(doc, field):
    refused(doc, field)


def test_missing_id_never_fails_alongside_other_problems():
    # a missing id never causes a failure, even alongside other problems
    refused(without("id") | {"hash": None}, "hash")


# --- JSON -------------------------------------------------------------------------------------


def test_json_round_trip():
    doc = good(extra="kept", start="2015-03-20", end=1426809601.5)
    text = to_json(doc)
    assert json.loads(text)["start"] == MARCH_20_2015_MS
    back = from_json(text)
    assert back == validate(doc)
    assert back["work_id"] is None
    assert back["extra"] == "kept"
    assert to_json(back) == text


def test_from_json_validates():
    with pytest.raises(MetadataError) as info:
        from_json(json.dumps(good(version="0")))
    assert info.value.field == "version"


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"version": NaN}'])
def test_from_json_refuses_non_documents(text):
    with pytest.raises(MetadataError):
        from_json(text)


# --- hashes -----------------------------------------------------------------------------------


def test_content_hash_of_empty_bytes():
    assert content_hash(b"") == hashlib.blake2b(b"", digest_size=16).hexdigest()
    assert len(content_hash(b"")) == 32


def test_content_hash_of_known_bytes():
    data = b"the quick brown fox jumps over the lazy dog\n" * 100
    assert content_hash(data) == hashlib.blake2b(data, digest_size=16).hexdigest()
    assert content_hash(data) != content_hash(data + b"!")


def test_hash_stream_matches_content_hash():
    data = bytes(range(256)) * 50
    chunks = [data[i : i + 1000] for i in range(0, len(data), 1000)]
    assert hash_stream(iter(chunks)) == content_hash(data)
    assert hash_stream([]) == content_hash(b"")


# --- time buckets -----------------------------------------------------------------------------


def test_time_bucket_is_floor_of_days():
    assert time_bucket(0) == 0
    assert time_bucket(DAY - 1) == 0
    assert time_bucket(DAY) == 1
    assert time_bucket(1437375600000) == 16636


def test_file_spanning_point_eight_to_two_point_two_days():
    doc = good(start=int(0.8 * DAY), end=int(2.2 * DAY))
    assert buckets(doc) == ["0", "1", "2"]


def test_file_without_end_has_one_bucket():
    assert buckets(without("end")) == [str(time_bucket(1426809920345))]
    assert buckets(good(end=None)) == [str(time_bucket(1426809920345))]


def test_buckets_of_a_validated_document():
    doc = validate(good(start=T0 + int(0.8 * DAY), end=T0 + int(2.2 * DAY)))
    assert buckets(doc) == [str(B0), str(B0 + 1), str(B0 + 2)]


def test_exactly_max_buckets_accepted():
    start = 100 * DAY
    doc = good(start=start, end=start + (MAX_BUCKETS - 1) * DAY + DAY - 1)
    assert buckets(doc) == [str(n) for n in range(100, 100 + MAX_BUCKETS)]
    assert MAX_BUCKETS == 30


def test_buckets_read_validated_ms_as_they_stand():
    # buckets() does not re-validate: 69_120_000 is ms here, although validate() would read it as seconds
    assert buckets({"start": 69_120_000}) == ["0"]
    assert buckets({"start": 69_120_000, "end": None}) == ["0"]


@pytest.mark.parametrize(
    "doc, field",
    [
        ({"start": "2015-03-20"}, "start"),
        ({"start": 1, "end": "x"}, "end"),
        ({}, "start"),
        ({"start": True}, "start"),
    ],
)
def test_buckets_refuse_unvalidated_dates(doc, field):
    with pytest.raises(MetadataError) as info:
        buckets(doc)
    assert info.value.field == field


def test_buckets_refuse_end_before_start():
    with pytest.raises(MetadataError) as info:
        buckets({"start": T0, "end": T0 - 1})
    assert info.value.field == "end"


def test_a_span_of_thirty_one_days_is_indexed_in_thirty_day_buckets():
    # upstream refuses such a file; here it goes in the buckets of the next width (30 days),
    # each named by its first day and its width
    start = 100 * DAY
    assert buckets(good(start=start, end=start + MAX_BUCKETS * DAY)) == ["90+30", "120+30"]
    assert buckets(good(start=start, end=start + 800 * DAY)) == [f"{n}+30" for n in range(90, 901, 30)]  # 28
    assert buckets(good(start=start, end=start + 1000 * DAY)) == [
        "0+900",
        "900+900",
    ]  # 34 of 30 days: too many


@pytest.mark.parametrize(
    "start, end",
    [
        (
            datetime(1, 1, 1, tzinfo=UTC),
            datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
        ),
        (datetime(2024, 3, 1, tzinfo=UTC), datetime(9999, 12, 31, tzinfo=UTC)),
        (datetime(1, 1, 1, tzinfo=UTC), datetime(2024, 3, 1, tzinfo=UTC)),
        (
            datetime(1969, 7, 20, tzinfo=UTC),
            datetime(1970, 1, 2, tzinfo=UTC),
        ),  # negative epochs
    ],
)
def test_the_first_and_last_years_and_negative_epochs_are_indexed(start, end):
    doc = validate(good(start=start.isoformat(), end=end.isoformat()))
    labels = buckets(doc)
    assert 1 <= len(labels) <= MAX_BUCKETS
    for moment in (start, end, start + (end - start) / 2):
        ms = doc["start"] + (moment - start) // timedelta(milliseconds=1)
        assert set(labels) & set(query_buckets(ms, ms)), moment


def test_times_beyond_the_calendar_are_indexed_at_its_edges():
    # 10**15 ms is in the year 33658; -10**15 before year 1: the record keeps them, the index clamps
    assert buckets({"start": 10**15}) == [str(time_bucket(LAST_INDEXED_MS))]
    assert buckets({"start": -(10**15)}) == [str(time_bucket(FIRST_INDEXED_MS))]
    assert len(buckets({"start": -(2**63), "end": 2**63 - 1})) <= MAX_BUCKETS
    assert set(buckets({"start": 10**15})) <= set(query_buckets(10**15, 10**15 + 1))


@settings(max_examples=400, deadline=None)
@given(
    start=st.integers(FIRST_INDEXED_MS - 10 * DAY, LAST_INDEXED_MS + 10 * DAY),
    length=st.one_of(st.integers(0, 40 * DAY), st.integers(0, 5000 * DAY), st.integers(0, 4_000_000 * DAY)),
    probe=st.floats(0, 1),
)
def test_a_file_is_in_at_most_thirty_buckets_and_found_from_every_instant_it_spans(start, length, probe):
    end = start + length
    labels = buckets({"start": start, "end": end})
    assert 1 <= len(labels) <= MAX_BUCKETS and len(set(labels)) == len(labels)
    inside = start + int(length * probe)
    assert set(labels) & set(query_buckets(inside, inside))
    days = range(time_bucket(start), time_bucket(end) + 1)
    if len(days) <= MAX_BUCKETS and start >= FIRST_INDEXED_MS and end <= LAST_INDEXED_MS:
        assert labels == [str(n) for n in days]  # a span of up to 30 days keeps the upstream day buckets


def test_a_query_reads_each_day_and_one_bucket_per_wider_width():
    assert query_buckets(100 * DAY, 101 * DAY) == ["100", "101", "90+30", "0+900", "0+27000", "0+810000"]


# --- records ----------------------------------------------------------------------------------


def test_build_records_one_per_bucket_with_exact_keys():
    doc = good(
        where="nebraska",
        what="nginx",
        id="91dd2525a5924c6c972e3d67fee8cda9",
        work_id="job-7",
        start=T0 + int(0.8 * DAY),
        end=T0 + int(2.2 * DAY),
    )
    records = build_records(doc, url="s3://datalake/x.txt", size=7892341, create_time=1426896791333)
    assert [r["time_index_key"] for r in records] == ["16636:nginx", "16637:nginx", "16638:nginx"]
    for record in records:
        assert set(record) == {
            "version",
            "url",
            "time_index_key",
            "work_id_index_key",
            "range_key",
            "create_time",
            "size",
            "metadata",
        }
        assert record["version"] == 0
        assert record["url"] == "s3://datalake/x.txt"
        assert record["work_id_index_key"] == "job-7:nginx"
        assert record["range_key"] == "nebraska:91dd2525a5924c6c972e3d67fee8cda9"
        assert record["create_time"] == 1426896791333
        assert record["size"] == 7892341
        assert record["metadata"] == validate(doc)


def test_build_records_null_work_id_prefix_shared_across_a_file():
    calls = []

    def token():
        calls.append(1)
        return "c177bfc032c548ba9e056c8e8672dba8"

    doc = good(what="nginx", work_id=None, start=T0 + int(0.8 * DAY), end=T0 + int(2.2 * DAY))
    records = build_records(doc, url="s3://b/k", size=1, create_time=5, null_work_id=token)
    assert len(records) == 3
    assert {r["work_id_index_key"] for r in records} == {"nullc177bfc032c548ba9e056c8e8672dba8:nginx"}
    assert len(calls) == 1


def test_build_records_default_null_work_id_is_random_per_file():
    doc = good(what="nginx", work_id=None, start=T0 + int(0.8 * DAY), end=T0 + int(2.2 * DAY))
    first = build_records(doc, url="s3://b/k", size=1)
    second = build_records(doc, url="s3://b/k", size=1)
    keys = {r["work_id_index_key"] for r in first}
    assert len(keys) == 1
    (key,) = keys
    assert re.fullmatch(r"null[0-9a-f]{32}:nginx", key)
    assert second[0]["work_id_index_key"] != key


def test_build_records_default_create_time_is_now():
    before = int(time.time() * 1000) - 1
    (record,) = build_records(good(end=None), url="s3://b/k", size=0)
    after = int(time.time() * 1000) + 1
    assert before <= record["create_time"] <= after


def test_build_records_does_not_mutate_input_and_normalises_metadata():
    source = without("id") | {"start": "2015-03-20", "end": None}
    before = copy.deepcopy(source)
    (record,) = build_records(source, url="s3://b/k", size=3, create_time=1)
    assert source == before
    assert record["metadata"]["start"] == MARCH_20_2015_MS
    assert record["range_key"] == f"webserver02:{record['metadata']['id']}"
    assert record["time_index_key"] == f"{MARCH_20_2015_MS // DAY}:syslog"


def test_build_records_validates_first():
    with pytest.raises(MetadataError) as info:
        build_records(good(version="0"), url="s3://b/k", size=1)
    assert info.value.field == "version"


def test_build_records_of_a_long_span_keep_its_true_start_and_end():
    doc = good(start="0001-01-01", end="9999-12-31T23:59:59.999Z")
    records = build_records(doc, url="s3://b/k", size=1, create_time=1)
    assert 1 <= len(records) <= MAX_BUCKETS
    assert {(r["metadata"]["start"], r["metadata"]["end"]) for r in records} == {
        (FIRST_INDEXED_MS, LAST_INDEXED_MS)
    }
    assert [r["time_index_key"] for r in records] == [f"{label}:syslog" for label in buckets(validate(doc))]


def test_build_records_metadata_copies_are_independent():
    records = build_records(good(start=T0, end=T0 + DAY), url="s3://b/k", size=1, create_time=1)
    records[0]["metadata"]["where"] = "changed"
    assert records[1]["metadata"]["where"] == "webserver02"
