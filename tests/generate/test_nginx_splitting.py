"""No request splitting through the perimeter: a decoded CR, LF or NUL in the path never reaches
vLLM's request line, on either NGINX build.

gixy-ng's http_splitting check flagged the old ``proxy_pass http://vllm_upstream$perimeter_path...``
and it was right in part: PCRE's ``$`` also matches before a final newline, so
``GET /v1/responses/abc%0A`` matched the template's location and went upstream as
``GET /v1/responses/abc<LF> HTTP/1.1``. Template locations now end in ``\\z``, and every location
that forwards a template re-captures the path through the template's regex. Here every allowed
HTTP route of the everything inventory under the default policy gets, from an admitted principal
and network, its clean path (which must reach the upstream: the test is not vacuous) and then
encoded CR/LF/NUL variants (which the proxy must answer itself, with nothing sent upstream). The
upstream is a raw socket, so what NGINX sends is seen byte for byte.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from scanner.inventory.model import load as load_inventory
from scanner.plan.model import BODY_METHODS, DECISION_HEADER, Decision
from tests.generate.nginx_harness import (
    BUILDS,
    LOOPBACK_NETWORKS,
    Principal,
    RunningNginx,
    get_build,
    listen_yaml,
    make_plan,
    make_principals,
    new_port,
    raw_request,
)
from tests.generate.test_nginx_live import INVENTORY, PEOPLE, bearer, live_policy_text

pytestmark = [pytest.mark.nginx]

# What a client may append to (or put inside) a path segment: decoded by NGINX into $uri.
SUFFIXES = ("%0A", "%0D%0A", "%0d%0aX-Injected:%201", "%0D", "%00", "%0A%0A", "%0D%0AX-Injected:%201%0D%0A")
INSIDE = ("a%0Ab", "a%0D%0AX-Injected:%201", "a%00b")
REQUEST_LINE = re.compile(rb"[A-Z]+ /[\x21-\x7e]* HTTP/1\.1")
BODY = b'{"model":"m","prompt":"x","messages":[],"input":"x","max_tokens":1,"max_completion_tokens":1,' \
       b'"max_output_tokens":1}'


class RawUpstream:
    """Accepts connections, records each request head as received, answers 200 and closes."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.heads: list[bytes] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    head = data.partition(b"\r\n\r\n")[0]
                    with self.lock:   # recorded before the reply: the client sees it once answered
                        self.heads.append(head)
                    length = re.search(rb"\r\ncontent-length: *(\d+)", head, re.I)
                    rest = len(data) - len(head) - 4
                    while length and rest < int(length.group(1)):
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        rest += len(chunk)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                except OSError:
                    pass

    def seen(self) -> int:
        with self.lock:
            return len(self.heads)

    def since(self, n: int) -> list[bytes]:
        with self.lock:
            return list(self.heads[n:])

    def __enter__(self) -> RawUpstream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def raw_upstream() -> Iterator[RawUpstream]:
    with RawUpstream() as upstream:
        yield upstream


def _source(d: Decision) -> str | None:
    import ipaddress

    for address in ("127.0.0.1", "127.0.0.2", "127.0.0.3"):
        if any(ipaddress.ip_address(address) in ipaddress.ip_network(c, strict=False) for c in d.networks):
            return address
    return None


def _who(d: Decision, people: dict[str, Principal]) -> dict[str, str]:
    if d.auth != "key":
        return {}
    person = next(p for p in people.values() if not d.roles or p.role in d.roles)
    return bearer(person)


def _send(port: int, d: Decision, target: str, people: dict[str, Principal], source: str) -> tuple[int, bool]:
    body = BODY if d.method in BODY_METHODS else b""
    headers = {**_who(d, people), **({"Content-Type": "application/json"} if body else {})}
    r = raw_request(port, target, d.method, headers=headers, body=body, source=source)
    return r.status, DECISION_HEADER.lower() in r.headers


@pytest.mark.parametrize("build_name", sorted(BUILDS))
def test_no_cr_lf_or_nul_reaches_the_upstream_request(build_name: str, raw_upstream: RawUpstream,
                                                      tmp_path: Path) -> None:
    build = get_build(build_name)
    _, people = make_principals(tmp_path, *PEOPLE)
    policy = live_policy_text().replace("rate: {rps: 200, burst: 400}", "rate: {rps: 1000, burst: 5000}")
    policy = re.sub(r"rate: \{rps: \d+, burst: \d+\}", "rate: {rps: 1000, burst: 5000}", policy)
    plan = make_plan(load_inventory(INVENTORY), policy, tmp_path,
                     extra_yaml="principals_file: principals.yaml\n"
                     + listen_yaml(new_port(), "127.0.0.1", raw_upstream.port),
                     overrides=LOOPBACK_NETWORKS)
    decisions = [d for d in plan.allowed if d.kind == "http"]
    templated = [d for d in decisions if "{" in d.path]
    assert templated and len(decisions) > 20
    with RunningNginx(build, plan, tmp_path / "nginx", options_extra={"upstream_keepalive": "0"}) as nginx:
        checked = 0
        for d in sorted(decisions, key=lambda x: (x.path, x.method)):
            source = _source(d)
            assert source is not None, d
            clean = re.sub(r"\{[^}]+\}", "abc", d.path)
            before = raw_upstream.seen()
            status, own = _send(nginx.port, d, clean, people, source)
            assert not own and status == 200, (d.method, d.path, status)
            assert [REQUEST_LINE.fullmatch(h.split(b"\r\n")[0]) is not None
                    for h in raw_upstream.since(before)] == [True], raw_upstream.since(before)
            variants = [clean + s for s in SUFFIXES]
            if "{" in d.path:
                variants += [re.sub(r"\{[^}]+\}", inside, d.path) for inside in INSIDE]
            for target in variants:
                before = raw_upstream.seen()
                status, own = _send(nginx.port, d, target, people, source)
                assert own and status in (400, 404), (d.method, target, status)
                assert raw_upstream.since(before) == [], (d.method, target, raw_upstream.since(before))
                checked += 1
        assert checked >= len(decisions) * len(SUFFIXES)
    for head in raw_upstream.heads:
        assert b"x-injected" not in head.lower() and b"\r\n\r\n" not in head
