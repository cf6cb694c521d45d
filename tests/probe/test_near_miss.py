"""The near-miss check (scanner/probe/checks/near_miss.py) on the real proxies: the generated configs
of NGINX 1.31 (njs), NGINX 1.22 with its Lua runtime and Envoy 1.40 refuse every near-miss form of
every key (exit 0, each key audience proved, no form's value in the JSON report); the key check
weakened by hand, so that the bearer's sha256 hex passes for its own digest (pass-the-hash) or only
the first len(key) characters are hashed (a prefix compare: the key with another tail admits),
fails the probe (exit 1, VP001 findings of the check)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scanner.inventory.catalog import load_ref
from scanner.plan.inputs import load_policy
from scanner.plan.model import Plan
from scanner.policy.keys import new_key
from scanner.probe import key_forms
from scanner.probe.interface import Credential, ProbeOptions, ProbeResult
from scanner.report import probe_json
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.probe.realproxy import proxy_named, unpaced

pytestmark = [pytest.mark.nginx, pytest.mark.envoy]

CATALOG = "vllm-0.29.0-default"
CHECK = "near-miss"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=10, max_time=120, checks=(CHECK,))
PROXIES = ("nginx", "nginx-lua", "envoy")
KEY_LEN = len(new_key())   # every key verify makes: "vp_" + 43 characters
JS, LUA, ENVOY = "perimeter.js", "perimeter.lua", "envoy.yaml"

Edit = Callable[[Path], None]


def text(name: str, old: str, new: str) -> Edit:
    """A reviewer's hand edit: the one literal ``old`` in the written file ``name`` made ``new``."""
    def edit(conf: Path) -> None:
        f = conf / name
        before = f.read_text()
        assert before.count(old) == 1, (name, old)
        f.write_text(before.replace(old, new))
    return edit


@dataclass(frozen=True)
class Run:
    result: ProbeResult
    plan: Plan
    credentials: tuple[Credential, ...]


def probed(tmp_path: Path, name: str, edit: Edit | None = None) -> Run:
    """The bundled policy's config for proxy ``name`` (edited by ``edit``), started in front of the
    stand-in and probed with the near-miss check alone."""
    proxy, inventory = proxy_named(name), load_ref(CATALOG)
    directory = tmp_path / "proxy"

    def written(plan: Plan) -> None:   # again on another port, when the proxy's was taken
        files = proxy.write(plan, directory)
        if edit is not None:
            edit(files)

    with StandinThread(inventory, "127.0.0.1", 0) as standin:
        s = loop.setup(inventory, unpaced(load_policy(None)), tmp_path, standin.port)
        written(s.plan)
        result = loop.proxy_run(s, proxy, directory, OPTIONS, standin.url, written).result
    return Run(result, s.plan, s.credentials)


# --- the hand weakenings (the generated text as it is written; each edit must change it) ----------

# pass-the-hash: a bearer of 64 hex digits is taken as its own digest
PASS_THE_HASH: dict[str, Edit] = {
    "nginx": text(JS, "    return key ? crypto.createHash('sha256')",
                  "    if (/^[0-9a-fA-F]{64}$/.test(key)) {\n        return key;\n    }\n"
                  "    return key ? crypto.createHash('sha256')"),
    "nginx-lua": text(LUA, '  return (bearer == nil or bearer == "") and "" or key_hash(bearer)',
                      '  if bearer ~= nil and #bearer == 64 and match(bearer, "^%x+$") then\n'
                      '    return lower(bearer)\n  end\n'
                      '  return (bearer == nil or bearer == "") and "" or key_hash(bearer)'),
    "envoy": text(ENVOY, "found = PRINCIPALS[sha256_hex(key)] or false",
                  "found = PRINCIPALS[sha256_hex(key)] or PRINCIPALS[lower(key)] or false"),
}

# a prefix compare: only the key's length of the bearer is hashed (a pasted key's trailing newline
# or garbage "tolerated"); the real key still admits, and so does the key with another tail
PREFIX: dict[str, Edit] = {
    "nginx": text(JS, "crypto.createHash('sha256').update(key).digest('hex') : '';",
                  f"crypto.createHash('sha256').update(key.slice(0, {KEY_LEN})).digest('hex') : '';"),
    "nginx-lua": text(LUA, 'and "" or key_hash(bearer)', f'and "" or key_hash(sub(bearer, 1, {KEY_LEN}))'),
    "envoy": text(ENVOY, "found = PRINCIPALS[sha256_hex(key)] or false",
                  f"found = PRINCIPALS[sha256_hex(key:sub(1, {KEY_LEN}))] or false"),
}


def form_values(run: Run) -> list[str]:
    """Every near-miss value the check derived from the run's keys (as it does: the plan's
    principals' names and digests)."""
    real = {p.key_sha256 for p in run.plan.principals}
    names = {p.key_sha256: p.name for p in run.plan.principals}
    out = []
    for c in run.credentials:
        if c.kind == "role":
            principal = names[hashlib.sha256(c.secret.encode()).hexdigest()]
            out += [f.value for f in key_forms.forms(c.secret, principal, real)]
    return out


@pytest.fixture(scope="module", params=PROXIES)
def unmodified(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """One probe of the unmodified config per proxy, shared by the tests that read it."""
    yield probed(tmp_path_factory.mktemp(request.param), request.param)


def test_the_generated_config_refuses_every_near_miss(unmodified: Run) -> None:
    res = unmodified.result
    assert res.deviations == (), [(f.rule, f.title, f.detail) for f in res.deviations]
    assert res.exit_code() == 0
    cov = {c.subject.split(" via ")[0]: c for c in res.coverage if c.check == CHECK}
    # each subject names the one route its forms went to (never the audience's every route)
    assert all(c.subject.endswith(f" via {c.method} {c.path}") for c in cov.values()), list(cov)
    assert set(cov) == {"near-miss keys inference", "near-miss keys service", "near-miss keys operator"}
    assert {c.status for c in cov.values()} == {"proved"}, cov
    sent = [a for a in res.attempts if a.check == CHECK and a.verdict == "proved"]
    # every form of every key (3 roles, 10 forms) on each of the 3 audiences' routes, each 401
    # unknown-key from the proxy
    assert len({(a.credential, a.path) for a in sent}) == 3 * 3 * len(key_forms.NAMES)
    assert {(a.status, a.reason, a.layer) for a in sent} == {(401, "unknown-key", "proxy")}


def test_the_report_names_each_form_and_holds_no_value(unmodified: Run) -> None:
    doc = probe_json.render(unmodified.result)
    values = form_values(unmodified)
    assert len(values) == 3 * len(key_forms.NAMES)
    leaked = [i for i, v in enumerate(values) if v in doc]
    assert not leaked, f"form values #{leaked} are in the JSON report"
    assert not [c.label for c in unmodified.credentials if c.secret and c.secret in doc]
    for name in key_forms.NAMES:
        assert f'"{name} of role:user"' in doc, name


@pytest.mark.parametrize("proxy", PROXIES)
@pytest.mark.parametrize("weakening", ["pass-the-hash", "prefix"])
def test_a_weakened_key_check_fails_the_probe(tmp_path: Path, proxy: str, weakening: str) -> None:
    edit = (PASS_THE_HASH if weakening == "pass-the-hash" else PREFIX)[proxy]
    res = probed(tmp_path, proxy, edit).result
    found = [f for f in res.deviations if f.check == CHECK]
    assert found and {f.rule for f in found} == {"VP001"}, [(f.rule, f.title) for f in res.deviations]
    assert res.exit_code() == 1
    failed = {a.credential.partition(" of ")[0] for a in res.attempts
              if a.check == CHECK and a.verdict == "failed"}
    # the forms that weakening admits, and only those (the others still refused as unknown keys)
    want = {"sha256-hex", "upper-case sha256-hex"} if weakening == "pass-the-hash" else \
        {"one character appended", "doubled"}
    assert failed == want, failed
    cov = {c.subject: c.status for c in res.coverage if c.check == CHECK}
    assert set(cov.values()) == {"failed"}, cov
