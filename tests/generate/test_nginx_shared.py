"""NGINX's config for a fleet (policy shared:, on_unavailable: deny): every limited route asks the
limiter for the plan's zones (no local limit_req / limit_conn left), the slot is released and the
reservation settled after the answer (post_action), and what NGINX cannot take is exit 2."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from scanner.errors import GenerateError
from scanner.generate.interface import GenerateOptions
from scanner.generate.nginx import NginxGenerator
from scanner.inventory.catalog import load_ref
from scanner.plan.model import Plan
from scanner.runtime import nginx
from scanner.runtime.proxy import NginxProxy
from scanner.verify import loop
from tests.limiter.fleet import CATALOG, fleet_policy, replace_shared


def _plan(tmp: Path, on_unavailable: str = "deny") -> Plan:
    tmp.mkdir(parents=True, exist_ok=True)
    return loop.setup(load_ref(CATALOG), fleet_policy(on_unavailable), tmp, 18000).plan


def _files(plan: Plan, extra: dict[str, str] | None = None) -> dict[str, str]:
    options = GenerateOptions(runtime_dir="/run/p", access_log="/run/p/a.log", error_log="/run/p/e.log",
                              extra=extra or {})
    return {f.name: f.content for f in NginxGenerator().render(plan, options).files}


def test_every_limited_route_asks_the_limiter_for_its_plan_zones(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    shared = plan.shared
    assert shared is not None
    files = _files(plan)
    http = files["perimeter-http.conf"]
    assert "limit_req " not in http and "limit_conn " not in http     # the limiter's, not local
    assert f'js_var $perimeter_limiter "{shared.limiter_url}";' in http
    # each block names its entry of perimeter_rules.shared (no spec parsed per request)
    ids = re.findall(r"set \$perimeter_shared (s\d+);", http)
    table = json.loads(files["perimeter-rules.json"])["shared"]
    want = {("a" if d.auth == "none" else "p", *shared.route_zones(d))
            for d in plan.allowed if shared.route_zones(d)}
    assert {(table[i]["by"], *table[i]["zones"]) for i in ids} == want and len(ids) >= len(plan.allowed_paths()) - 1
    assert all(e["conc"] == [z for z in e["zones"] if z.startswith("conc:")] for e in table.values())
    assert all(e["tokens"] in [z for z in e["zones"] if z.startswith("tokens:")] + [""] for e in table.values())
    # each proxying location of a limited route releases and settles after the answer
    assert http.count("post_action @perimeter_after;") >= len(ids)
    assert "location @perimeter_after {" in http and "location @perimeter_shared_503 {" in http
    njs = files["perimeter.js"]
    assert re.search(r"export default \{[^}]*\blimit, after, onward, heartbeat\};", njs)
    assert files["limiter-zones.json"] and files["ratelimit-config.yaml"]
    assert _files(plan) == files                                        # deterministic


def test_the_replica_heartbeat_only_where_njs_has_js_periodic(tmp_path: Path) -> None:
    """njs >= 0.8.1 (and an njs not named: assumed so): one replica id in a shared dict and a
    js_periodic heartbeat every HEARTBEAT_S, so the limiter keeps this NGINX's slots while it
    lives (scanner.limiter.store.Owners); njs 0.7 has neither: none written."""
    from scanner.limiter.config import HEARTBEAT_S

    tmp_path.mkdir(parents=True, exist_ok=True)
    plan = loop.setup(load_ref(CATALOG), fleet_policy("deny", tokens=False), tmp_path, 18000).plan
    beat = f"js_periodic perimeter.heartbeat interval={round(HEARTBEAT_S * 1000)}ms;"
    for njs in ("0.9.9", "0.8.1", ""):
        http = _files(plan, {"njs": njs} if njs else None)["perimeter-http.conf"]
        assert http.count(beat) == 1 and "js_shared_dict_zone zone=perimeter_replica:32k;" in http, njs
    for njs in ("0.7.9", "0.8.0"):   # js_periodic is njs 0.8.1's
        old = _files(plan, {"njs": njs})["perimeter-http.conf"]
        assert "js_periodic" not in old and "perimeter_replica" not in old, njs
    assert "perimeter_replica" not in _files(replace(plan, shared=None), {"njs": "0.9.9"})["perimeter-http.conf"]


def test_without_shared_nothing_changes(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    plain = _files(replace(plan, shared=None))
    assert "perimeter_limiter" not in plain["perimeter-http.conf"] and "limiter-zones.json" not in plain
    assert "limit_req zone=" in plain["perimeter-http.conf"]


@pytest.mark.parametrize(("change", "message"), [
    ({"limiter": ("limiter.perimeter.svc", 8081)}, "must be an IP address"),
])
def test_what_nginx_cannot_take_is_a_generate_error(tmp_path: Path, change: dict[str, object],
                                                    message: str) -> None:
    plan = replace_shared(_plan(tmp_path), **change)
    with pytest.raises(GenerateError, match=message):
        _files(plan)


def test_local_keeps_each_routes_share_for_the_limiter_undecided(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "local")
    files = _files(plan)
    http = files["perimeter-http.conf"]
    share = plan.shared.local["rate:inference:key:4/5"]   # type: ignore[union-attr]
    assert share.burst == 2 and "burst=2 nodelay;" in http                     # type: ignore[union-attr]
    assert re.search(r"location @perimeter_up_\d+_\d+_local \{\n\s+limit_req zone=perimeter_rate_\d+ burst=2 "
                     r"nodelay;\n\s+limit_conn perimeter_conn_\d+ 1;\n\s+js_content perimeter.onward;", http)
    zone = re.search(r"set \$perimeter_local_tokens (t\d+);", http)
    assert zone is not None                                                    # 2000 / 2, its bucket too
    assert json.loads(files["perimeter-rules.json"])["tokens"][zone[1]] == {"by": "principal", "cap": 1000,
                                                                          "limit": 1000}


@pytest.mark.nginx
@pytest.mark.parametrize(("which", "mode"), [("static", "deny"), ("debian", "deny"), ("static", "local")])
def test_nginx_takes_it(tmp_path: Path, which: str, mode: str) -> None:
    build = nginx.static_build() if which == "static" else nginx.debian_build()
    if build is None:
        pytest.skip(f"no {which} NGINX")
    plan = _plan(tmp_path, mode)
    if which == "debian":   # njs 0.7.9: no token budgets (js_shared_dict_zone needs 0.8): rate and slots
        plan = replace(plan, decisions=tuple(
            replace(d, limits=replace(d.limits, tokens_per_minute=None)) for d in plan.decisions))
        plan = replace_shared(plan, zones={   # type: ignore[union-attr]
            n: z for n, z in plan.shared.zones.items() if not n.startswith("tokens:")})  # type: ignore[union-attr]
    proxy = NginxProxy(build, which)
    written = proxy.write(plan, tmp_path / "proxy")
    assert proxy.validate(plan, tmp_path / "proxy") == "", written


def test_a_route_with_only_a_rate_zone_has_no_release(tmp_path: Path) -> None:
    """Nothing to give back (no slot, no reservation): no post_action on the route's proxying
    locations, so no call to the limiter after the answer; a route with a slot keeps it."""
    from scanner.policy.load import loads
    from tests.limiter.fleet import DEFAULT

    text = DEFAULT.read_text().replace("      rate: {rps: 10, burst: 20}\n      concurrency: 16\n",
                                       "      rate: {rps: 10, burst: 20}\n", 1)
    text += "\nshared:\n  redis: redis://127.0.0.1:6379/0\n  on_unavailable: deny\n"
    (tmp_path / "r").mkdir()
    plan = loop.setup(load_ref(CATALOG), loads(text), tmp_path / "r", 18000).plan
    http = _files(plan)["perimeter-http.conf"]
    blocks = {b.split("\n", 1)[0]: b for b in re.split(r"\n    location ", http)}
    seen = {False: 0, True: 0}
    for block in blocks.values():
        spec, up = re.search(r"set \$perimeter_shared s\d+;  # perimeter_rules.shared: (.+)\n", block), \
            re.search(r"set \$perimeter_up (\S+);", block)
        if spec is None or up is None:
            continue
        holds = "conc:" in spec[1] or "tokens:" in spec[1]
        named = [b for name, b in blocks.items() if name.split(" ")[0].startswith(up[1])]
        assert named and all(("post_action @perimeter_after;" in b) is holds for b in named), up[1]
        seen[holds] += 1
    assert seen[False] and seen[True]
