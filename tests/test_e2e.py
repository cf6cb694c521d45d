"""The closed loop on real parts: generated proxies in front of the engine-less real vLLM 0.29.0
(behind its upstream witness), proven by the prober with the same plan: zero findings and every
subject proved. State-changing requests are sent too: without an engine no handler can act.
Weakened configs are caught, here against the real app (the full mutation run against the
stand-in is tests/verify/test_mutation.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scanner import mutate
from scanner.inventory.catalog import load_ref
from scanner.plan.inputs import load_policy
from scanner.probe.interface import ProbeOptions, ProbeResult
from scanner.runtime import nginx
from scanner.runtime.proxy import EnvoyProxy, NginxProxy, Proxy
from scanner.verify import loop, mutation

OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=180)
# The engine-less app closes its connection after each handler error (500): no upstream
# keep-alive, or the proxy's next POST on that connection would be a 502.
ENGINELESS = {"upstream_keepalive": "0"}


def _summary(res: ProbeResult) -> list[str]:
    return [f"{f.severity} {f.rule} {f.method} {f.path} [{f.vantage}] {f.evidence[:1]}" for f in res.findings]


def _proved(res: ProbeResult) -> None:
    """Zero findings and every subject proved: the witness saw what reached vLLM."""
    assert not res.unreachable, res.reason
    assert res.findings == (), _summary(res)
    assert len(res.attempts) > 5000
    unproven = [c for c in res.coverage if c.status not in ("proved", "not-applicable")]
    assert not unproven, unproven[:5]
    assert {c.check for c in res.coverage if c.status == "proved"} >= {
        "matrix", "bypass", "limits", "rate", "concurrency", "upstream"}


@pytest.fixture(scope="module")
def setup(real_vllm, tmp_path_factory) -> loop.Setup:  # type: ignore[no-untyped-def]
    work = tmp_path_factory.mktemp("e2e")
    return loop.setup(load_ref("vllm-0.29.0-everything"), load_policy(None), work, real_vllm.port, 2)


def _proxies() -> Iterator[Proxy]:
    for build_ in (nginx.static_build(), nginx.debian_build()):
        if build_ is not None:
            yield NginxProxy(build_, build_.name, ENGINELESS)


def _proxy(name: str) -> Proxy:
    if name == "envoy":
        return EnvoyProxy()
    found = {p.name: p for p in _proxies()}.get(name)
    if found is None:
        pytest.fail(f"NGINX {name} missing") if __import__("os").environ.get("CI") else pytest.skip(name)
    return found


# NGINX 1.22 in front of the real app is slow-marked for CI time (about 80 s); it runs the same
# generated config as 1.31 in front of the stand-in in CI (tests/generate/test_nginx_live.py)
@pytest.mark.parametrize("name", ["static-1.31", pytest.param("debian-1.22", marks=pytest.mark.slow), "envoy"])
def test_proxy_in_front_of_real_vllm_is_proved(setup: loop.Setup, real_vllm, name: str,  # type: ignore[no-untyped-def]
                                               tmp_path: Path) -> None:
    proxy = _proxy(name)
    proxy.write(setup.plan, tmp_path)
    res = loop.proxy_run(setup, proxy, tmp_path, OPTIONS, real_vllm.url).result
    _proved(res)


# --- deliberately weakened configs, in front of the real app ------------------------------------

WEAKENINGS = ("nginx.prefix-location-added", "nginx.method-check-removed", "nginx.network-check-removed",
              "nginx.raw-target-forwarded", "nginx.client-headers-forwarded", "envoy.json-cap-removed",
              "envoy.denied-route-forwarded")


@pytest.mark.parametrize("op_id", WEAKENINGS)
def test_weakened_config_is_caught(setup: loop.Setup, real_vllm, op_id: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    op = mutate.OPERATORS[op_id]
    proxy = EnvoyProxy() if op.kind == "envoy" else next(_proxies())
    run = mutation.mutant(setup, proxy, op, tmp_path, mutation.mutant_options(OPTIONS, op_id), real_vllm.url)
    assert run.status == "caught", run
    assert run.rules and run.rules != ("VP011",), run


# --- what the proxy forwards, the real request models accept -------------------------------------

# the routes end users call and the least each needs besides the defaults of its model
REQUIRED = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
    "/v1/responses": {"input": "hi"},
    "/v1/messages": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
    "/v1/embeddings": {"input": "hi"},
    "/v1/rerank": {"query": "q", "documents": ["d"]},
    "/v2/embed": {"texts": ["hi"]},
}


@pytest.mark.parametrize("name", ["static-1.31", "envoy"])
def test_vllm_accepts_every_allowed_field_the_proxy_forwards(setup: loop.Setup, real_vllm, name: str,  # type: ignore[no-untyped-def]
                                                             tmp_path: Path) -> None:
    """Issue 10: a body holding every field the bundled policy lets end users send (each at its
    model's default, from the inventory) passes the proxy and vLLM's own validation (pydantic and
    the handlers' checks): engine-less, the handler answers 500/501 after validation, never 400/422."""
    import json
    from contextlib import ExitStack

    import httpx

    inventory = load_ref("vllm-0.29.0-everything")
    models = {r.path: r.request for r in inventory.routes if r.kind == "http"}
    proxy = _proxy(name)
    proxy.write(setup.plan, tmp_path)
    key = next(c.secret for c in setup.credentials if c.role == "user")
    public = next(v for v in setup.vantages if v.name == "public")
    answers = {}
    with ExitStack() as stack, httpx.Client(
            base_url=f"http://127.0.0.1:{setup.plan.listen.port}", timeout=20,
            transport=httpx.HTTPTransport(local_address=public.address)) as client:
        loop.start_checked(proxy, setup.plan, tmp_path, stack)
        for path, needed in REQUIRED.items():
            d, model = setup.plan.decision("POST", path), models[path]
            assert d is not None and d.allowed and model is not None
            body = {f.name: json.loads(f.default_json) for f in model.fields
                    if d.fields.mode(f.name) == "allow" and f.default_json is not None}
            assert len(body) >= 5, path
            body.update(needed)
            r = client.post(path, json=body, headers={"Authorization": f"Bearer {key}"})
            # the perimeter's own reply, but not its error replacing vLLM's 5xx body (vLLM answered)
            marked = "x-perimeter-decision" in r.headers and r.headers.get("x-perimeter-reason") != "upstream-error"
            answers[path] = (r.status_code, marked, r.text[:200])
    refused = {p: a for p, a in answers.items() if a[1] or a[0] in (400, 422)}
    assert not refused, refused
    # validated, then the missing engine: 500, 501 where the model has no such task, or (rerank on
    # 0.29, whose handler returns None without its serving object) 200 with a null body
    unexpected = {p: a for p, a in answers.items()
                  if a[0] not in (500, 501) and a[:1] + a[2:] != (200, "null")}
    assert not unexpected, unexpected
