"""The gRPC door's per-call shortcuts (scanner/limiter/server.py): the OK answer's header blocks
encoded once, and header blocks that leave HPACK's table alone remembered; each checked against
what it stands in for (hpack's own encoder and decoder). The whole door through an h2 client:
tests/limiter/test_server.py."""

from __future__ import annotations

import random

import hpack

from scanner.limiter import rls, server

CALL_HEADERS = [(":method", "POST"), (":path", rls.SERVICE_PATH), (":authority", "perimeter_limiter"),
                (":scheme", "http"), ("te", "trailers"), ("grpc-timeout", "1000m"),
                ("content-type", "application/grpc"), ("x-envoy-expected-rq-timeout-ms", "250")]


def test_the_answer_blocks_are_hpack_s_encoding_of_the_answer_headers() -> None:
    for block in (server.OK_HEADERS, server.OK_TRAILERS):
        decoder = hpack.Decoder()
        assert [tuple(h) for h in decoder.decode(server._OK_BLOCKS[block], raw=True)] == list(block)
        assert not decoder.header_table.dynamic_entries      # never indexed: no table entry
    encoder = server._AnswerEncoder()
    assert encoder.encode(list(server.OK_HEADERS)) == server._OK_BLOCKS[server.OK_HEADERS]
    other = [(b"grpc-status", b"14"), (b"grpc-message", b"shared-store-unavailable")]
    assert encoder.encode(other) == hpack.Encoder().encode(other)     # anything else: encoded
    encoder.header_table_size = 0          # the peer resized the table: the update must be sent
    assert encoder.encode(list(server.OK_TRAILERS)) != server._OK_BLOCKS[server.OK_TRAILERS]


def test_the_call_decoder_reads_every_block_as_hpack_does() -> None:
    """Random header lists (repeated ones, new values that enter and evict table entries, never
    indexed fields, table size updates) through one encoder: the remembering decoder and hpack's
    own give the same headers for every block, and the remembered blocks are used."""
    rnd = random.Random(27)
    encoder, plain, remembering = hpack.Encoder(), hpack.Decoder(), server._CallDecoder()
    hits = 0
    for i in range(3000):
        headers: list[hpack.HeaderTuple | tuple[bytes | str, bytes | str]] = list(CALL_HEADERS)
        if rnd.random() < 0.1:
            headers.append(("x-request-id", f"{rnd.randrange(1000):04d}" * rnd.randrange(1, 40)))
        if rnd.random() < 0.05:
            headers[1] = hpack.NeverIndexedHeaderTuple(":path", rls.SERVICE_PATH)
        if rnd.random() < 0.01:
            encoder.header_table_size = rnd.choice((256, 4096))
        block = encoder.encode(headers)
        before = len(remembering.known)
        got = remembering.decode(block, raw=True)
        assert got == plain.decode(block, raw=True), i
        assert list(remembering.header_table.dynamic_entries) == list(plain.header_table.dynamic_entries)
        hits += block in remembering.known and len(remembering.known) == before
    assert hits > 1000
