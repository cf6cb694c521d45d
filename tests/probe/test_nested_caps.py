"""The json caps at nested positions of a request model (Decision.cap_paths): POST
/inference/v1/generate reads n and max_tokens inside sampling_params. The limits check proves each
cap at every path it applies to (over: refused json-cap:PATH, at: let through); a config whose
nested cap a reviewer dropped by hand is caught (the over body reaches the stand-in)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanner.probe.interface import ProbeOptions
from scanner.reasons import parse
from tests.probe.realproxy import Edit, probe_edited, proxy_named, sub

OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=10, max_time=300, checks=("limits",))
GEN = "/inference/v1/generate"
SUBJECTS = (f"json-cap sampling_params.n POST {GEN}", f"json-cap sampling_params.max_tokens POST {GEN}",
            f"budget POST {GEN}")
# the nested n cap dropped from the rendered rule program (its cap step reads a field no body has;
# the plan the probe reads still has it)
WEAKENED: dict[str, Edit] = {
    "nginx": sub("perimeter-rules.json", r'"op":"cap","path":"sampling_params\.n"', '"op":"cap","path":"sampling_params.dropped"'),
    # NGINX's Lua runtime runs this route's program from perimeter.lua (not perimeter-rules.json)
    "nginx-lua": sub("perimeter.lua", r'\["op"\] = "cap", \["path"\] = "sampling_params\.n"',
                     '["op"] = "cap", ["path"] = "sampling_params.dropped"'),
    "envoy": sub("envoy.yaml", r'\["op"\] = "cap", \["path"\] = "sampling_params\.n"',
                 '["op"] = "cap", ["path"] = "sampling_params.dropped"'),
}


@pytest.mark.parametrize("name", ["nginx", "nginx-lua", "envoy"])
def test_the_nested_caps_are_proved_and_a_dropped_one_is_caught(tmp_path: Path, name: str) -> None:
    proxy = proxy_named(name)
    (tmp_path / "clean").mkdir()
    (tmp_path / "weak").mkdir()
    clean = probe_edited(tmp_path / "clean", proxy, OPTIONS)
    status = {c.subject: c.status for c in clean.coverage}
    assert clean.exit_code() == 0 and {status.get(s) for s in SUBJECTS} == {"proved"}, \
        ([(s, status.get(s)) for s in SUBJECTS], clean.findings)
    over = [a for a in clean.attempts if a.path == GEN and a.note.startswith("json cap: sampling_params.n=9 ")]
    assert over and all(a.status == 400 and parse(a.reason) == ("json-cap", "sampling_params.n") for a in over), \
        [(a.note, a.status, a.reason) for a in over]
    weak = probe_edited(tmp_path / "weak", proxy, OPTIONS, WEAKENED[name])
    assert weak.exit_code() == 1, weak.findings
    assert any(f.rule == "VP005" and f.path == GEN and "sampling_params.n" in repr(f) for f in weak.findings), \
        weak.findings
