"""What both generators decide the same way, decided once: names they will write, durations,
upstream TLS, retry safety, generator options (typed, validated once). The renderers
(``nginx_model``, ``envoy_model``) only turn these facts into their proxy's syntax.

Body methods and governed fields are the plan's (:data:`scanner.plan.model.BODY_METHODS`,
:attr:`scanner.plan.model.Decision.fields`, each route's field rules): the prober reads them
from there too.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from scanner.errors import GenerateError
from scanner.plan.model import Decision, Plan


@dataclass(frozen=True)
class Stamp:
    """What a generated config says it was made from (its header comments)."""

    plan_digest: str
    policy_name: str
    policy_digest: str
    inventory_hash: str
    vllm_version: str

    @staticmethod
    def of(plan: Plan) -> Stamp:
        return Stamp(plan.digest, plan.policy_name, plan.policy_digest, plan.inventory_hash,
                     plan.vllm_version)


# Principal, role and audience names go into maps, headers, cluster names and rate-limit
# descriptors: one rule for both proxies.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
DEFAULT_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def safe_name(generator: str, kind: str, value: str) -> str:
    if not NAME.match(value):
        raise GenerateError(f"{generator} generator: {kind} {value!r} is not a safe name (letters, digits, "
                            "'_', '.', '@', '-'; at most 64, starting with a letter or digit)")
    return value


def salts(plan: Plan, generator: str) -> tuple[tuple[str, str], ...]:
    """(subject, salt) for every salt a salted route may write ("principal:NAME" for each
    principal, "audience:NAME" for each audience a route salts by): computed here from the
    policy's secret, written only into the generator's 0600 files. Empty: nothing is salted."""
    if not any(d.salt for d in plan.allowed):
        return ()
    from scanner.policy.salt import read_secret, salt

    path = plan.body.cache_salt_secret_file
    if not path:
        raise GenerateError(f"{generator} generator: salted routes but no cache_salt_secret_file")
    secret = read_secret(path)
    subjects = {d.salt_subject("") for d in plan.allowed if d.salt == "audience"}
    if any(d.salt == "principal" for d in plan.allowed):
        subjects |= {f"principal:{name}" for name in (*(p.name for p in plan.principals),
                                                        *(c.name for c in plan.certs))}
    for subject in subjects:
        kind, _, name = subject.partition(":")
        safe_name(generator, kind, name)
    return tuple((s, salt(secret, s)) for s in sorted(subjects))


# what the principals file holds besides key hashes when responses are owned (generate's notes)
OWNER_HOLDS = " and the responses secret (responses: owned)"


def owner_secret(plan: Plan) -> str:
    """responses: owned: the secret both generators write into their 0600 principals file (read
    by the proxy's master / at script load, never by a worker from the user's file): one line,
    exit 2, when it cannot be read. "" when nothing is owned."""
    if not plan.body.owned or not plan.body.responses_secret_file:
        return ""
    from scanner.policy.salt import read_secret

    return read_secret(plan.body.responses_secret_file, "responses_secret_file").decode("utf-8")


def host_header(plan: Plan, generator: str) -> str:
    """The Host both proxies send upstream (:attr:`scanner.plan.model.Plan.host_header`), checked
    for what a config may hold: never the client's Host or an absolute-form target's host."""
    value = plan.host_header
    if not re.fullmatch(r"[A-Za-z0-9.-]+:\d+|\[[0-9A-Fa-f:.]+\]:\d+", value):
        raise GenerateError(f"{generator} generator: upstream Host {value!r} is not host:port")
    return value


def timeout_ms(seconds: float) -> int:
    """A policy timeout in whole milliseconds, rounded up: never shorter than the policy says."""
    return max(1, math.ceil(seconds * 1000))


def retries_allowed(d: Decision) -> bool:
    """May the proxy resend this request after the upstream reset it? Only if it changes no state
    (the plan's merged flag: the policy's and the built-in list's)."""
    return not d.state_changing


@dataclass(frozen=True)
class UpstreamTls:
    """TLS (or mutual TLS) to vLLM, as both proxies must verify it."""

    ca: str                        # CA file the upstream certificate must chain to
    server_name: str               # name to send (SNI) and verify; "" when the host is an IP
    host: str                      # the upstream host itself (DNS name or IP address)
    host_is_ip: bool
    client_cert: str = ""
    client_key: str = ""

    @property
    def verify_name(self) -> str:
        """The name the certificate must carry: the server name, else the host (IP included)."""
        return self.server_name or self.host


def upstream_tls(plan: Plan, generator: str, ca_bundle: str) -> UpstreamTls | None:
    up = plan.upstream
    if not up.use_tls:
        return None
    tls = up.tls
    cert, key = (tls.client_cert or "", tls.client_key or "") if tls else ("", "")
    if bool(cert) != bool(key):
        raise GenerateError(f"{generator} generator: upstream mTLS needs both client_cert and client_key")
    try:
        ipaddress.ip_address(up.host)
        host_ip = True
    except ValueError:
        host_ip = False
    server_name = tls.server_name if tls and tls.server_name else ("" if host_ip else up.host)
    if server_name and not re.match(r"^[A-Za-z0-9.-]+$", server_name):
        raise GenerateError(f"{generator} generator: upstream TLS server name {server_name!r} is not valid")
    return UpstreamTls(ca=(tls.ca if tls and tls.ca else None) or ca_bundle, server_name=server_name,
                       host=up.host, host_is_ip=host_ip, client_cert=cert, client_key=key)


# --- options: each generator's GenerateOptions.extra, parsed and checked once -----------------


def _unknown(generator: str, extra: Mapping[str, str], known: tuple[str, ...]) -> None:
    unknown = sorted(set(extra) - set(known))
    if unknown:
        raise GenerateError(f"{generator} generator: unknown option(s) {', '.join(unknown)} "
                            f"(known: {', '.join(known)})")


def _absolute(generator: str, what: str, value: str) -> str:
    if value and not value.startswith("/"):
        raise GenerateError(f"{generator} generator: {what} {value!r} must be an absolute path")
    return value


def config_dir(generator: str, configured: str, output_dir: str) -> str:
    """The one rule for where a proxy opens its key files at run time: the ``config_dir`` option
    (where the files will be deployed) if given, else the absolute directory ``generate`` writes
    them to (``GenerateOptions.output_dir``); "" when neither is known. No trailing slash."""
    directory = (_absolute(generator, "config_dir", configured)
                 or _absolute(generator, "output directory", output_dir))
    if any(c in directory for c in "\n\r\0"):
        raise GenerateError(f"{generator} generator: config directory {directory!r} has a control character")
    return directory.rstrip("/") or ("/" if directory else "")


def njs_version(module: str) -> str:
    """The njs version a dynamic ``ngx_http_js_module.so`` was built as (the one version string it
    holds, e.g. "0.7.9" for Debian 12's libnginx-mod-http-js); "" when unreadable or unclear."""
    try:
        with open(module, "rb") as f:
            data = f.read(32 * 1024 * 1024)
    except OSError:
        return ""
    found = {m.decode() for m in re.findall(rb"(?<![0-9.])(0\.[0-9]{1,2}\.[0-9]{1,2})\x00", data)}
    return found.pop() if len(found) == 1 else ""


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


@dataclass(frozen=True)
class NginxOptions:
    njs_module: str = ""
    config_dir: str = ""
    upstream_keepalive: int = 32
    user: str = ""
    worker_processes: str = "auto"
    ca_bundle: str = DEFAULT_CA_BUNDLE
    njs: str = ""            # the target's njs version ("0.7.9"); "" unknown (assumed >= 0.8)
    lua_module: str = ""     # the directory of the lua module and NDK (.so); "" no Lua runtime

    KNOWN = ("ca_bundle", "config_dir", "lua_module", "njs", "njs_module", "upstream_keepalive", "user",
             "worker_processes")

    @classmethod
    def parse(cls, extra: Mapping[str, str]) -> NginxOptions:
        _unknown("nginx", extra, cls.KNOWN)
        user = extra.get("user", "")
        if user and not re.match(r"^[A-Za-z0-9_.-]+( [A-Za-z0-9_.-]+)?$", user):
            raise GenerateError(f"nginx generator: user {user!r} is not valid")
        workers = extra.get("worker_processes", "auto")
        if not re.match(r"^(auto|[1-9][0-9]{0,2})$", workers):
            raise GenerateError(f"nginx generator: worker_processes {workers!r} is not 'auto' or a number")
        keepalive = extra.get("upstream_keepalive", "32")
        if not re.match(r"^(0|[1-9][0-9]{0,3})$", keepalive):
            raise GenerateError(f"nginx generator: upstream_keepalive {keepalive!r} is not a number")
        njs = extra.get("njs", "")
        if njs and not re.match(r"^[0-9]{1,3}(\.[0-9]{1,3}){1,2}$", njs):
            raise GenerateError(f"nginx generator: njs {njs!r} is not a version (e.g. 0.7.9)")
        if not njs and extra.get("njs_module"):
            njs = njs_version(extra["njs_module"])   # a dynamic module says which it is
        return cls(njs_module=extra.get("njs_module", ""), njs=njs,
                   lua_module=_absolute("nginx", "lua_module", extra.get("lua_module", "")),
                   config_dir=_absolute("nginx", "config_dir", extra.get("config_dir", "")),
                   upstream_keepalive=int(keepalive), user=user, worker_processes=workers,
                   ca_bundle=extra.get("ca_bundle", DEFAULT_CA_BUNDLE))


@dataclass(frozen=True)
class EnvoyOptions:
    config_dir: str = ""
    ca_bundle: str = DEFAULT_CA_BUNDLE
    admin: tuple[str, int] | None = None
    workers: int = 1      # Envoy's --concurrency: token-budget credits are held per worker

    KNOWN = ("admin", "ca_bundle", "config_dir", "workers")

    @classmethod
    def parse(cls, extra: Mapping[str, str]) -> EnvoyOptions:
        _unknown("envoy", extra, cls.KNOWN)
        workers = extra.get("workers", "1")
        if not workers.isdigit() or not 1 <= int(workers) <= 1024:
            raise GenerateError(f"envoy generator: workers {workers!r} must be Envoy's --concurrency "
                                "(1..1024)")
        return cls(config_dir=_absolute("envoy", "config_dir", extra.get("config_dir", "")),
                   ca_bundle=extra.get("ca_bundle", DEFAULT_CA_BUNDLE), admin=_admin(extra.get("admin", "")),
                   workers=int(workers))


def _admin(text: str) -> tuple[str, int] | None:
    if not text:
        return None
    host, _, port = text.rpartition(":")
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = False
    if not loopback or not port.isdigit() or not 0 < int(port) < 65536:
        raise GenerateError(f"envoy generator: admin {text!r} must be a loopback address:port, "
                            "e.g. 127.0.0.1:9901 (the admin interface is off unless set)")
    return host.strip("[]"), int(port)
