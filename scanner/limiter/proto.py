"""A hand-written protobuf codec for exactly the messages of Envoy's rate limit service.

Field numbers from envoyproxy/data-plane-api (the same in Envoy 1.40's API):

``envoy/service/ratelimit/v3/rls.proto``::

    RateLimitRequest   { string domain = 1; repeated RateLimitDescriptor descriptors = 2;
                         uint32 hits_addend = 3; }                 // 0: each descriptor counts 1
    RateLimitResponse  { Code overall_code = 1; repeated DescriptorStatus statuses = 2;
                         repeated config.core.v3.HeaderValue response_headers_to_add = 3;
                         repeated config.core.v3.HeaderValue request_headers_to_add = 4;
                         bytes raw_body = 5; Struct dynamic_metadata = 6; Quota quota = 7; }
      Code             { UNKNOWN = 0; OK = 1; OVER_LIMIT = 2; }
      DescriptorStatus { Code code = 1; RateLimit current_limit = 2; uint32 limit_remaining = 3;
                         google.protobuf.Duration duration_until_reset = 4; Quota quota = 5; }
      RateLimit        { uint32 requests_per_unit = 1; Unit unit = 2; string name = 3; }
      Unit             { UNKNOWN = 0; SECOND = 1; MINUTE = 2; HOUR = 3; DAY = 4; MONTH = 5; YEAR = 6; }

``envoy/extensions/common/ratelimit/v3/ratelimit.proto``::

    RateLimitDescriptor { repeated Entry entries = 1; RateLimitOverride limit = 2;
                          google.protobuf.UInt64Value hits_addend = 3; }   // overrides the request's
      Entry             { string key = 1; string value = 2; }

``envoy/config/core/v3/base.proto``: ``HeaderValue { string key = 1; string value = 2; }``;
``google/protobuf/duration.proto``: ``Duration { int64 seconds = 1; int32 nanos = 2; }``;
``google/protobuf/wrappers.proto``: ``UInt64Value { uint64 value = 1; }``.

Unknown fields are skipped (wire types 0, 1, 2, 5), as protobuf readers do; groups, truncated
fields and over-long varints are :class:`ProtoError`. ``RateLimitOverride`` is ignored: the
limits are the zones file's, never the caller's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

VARINT, I64, LEN, I32 = 0, 1, 2, 5
CODE_UNKNOWN, CODE_OK, CODE_OVER_LIMIT = 0, 1, 2
UNIT_SECOND, UNIT_MINUTE = 1, 2


class ProtoError(ValueError):
    """Bytes that are not the message they should be."""


@dataclass(frozen=True)
class Descriptor:
    entries: tuple[tuple[str, str], ...]
    hits_addend: int | None = None        # the descriptor's own, when set

    def get(self, key: str) -> str | None:
        return next((v for k, v in self.entries if k == key), None)


@dataclass(frozen=True)
class Request:
    domain: str
    descriptors: tuple[Descriptor, ...]
    hits_addend: int = 0

    def hits(self, d: Descriptor) -> int:
        """What ``d`` adds, as Envoy's protocol says: its own hits_addend, else the request's,
        else 1."""
        given = self.given_hits(d)
        return 1 if given is None else given

    def given_hits(self, d: Descriptor) -> int | None:
        """``d``'s own hits_addend, else the request's when set (not 0); None when neither is."""
        if d.hits_addend is not None:
            return d.hits_addend
        return self.hits_addend or None


@dataclass(frozen=True)
class CurrentLimit:
    requests_per_unit: int
    unit: int
    name: str = ""


@dataclass(frozen=True)
class DescriptorStatus:
    code: int
    current_limit: CurrentLimit | None = None
    limit_remaining: int = 0
    duration_until_reset_s: int = 0


@dataclass(frozen=True)
class Response:
    overall_code: int
    statuses: tuple[DescriptorStatus, ...] = ()
    response_headers: tuple[tuple[str, str], ...] = ()
    request_headers: tuple[tuple[str, str], ...] = ()
    # field 6, a Struct of strings: Envoy's filter writes it to its dynamic metadata
    # (namespace envoy.filters.http.ratelimit) for the filters after it
    dynamic_metadata: tuple[tuple[str, str], ...] = ()


# --- wire primitives ------------------------------------------------------------------------

def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _len(field: int, payload: bytes) -> bytes:
    return _key(field, LEN) + _varint(len(payload)) + payload


def _uint(field: int, value: int) -> bytes:
    return _key(field, VARINT) + _varint(value) if value else b""


def _str(field: int, value: str) -> bytes:
    return _len(field, value.encode()) if value else b""


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ProtoError("truncated varint")
        if shift > 63:
            raise ProtoError("varint longer than 10 bytes")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value & ((1 << 64) - 1), pos


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value: an int, or the bytes of a LEN field) of a message."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise ProtoError("field number 0")
        if wire == VARINT:
            value, pos = _read_varint(data, pos)
            yield field, wire, value
        elif wire == LEN:
            size, pos = _read_varint(data, pos)
            if pos + size > len(data):
                raise ProtoError("truncated length-delimited field")
            yield field, wire, data[pos:pos + size]
            pos += size
        elif wire in (I64, I32):
            width = 8 if wire == I64 else 4
            if pos + width > len(data):
                raise ProtoError("truncated fixed-width field")
            yield field, wire, int.from_bytes(data[pos:pos + width], "little")
            pos += width
        else:
            raise ProtoError(f"wire type {wire} is not supported")


def _text(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise ProtoError("a string field with a number")
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise ProtoError("a string field that is not UTF-8") from None


def _bytes(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise ProtoError("a message field with a number")
    return value


def _number(value: int | bytes) -> int:
    if isinstance(value, bytes):
        raise ProtoError("a number field with bytes")
    return value


# --- RateLimitRequest -----------------------------------------------------------------------

def decode_request(data: bytes) -> Request:
    domain, descriptors, hits = "", [], 0
    for field, _wire, value in fields(data):
        if field == 1:
            domain = _text(value)
        elif field == 2:
            descriptors.append(_descriptor(_bytes(value)))
        elif field == 3:
            hits = _number(value) & 0xFFFFFFFF
    return Request(domain, tuple(descriptors), hits)


def _descriptor(data: bytes) -> Descriptor:
    entries, hits = [], None
    for field, _wire, value in fields(data):
        if field == 1:
            key = val = ""
            for f, _w, v in fields(_bytes(value)):
                if f == 1:
                    key = _text(v)
                elif f == 2:
                    val = _text(v)
            entries.append((key, val))
        elif field == 3:
            hits = 0
            for f, _w, v in fields(_bytes(value)):
                if f == 1:
                    hits = _number(v)
    return Descriptor(tuple(entries), hits)


def encode_request(r: Request) -> bytes:
    out = bytearray(_str(1, r.domain))
    for d in r.descriptors:
        body = b"".join(_len(1, _str(1, k) + _str(2, v)) for k, v in d.entries)
        if d.hits_addend is not None:
            body += _len(3, _uint(1, d.hits_addend))
        out += _len(2, body)
    out += _uint(3, r.hits_addend)
    return bytes(out)


# --- RateLimitResponse ----------------------------------------------------------------------

def encode_response(r: Response) -> bytes:
    out = bytearray(_uint(1, r.overall_code))
    for s in r.statuses:
        body = _uint(1, s.code)
        if s.current_limit is not None:
            c = s.current_limit
            body += _len(2, _uint(1, c.requests_per_unit) + _uint(2, c.unit) + _str(3, c.name))
        body += _uint(3, s.limit_remaining)
        if s.duration_until_reset_s:
            body += _len(4, _uint(1, s.duration_until_reset_s))
        out += _len(2, body)
    for field, headers in ((3, r.response_headers), (4, r.request_headers)):
        for k, v in headers:
            out += _len(field, _str(1, k) + _str(2, v))
    if r.dynamic_metadata:   # Struct {map<string, Value> fields = 1}; Value.string_value = 3
        out += _len(6, b"".join(_len(1, _str(1, k) + _len(2, _str(3, v))) for k, v in r.dynamic_metadata))
    return bytes(out)


def decode_response(data: bytes) -> Response:
    code, statuses, headers = 0, [], {3: [], 4: []}   # type: ignore[var-annotated]
    metadata: list[tuple[str, str]] = []
    for field, _wire, value in fields(data):
        if field == 1:
            code = _number(value)
        elif field == 2:
            statuses.append(_status(_bytes(value)))
        elif field in headers:
            pair = {f: _text(v) for f, _w, v in fields(_bytes(value)) if f in (1, 2)}
            headers[field].append((pair.get(1, ""), pair.get(2, "")))
        elif field == 6:   # a Struct: its string values (other kinds are not written here)
            for _f, _w, entry in fields(_bytes(value)):
                item = {f: v for f, _w2, v in fields(_bytes(entry)) if f in (1, 2)}
                kinds = fields(_bytes(item[2])) if 2 in item else []
                text = next((_text(v) for f, _w2, v in kinds if f == 3), "")
                metadata.append((_text(item[1]) if 1 in item else "", text))
    return Response(code, tuple(statuses), tuple(headers[3]), tuple(headers[4]), tuple(metadata))


def _status(data: bytes) -> DescriptorStatus:
    code = remaining = seconds = 0
    limit = None
    for field, _wire, value in fields(data):
        if field == 1:
            code = _number(value)
        elif field == 2:
            parts = dict((f, v) for f, _w, v in fields(_bytes(value)))
            limit = CurrentLimit(_number(parts.get(1, 0)), _number(parts.get(2, 0)),
                                 _text(parts[3]) if 3 in parts else "")
        elif field == 3:
            remaining = _number(value)
        elif field == 4:
            seconds = next((_number(v) for f, _w, v in fields(_bytes(value)) if f == 1), 0)
    return DescriptorStatus(code, limit, remaining, seconds)
