"""Envoy's rate limit service messages (scanner/limiter/proto.py: the generated classes of
xds-protos) and the readings rls.py takes of them."""

from __future__ import annotations

import pytest

from scanner.limiter import proto


def test_hits_follow_envoys_protocol() -> None:
    """A descriptor's own hits_addend (an explicit 0 kept), else the request's, else 1."""
    request = proto.request("vllm-perimeter", (
        proto.descriptor((("zone", "inference:key:10/20"), ("principal", "alice"))),
        proto.descriptor((("zone", "tok"), ("remote_address", "2001:db8::1"), ("op", "settle")), 123456),
        proto.descriptor((("zone", "tok"), ("principal", "é")), 0),
    ), hits_addend=7)
    back = proto.decode_request(request.SerializeToString())
    assert back == request
    assert [proto.hits(back, d) for d in back.descriptors] == [7, 123456, 0]
    alone = proto.request("d", (proto.descriptor((("a", "b"),)),))
    assert proto.hits(alone, alone.descriptors[0]) == 1 and proto.given_hits(alone, alone.descriptors[0]) is None
    assert proto.entry(back.descriptors[1], "op") == "settle" and proto.entry(back.descriptors[0], "op") is None


def test_request_bytes_are_envoys() -> None:
    """Known bytes (as protoc encodes them): domain "d", one descriptor {entries [{k: v}],
    hits_addend {value: 300}}, hits_addend 2."""
    data = bytes.fromhex("0a0164" "120d" "0a06" "0a016b" "120176" "1a03" "08ac02" "1802")
    assert proto.decode_request(data) == proto.request("d", (proto.descriptor((("k", "v"),), 300),), 2)
    assert proto.decode_request(data).SerializeToString() == data


def test_unknown_fields_are_skipped() -> None:
    # field 9 varint, field 10 fixed64, field 11 LEN, field 12 fixed32, then domain
    data = bytes.fromhex("4801" "510000000000000000" "5a026869" "6500000000" "0a0164")
    assert proto.decode_request(data).domain == "d"


@pytest.mark.parametrize("bad", [
    b"\x0a\x05ab",                 # truncated string
    b"\x0a",                       # truncated length
    b"\x08" + b"\xff" * 11,        # varint over 10 bytes
    b"\x0b",                       # wire type 3 (group) never closed
    b"\x00\x01",                   # field 0
    b"\x0a\x02\xff\xfe",           # domain not UTF-8
])
def test_bad_bytes_are_proto_errors(bad: bytes) -> None:
    with pytest.raises(proto.ProtoError):
        proto.decode_request(bad)


def test_response_bytes_are_envoys() -> None:
    """overall_code OVER_LIMIT is field 1 varint 2; dynamic_metadata (field 6) the Struct
    {fields: {"shared": Value {string_value: "unavailable"}}}: known bytes."""
    assert proto.Response(overall_code=proto.CODE_OVER_LIMIT).SerializeToString() == b"\x08\x02"
    answer = proto.Response(overall_code=proto.CODE_OK)
    answer.dynamic_metadata.update({"shared": "unavailable"})
    entry = b"\x0a\x06shared" + b"\x12\x0d" + b"\x1a\x0bunavailable"
    assert answer.SerializeToString() == (b"\x08\x01" + b"\x32" + bytes([len(entry) + 2]) + b"\x0a"
                                          + bytes([len(entry)]) + entry)
