"""HTTP/2 with prior knowledge (h2c), by hand: just enough to ask a listener whether it speaks
HTTP/2 in clear text, and to recognise the answer.

A request is the 24-byte connection preface, an empty SETTINGS frame and one HEADERS frame
(HPACK literals, never Huffman-coded, never indexed: no state to keep). An HTTP/1.1 listener
answers the preface line ``PRI * HTTP/2.0`` as a bad request line; an HTTP/2 one answers with
its own SETTINGS frame. Of an HTTP/2 answer only ``:status`` is read, and only when it is a
static-table entry or a plain literal (what Envoy and NGINX send); the rest is not decoded.
"""

from __future__ import annotations

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, GOAWAY = 0x0, 0x1, 0x4, 0x7
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
FRAME_HEAD = 9
# HPACK static table (RFC 7541, appendix A): the :status entries
_STATIC_STATUS = {8: 200, 9: 204, 10: 206, 11: 304, 12: 400, 13: 404, 14: 500}
# Connection-specific headers have no place in HTTP/2 (RFC 9113 8.2.2)
_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "host"})


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def _integer(value: int, prefix: int, first: int = 0) -> bytes:
    """An HPACK integer with a ``prefix``-bit prefix (RFC 7541 5.1)."""
    top = (1 << prefix) - 1
    if value < top:
        return bytes((first | value,))
    out = bytearray((first | top,))
    value -= top
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: str, value: str) -> bytes:
    """A literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2)."""
    n, v = name.encode("latin-1"), value.encode("latin-1")
    return b"\x00" + _integer(len(n), 7) + n + _integer(len(v), 7) + v


def request(method: str, target: str, authority: str, headers: dict[str, str], body: bytes | None) -> bytes:
    """Preface, SETTINGS, HEADERS (and DATA) of one request on stream 1."""
    fields = [(":method", method), (":scheme", "http"), (":path", target), (":authority", authority)]
    fields += [(k.lower(), v) for k, v in headers.items() if k.lower() not in _HOP]
    block = b"".join(_literal(k, v) for k, v in fields)
    flags = END_HEADERS | (0 if body else END_STREAM)
    out = PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, flags, 1, block)
    if body:
        out += frame(DATA, END_STREAM, 1, body)
    return out


def is_http1(head: bytes) -> bool:
    return head.startswith(b"HTTP/1.")


def is_settings(head: bytes) -> bool:
    """The first frame of an HTTP/2 server: SETTINGS on stream 0 (RFC 9113 3.4)."""
    return len(head) >= FRAME_HEAD and head[3] == SETTINGS and head[5:9] == b"\0\0\0\0"


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """The complete frames at the start of ``data``: (type, flags, stream, payload)."""
    out, at = [], 0
    while at + FRAME_HEAD <= len(data):
        size = int.from_bytes(data[at:at + 3], "big")
        if at + FRAME_HEAD + size > len(data):
            break
        out.append((data[at + 3], data[at + 4], int.from_bytes(data[at + 5:at + 9], "big") & 0x7FFFFFFF,
                    data[at + FRAME_HEAD:at + FRAME_HEAD + size]))
        at += FRAME_HEAD + size
    return out


def status(block: bytes) -> int | None:
    """``:status`` when it is the first field of a header block in a form read without state:
    an indexed static entry, or a literal with the static name and a plain (non-Huffman) value."""
    if not block:
        return None
    b = block[0]
    if b & 0x80:
        return _STATIC_STATUS.get(b & 0x7F)
    if b in (0x48, 0x08, 0x18) and len(block) >= 2 and not block[1] & 0x80:
        size = block[1]
        digits = block[2:2 + size]
        return int(digits) if size == 3 and digits.isdigit() else None
    return None


def answer_status(data: bytes) -> int | None:
    """The :status of the first HEADERS frame on stream 1 in ``data`` (None: not read)."""
    for kind, flags, stream, payload in frames(data):
        if kind == HEADERS and stream == 1:
            if flags & 0x8:                                  # PADDED
                payload = payload[1:len(payload) - payload[0]]
            if flags & 0x20:                                 # PRIORITY
                payload = payload[5:]
            return status(payload)
    return None


def answered(data: bytes) -> bool:
    """Has stream 1 got its HEADERS, or has the server said GOAWAY?"""
    return any((k == HEADERS and s == 1) or k == GOAWAY for k, _f, s, _p in frames(data))
