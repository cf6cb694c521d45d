"""The bypass check's asterisk-form target (``OPTIONS *``) through the real proxies: refused with
a reason on each. H4's campaign found Envoy 1.40 answering it with its own 404 and no reason (the
request never reaches a route); with the generator's fix undone the probe cannot prove the denial."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanner.probe.interface import Attempt, ProbeOptions
from tests.probe.realproxy import probe_edited, proxy_named, sub

pytestmark = [pytest.mark.nginx, pytest.mark.envoy]

OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=10, max_time=180, checks=("bypass",))
NOTE = "asterisk-form OPTIONS *"


def asterisk(attempts: tuple[Attempt, ...]) -> list[Attempt]:
    return [a for a in attempts if a.note == NOTE]


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "envoy"])
def test_options_asterisk_is_refused_with_a_reason(tmp_path: Path, name: str) -> None:
    r = probe_edited(tmp_path, proxy_named(name), OPTIONS)
    sent = asterisk(r.attempts)
    assert sent, "no OPTIONS * case"
    for a in sent:
        assert a.request_line == "OPTIONS * HTTP/1.1", a.request_line
        assert a.layer == "proxy" and a.outcome != "reached", (a.status, a.reason, a.layer)
        assert a.verdict == "proved", (a.status, a.reason, a.why)


def test_envoy_without_the_fix_leaves_it_unproven(tmp_path: Path) -> None:
    # before the fix: no local_reply mapper gave Envoy's own 404 (absolute_path_rejected) a reason
    unfixed = sub("envoy.yaml", r"value: \{default_value: 404, runtime_key", "value: {default_value: 418, runtime_key")
    r = probe_edited(tmp_path, proxy_named("envoy"), OPTIONS, unfixed)
    sent = asterisk(r.attempts)
    assert sent and all(a.status == 404 and not a.reason and a.verdict != "proved" for a in sent), \
        [(a.status, a.reason, a.verdict) for a in sent]
    assert any(f.rule == "VP011" and NOTE in str(f) for f in r.findings), [f.title for f in r.findings]
