"""The Kubernetes bundle of a fleet (policy shared:): the limiter (its own Deployment + Service,
or a sidecar in each proxy pod), the bundled Redis (or a reference to yours), NetworkPolicies
letting only the proxy pods reach the limiter and only the limiter reach Redis, and at least two
proxy replicas; every manifest checked against the API's schemas (tests/generate/test_kubernetes)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scanner.errors import GenerateError
from scanner.generate import kubernetes as k8s
from tests.generate.test_kubernetes import UPSTREAM, docs, pod_spec, policy, render, validate

SERVICE_FLEET = """shared:
  redis: redis://vllm-perimeter-redis.llm.svc:6379/0
  limiter: vllm-perimeter-limiter.llm.svc:8081
  password_file: /var/run/redis/password
  on_unavailable: local
  replicas: 2
"""
SIDECAR_FLEET = """shared:
  redis: rediss://redis.example.internal:6380/0
  tls: {ca: /var/run/redis-tls/ca.crt}
  limiter: 127.0.0.1:8081
"""


def test_a_limiter_service_and_the_bundled_redis(tmp_path: Path) -> None:
    _config, bundle = render("envoy", policy(tmp_path, UPSTREAM + SERVICE_FLEET))
    d = docs(bundle)
    assert {"limiter-deployment.yaml", "limiter-service.yaml", "networkpolicy-limiter.yaml",
            "redis-deployment.yaml", "redis-service.yaml", "networkpolicy-redis.yaml"} <= set(d)
    for name, doc in d.items():
        assert validate(doc) == [], name
    proxy, limiter = d["deployment.yaml"], d["limiter-deployment.yaml"]
    assert proxy["spec"]["replicas"] == 2                     # the policy's shared.replicas (local)
    assert "limiter-zones.json" in d["configmap.yaml"]["data"]
    args = pod_spec(limiter)["containers"][0]["args"]
    assert args[:3] == ["limiter", "--redis", "redis://vllm-perimeter-redis.llm.svc:6379/0"]
    assert "--redis-password-file" in args and args[args.index("--listen") + 1] == "0.0.0.0:8081"
    proxy_labels = proxy["spec"]["selector"]["matchLabels"]
    limiter_labels = limiter["spec"]["selector"]["matchLabels"]
    lp = d["networkpolicy-limiter.yaml"]["spec"]
    assert lp["podSelector"]["matchLabels"] == limiter_labels
    assert lp["ingress"] == [{"from": [{"podSelector": {"matchLabels": proxy_labels}}],
                              "ports": [{"protocol": "TCP", "port": 8081}]}]
    rp = d["networkpolicy-redis.yaml"]["spec"]
    assert rp["ingress"][0]["from"] == [{"podSelector": {"matchLabels": limiter_labels}}]
    redis = pod_spec(d["redis-deployment.yaml"])["containers"][0]
    assert "--requirepass" in redis["args"] and redis["env"][0]["valueFrom"]["secretKeyRef"]["name"] == \
        "vllm-perimeter-redis"
    assert d["limiter-service.yaml"]["metadata"]["name"] == "vllm-perimeter-limiter"
    # two limiters, at most one evicted at a time (a drain keeps the proxies a limiter to ask)
    assert d["limiter-service.yaml"]["spec"]["clusterIP"] == "None"    # headless: Envoy sees every pod
    pdb = d["limiter-pdb.yaml"]
    assert limiter["spec"]["replicas"] >= 2 and pdb["kind"] == "PodDisruptionBudget"
    assert pdb["spec"] == {"minAvailable": limiter["spec"]["replicas"] - 1, "selector": {"matchLabels": limiter_labels}}
    head = next(f.content for f in bundle.files if f.name == "kubernetes/deployment.yaml")
    assert "N times" not in head and "2 replicas share every rate" in head
    again = render("envoy", policy(tmp_path, UPSTREAM + SERVICE_FLEET))[1]
    assert again == bundle                                     # deterministic


def test_a_limiter_sidecar_and_a_redis_of_yours(tmp_path: Path) -> None:
    _config, bundle = render("nginx", policy(tmp_path, UPSTREAM + SIDECAR_FLEET))
    d = docs(bundle)
    assert not {"limiter-deployment.yaml", "limiter-pdb.yaml", "redis-deployment.yaml",
                "networkpolicy-redis.yaml"} & set(d)
    for name, doc in d.items():
        assert validate(doc) == [], name
    spec = pod_spec(d["deployment.yaml"])
    assert d["deployment.yaml"]["spec"]["replicas"] == 2      # a fleet: at least two
    sidecar = next(c for c in spec["containers"] if c["name"] == "limiter")
    args = sidecar["args"]
    assert args[args.index("--listen") + 1] == "127.0.0.1:8081"    # the pod's loopback only
    assert args[args.index("--zones") + 1] == f"{k8s.CONFIG_DIR}/limiter-zones.json"
    assert args[args.index("--redis-ca-file") + 1] == "/var/run/redis-tls/ca.crt"
    assert any(v.get("secret", {}).get("secretName") == "vllm-perimeter-redis-tls" for v in spec["volumes"])


def test_a_sentinel_redis_of_yours(tmp_path: Path) -> None:
    """redis+sentinel:// names your Sentinel (never the bundled Redis, even under its name): the
    limiter is given the URL as it is, nothing of Redis is bundled."""
    url = "redis+sentinel://vllm-perimeter-redis.llm.svc:26379,sentinel-1.llm.svc:26379/mymaster"
    _config, bundle = render("envoy", policy(tmp_path, UPSTREAM + SERVICE_FLEET.replace(
        "redis://vllm-perimeter-redis.llm.svc:6379/0", url)))
    d = docs(bundle)
    assert not {"redis-deployment.yaml", "redis-service.yaml", "networkpolicy-redis.yaml"} & set(d)
    args = pod_spec(d["limiter-deployment.yaml"])["containers"][0]["args"]
    assert args[args.index("--redis") + 1] == url
    for name, doc in d.items():
        assert validate(doc) == [], name


@pytest.mark.parametrize(("fleet", "settings", "message"), [
    (SERVICE_FLEET.replace("vllm-perimeter-limiter.llm.svc", "limiter.other.svc"), {}, "is neither 127.0.0.1"),
    (SERVICE_FLEET, {"replicas": 3}, "differs from the policy's shared.replicas 2"),
    (SERVICE_FLEET.replace("redis://", "rediss://"), {}, "the bundled Redis serves no TLS"),
    (SERVICE_FLEET.replace("redis://vllm-perimeter-redis.llm.svc:6379/0", "redis+cluster://10.0.0.8:7000,127.0.0.1:7001"),
     {}, "shared.redis 127.0.0.1 is the pod itself"),
])
def test_what_the_bundle_cannot_lay_out_is_one_line(tmp_path: Path, fleet: str, settings: dict[str, int],
                                                    message: str) -> None:
    with pytest.raises(GenerateError, match=message) as err:
        render("envoy", policy(tmp_path, UPSTREAM + fleet), replace(k8s.Settings(namespace="llm"), **settings))
    assert "\n" not in str(err.value)
