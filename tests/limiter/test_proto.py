"""The protobuf codec of Envoy's rate limit service messages (scanner/limiter/proto.py)."""

from __future__ import annotations

import pytest

from scanner.limiter import proto


def test_request_round_trip() -> None:
    request = proto.Request("vllm-perimeter", (
        proto.Descriptor((("zone", "inference:key:10/20"), ("principal", "alice"))),
        proto.Descriptor((("zone", "tok"), ("remote_address", "2001:db8::1"), ("op", "settle")), 123456),
        proto.Descriptor((("zone", "tok"), ("principal", "é")), 0),   # an explicit 0 is kept
    ), hits_addend=7)
    back = proto.decode_request(proto.encode_request(request))
    assert back == request
    assert [back.hits(d) for d in back.descriptors] == [7, 123456, 0]
    assert proto.Request("d", (proto.Descriptor((("a", "b"),)),)).hits(proto.Descriptor((("a", "b"),))) == 1


def test_request_bytes_are_protobufs() -> None:
    """Known bytes: the protobuf encoding of domain "d", one descriptor {entries [{k: v}],
    hits_addend {value: 300}}, hits_addend 2."""
    data = bytes.fromhex("0a0164" "120d" "0a06" "0a016b" "120176" "1a03" "08ac02" "1802")
    assert proto.decode_request(data) == proto.Request(
        "d", (proto.Descriptor((("k", "v"),), 300),), 2)
    assert proto.encode_request(proto.decode_request(data)) == data


def test_unknown_fields_are_skipped() -> None:
    # field 9 varint, field 10 fixed64, field 11 LEN, field 12 fixed32, then domain
    data = bytes.fromhex("4801" "510000000000000000" "5a026869" "6500000000" "0a0164")
    assert proto.decode_request(data).domain == "d"


def test_response_round_trip() -> None:
    response = proto.Response(proto.CODE_OVER_LIMIT, (
        proto.DescriptorStatus(proto.CODE_OK, proto.CurrentLimit(10, proto.UNIT_SECOND, "z"), 4, 0),
        proto.DescriptorStatus(proto.CODE_OVER_LIMIT, proto.CurrentLimit(600, proto.UNIT_MINUTE, "t"), 0, 9),
    ), (("retry-after", "9"), ("x-perimeter-reason", "token-budget")))
    assert proto.decode_response(proto.encode_response(response)) == response
    # overall_code OVER_LIMIT is field 1 varint 2
    assert proto.encode_response(proto.Response(proto.CODE_OVER_LIMIT)) == b"\x08\x02"


@pytest.mark.parametrize("bad", [
    b"\x0a\x05ab",                 # truncated string
    b"\x0a",                       # truncated length
    b"\x08" + b"\xff" * 11,        # varint over 10 bytes
    b"\x0b",                       # wire type 3 (group)
    b"\x00\x01",                   # field 0
    b"\x0a\x02\xff\xfe",           # domain not UTF-8
    b"\x12\x02\x08\x01",           # descriptor: entries as a number
])
def test_bad_bytes_are_proto_errors(bad: bytes) -> None:
    with pytest.raises(proto.ProtoError):
        proto.decode_request(bad)


def test_response_dynamic_metadata_is_a_struct_of_strings() -> None:
    """Field 6, google.protobuf.Struct {fields: {"shared": Value {string_value: "unavailable"}}}:
    known bytes (as protoc encodes them)."""
    data = proto.encode_response(proto.Response(proto.CODE_OK, dynamic_metadata=(("shared", "unavailable"),)))
    entry = b"\x0a\x06shared" + b"\x12\x0d" + b"\x1a\x0bunavailable"
    assert proto.decode_response(data).dynamic_metadata == (("shared", "unavailable"),)
    assert data == b"\x08\x01" + b"\x32" + bytes([len(entry) + 2]) + b"\x0a" + bytes([len(entry)]) + entry
