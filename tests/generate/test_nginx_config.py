"""NGINX generator: golden files, determinism, `nginx -t` on both builds, input validation,
and the native JSON fast-path regex against Python's own reading of bodies."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path

import pytest

from scanner.errors import GenerateError, PolicyError
from scanner.generate import interface
from scanner.generate.interface import GenerateOptions
from scanner.generate.nginx import NginxGenerator
from scanner.generate.nginx_regex import json_key, uint_at_most, unsafe_body
from scanner.inventory.model import load as load_inventory
from scanner.plan.model import Plan
from scanner.policy.keys import key_sha256
from tests.generate.golden import assert_matches_golden
from tests.generate.nginx_harness import (
    BUILDS,
    GOLDEN,
    RunningNginx,
    default_policy_text,
    get_build,
    make_plan,
)

INVENTORY = GOLDEN / "inventory-vllm-0.29.0-everything.json"
GOLDEN_OPTIONS = GenerateOptions(runtime_dir="/var/lib/vllm-perimeter")
# Fixed, fake principals: hashes of public strings, never real keys.
GOLDEN_PRINCIPALS = """principals:
  - {{name: alice, role: user, key_sha256: {}}}
  - {{name: batch-svc, role: service, key_sha256: {}}}
  - {{name: ops, role: operator, key_sha256: {}}}
""".format(key_sha256("golden-alice"), key_sha256("golden-batch"), key_sha256("golden-ops"))


def golden_plan(tmp: Path) -> Plan:
    (tmp / "principals.yaml").write_text(GOLDEN_PRINCIPALS, encoding="utf-8")
    return make_plan(load_inventory(INVENTORY), default_policy_text(), tmp,
                     extra_yaml="principals_file: principals.yaml\n")


def test_golden_default_policy(tmp_path: Path) -> None:
    config = NginxGenerator().render(golden_plan(tmp_path), GOLDEN_OPTIONS)
    assert config.main == "nginx.conf"
    assert_matches_golden(config, GOLDEN / "default")
    modes = {f.name: f.mode for f in config.files}
    assert modes["perimeter-principals.conf"] == 0o600
    assert all(m == 0o644 for n, m in modes.items() if n != "perimeter-principals.conf")


def test_deterministic(tmp_path: Path) -> None:
    a = NginxGenerator().render(golden_plan(tmp_path), GOLDEN_OPTIONS)
    b = NginxGenerator().render(golden_plan(tmp_path), GOLDEN_OPTIONS)
    assert a == b


def test_registered_under_its_name() -> None:
    assert isinstance(interface.get("nginx"), NginxGenerator)
    assert interface.get("nginx").name == "nginx"


def test_no_keys_or_secrets_in_output(tmp_path: Path) -> None:
    config = NginxGenerator().render(golden_plan(tmp_path), GOLDEN_OPTIONS)
    everything = "".join(f.content for f in config.files)
    assert "golden-alice" not in everything
    hashes = [key_sha256(x) for x in ("golden-alice", "golden-batch", "golden-ops")]
    for f in config.files:
        has_hash = any(h in f.content for h in hashes)
        assert has_hash == (f.name == "perimeter-principals.conf"), f.name


def test_shape_of_the_allowlist(tmp_path: Path) -> None:
    files = {f.name: f.content for f in NginxGenerator().render(golden_plan(tmp_path), GOLDEN_OPTIONS).files}
    http = files["perimeter-http.conf"]
    # exact routes carry their URI in proxy_pass at their own location; a proxy_pass without a URI
    # (it would send the raw request target) only straight after a rewrite to the normalised path:
    # the route itself, or a template's capture of the saved $uri checked against its regex
    assert "proxy_pass http://vllm_upstream/v1/models;" in http
    bare = [m.start() for m in re.finditer(r"proxy_pass http://vllm_upstream;", http)]
    assert bare
    for at in bare:
        before = http[:at].rstrip().rsplit("\n", 2)
        rewrite = before[-1].strip()
        assert re.fullmatch(r'rewrite \^ (?:"/[A-Za-z0-9_./:~-]*"|\$perimeter_fwd) break;', rewrite), rewrite
        if rewrite.endswith("$perimeter_fwd break;"):
            assert re.fullmatch(r'if \(\$perimeter_path !~ "\^\(\?<perimeter_fwd>/[^"]*\)\\z"\) \{ return 500; \}',
                                before[-2].strip()), before[-2]
    assert not re.search(r"proxy_pass [^;]*\$", http), "no variables in proxy_pass"
    assert "location = /invocations" not in http and "location = /collective_rpc" not in http
    assert "limit_except" not in http
    # \z, not $: PCRE's $ also matches before a final newline (a trailing %0A in the path)
    assert 'location ~ "^/v1/responses/(?:[A-Za-z0-9_][A-Za-z0-9_.:~-]{0,255})\\z"' in http
    assert not re.search(r'location ~ "[^"]*\$"', http)
    # an `if` in a location holds nothing but `return` or `rewrite ... last`; at server level
    # (h2c, gRPC) it may set the reason first
    ifs = re.findall(r"\n( *)if \([^\n]*\) \{ ([^\n]*) \}(?=\n)", http)
    assert len(ifs) == http.count(" if (") > 0
    for indent, body in ifs:
        server = r"|set \$perimeter_reason [a-z-]+; return \d{3};" if indent == "    " else ""
        assert re.fullmatch(r"return \d{3};|rewrite \^ /@perimeter/[a-z0-9/]+ last;" + server, body), body
    assert 'if ($content_type ~* "^application/grpc") { set $perimeter_reason grpc; return 415; }' in http
    # every proxying location sends the shared header set: only listed client headers pass on
    proxy = files["perimeter-proxy.conf"]
    assert "proxy_pass_request_headers off;" in proxy
    assert "proxy_set_header Content-Type $content_type;" in proxy
    assert "Authorization" not in proxy.replace("the client's Authorization", "")
    assert http.count('include "perimeter-proxy.conf";') == http.count("proxy_pass ") > 0
    assert "proxy_hide_header X-Perimeter-Decision;" in http


@pytest.mark.nginx
@pytest.mark.parametrize("build_name", sorted(BUILDS))
def test_nginx_t_default_policy(tmp_path: Path, build_name: str) -> None:
    build = get_build(build_name)
    plan = golden_plan(tmp_path)
    result = RunningNginx(build, plan, tmp_path / "n").test_config()
    assert result.returncode == 0, result.stderr


@pytest.mark.nginx
@pytest.mark.parametrize("build_name", sorted(BUILDS))
def test_nginx_t_tls_trusted_proxies_strip(tmp_path: Path, build_name: str) -> None:
    from tests.generate.certs import CertAuthority

    build = get_build(build_name)
    ca = CertAuthority(tmp_path)
    server = ca.issue("perimeter", dns=("localhost",), ips=("127.0.0.1",))
    client = ca.issue("perimeter-client", client=True)
    extra = (
        "principals_file: principals.yaml\n"
        "trusted_proxies: [10.0.0.0/8, '::1/128']\n"
        "body: {cache_salt: strip, chat_template: pass}\n"
        f"listen: {{address: '::1', port: 8443, tls: {{cert: {server.cert}, key: {server.key}}}}}\n"
        f"upstream: {{host: 127.0.0.1, port: 8000, tls: {{ca: {ca.pair.cert}, client_cert: {client.cert}, "
        f"client_key: {client.key}, server_name: vllm.internal}}}}\n"
    )
    (tmp_path / "principals.yaml").write_text(GOLDEN_PRINCIPALS, encoding="utf-8")
    text = default_policy_text().replace("body:\n  cache_salt: reject", "body_was:\n  cache_salt: reject")
    text = re.sub(r"\nbody_was:\n(  .*\n)+", "\n", text)
    text = re.sub(r"  - \{path: /v1/realtime, audience: none[^}]*\}", "  - {path: /v1/realtime, audience: inference}",
                  text)
    plan = make_plan(load_inventory(INVENTORY), text, tmp_path, extra_yaml=extra)
    assert plan.body.cache_salt == "strip"
    run = RunningNginx(build, plan, tmp_path / "n")
    result = run.test_config()
    assert result.returncode == 0, result.stderr
    http = (tmp_path / "n" / "conf" / "perimeter-http.conf").read_text()
    assert "listen [::1]:8443 ssl;" in http
    assert "proxy_ssl_verify on;" in http and "proxy_ssl_name vllm.internal;" in http
    assert "proxy_pass https://vllm_upstream/v1/models;" in http and "http://vllm_upstream" not in http
    assert "proxy_set_body $perimeter_body_out;" in http
    assert "set_real_ip_from 10.0.0.0/8;" in http
    realtime = http[http.index("location = /v1/realtime {"):]
    realtime = realtime[:realtime.index("\n    }")]
    assert 'proxy_set_header Connection "upgrade";' in realtime and "js_content" not in realtime


# --- validation ---------------------------------------------------------------------------

def _plan_with(tmp: Path, extra: str, principals: str = GOLDEN_PRINCIPALS) -> Plan:
    (tmp / "principals.yaml").write_text(principals, encoding="utf-8")
    return make_plan(load_inventory(INVENTORY), default_policy_text(), tmp,
                     extra_yaml="principals_file: principals.yaml\n" + extra)


def test_rejects_unsafe_names_and_options(tmp_path: Path) -> None:
    bad = GOLDEN_PRINCIPALS.replace("name: alice", 'name: "ali ce$x"')
    with pytest.raises(PolicyError, match="use letters, digits"):   # the loader's rule first
        _plan_with(tmp_path, "", bad)
    good = _plan_with(tmp_path, "")
    unsafe = dataclasses.replace(good, principals=tuple(
        dataclasses.replace(p, name="ali ce$x") if p.name == "alice" else p for p in good.principals))
    with pytest.raises(GenerateError, match="not a safe name"):     # and the generator's, still
        NginxGenerator().render(unsafe, GOLDEN_OPTIONS)
    dup = GOLDEN_PRINCIPALS.replace(key_sha256("golden-ops"), key_sha256("golden-alice"))
    with pytest.raises(GenerateError, match="share one key"):
        NginxGenerator().render(_plan_with(tmp_path, "", dup), GOLDEN_OPTIONS)
    plan = _plan_with(tmp_path, "")
    with pytest.raises(GenerateError, match="unknown option"):
        NginxGenerator().render(plan, GenerateOptions(extra={"bogus": "1"}))
    with pytest.raises(GenerateError, match="runtime_dir"):
        NginxGenerator().render(plan, GenerateOptions(runtime_dir='/tmp/x"; evil'))


# --- the native fast path -----------------------------------------------------------------

@pytest.mark.parametrize("cap", [0, 1, 4, 9, 10, 20, 99, 100, 4096, 8192, 65535])
def test_uint_at_most(cap: int) -> None:
    rx = re.compile("^" + uint_at_most(cap) + "$")
    for n in range(0, cap * 2 + 120):
        assert bool(rx.match(str(n))) == (n <= cap), n
    assert not rx.match("0" + str(max(cap, 1)))
    assert not rx.match("-1") and not rx.match("1.0")


def test_json_key_matches_every_spelling() -> None:
    rx = re.compile(json_key("max_tokens").replace(r"\x22", '"').replace(r"\x5c", r"\\"))
    for spelled in ('"max_tokens"', '"m\\u0061x_tokens"', '"\\u006D\\u0061\\u0078\\u005f\\u0074okens"'):
        assert json.loads(spelled) == "max_tokens"
        assert rx.fullmatch(spelled), spelled
    assert not rx.fullmatch('"max_tokens_x"')


def _python_verdict(body: str, caps: dict[str, int], forbidden: tuple[str, ...]) -> bool:
    """True when the body is fine as Python's json (last duplicate wins) reads it."""
    try:
        obj = json.loads(body)
    except ValueError:
        return True  # vLLM rejects it too; the fast path need not
    if not isinstance(obj, dict):
        return True
    if any(f in obj for f in forbidden):
        return False
    for name, cap in caps.items():
        v = obj.get(name)
        if v is None:
            continue
        if isinstance(v, bool):
            v = int(v)
        if isinstance(v, str):
            return False  # the fast path sends every string to the exact check
        if not isinstance(v, int | float) or v > cap:
            return False
    return True


def _random_body(rng: random.Random) -> str:
    names = ["max_tokens", "n", "model", "messages", "cache_salt", "max_tokensx", "logprobs"]
    values: list[object] = [0, 1, 4, 5, 4096, 4097, 10**9, 4096.0, 1e9, "5000", "1", None, True,
                            False, [1], {"max_tokens": 99999}, "x" * 5, -3]
    parts = []
    for _ in range(rng.randint(0, 6)):
        name = rng.choice(names)
        if rng.random() < 0.2:
            name = "".join(f"\\u{ord(c):04x}" if rng.random() < 0.5 else c for c in name)
        val = json.dumps(rng.choice(values))
        ws = rng.choice(["", " ", "\n", "\t "])
        parts.append(f'"{name}"{ws}:{ws}{val}{ws}')
    return "{" + ",".join(parts) + "}"


def test_fast_path_is_sound_against_python_json() -> None:
    caps = {"max_tokens": 4096, "n": 4, "logprobs": 20}
    forbidden = ("cache_salt",)
    rx = re.compile(unsafe_body(caps, forbidden).replace(r"\x22", '"').replace(r"\x5c", r"\\"))
    rng = random.Random(1234)
    cleared = 0
    for _ in range(4000):
        body = _random_body(rng)
        if not rx.search(body):
            cleared += 1
            assert _python_verdict(body, caps, forbidden), body
    assert cleared > 300  # the fast path does clear ordinary bodies
