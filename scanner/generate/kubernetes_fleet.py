"""The Kubernetes bundle of a fleet (policy ``shared:``): the limiter, a Redis (or a reference to
an existing one), who may reach them, and the proxy's replica count. Decided from the plan's
``shared`` (Plan.shared) and the bundle's name and namespace; scanner.generate.kubernetes writes
the objects (one file each) with its headers.

Where the limiter runs (the proxies reach it at the plan's ``shared.limiter``):

* ``127.0.0.1:PORT`` (or ``::1``, ``localhost``): a **sidecar** in every proxy pod (one limiter
  per proxy, all on one Redis; nothing else can reach it: it listens on the pod's loopback). The
  only layout NGINX can take, whose njs needs the limiter's IP address.
* ``NAME-limiter[.NS.svc[.cluster.local]]:PORT``: its own **Deployment** (2 replicas, a
  **PodDisruptionBudget** keeping one of them through voluntary evictions) and
  **Service**, and a NetworkPolicy letting only the proxy pods reach its port (the limiter has
  no authentication of its own).

Redis: ``redis://NAME-redis[.NS.svc[.cluster.local]][:PORT]`` is **bundled** (Deployment of one
``redis:7`` without persistence, a Service, a NetworkPolicy letting only the limiter reach it; the
policy's ``password_file`` then comes from the Secret ``NAME-redis``, key ``password``, which
also sets Redis's ``requirepass``); any other URL is a **reference** to a Redis you run (restrict
who reaches it yourself), with the password and TLS CA files from the Secrets ``NAME-redis``
(key ``password``) and ``NAME-redis-tls`` (key ``ca.crt``) mounted at the policy's paths.

Replicas: at least 2 (a fleet); under ``on_unavailable: local`` exactly the policy's
``shared.replicas`` (each proxy's share of every limit is divided by it in the plan).
"""

from __future__ import annotations

import ipaddress
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scanner.errors import GenerateError
from scanner.generate.shared import ZONES_FILE
from scanner.plan.model import Plan, SharedPlan
from scanner.store_url import parse_url

REDIS_IMAGE = "redis:7.4"
LIMITER_REPLICAS = 2
LIMITER_ZONES_DIR = "/etc/vllm-perimeter-limiter"     # the zones file in the limiter's own pods
PASSWORD_KEY = "password"
CA_KEY = "ca.crt"

Meta = Callable[[str, str], dict[str, Any]]           # (object name, component) -> metadata


class Mode(int):
    """A file mode, written as YAML octal (``0440``) as the Kubernetes docs write them."""


@dataclass(frozen=True)
class FleetLayout:
    """How the bundle lays out one plan's fleet."""

    shared: SharedPlan
    base: str                # the bundle's name
    namespace: str
    sidecar: bool            # the limiter in every proxy pod
    redis_bundled: bool
    redis_port: int
    replicas: int

    @property
    def limiter_name(self) -> str:
        return f"{self.base}-limiter"

    @property
    def redis_name(self) -> str:
        return f"{self.base}-redis"

    @property
    def password_secret(self) -> str:
        return f"{self.base}-redis"

    @property
    def tls_secret(self) -> str:
        return f"{self.base}-redis-tls"

    @property
    def port(self) -> int:
        return self.shared.limiter[1]


def _service_names(name: str, namespace: str) -> tuple[str, ...]:
    return (name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.rstrip(".").lower() == "localhost"


def layout(plan: Plan, base: str, namespace: str, replicas: int) -> FleetLayout | None:
    """The fleet's layout (None without ``shared:``); GenerateError, one line, when the plan's
    addresses name neither layout or the replica count cannot hold its limits."""
    s = plan.shared
    if s is None:
        return None
    host = s.limiter[0]
    sidecar = _loopback(host)
    if not sidecar and host.rstrip(".") not in _service_names(f"{base}-limiter", namespace):
        raise GenerateError(f"kubernetes bundle: shared.limiter {host} is neither 127.0.0.1 (a sidecar in "
                            f"each proxy pod) nor the bundle's Service {base}-limiter.{namespace}.svc; "
                            "set one of them")
    store = parse_url(s.redis)          # the policy read it: one Redis, Sentinel or Cluster
    redis_host, redis_port = store.hosts[0]
    redis_host = redis_host.rstrip(".")
    # the bundled Redis is one Redis (Sentinel and Cluster are yours)
    bundled = store.layout == "single" and redis_host in _service_names(f"{base}-redis", namespace)
    loopback = next((h for h, _p in store.hosts if _loopback(h)), None)
    if loopback is not None:
        raise GenerateError(f"kubernetes bundle: shared.redis {loopback} is the pod itself; name the "
                            f"bundle's Redis ({base}-redis.{namespace}.svc) or yours")
    if bundled and (store.tls or s.tls_ca):
        raise GenerateError("kubernetes bundle: the bundled Redis serves no TLS; use redis:// for it, or "
                            "give your own TLS Redis's address")
    if replicas < 2:
        replicas = max(2, s.replicas)
    if s.on_unavailable == "local" and replicas != s.replicas:
        raise GenerateError(f"kubernetes bundle: --k8s-replicas {replicas} differs from the policy's "
                            f"shared.replicas {s.replicas}, by which on_unavailable: local divides every "
                            "limit")
    return FleetLayout(shared=s, base=base, namespace=namespace, sidecar=sidecar, redis_bundled=bundled,
                 redis_port=redis_port, replicas=replicas)


# --- the limiter -------------------------------------------------------------------------------


def _secret_mounts(f: FleetLayout) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) of the Redis password and CA files at the policy's paths."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    files = ((f.shared.password_file, f.password_secret, PASSWORD_KEY, "redis-password"),
             (f.shared.tls_ca, f.tls_secret, CA_KEY, "redis-ca"))
    for path, secret, key, volume in files:
        if path:
            volumes.append({"name": volume, "secret": {"secretName": secret, "defaultMode": Mode(0o440),
                                                       "items": [{"key": key, "path": key}]}})
            mounts.append({"name": volume, "mountPath": path, "subPath": key, "readOnly": True})
    return volumes, mounts


def limiter_container(f: FleetLayout, image: str, zones_dir: str, config_volume: str) -> dict[str, Any]:
    """The limiter's container: ``vllm-perimeter limiter`` on the plan's Redis with the zones file
    ``generate`` wrote (from the config volume ``config_volume`` mounted at ``zones_dir``)."""
    listen = f"127.0.0.1:{f.port}" if f.sidecar else f"0.0.0.0:{f.port}"
    args = ["limiter", "--redis", f.shared.redis, "--zones", posixpath.join(zones_dir, ZONES_FILE),
            "--listen", listen]
    if f.shared.password_file:
        args += ["--redis-password-file", f.shared.password_file]
    if f.shared.tls_ca:
        args += ["--redis-ca-file", f.shared.tls_ca]
    _volumes, mounts = _secret_mounts(f)
    probe = {"tcpSocket": {"port": f.port}} if not f.sidecar else {"tcpSocket": {"port": f.port,
                                                                                 "host": "127.0.0.1"}}
    return {
        "name": "limiter", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["vllm-perimeter"], "args": args,
        **({} if f.sidecar else {"ports": [{"name": "limiter", "containerPort": f.port, "protocol": "TCP"}]}),
        "readinessProbe": {**probe, "periodSeconds": 5},
        "resources": {"requests": {"cpu": "250m", "memory": "96Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": config_volume, "mountPath": zones_dir, "readOnly": True}, *mounts],
    }


def limiter_secret_volumes(f: FleetLayout) -> list[dict[str, Any]]:
    return _secret_mounts(f)[0]


def limiter_deployment(f: FleetLayout, meta: Meta, labels: dict[str, str], image: str, configmap: str,
                       digest: str) -> dict[str, Any]:
    volumes = [{"name": "zones", "configMap": {"name": configmap, "items": [{"key": ZONES_FILE,
                                                                            "path": ZONES_FILE}]}},
               *limiter_secret_volumes(f)]
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(f.limiter_name, "limiter"),
        "spec": {
            "replicas": LIMITER_REPLICAS, "revisionHistoryLimit": 5,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {"vllm-perimeter/config-digest": digest}},
                "spec": {
                    "automountServiceAccountToken": False, "enableServiceLinks": False,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                        "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [limiter_container(f, image, LIMITER_ZONES_DIR, "zones")],
                    "volumes": volumes,
                },
            },
        },
    }


def limiter_disruption_budget(f: FleetLayout, meta: Meta, labels: dict[str, str]) -> dict[str, Any]:
    """At most one of the limiter's replicas evicted at a time (a node drained, a cluster
    upgraded): the proxies keep one limiter to ask (each replica is stateless: the state is in
    Redis)."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": meta(f.limiter_name, "limiter"),
            "spec": {"minAvailable": LIMITER_REPLICAS - 1, "selector": {"matchLabels": labels}}}


def limiter_service(f: FleetLayout, meta: Meta, labels: dict[str, str]) -> dict[str, Any]:
    """Headless: the name resolves to every ready limiter pod, so Envoy (STRICT_DNS) holds each as
    an endpoint of its limiter cluster, spreads the calls, and retries a call whose limiter is gone
    on another (its gRPC service's retry policy), where a ClusterIP would hand it one address."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta(f.limiter_name, "limiter"),
            "spec": {"type": "ClusterIP", "clusterIP": "None", "selector": labels,
                     "ports": [{"name": "limiter", "port": f.port, "targetPort": "limiter",
                                "protocol": "TCP"}]}}


def limiter_policy(f: FleetLayout, meta: Meta, labels: dict[str, str],
                   proxy_labels: dict[str, str]) -> dict[str, Any]:
    """Only the proxy pods reach the limiter (it has no authentication of its own)."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": meta(f.limiter_name, "limiter"),
            "spec": {"podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": proxy_labels}}],
                                  "ports": [{"protocol": "TCP", "port": f.port}]}]}}


# --- the bundled Redis -----------------------------------------------------------------------------


def redis_deployment(f: FleetLayout, meta: Meta, labels: dict[str, str]) -> dict[str, Any]:
    """One Redis without persistence (a restart empties the buckets: limits start afresh, never
    looser than the policy); ``requirepass`` from the Secret when the policy has a password file."""
    args = ["--port", str(f.redis_port), "--save", "", "--appendonly", "no", "--protected-mode", "no"]
    env: list[dict[str, Any]] = []
    if f.shared.password_file:
        env = [{"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {"name": f.password_secret,
                                                                         "key": PASSWORD_KEY}}}]
        args += ["--requirepass", "$(REDIS_PASSWORD)"]
    container = {
        "name": "redis", "image": REDIS_IMAGE, "imagePullPolicy": "IfNotPresent",
        "command": ["redis-server"], "args": args, **({"env": env} if env else {}),
        "ports": [{"name": "redis", "containerPort": f.redis_port, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 5},
        "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(f.redis_name, "redis"),
        "spec": {
            "replicas": 1, "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "automountServiceAccountToken": False, "enableServiceLinks": False,
                "securityContext": {"runAsNonRoot": True, "runAsUser": 999, "runAsGroup": 999, "fsGroup": 999,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [container], "volumes": [{"name": "data", "emptyDir": {}}]}},
        },
    }


def redis_service(f: FleetLayout, meta: Meta, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta(f.redis_name, "redis"),
            "spec": {"type": "ClusterIP", "selector": labels,
                     "ports": [{"name": "redis", "port": f.redis_port, "targetPort": "redis",
                                "protocol": "TCP"}]}}


def redis_policy(f: FleetLayout, meta: Meta, labels: dict[str, str],
                 limiter_labels: dict[str, str]) -> dict[str, Any]:
    """Only the limiter reaches Redis (in the sidecar layout: the proxy pods, which hold it)."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": meta(f.redis_name, "redis"),
            "spec": {"podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": limiter_labels}}],
                                  "ports": [{"protocol": "TCP", "port": f.redis_port}]}]}}
