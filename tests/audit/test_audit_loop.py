"""End to end on loopback: baseline, then no change / a grown upstream / an edited config."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from scanner.audit.metrics import LABELS
from scanner.documents import validate
from scanner.inventory.catalog import load_ref
from scanner.runtime import nginx
from scanner.standin.serve import StandinThread
from tests.audit.loop import GROWN_CATALOG, Loop, deployment, edited_config, invoke

pytestmark = pytest.mark.nginx


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Loop, ExitStack]]:
    try:
        nginx.any_build()
    except Exception as exc:  # no NGINX build at all
        pytest.skip(str(exc))
    with deployment(tmp_path_factory.mktemp("audit")) as pair:
        yield pair


def _audit(lp: Loop, *extra: str) -> tuple[int, dict[str, object], str]:
    out = lp.work / f"report-{len(list(lp.work.glob('report-*')))}.json"
    res = invoke("audit", str(lp.baseline), lp.proxy_url, *lp.key_args(),
                 "--upstream-url", lp.upstream_url, "--format", "json", "-o", str(out), "-q", "--rate", "0", "--timeout", "15", *extra,
                 env=lp.env())
    doc = json.loads(out.read_text())
    validate("audit-result", doc, str(out))   # the published schema holds
    return int(res.return_value), doc, res.output


def test_baseline_layout(loop: tuple[Loop, ExitStack]) -> None:
    lp, _ = loop
    names = {p.relative_to(lp.baseline).as_posix() for p in lp.baseline.rglob("*") if p.is_file()}
    assert {"inventory.json", "policy.yaml", "principals.yaml", "plan.json", "probe.json",
            "nginx/nginx.conf", "nginx/perimeter-http.conf"} <= names
    text = "".join((lp.baseline / n).read_text() for n in names)
    assert not any(k in text for k in lp.keys.values())


def test_a_no_change_is_clean(loop: tuple[Loop, ExitStack]) -> None:
    lp, _ = loop
    metrics = lp.work / "clean.prom"
    rc, doc, _ = _audit(lp, "--nginx-config", str(lp.nginx_main), "--metrics", str(metrics))
    summary = doc["summary"]
    assert isinstance(summary, dict)
    changes = [(c["request_line"], c["credential"], c["old"], c["new"])
               for c in doc["probe_drift"]["outcome_changes"]]  # type: ignore[index]
    assert rc == 0, (summary, doc["routes"], changes, doc["config"])
    assert summary["drift"] is False and summary["routes_added"] == 0 and summary["config_changes"] == 0
    assert summary["findings_new"] == 0 and summary["outcome_changes"] == 0
    samples = _parse_prometheus(metrics.read_text())
    assert samples[("vllm_perimeter_drift", ())] == 0


def test_b_upstream_gains_routes(loop: tuple[Loop, ExitStack]) -> None:
    lp, standin = loop
    standin.close()  # the default stand-in goes; vLLM is redeployed with every optional surface on
    standin.enter_context(StandinThread(load_ref(GROWN_CATALOG), "127.0.0.1", lp.upstream_port))
    try:
        metrics = lp.work / "grown.prom"
        rc, doc, _ = _audit(lp, "--metrics", str(metrics))
        assert rc == 1
        added = {r["path"] for r in doc["routes"] if r["change"] == "added"}  # type: ignore[union-attr]
        assert {"/collective_rpc", "/start_profile", "/sleep"} <= added
        # the proxy still denies them: drift, but no new finding
        assert doc["probe_drift"]["new_findings"] == []  # type: ignore[index]
        samples = _parse_prometheus(metrics.read_text())
        assert samples[("vllm_perimeter_drift_routes_total", (("kind", "added"),))] == len(added)
    finally:
        standin.close()
        standin.enter_context(StandinThread(load_ref("vllm-0.29.0-default"), "127.0.0.1", lp.upstream_port))


def test_c_edited_nginx_config(loop: tuple[Loop, ExitStack]) -> None:
    lp, _ = loop
    deployed = edited_config(lp, lp.work / "deployed-edited")
    rc, doc, _ = _audit(lp, "--nginx-config", str(deployed), "--check", "matrix")
    assert rc == 1
    config = doc["config"]
    assert isinstance(config, list)
    assert [(c["change"], c["directive"]) for c in config] == [("added", "location = /debug")]


def test_d_metrics_are_prometheus_text_with_bounded_labels(loop: tuple[Loop, ExitStack]) -> None:
    lp, _ = loop
    metrics = lp.work / "d.prom"
    _audit(lp, "--metrics", str(metrics), "--check", "matrix")
    text = metrics.read_text()
    samples = _parse_prometheus(text)
    names = {n for n, _ in samples}
    assert {"vllm_perimeter_findings", "vllm_perimeter_drift_routes_total", "vllm_perimeter_config_drift",
            "vllm_perimeter_audit_timestamp_seconds"} <= names
    assert {k for _, labels in samples for k, _ in labels} <= LABELS
    assert "/v1" not in text and not any(k in text for k in lp.keys.values())
    assert re.search(r'release="0\.29\.0",config_hash="[0-9a-f]{8}"', text)


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (-?[0-9.e+]+|NaN|[+-]Inf)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def _parse_prometheus(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A strict reader of the text exposition format (HELP/TYPE comments, then samples)."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    typed: set[str] = set()
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            assert kind in ("gauge", "counter") and name not in typed
            typed.add(name)
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        labels = tuple((k, v) for k, v, _ in _LABEL.findall(m.group(3) or ""))
        assert m.group(1) in typed
        out[(m.group(1), tuple(x for x in labels if x[0] in ("kind", "severity")))] = float(m.group(4))
    return out


def test_bad_input_is_one_line_exit_2(loop: tuple[Loop, ExitStack], tmp_path: Path) -> None:
    lp, _ = loop
    for baseline, expect in ((tmp_path / "missing", "no such directory"),
                             (_broken(lp, tmp_path / "b1", "inventory.json", "{not json"), "inventory"),
                             (_broken(lp, tmp_path / "b2", "probe.json", '{"schema_version": 9}'),
                              "not a probe result")):
        res = _cli_main(["audit", str(baseline), lp.proxy_url, "-q"])
        assert res[0] == 2, res
        assert len(res[1].strip().splitlines()) == 1 and expect in res[1], res[1]
    res = _cli_main(["audit", str(lp.baseline), lp.proxy_url, "--nginx-config", str(tmp_path / "nope.conf")])
    assert res[0] == 2 and "no such NGINX config" in res[1]


def _broken(lp: Loop, dest: Path, name: str, text: str) -> Path:
    import shutil

    shutil.copytree(lp.baseline, dest)
    (dest / name).write_text(text)
    return dest


def _cli_main(argv: list[str]) -> tuple[int, str]:
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "scanner.cli.main", *argv], capture_output=True, text=True,
                       timeout=60, check=False)
    return p.returncode, p.stderr


def test_evidence_pack_baseline_is_verified_first(loop: tuple[Loop, ExitStack], tmp_path: Path) -> None:
    lp, _ = loop
    key = tmp_path / "evidence.key"
    assert invoke("keys", "signing-key", "--out", str(key)).return_value in (0, None)
    b = lp.baseline
    configs = [a for f in sorted((b / "nginx").iterdir()) for a in ("--config", str(f))]
    pack = tmp_path / "pack"
    res = invoke("evidence", "build", str(pack), "--inventory", str(b / "inventory.json"), "--policy",
                 str(b / "policy.yaml"), "--plan", str(b / "plan.json"), "--probe", str(b / "probe.json"),
                 *configs, "--signing-key", str(key))
    assert res.return_value in (0, None), res.output
    out = tmp_path / "r.json"
    res = invoke("audit", str(pack), lp.proxy_url, *lp.key_args(), "--public-key", f"{key}.pub",
                 "--nginx-config", str(lp.nginx_main), "--check", "matrix", "--rate", "0", "-q",
                 "--format", "json", "-o", str(out), env=lp.env())
    doc = json.loads(out.read_text())
    assert res.return_value == 0, doc["summary"]
    assert doc["signed_by"].startswith("sha256:") and doc["summary"]["config_changes"] == 0
    (pack / "files" / "probe" / "probe.json").write_text("{}")
    rc, err = _cli_main(["audit", str(pack), lp.proxy_url, "--public-key", f"{key}.pub", "-q"])
    assert rc == 2 and "verification failed" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("fmt, marker", [("markdown", "## Config drift"), ("html", '<table class="config">'),
                                         ("table", "config drift")])
def test_writers_show_the_config_drift(loop: tuple[Loop, ExitStack], fmt: str, marker: str) -> None:
    lp, _ = loop
    deployed = lp.work / "deployed-edited" / "nginx.conf"
    if not deployed.exists():
        deployed = edited_config(lp, lp.work / "deployed-edited")
    out = lp.work / f"report.{fmt}"
    res = invoke("audit", str(lp.baseline), lp.proxy_url, *lp.key_args(), "--nginx-config", str(deployed),
                 "--check", "matrix", "--rate", "0", "-q", "--format", fmt, "-o", str(out), env=lp.env())
    text = out.read_text()
    assert res.return_value == 1 and marker in text and "location = /debug" in text
    assert not any(k in text for k in lp.keys.values())


def test_unreachable_upstream_or_target_is_exit_3(loop: tuple[Loop, ExitStack]) -> None:
    lp, _ = loop
    from scanner.net import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    rc, doc, _ = _audit(lp, "--check", "matrix", "--upstream-url", dead)
    assert rc == 3 and doc["surface_error"]
    res = invoke("audit", str(lp.baseline), dead, "-q", "--check", "matrix", "-o", str(lp.work / "dead.txt"))
    assert res.return_value == 3
