"""Kubernetes bundle (`generate nginx|envoy --kubernetes`): every manifest against the Kubernetes
API's own schemas offline (kubernetes-validate, strict: unknown fields, types, required fields)
plus the cross-references the API server and kubelet check (volumes, ports, selectors); the
config in the ConfigMap + Secret under `nginx -t` and `envoy --mode validate`; secrets only in the
Secret; NetworkPolicies; determinism; the CLI."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from scanner.errors import GenerateError
from scanner.generate import kubernetes as k8s
from scanner.generate.interface import GeneratedConfig, GenerateOptions, get
from scanner.generate.nginx_model import RULES
from scanner.inventory.catalog import load_ref
from scanner.netscan.ports import KNOWN_PORTS
from scanner.plan.model import Plan
from scanner.policy.keys import key_sha256
from scanner.policy.load import loads
from scanner.policy.model import Policy
from tests.generate.nginx_harness import BUILDS, REPO, default_policy_text, get_build
from tests.generate.test_envoy_harness import envoy_binary

try:
    import kubernetes_validate
except ImportError:  # a dev dependency (pyproject [dev]); CI installs it
    if os.environ.get("CI"):
        raise
    pytest.skip("kubernetes-validate is not installed (pip install -e '.[dev]')", allow_module_level=True)

CATALOG = "vllm-0.29.0-default"
SCHEMA_VERSIONS = ("1.27", kubernetes_validate.latest_version())   # CronJob timeZone is GA from 1.27
UPSTREAM = "upstream: {host: 10.96.0.10, port: 8000}\n"          # vLLM's Service (a ClusterIP)
PRINCIPALS = """principals:
  - {{name: alice, role: user, key_sha256: {}}}
  - {{name: batch-svc, role: service, key_sha256: {}}}
  - {{name: ops, role: operator, key_sha256: {}}}
""".format(key_sha256("k8s-alice"), key_sha256("k8s-batch"), key_sha256("k8s-ops"))
HASHES = tuple(key_sha256(k) for k in ("k8s-alice", "k8s-batch", "k8s-ops"))
UPSTREAM_KEY = "sk-upstream-k8s-test-0123456789"   # a throwaway key for the api_key_file cases
PORTS = """ports:
  allow:
    - {port: 8080, networks: [admin, monitoring]}
    - {port: 8000, networks: [admin]}
    - {port: 29500, networks: [admin]}
    - {port: 5600, networks: [admin]}
"""


# --- building bundles -------------------------------------------------------------------------


def policy(tmp: Path, extra: str = UPSTREAM) -> Policy:
    (tmp / "principals.yaml").write_text(PRINCIPALS, encoding="utf-8")
    return loads(default_policy_text() + "\nprincipals_file: principals.yaml\n" + extra,
                 source="k8s-policy.yaml", base_dir=tmp)


def plan_of(pol: Policy) -> Plan:
    from scanner.plan.build import build

    return build(load_ref(CATALOG), pol)


def render(proxy: str, pol: Policy, settings: k8s.Settings | None = None,
           options: GenerateOptions | None = None) -> tuple[GeneratedConfig, k8s.Bundle]:
    plan = plan_of(pol)
    opts = k8s.proxy_options(proxy, options or GenerateOptions())
    config = get(proxy).render(plan, opts)
    internal = [(k.port, k.name) for k in KNOWN_PORTS if k.internal]
    return config, k8s.render(plan, config, opts, pol.ports, settings or k8s.Settings(namespace="llm"), internal)


def docs(bundle: k8s.Bundle) -> dict[str, dict[str, Any]]:
    """file name (without kubernetes/) -> the manifest, as kubectl would read it."""
    out = {}
    for f in bundle.files:
        assert f.name.startswith("kubernetes/")
        loaded = list(yaml.safe_load_all(f.content))
        assert len(loaded) == 1, f.name
        out[f.name.removeprefix("kubernetes/")] = loaded[0]
    return out


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return doc["spec"]["template"]["spec"]


def secret_data(doc: dict[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in doc["data"].items()}


# --- the offline validator --------------------------------------------------------------------

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
IANA_SVC_NAME = re.compile(r"^(?=.{1,15}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
NAME_RULES = {"Service": DNS_LABEL, "NetworkPolicy": DNS_SUBDOMAIN, "Deployment": DNS_SUBDOMAIN,
              "ConfigMap": DNS_SUBDOMAIN, "Secret": DNS_SUBDOMAIN, "CronJob": DNS_SUBDOMAIN,
              "PodDisruptionBudget": DNS_SUBDOMAIN}


def validate(doc: dict[str, Any]) -> list[str]:
    """Problems with one manifest: the API's JSON schema (strict) for each supported version, then
    what the API server validates beyond the schema for the fields these manifests use."""
    problems = []
    for version in SCHEMA_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{version}: {'.'.join(map(str, exc.path))}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"{version}: {exc.message}")
    if problems:
        return problems
    meta, kind = doc["metadata"], doc["kind"]
    if not NAME_RULES[kind].match(meta["name"]) or (kind == "CronJob" and len(meta["name"]) > 52):
        problems.append(f"metadata.name {meta['name']!r} is not valid for a {kind}")
    if not DNS_LABEL.match(meta.get("namespace", "default")):
        problems.append(f"metadata.namespace {meta.get('namespace')!r}")
    for where, lab in _label_maps(doc):
        for key, value in lab.items():
            if not LABEL_VALUE.match(value) or not re.match(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
                                                          key):
                problems.append(f"{where}: label {key}={value!r}")
    if kind in ("Deployment", "CronJob"):
        problems += _pod_problems(pod_spec(doc))
    if kind == "Deployment":
        selector = doc["spec"]["selector"]["matchLabels"]
        template = doc["spec"]["template"]["metadata"]["labels"]
        if any(template.get(k) != v for k, v in selector.items()):
            problems.append("spec.selector does not match the template's labels")
    if kind == "ConfigMap":
        problems += [f"data key {k!r}" for k in doc["data"] if not re.match(r"^[-._a-zA-Z0-9]+$", k)]
    if kind == "Secret":
        for k, v in doc["data"].items():
            if not re.match(r"^[-._a-zA-Z0-9]+$", k):
                problems.append(f"data key {k!r}")
            try:
                base64.b64decode(v, validate=True)
            except ValueError:
                problems.append(f"data {k!r} is not base64")
    return problems


def _label_maps(doc: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    out = [("metadata.labels", doc["metadata"].get("labels", {}))]
    spec = doc.get("spec", {})
    if doc["kind"] == "Deployment":
        out.append(("spec.selector", spec["selector"]["matchLabels"]))
        out.append(("template", spec["template"]["metadata"]["labels"]))
    if doc["kind"] == "NetworkPolicy":
        out.append(("spec.podSelector", spec["podSelector"].get("matchLabels", {})))
        for rule in spec.get("ingress", []):
            for peer in rule.get("from", []):
                for sel in ("podSelector", "namespaceSelector"):
                    if sel in peer:
                        out.append((f"ingress {sel}", peer[sel].get("matchLabels", {})))
    return out


def _pod_problems(spec: dict[str, Any]) -> list[str]:
    problems = []
    volumes = [v["name"] for v in spec.get("volumes", [])]
    if len(volumes) != len(set(volumes)):
        problems.append(f"duplicate volume names {volumes}")
    for v in spec.get("volumes", []):
        if not DNS_LABEL.match(v["name"]):
            problems.append(f"volume name {v['name']!r}")
        for source in v.get("projected", {}).get("sources", []):
            for item in next(iter(source.values())).get("items", []):
                if item["path"].startswith("/") or ".." in item["path"].split("/"):
                    problems.append(f"projected path {item['path']!r}")
    for c in spec["containers"]:
        mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
        if len(mounts) != len(set(mounts)):
            problems.append(f"{c['name']}: duplicate mount paths")
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                problems.append(f"{c['name']}: volumeMount {m['name']!r} names no volume")
            if not m["mountPath"].startswith("/"):
                problems.append(f"{c['name']}: mountPath {m['mountPath']!r} is not absolute")
        ports = {p.get("name") for p in c.get("ports", [])}
        for p in c.get("ports", []):
            if "name" in p and not IANA_SVC_NAME.match(p["name"]):
                problems.append(f"{c['name']}: port name {p['name']!r}")
        for probe in ("readinessProbe", "livenessProbe"):
            port = c.get(probe, {}).get("tcpSocket", {}).get("port")
            if isinstance(port, str) and port not in ports:
                problems.append(f"{c['name']}: {probe} names port {port!r} the container does not have")
        for mode_holder in _modes(spec):
            if not 0 <= mode_holder <= 0o777:
                problems.append(f"file mode {mode_holder} out of range")
    return problems


def _modes(spec: dict[str, Any]) -> list[int]:
    out = []
    for v in spec.get("volumes", []):
        for kind in ("secret", "configMap", "projected"):
            if kind in v:
                out += [v[kind][m] for m in ("defaultMode",) if m in v[kind]]
                for source in v[kind].get("sources", []):
                    out += [i["mode"] for i in next(iter(source.values())).get("items", []) if "mode" in i]
    return out


def assert_valid(bundle: k8s.Bundle) -> None:
    for name, doc in docs(bundle).items():
        assert validate(doc) == [], name


# --- the validator itself can fail ------------------------------------------------------------


def test_validator_rejects_misspelt_fields_wrong_types_and_dangling_references(tmp_path: Path) -> None:
    _, bundle = render("nginx", policy(tmp_path))
    deployment = docs(bundle)["deployment.yaml"]
    assert validate(deployment) == []

    misspelt = yaml.safe_load(yaml.safe_dump(deployment))
    misspelt["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    assert any("imagePullPolicyy" in p for p in validate(misspelt))

    wrong_type = yaml.safe_load(yaml.safe_dump(deployment))
    wrong_type["spec"]["replicas"] = "2"
    assert any("spec.replicas" in p and "not of type 'integer'" in p for p in validate(wrong_type))

    missing = yaml.safe_load(yaml.safe_dump(deployment))
    del missing["spec"]["template"]["spec"]["containers"][0]["name"]
    assert any("'name' is a required property" in p for p in validate(missing))

    dangling = yaml.safe_load(yaml.safe_dump(deployment))
    dangling["spec"]["template"]["spec"]["volumes"][0]["name"] = "other"
    assert any("names no volume" in p for p in validate(dangling))

    policy_doc = yaml.safe_load(yaml.safe_dump(docs(bundle)["networkpolicy-vllm.yaml"]))
    policy_doc["spec"]["ingress"][0]["ports"][0]["port"] = 8000.5
    assert validate(policy_doc) != []
    bad_label = yaml.safe_load(yaml.safe_dump(docs(bundle)["service.yaml"]))
    bad_label["metadata"]["labels"]["x"] = "-not valid"
    assert any("label x" in p for p in validate(bad_label))


# --- the bundle -------------------------------------------------------------------------------

FILES = {"configmap.yaml", "secret.yaml", "deployment.yaml", "service.yaml", "networkpolicy-vllm.yaml",
         "networkpolicy-proxy.yaml", "cronjob-audit.yaml"}


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_bundle_is_valid_and_complete(tmp_path: Path, proxy: str) -> None:
    config, bundle = render(proxy, policy(tmp_path))
    assert {f.name.removeprefix("kubernetes/") for f in bundle.files} == FILES
    modes = {f.name: f.mode for f in bundle.files}
    assert modes.pop("kubernetes/secret.yaml") == 0o600
    assert set(modes.values()) == {0o644}
    assert_valid(bundle)
    d = docs(bundle)
    assert {doc["metadata"]["namespace"] for doc in d.values()} == {"llm"}
    # the ConfigMap holds exactly the non-secret files, byte for byte; the Secret the 0600 ones
    plain = {f.name: f.content for f in config.files if f.mode == 0o644}
    secret = {f.name: f.content for f in config.files if f.mode == 0o600}
    assert d["configmap.yaml"]["data"] == plain
    assert secret_data(d["secret.yaml"]) == secret
    key_file = "perimeter-principals.conf" if proxy == "nginx" else "envoy-principals.tsv"
    assert set(secret) == {key_file}
    assert all(h in secret[key_file] for h in HASHES)


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_deterministic(tmp_path: Path, proxy: str) -> None:
    a = render(proxy, policy(tmp_path))
    b = render(proxy, policy(tmp_path))
    assert a == b


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_no_secret_outside_the_secret(tmp_path: Path, proxy: str) -> None:
    (tmp_path / "vllm-api-key").write_text(UPSTREAM_KEY + "\n")
    os.chmod(tmp_path / "vllm-api-key", 0o600)
    pol = policy(tmp_path, f"upstream: {{host: 10.96.0.10, port: 8000, api_key_file: {tmp_path / 'vllm-api-key'}}}\n")
    _, bundle = render(proxy, pol)
    for f in bundle.files:
        assert UPSTREAM_KEY not in f.content, f.name
        has_hash = any(h in f.content for h in HASHES)
        assert not has_hash, f.name   # hashes only base64-encoded in the Secret
    d = docs(bundle)
    assert not any(h in str(d["configmap.yaml"]) for h in HASHES)
    data = secret_data(d["secret.yaml"])
    assert any(UPSTREAM_KEY in v for v in data.values())
    assert all(h in "".join(data.values()) for h in HASHES)
    if proxy == "envoy":   # Lua reads the policy's file: the Secret puts it there
        assert data[k8s.UPSTREAM_KEY_ITEM] == UPSTREAM_KEY + "\n"
        container = pod_spec(d["deployment.yaml"])["containers"][0]
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(tmp_path / "vllm-api-key"))
        assert mount["subPath"] == k8s.UPSTREAM_KEY_ITEM and mount["readOnly"]
    else:                  # NGINX: the generated include holds it
        assert set(data) == {"perimeter-principals.conf", "perimeter-upstream-key.conf"}
    assert_valid(bundle)


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_deployment_runs_the_config_from_its_mounts(tmp_path: Path, proxy: str) -> None:
    config, bundle = render(proxy, policy(tmp_path))
    d = docs(bundle)
    spec = pod_spec(d["deployment.yaml"])
    container = spec["containers"][0]
    argv = container["command"] + container["args"]
    assert argv[argv.index("-c") + 1] == f"{k8s.CONFIG_DIR}/{config.main}"
    config_mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert config_mount == {"name": "config", "mountPath": k8s.CONFIG_DIR, "readOnly": True}
    projected = next(v for v in spec["volumes"] if v["name"] == "config")["projected"]["sources"]
    paths = {i["path"] for s in projected for i in next(iter(s.values()))["items"]}
    assert paths == {f.name for f in config.files}
    # every file the config opens by absolute path is under the mount (NGINX's rule programs too)
    text = "\n".join(f.content for f in config.files)
    for name in (f.name for f in config.files if f.name != config.main):
        if proxy == "nginx" or name.endswith(".tsv"):
            assert f"{k8s.CONFIG_DIR}/{name}" in text, name
    if proxy == "nginx":
        assert RULES in paths
    # hardened pod
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert container["readinessProbe"]["tcpSocket"]["port"] == "http"
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    if proxy == "nginx":   # the runtime dir is the only writable path
        assert {"name": "run", "mountPath": "/var/lib/vllm-perimeter"} in container["volumeMounts"]
        assert {"name": "run", "emptyDir": {}} in spec["volumes"]
        assert 'load_module "/usr/lib/nginx/modules/ngx_http_js_module.so";' in config.files[0].content
    service = d["service.yaml"]["spec"]
    assert service["selector"] == d["deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
    assert service["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]


def test_changed_config_rolls_the_pods(tmp_path: Path) -> None:
    def digest(bundle: k8s.Bundle) -> str:
        meta = docs(bundle)["deployment.yaml"]["spec"]["template"]["metadata"]
        return meta["annotations"]["vllm-perimeter/config-digest"]

    _, base = render("nginx", policy(tmp_path))
    assert re.match(r"^sha256:[0-9a-f]{64}$", digest(base))
    # the same policy with one more principal
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "principals.yaml").write_text(
        PRINCIPALS + f"  - {{name: bob, role: user, key_sha256: {key_sha256('k8s-bob')}}}\n")
    more = loads(default_policy_text() + "\nprincipals_file: principals.yaml\n" + UPSTREAM,
                 source="k8s-policy.yaml", base_dir=tmp_path / "more")
    _, rotated = render("nginx", more)
    assert digest(rotated) != digest(base)
    _, again = render("nginx", policy(tmp_path))
    assert digest(again) == digest(base)


def test_vllm_network_policy_admits_only_the_proxy_to_the_api_port(tmp_path: Path) -> None:
    _, bundle = render("nginx", policy(tmp_path))   # no ports: section
    d = docs(bundle)
    proxy_labels = d["deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
    spec = d["networkpolicy-vllm.yaml"]["spec"]
    assert spec["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "vllm"}}
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["ingress"] == [{
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "llm"}},
                  "podSelector": {"matchLabels": proxy_labels}}],
        "ports": [{"protocol": "TCP", "port": 8000}]}]
    # the audit's pods are not the proxy's
    audit_labels = d["cronjob-audit.yaml"]["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    assert audit_labels["app.kubernetes.io/component"] == "audit" and audit_labels != proxy_labels
    header = next(f.content for f in bundle.files if f.name.endswith("networkpolicy-vllm.yaml"))
    assert "29500 torch-master" in header and "8265 ray-dashboard" in header


def test_internal_ports_from_the_policy_only_between_vllm_pods(tmp_path: Path) -> None:
    settings = k8s.Settings(namespace="edge", vllm_namespace="llm",
                            vllm_selector=k8s.parse_selector(["app=vllm,tier=engine"]))
    _, bundle = render("envoy", policy(tmp_path, UPSTREAM + PORTS), settings)
    assert_valid(bundle)
    vllm = docs(bundle)["networkpolicy-vllm.yaml"]
    assert vllm["metadata"]["namespace"] == "llm"
    spec = vllm["spec"]
    assert spec["podSelector"] == {"matchLabels": {"app": "vllm", "tier": "engine"}}
    api, peers = spec["ingress"]
    assert api["ports"] == [{"protocol": "TCP", "port": 8000}]   # ports: allows 8000 from admin: ignored
    assert api["from"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "edge"}}
    assert peers == {"from": [{"podSelector": {"matchLabels": {"app": "vllm", "tier": "engine"}}}],
                     "ports": [{"protocol": "TCP", "port": 5600}, {"protocol": "TCP", "port": 29500}]}
    assert not any("ipBlock" in p for rule in spec["ingress"] for p in rule["from"])


def test_replicas_each_port_admitted_each_host_checked(tmp_path: Path) -> None:
    servers = "upstream: {servers: [vllm-0.vllm.llm.svc.cluster.local:8000, 10.96.0.11:8001]}\n"
    _, bundle = render("nginx", policy(tmp_path, servers + PORTS))
    assert_valid(bundle)
    api, peers = docs(bundle)["networkpolicy-vllm.yaml"]["spec"]["ingress"]
    assert api["ports"] == [{"protocol": "TCP", "port": 8000}, {"protocol": "TCP", "port": 8001}]
    assert peers["ports"] == [{"protocol": "TCP", "port": 5600}, {"protocol": "TCP", "port": 29500}]
    with pytest.raises(GenerateError, match=re.escape("upstream.host 127.0.0.1 is the proxy pod itself")):
        render("nginx", policy(tmp_path, "upstream: {servers: [10.96.0.11:8000, 127.0.0.1:8000]}\n"))


def test_proxy_network_policy_ip_blocks(tmp_path: Path) -> None:
    _, bundle = render("nginx", policy(tmp_path))
    d = docs(bundle)
    rule, = d["networkpolicy-proxy.yaml"]["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8080}]
    blocks = [p["ipBlock"]["cidr"] for p in rule["from"] if "ipBlock" in p]
    assert blocks == ["0.0.0.0/0", "::/0"]   # the public audience; admin and monitoring collapse into it
    audit = [p for p in rule["from"] if "podSelector" in p]
    assert audit == [{"podSelector": {"matchLabels": d["cronjob-audit.yaml"]["spec"]["jobTemplate"]["spec"]
                                      ["template"]["metadata"]["labels"]}}]
    # a ports: rule for the listen port decides; trusted proxies are added
    _, bundle = render("nginx", policy(tmp_path, UPSTREAM + PORTS + "trusted_proxies: [192.168.7.0/24]\n"))
    rule, = docs(bundle)["networkpolicy-proxy.yaml"]["spec"]["ingress"]
    blocks = [p["ipBlock"]["cidr"] for p in rule["from"] if "ipBlock" in p]
    assert blocks == ["10.20.0.0/16", "10.30.0.0/16", "192.168.7.0/24"]


def test_tls_files_come_from_the_users_secret(tmp_path: Path) -> None:
    extra = ("listen: {address: 0.0.0.0, port: 8443, tls: {cert: /etc/perimeter-tls/tls.crt, "
             "key: /etc/perimeter-tls/tls.key}}\n"
             "upstream: {host: vllm.llm.svc.cluster.local, port: 8000, tls: {ca: /etc/vllm-ca/ca.crt}}\n")
    _, bundle = render("envoy", policy(tmp_path, extra))
    assert_valid(bundle)
    d = docs(bundle)
    spec = pod_spec(d["deployment.yaml"])
    mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert mounts["/etc/perimeter-tls/tls.crt"]["subPath"] == "listen.crt"
    assert mounts["/etc/perimeter-tls/tls.key"]["subPath"] == "listen.key"
    assert mounts["/etc/vllm-ca/ca.crt"]["subPath"] == "upstream-ca.crt"
    tls = next(v for v in spec["volumes"] if v["name"] == "tls")["secret"]
    assert tls["secretName"] == "vllm-perimeter-tls"
    assert spec["containers"][0]["ports"][0]["name"] == "https"
    header = next(f.content for f in bundle.files if f.name.endswith("deployment.yaml"))
    assert "--from-file=listen.crt=<file>" in header
    args = pod_spec(d["cronjob-audit.yaml"])["containers"][0]["args"]
    assert "https://vllm-perimeter.llm.svc:8443" in args and "--ca-bundle=/ca/ca.crt" in args


def test_audit_cronjob_matches_the_example(tmp_path: Path) -> None:
    example = yaml.safe_load((REPO / "examples" / "nightly" / "audit-cronjob.yaml").read_text())
    listen = "listen: {address: 0.0.0.0, port: 8443, tls: {cert: /tls/c, key: /tls/k}}\n"
    _, bundle = render("nginx", policy(tmp_path, UPSTREAM + listen))
    ours = docs(bundle)["cronjob-audit.yaml"]
    assert validate(example) == []   # the hand-written one passes the same check
    for key in ("schedule", "timeZone", "concurrencyPolicy", "successfulJobsHistoryLimit",
                "failedJobsHistoryLimit"):
        assert ours["spec"][key] == example["spec"][key], key
    job, job_ex = ours["spec"]["jobTemplate"]["spec"], example["spec"]["jobTemplate"]["spec"]
    assert (job["backoffLimit"], job["activeDeadlineSeconds"]) == (job_ex["backoffLimit"], job_ex["activeDeadlineSeconds"])
    pod, pod_ex = pod_spec(ours), pod_spec(example)
    for key in ("restartPolicy", "automountServiceAccountToken", "securityContext"):
        assert pod[key] == pod_ex[key], key
    c, c_ex = pod["containers"][0], pod_ex["containers"][0]
    for key in ("name", "resources", "securityContext", "volumeMounts"):
        assert c[key] == c_ex[key], key
    # the same arguments, but for the target and --upstream-url (vLLM's NetworkPolicy admits only the proxy)
    assert sorted(c["args"][3:]) == sorted(a for a in c_ex["args"][3:] if not a.startswith("--upstream-url="))
    assert c["args"][:2] == c_ex["args"][:2] and c["args"][2] == "https://vllm-perimeter.llm.svc:8443"
    assert [v["name"] for v in pod["volumes"]] == [v["name"] for v in pod_ex["volumes"]]
    assert pod["volumes"][0]["secret"] == pod_ex["volumes"][0]["secret"]


def test_bad_deployment_inputs_are_refused(tmp_path: Path) -> None:
    cases = {
        "listen: {address: 127.0.0.1, port: 8080}\n" + UPSTREAM: "listen.address 127.0.0.1",
        "listen: {address: 0.0.0.0, port: 443}\n" + UPSTREAM: "listen.port 443 needs root",
        "upstream: {host: 127.0.0.1, port: 8000}\n": "upstream.host 127.0.0.1 is the proxy pod itself",
        "upstream: {host: localhost, port: 8000}\n": "upstream.host localhost",
    }
    for extra, message in cases.items():
        with pytest.raises(GenerateError, match=re.escape(message)):
            render("nginx", policy(tmp_path, extra))
    pol = policy(tmp_path)
    with pytest.raises(GenerateError, match="read-only root filesystem"):
        render("nginx", pol, options=GenerateOptions(access_log="/var/log/nginx/access.log"))
    with pytest.raises(GenerateError, match=r"access.log is on the read-only root filesystem; use /dev/stdout$"):
        render("envoy", pol, options=GenerateOptions(access_log="/var/lib/vllm-perimeter/access.log"))
    render("nginx", pol, options=GenerateOptions(access_log="/var/lib/vllm-perimeter/access.log"))   # the emptyDir
    with pytest.raises(GenerateError, match="would hide the image's own files"):
        render("envoy", pol, options=GenerateOptions(extra={"config_dir": "/etc"}))
    with pytest.raises(GenerateError, match="must not overlap"):
        render("nginx", pol, options=GenerateOptions(runtime_dir="/etc/vllm-perimeter/run"))
    for bad, message in ((k8s.Settings(name="Perimeter"), "name 'Perimeter'"),
                         (k8s.Settings(namespace="a_b"), "namespace 'a_b'"),
                         (k8s.Settings(replicas=0), "replicas 0"),
                         (k8s.Settings(image="nginx latest"), "image 'nginx latest'"),
                         (k8s.Settings(vllm_selector=(("app", "-x"),)), "label app='-x'")):
        with pytest.raises(GenerateError, match=re.escape(message)):
            render("nginx", pol, bad)
    with pytest.raises(GenerateError, match="not key=value"):
        k8s.parse_selector(["app"])


def test_settings_reach_the_manifests(tmp_path: Path) -> None:
    settings = k8s.Settings(namespace="edge", name="gw", image="registry.local/nginx:1.31-njs", replicas=3,
                            audit_image="registry.local/vllm-perimeter:9")
    _, bundle = render("nginx", policy(tmp_path), settings)
    assert_valid(bundle)
    d = docs(bundle)
    assert {doc["metadata"]["name"] for doc in d.values()} == {
        "gw", "gw-proxy-config", "gw-proxy-secret", "gw-vllm", "gw-proxy", "gw-audit"}
    deployment = d["deployment.yaml"]
    assert deployment["spec"]["replicas"] == 3
    assert pod_spec(deployment)["containers"][0]["image"] == "registry.local/nginx:1.31-njs"
    assert pod_spec(d["cronjob-audit.yaml"])["containers"][0]["image"] == "registry.local/vllm-perimeter:9"
    assert "http://gw.edge.svc:8080" in pod_spec(d["cronjob-audit.yaml"])["containers"][0]["args"]


# --- the config as the pod sees it, under the real proxies ------------------------------------


def unpack(bundle: k8s.Bundle, directory: Path) -> None:
    """Write the ConfigMap's and the Secret's files where the projected volume puts them."""
    d = docs(bundle)
    directory.mkdir(parents=True)
    for name, text in {**d["configmap.yaml"]["data"], **secret_data(d["secret.yaml"])}.items():
        (directory / name).write_text(text, encoding="utf-8")


@pytest.mark.nginx
@pytest.mark.parametrize("build_name", sorted(BUILDS))
def test_nginx_t_on_the_configmap(tmp_path: Path, build_name: str) -> None:
    build = get_build(build_name)
    conf, run = tmp_path / "etc", tmp_path / "run"
    (tmp_path / "vllm-api-key").write_text(UPSTREAM_KEY + "\n")
    pol = policy(tmp_path, f"upstream: {{host: 10.96.0.10, port: 8000, api_key_file: {tmp_path / 'vllm-api-key'}}}\n")
    # the pod's paths moved under tmp_path; the Debian build loads njs from the image's path
    extra = {"config_dir": str(conf)} | ({} if build.njs_module else {"njs_module": ""})
    options = GenerateOptions(runtime_dir=str(run), extra=extra)
    _, bundle = render("nginx", pol, options=options)
    unpack(bundle, conf)
    run.mkdir()
    container = pod_spec(docs(bundle)["deployment.yaml"])["containers"][0]
    assert container["args"][:4] == ["-e", "stderr", "-p", f"{run}/"]
    result = subprocess.run([build.binary, *container["args"], "-t", "-q"], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.envoy
def test_envoy_validate_on_the_configmap(tmp_path: Path) -> None:
    conf = tmp_path / "etc"
    extra = UPSTREAM + PORTS + "trusted_proxies: [10.0.0.0/8]\n"
    _, bundle = render("envoy", policy(tmp_path, extra),
                       options=GenerateOptions(extra={"config_dir": str(conf)}))
    unpack(bundle, conf)
    assert f'"{conf}/envoy-principals.tsv"' in (conf / "envoy.yaml").read_text()
    container = pod_spec(docs(bundle)["deployment.yaml"])["containers"][0]
    result = subprocess.run([envoy_binary(), *container["args"], "--mode", "validate"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]


def test_kubectl_dry_run(tmp_path: Path) -> None:
    """`kubectl apply --dry-run=client` needs an API server for discovery even in client mode:
    set VLLM_PERIMETER_KUBECTL_CONTEXT to a context whose server is on loopback (kind, k3d)."""
    context = os.environ.get("VLLM_PERIMETER_KUBECTL_CONTEXT")
    kubectl = shutil.which("kubectl")
    if not kubectl or not context:
        pytest.skip("kubectl client dry-run needs a cluster: set VLLM_PERIMETER_KUBECTL_CONTEXT (loopback only)")
    server = subprocess.run([kubectl, "config", "view", "--minify", "--context", context, "-o",
                             "jsonpath={.clusters[0].cluster.server}"], capture_output=True, text=True,
                            timeout=30, check=False).stdout
    if not re.match(r"^https?://(127\.[0-9.]+|localhost|\[::1\])(:\d+)?/?$", server):
        pytest.skip(f"context {context} is not on loopback ({server!r})")
    _, bundle = render("nginx", policy(tmp_path))
    out = tmp_path / "out"
    for f in bundle.files:
        (out / f.name).parent.mkdir(parents=True, exist_ok=True)
        (out / f.name).write_text(f.content)
    result = subprocess.run([kubectl, "--context", context, "apply", "--dry-run=client", "-f",
                             str(out / "kubernetes")], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr


# --- the CLI ----------------------------------------------------------------------------------

CLI = [sys.executable, "-m", "scanner.cli.main"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, check=False)


def test_cli_writes_config_and_bundle(tmp_path: Path) -> None:
    pol = tmp_path / "policy.yaml"
    (tmp_path / "principals.yaml").write_text(PRINCIPALS)
    pol.write_text(default_policy_text() + "\nprincipals_file: principals.yaml\n" + UPSTREAM)
    out = tmp_path / "out"
    r = cli("generate", "envoy", "--inventory", CATALOG, "--policy", str(pol), "-o", str(out), "--kubernetes",
            "--k8s-namespace", "llm", "--vllm-selector", "app=vllm")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (out / "kubernetes").iterdir()) == sorted(FILES)
    assert (out / "kubernetes" / "secret.yaml").stat().st_mode & 0o777 == 0o600
    assert (out / "envoy-principals.tsv").stat().st_mode & 0o777 == 0o600
    assert "kubectl apply -f" in r.stderr and "copy " not in r.stderr
    configmap = yaml.safe_load((out / "kubernetes" / "configmap.yaml").read_text())
    assert configmap["data"]["envoy.yaml"] == (out / "envoy.yaml").read_text()   # the files written = the pod's
    assert f'"{k8s.CONFIG_DIR}/envoy-principals.tsv"' in (out / "envoy.yaml").read_text()
    assert not any(h in r.stdout + r.stderr for h in HASHES)
    vllm = yaml.safe_load((out / "kubernetes" / "networkpolicy-vllm.yaml").read_text())
    assert vllm["spec"]["podSelector"] == {"matchLabels": {"app": "vllm"}}


def test_cli_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    pol = tmp_path / "policy.yaml"
    (tmp_path / "principals.yaml").write_text(PRINCIPALS)
    pol.write_text(default_policy_text() + "\nprincipals_file: principals.yaml\n" + UPSTREAM)
    base = ["generate", "nginx", "--inventory", CATALOG, "--policy", str(pol), "-o"]
    cases = [
        (["--kubernetes", "--k8s-namespace", "Bad_NS"], "namespace 'Bad_NS'"),
        (["--kubernetes", "--vllm-selector", "app"], "vLLM selector 'app' is not key=value"),
        (["--kubernetes", "--k8s-replicas", "0"], "replicas 0"),
        (["--k8s-namespace", "llm"], "--k8s-namespace needs --kubernetes"),
    ]
    for i, (flags, message) in enumerate(cases):
        out = tmp_path / f"out{i}"
        r = cli(*base, str(out), *flags)
        assert r.returncode == 2, (flags, r.stderr)
        assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr and not out.exists()
    # the bundled policy's loopback upstream: refused before anything is written
    out = tmp_path / "loopback"
    r = cli("generate", "nginx", "--inventory", CATALOG, "-o", str(out), "--kubernetes")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "upstream.host 127.0.0.1" in r.stderr and not out.exists()


def test_dumper_keeps_content_exact() -> None:
    tricky = {"a": "x\n", "b": "no newline", "c": "two\n\n", "d": "  leading\n", "e": "tab\there\n",
              "f": "trailing space \nx\n", "g": "unicode é ✓\n", "h": ""}
    doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": tricky}
    assert yaml.safe_load(k8s.dump(doc))["data"] == tricky
    assert yaml.safe_load(k8s.dump({"m": k8s.Mode(0o440)})) == {"m": 0o440}
    assert "m: 0440" in k8s.dump({"m": k8s.Mode(0o440)})
    assert replace(k8s.Settings(), replicas=2).check().replicas == 2


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_the_responses_secret_is_in_the_generated_secret_only(tmp_path: Path, proxy: str) -> None:
    """responses: owned: the secret is in the generated 0600 principals file (the proxy's master,
    or Envoy's Lua at load, reads it there), so in secret.yaml only: no ConfigMap holds it and
    the user's file is not mounted."""
    secret = "s" * 20 + "ecret-of-the-responses-" + "x" * 9
    (tmp_path / "responses.secret").write_text(secret + "\n")
    (tmp_path / "responses.secret").chmod(0o600)
    pol = policy(tmp_path)
    pol = replace(pol, body=replace(pol.body, responses="owned",
                                    responses_secret_file=str(tmp_path / "responses.secret")))
    _config, bundle = render(proxy, pol)
    assert_valid(bundle)
    spec = pod_spec(docs(bundle)["deployment.yaml"])
    mounts = [m for c in spec["containers"] for m in c["volumeMounts"]]
    assert not [m for m in mounts if "responses" in m["mountPath"]], mounts
    data = secret_data(docs(bundle)["secret.yaml"])
    assert [k for k, v in data.items() if secret in v] == [next(k for k in data if "principals" in k)]
    assert all(secret not in f.content for f in bundle.files if f.mode & 0o077)
