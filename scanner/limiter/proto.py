"""Envoy's rate limit service messages: the generated protobuf classes of envoyproxy/data-plane-api
(PyPI ``xds-protos``: ``envoy/service/ratelimit/v3/rls.proto`` and the descriptor of
``envoy/extensions/common/ratelimit/v3/ratelimit.proto``), and the few readings of them the
service needs.

``RateLimitRequest { domain; repeated RateLimitDescriptor descriptors; uint32 hits_addend }``,
a descriptor ``{ repeated Entry entries {key, value}; RateLimitOverride limit;
UInt64Value hits_addend }`` (its own count, overriding the request's); ``RateLimitResponse
{ overall_code; repeated DescriptorStatus statuses; response_headers_to_add;
request_headers_to_add; raw_body; Struct dynamic_metadata; quota }``. ``RateLimitOverride`` is
ignored: the limits are the zones file's, never the caller's. Bytes that are not the message
(truncated, a bad wire type, a string that is not UTF-8) are :class:`ProtoError`.
"""

from __future__ import annotations

from envoy.config.core.v3.base_pb2 import HeaderValue
from envoy.extensions.common.ratelimit.v3.ratelimit_pb2 import RateLimitDescriptor
from envoy.service.ratelimit.v3.rls_pb2 import RateLimitRequest, RateLimitResponse
from google.protobuf.message import DecodeError

Request = RateLimitRequest
Response = RateLimitResponse
Descriptor = RateLimitDescriptor
DescriptorStatus = RateLimitResponse.DescriptorStatus
CurrentLimit = RateLimitResponse.RateLimit

CODE_UNKNOWN: int = RateLimitResponse.Code.Value("UNKNOWN")
CODE_OK: int = RateLimitResponse.Code.Value("OK")
CODE_OVER_LIMIT: int = RateLimitResponse.Code.Value("OVER_LIMIT")
UNIT_SECOND: int = RateLimitResponse.RateLimit.Unit.Value("SECOND")
UNIT_MINUTE: int = RateLimitResponse.RateLimit.Unit.Value("MINUTE")

__all__ = ["CODE_OK", "CODE_OVER_LIMIT", "CODE_UNKNOWN", "UNIT_MINUTE", "UNIT_SECOND", "CurrentLimit",
           "Descriptor", "DescriptorStatus", "HeaderValue", "ProtoError", "Request", "Response",
           "decode_request", "descriptor", "entry", "given_hits", "hits", "request"]


class ProtoError(ValueError):
    """Bytes that are not the message they should be."""


def decode_request(data: bytes) -> RateLimitRequest:
    try:
        return RateLimitRequest.FromString(data)
    except DecodeError as exc:
        raise ProtoError(str(exc)) from None


def descriptor(entries: tuple[tuple[str, str], ...], hits_addend: int | None = None) -> RateLimitDescriptor:
    """A descriptor of ``(key, value)`` entries, with its own hits_addend when given."""
    d = RateLimitDescriptor(entries=[RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries])
    if hits_addend is not None:
        d.hits_addend.value = hits_addend
    return d


def request(domain: str, descriptors: tuple[RateLimitDescriptor, ...],
            hits_addend: int = 0) -> RateLimitRequest:
    return RateLimitRequest(domain=domain, descriptors=descriptors, hits_addend=hits_addend)


def entry(d: RateLimitDescriptor, key: str) -> str | None:
    """The value of ``d``'s first entry named ``key``; None without one."""
    return next((e.value for e in d.entries if e.key == key), None)


def given_hits(r: RateLimitRequest, d: RateLimitDescriptor) -> int | None:
    """``d``'s own hits_addend, else the request's when set (not 0); None when neither is."""
    if d.HasField("hits_addend"):
        return int(d.hits_addend.value)
    return int(r.hits_addend) or None


def hits(r: RateLimitRequest, d: RateLimitDescriptor) -> int:
    """What ``d`` adds, as Envoy's protocol says: its own hits_addend, else the request's, else 1."""
    given = given_hits(r, d)
    return 1 if given is None else given
