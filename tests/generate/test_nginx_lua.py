"""The NGINX Lua runtime (generator option lua_module, issue 28 item 2): golden files, determinism,
the per-location runtime decision, the options a target cannot take, `nginx -t` on Debian's NGINX
1.22, and live: the same plan under njs and under Lua, side by side in front of the echo upstream,
giving the same status, reason, body reaching the upstream and access-log fields for each request."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from scanner.errors import GenerateError
from scanner.generate.interface import GenerateOptions
from scanner.generate.nginx import NginxGenerator
from scanner.generate.nginx_model import LUA, build_model, lua_refusal
from scanner.inventory.model import load as load_inventory
from scanner.runtime import nginx as runtime_nginx
from scanner.runtime.proxy import relisten
from tests.generate.golden import assert_matches_golden
from tests.generate.nginx_harness import (
    GOLDEN,
    RunningNginx,
    default_policy_text,
    get_build,
    make_plan,
    raw_request,
)
from tests.generate.test_nginx_config import GOLDEN_OPTIONS, GOLDEN_PRINCIPALS, INVENTORY, golden_plan
from tests.generate.test_nginx_live import EchoServer, echoed, start_perimeter

MODULES = runtime_nginx.DEBIAN_MODULES
LUA_EXTRA = {"njs_module": runtime_nginx.DEBIAN_NJS, "njs": "0.7.9", "lua_module": MODULES,
             "config_dir": "/etc/vllm-perimeter"}


def needs_lua() -> None:
    missing = runtime_nginx.lua_missing()
    if missing and os.environ.get("CI"):
        pytest.fail(f"the Lua runtime needs {missing}; .ci/run installs it")
    if missing:
        pytest.skip(f"the Lua runtime needs {missing}")


def lua_options() -> GenerateOptions:
    return replace(GOLDEN_OPTIONS, extra=LUA_EXTRA)


# the files the Lua runtime changes (golden under golden/nginx/lua); the others are njs's, byte for byte
LUA_FILES = ("nginx.conf", "perimeter-http.conf", LUA)


def test_golden_lua(tmp_path: Path) -> None:
    needs_lua()
    config = NginxGenerator().render(golden_plan(tmp_path), lua_options())
    assert_matches_golden(replace(config, files=tuple(f for f in config.files if f.name in LUA_FILES)),
                          GOLDEN / "lua")
    files = {f.name: f.content for f in config.files}
    njs_options = replace(GOLDEN_OPTIONS, extra={k: v for k, v in LUA_EXTRA.items() if k != "lua_module"})
    njs = {f.name: f.content for f in NginxGenerator().render(golden_plan(tmp_path), njs_options).files}
    assert {n: c for n, c in files.items() if n not in LUA_FILES} == {n: c for n, c in njs.items()
                                                                     if n not in LUA_FILES}
    assert files["nginx.conf"].index("ngx_http_js_module.so") < files["nginx.conf"].index("ndk_http_module.so") \
        < files["nginx.conf"].index("ngx_http_lua_module.so")
    http = files["perimeter-http.conf"]
    assert 'lua_package_path "/etc/vllm-perimeter/?.lua;;";' in http
    assert "js_set $perimeter_key_sha256" not in http and "set_by_lua_block $perimeter_key_sha256" in http
    # the chat route's check is Lua's, and says so; the identical njs config says nothing of Lua
    chat = http[http.index("location = /v1/chat/completions {"):]
    chat = chat[:chat.index("\n    }\n")]
    assert "# the body check: Lua" in chat and "content_by_lua_block" in chat and "js_content" not in chat
    plain = NginxGenerator().render(golden_plan(tmp_path), GOLDEN_OPTIONS)
    assert LUA not in {f.name for f in plain.files}
    njs_http = next(f.content for f in plain.files if f.name == "perimeter-http.conf")
    assert "_by_lua" not in njs_http and "the body check:" not in njs_http


def test_deterministic_lua(tmp_path: Path) -> None:
    needs_lua()
    assert NginxGenerator().render(golden_plan(tmp_path), lua_options()) == \
        NginxGenerator().render(golden_plan(tmp_path), lua_options())


def test_one_decision_per_block(tmp_path: Path) -> None:
    """Every checked block's runtime is lua_refusal's answer, and the conf shows it."""
    needs_lua()
    model = build_model(golden_plan(tmp_path), lua_options())
    checked = [b for loc in model.locations for b in loc.blocks if b.check]
    assert checked and any(b.lua for b in checked)
    for b in checked:
        why = lua_refusal(b, model.programs[b.check.program] if b.check else None)
        assert b.lua == (why == "") and b.lua_note == (why or "Lua: perimeter.lua runs the rule program")
        assert b.lua <= b.check.parse_all if b.check else True


def test_a_token_budget_stays_with_njs(tmp_path: Path) -> None:
    """A route whose admission njs charges (a token budget; njs >= 0.8 declared) keeps
    perimeter.direct under lua_module, and its location says why; the others still go to Lua."""
    needs_lua()
    (tmp_path / "principals.yaml").write_text(GOLDEN_PRINCIPALS, encoding="utf-8")
    text = default_policy_text().replace("      concurrency: 16\n",
                                         "      concurrency: 16\n      tokens_per_minute: 8000\n", 1)
    assert "tokens_per_minute" in text
    plan = make_plan(load_inventory(INVENTORY), text, tmp_path, extra_yaml="principals_file: principals.yaml\n")
    options = replace(GOLDEN_OPTIONS, extra={**LUA_EXTRA, "njs": "0.9.9"})
    model = build_model(plan, options)
    checked = [b for loc in model.locations for b in loc.blocks if b.check and b.check.parse_all]
    budgeted = [b for b in checked if b.check and b.check.tokens]
    assert budgeted and not any(b.lua for b in budgeted)
    assert {b.lua_note for b in budgeted} == {"njs: a token budget (njs charges and settles it)"}
    http = next(f.content for f in NginxGenerator().render(plan, options).files if f.name == "perimeter-http.conf")
    assert "# the body check: njs: a token budget (njs charges and settles it)" in http
    assert http.count("js_content perimeter.direct;") == len(budgeted)
    assert http.count("content_by_lua_block") == sum(b.lua for b in checked) > 0


@pytest.mark.parametrize("extra,message", [
    ({"lua_module": MODULES, "config_dir": "/etc/p"}, "needs a build that loads dynamic modules"),
    ({"njs_module": runtime_nginx.DEBIAN_NJS, "lua_module": "/nonexistent", "config_dir": "/etc/p"},
     "has no ndk_http_module.so, ngx_http_lua_module.so"),
    ({"njs_module": runtime_nginx.DEBIAN_NJS, "lua_module": "modules"}, "must be an absolute path"),
    ({"njs_module": runtime_nginx.DEBIAN_NJS, "lua_module": MODULES}, "needs to know where perimeter.lua"),
])
def test_options_the_target_cannot_take(tmp_path: Path, extra: dict[str, str], message: str) -> None:
    if "lua_module" in extra and extra["lua_module"] == MODULES and "njs_module" in extra:
        needs_lua()
    with pytest.raises(GenerateError, match=message) as info:
        NginxGenerator().render(golden_plan(tmp_path), replace(GOLDEN_OPTIONS, extra=extra))
    assert "\n" not in str(info.value)


@pytest.mark.nginx
def test_nginx_t_lua(tmp_path: Path) -> None:
    needs_lua()
    plan = golden_plan(tmp_path)
    result = RunningNginx(get_build("debian-1.22"), plan, tmp_path / "n",
                          options_extra={"lua_module": MODULES}).test_config()
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "n" / "conf" / LUA).exists()


# --- live: njs and Lua side by side, the same plan, the same echo upstream ----------------------

@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningNginx, RunningNginx, dict[str, Any]]]:
    needs_lua()
    with EchoServer() as echo:
        directory = tmp_path_factory.mktemp("nginx-lua")
        njs, people = start_perimeter("debian-1.22", directory / "njs", "127.0.0.1", echo.port,
                                      cache_salt="strip")
        lua = RunningNginx(njs.build, relisten(njs.plan, _free()), directory / "lua",
                           options_extra={"lua_module": MODULES})
        try:
            lua.start()
            yield njs, lua, people
        finally:
            njs.stop()
            lua.stop()


def _free() -> int:
    from scanner.net import free_port

    return free_port("127.0.0.1")


CHAT = "/v1/chat/completions"
OK = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
BODIES: list[tuple[str, bytes, str]] = [
    ("allowed", json.dumps(OK).encode(), "application/json"),
    ("over its cap", json.dumps({**OK, "max_tokens": 99999}).encode(), "application/json"),
    ("vLLM's string form", json.dumps({**OK, "max_tokens": " +1_6 "}).encode(), "application/json"),
    ("n over its cap", json.dumps({**OK, "n": 99}).encode(), "application/json"),
    ("budget written in", json.dumps({k: v for k, v in OK.items() if k != "max_tokens"}).encode(),
     "application/json"),
    ("cache_salt stripped", json.dumps({**OK, "cache_salt": "s"}).encode(), "application/json"),
    ("forbidden", json.dumps({**OK, "chat_template": "x"}).encode(), "application/json"),
    ("escaped key over its cap", b'{"model":"m","messages":[],"max_\\u0074okens":99999}', "application/json"),
    ("duplicated key", b'{"model":"m","messages":[],"max_tokens":1,"max_tokens":99999}', "application/json"),
    ("media url", json.dumps({**OK, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://169.254.169.254/x.png"}}]}]}).encode(),
     "application/json"),
    ("stop list over its count", json.dumps({**OK, "stop": ["x"] * 99}).encode(), "application/json"),
    ("not JSON", b"{", "application/json"),
    ("not an object", b"[1]", "application/json"),
    ("invalid UTF-8", b'{"model":"m\xff","messages":[]}', "application/json"),
    ("too deep", b'{"a":' + b"[" * 40 + b"]" * 40 + b"}", "application/json"),
    ("empty", b"", "application/json"),
    ("a form", b"max_tokens=99999", "application/x-www-form-urlencoded"),
]


def _answer(nginx: RunningNginx, key: str, body: bytes | None, content_type: str = "") -> tuple[Any, ...]:
    if body is None:
        r = raw_request(nginx.port, "/v1/models", headers={"Authorization": f"Bearer {key}"})
    else:
        r = raw_request(nginx.port, CHAT, "POST", body=body,
                        headers={"Authorization": f"Bearer {key}", "Content-Type": content_type})
    reached = echoed(r) if r.status == 200 else None
    sent = reached and reached["body"]
    with contextlib.suppress(ValueError):
        sent = json.loads(sent) if sent else sent
    return r.status, r.headers.get("x-perimeter-reason", ""), sent


LOGGED = ("principal", "route", "status", "decision", "reason", "model", "sequences", "output", "output_from")


def _log(nginx: RunningNginx, n: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 5
    lines: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        lines = [json.loads(x) for x in nginx.access_log.read_text().splitlines() if x.strip()]
        if len(lines) >= n:
            break
        time.sleep(0.02)
    return [{k: x[k] for k in LOGGED} for x in lines]


def test_same_answers_as_njs(pair: tuple[RunningNginx, RunningNginx, dict[str, Any]]) -> None:
    njs, lua, people = pair
    assert "content_by_lua_block" in (lua.directory / "conf" / "perimeter-http.conf").read_text()
    assert "content_by_lua_block" not in (njs.directory / "conf" / "perimeter-http.conf").read_text()
    alice = people["alice"].key
    cases: list[tuple[str, str, bytes | None, str]] = [
        ("keyed GET", alice, None, ""), ("unknown key", "vp_not-a-key", None, ""),
        ("unknown key, chat", "vp_not-a-key", json.dumps(OK).encode(), "application/json"),
        *[(name, alice, body, ct) for name, body, ct in BODIES]]
    before = len(_log(njs, 0)), len(_log(lua, 0))
    seen = []
    for i, (name, key, body, ct) in enumerate(cases, 1):
        a, b = _answer(njs, key, body, ct), _answer(lua, key, body, ct)
        seen.append((name, a, b))
        # a line is written after its answer, by whichever worker served it: wait for it, so that
        # line i is request i on both sides (two workers may otherwise log out of order)
        _log(njs, before[0] + i), _log(lua, before[1] + i)
    differ = [(name, a, b) for name, a, b in seen if a != b]
    assert not differ, differ
    answers = {name: a for name, a, _ in seen}
    # the cases mean what they say: admitted, refused, rewritten
    assert answers["keyed GET"][0] == 200 and answers["unknown key"][:2] == (401, "unknown-key")
    assert answers["allowed"] == (200, "", OK)
    assert answers["over its cap"][:2] == (400, "json-cap:max_tokens")
    assert answers["forbidden"][:2] == (400, "forbidden-field:chat_template")
    assert answers["cache_salt stripped"] == (200, "", OK)
    written = answers["budget written in"]
    sent = {k: v for k, v in OK.items() if k != "max_tokens"}
    assert written[0] == 200 and len(written[2]) == len(sent) + 1 and sent.items() < written[2].items()
    assert answers["too deep"][:2] == (400, "bad-json:depth-over-31")
    assert answers["not an object"][:2] == (400, "bad-json:not-an-object")
    assert answers["invalid UTF-8"][:2] == (400, "bad-json")
    # the access log: the same fields, line by line
    njs_log = _log(njs, before[0] + len(cases))[before[0]:]
    lua_log = _log(lua, before[1] + len(cases))[before[1]:]
    assert len(njs_log) == len(lua_log) == len(cases)
    assert njs_log == lua_log
    assert any(x["output_from"] == "written" for x in lua_log) and any(x["model"] == "m" for x in lua_log)
    # no Lua error (the module's own, or the adapter's "perimeter:" line of a check that failed
    # closed), nothing worse than an error; an upstream's own trouble under load is not Lua's
    bad = [line for line in (lua.directory / "run" / "error.log").read_text().splitlines()
           if any(f"[{level}]" in line for level in ("alert", "crit", "emerg"))
           or ("[error]" in line and ("lua" in line or "perimeter:" in line))]
    assert not bad, bad[-10:]
