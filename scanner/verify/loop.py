"""``verify``: the closed loop on your own inventory and policy, on loopback, one proxy at a time.

For each proxy: throwaway keys per role (the policy's principals are replaced), each
policy network mapped to a loopback address of its own (plus one outside them all), the
stand-in upstream serving the inventory behind its witness, the generated config checked by
the proxy's own validator, the proxy started, and the probe run with the witness and state
changes allowed (the stand-in has no state). Every process and temporary file is gone when
this returns or raises, Ctrl-C included.

The same loop runs weakened copies of the generated config (:mod:`scanner.verify.mutation`),
a fleet of replicas (:mod:`scanner.verify.fleet`) and the demo (:mod:`scanner.verify.demo`).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from scanner import stop
from scanner.errors import InternalError, UsageError
from scanner.inventory.model import Inventory
from scanner.net import free_port, on_free_port
from scanner.output import write_text
from scanner.plan.build import build
from scanner.plan.model import Plan
from scanner.policy import keys
from scanner.policy.model import GrpcUpstream, Listen, Policy, Principal, TlsServer, Upstream
from scanner.policy.salt import new_secret
from scanner.probe import config
from scanner.probe.certs_cases import cert_credential
from scanner.probe.interface import Credential, ProbeOptions, ProbeResult, Target, Vantage
from scanner.probe.runner import probe
from scanner.probe.testca import TestCa
from scanner.probe.tokens_jwt import Issuer, valid_claims
from scanner.runtime.process import ManagedProcess
from scanner.runtime.proxy import Proxy, relisten
from scanner.secrets import fingerprint
from scanner.standin.grpc_standin import GrpcStandin
from scanner.standin.serve import StandinThread

OUTSIDE = "outside"
DEFAULT_ROLE = "user"


@dataclass(frozen=True)
class Setup:
    """What one verify run probes with: the plan (loopback networks, throwaway principals),
    the credentials, the vantages."""

    plan: Plan
    credentials: tuple[Credential, ...]
    vantages: tuple[Vantage, ...]
    networks: dict[str, tuple[str, ...]]
    upstream_key: str = field(default="", repr=False)   # vLLM's (throwaway) key, if the policy has one
    salt_secret: str = field(default="", repr=False)    # the (throwaway) cache_salt secret, if salted
    issuer: Issuer | None = field(default=None, repr=False)   # the test issuer of auth "jwt" audiences
    owner_secret: str = field(default="", repr=False)   # the (throwaway) responses secret, if owned
    signing_key: str = ""     # the test issuer's private key (PEM, 0600 in the run's directory)
    # auth "cert": the test CA (its PEM file is the listener's client CA and signs the listener's
    # own certificate) and a client certificate per certificate principal of the policy
    ca: TestCa | None = field(default=None, repr=False)
    ca_file: str = ""
    client_certs: tuple[ClientCert, ...] = ()
    cert_ca: str = field(default="", repr=False)   # "CERT,KEY" of the test CA (the mtls check's)


@dataclass(frozen=True)
class ClientCert:
    """A test client certificate naming a certificate principal (its SAN or subject): files in the
    run's directory, the key 0600."""

    principal: str
    role: str
    cert: str
    key: str


def make_test_ca(policy: Policy, directory: Path) -> tuple[TestCa, str, TlsServer, tuple[ClientCert, ...]]:
    """A throwaway CA for a policy with client certificates: the listener's certificate (127.0.0.1
    and localhost) and client CA, and a client certificate per certificate principal."""
    ca = TestCa.new()
    ca_file = directory / "client-ca.pem"
    write_text(ca_file, ca.pem.decode())
    write_text(directory / "client-ca.key", ca.key_pem.decode(), mode=0o600)
    cert, key = ca.issue("CN=vllm-perimeter listener", dns=("localhost",), ips=("127.0.0.1",),
                         server=True).write(directory, "listener")
    depth = policy.listen.tls.verify_depth if policy.listen.tls else 2
    clients = tuple(ClientCert(c.name, c.role, *ca.issue(c.subject or f"CN={c.name}", san=c.san)
                               .write(directory, f"client-{c.name}")) for c in policy.certs)
    return ca, str(ca_file.resolve()), TlsServer(cert, key, client_ca=str(ca_file.resolve()),
                                                 verify_depth=depth), clients


@dataclass(frozen=True)
class ProxyRun:
    proxy: str
    result: ProbeResult
    seconds: float


def roles_of(policy: Policy) -> tuple[str, ...]:
    """Every role a key may have: the audiences' roles and the policy's own principals'."""
    roles = {r for a in policy.audiences.values() if a.auth == "key" for r in a.roles}
    roles |= {p.role for p in policy.principals}
    return tuple(sorted(roles)) or (DEFAULT_ROLE,)


def loopback(policy: Policy) -> tuple[dict[str, tuple[str, ...]], tuple[Vantage, ...]]:
    """Each policy network as one loopback address of its own (127.0.0.10, .11, ...), a vantage
    there, and one vantage outside every network. A network of an ``auth: none`` audience with
    limits gets a second address (127.0.1.x) and vantage (``NAME-2``): its limits are counted per
    client address, and the probe proves that two addresses have buckets of their own."""
    names = sorted(policy.networks)
    if len(names) > 200:
        raise UsageError("verify maps each policy network to a loopback address: at most 200 networks")
    per_address = {n for a in policy.audiences.values() if a.auth == "none" and
                   (a.limits.rate or a.limits.concurrency or a.limits.tokens_per_minute) for n in a.networks}
    nets: dict[str, tuple[str, ...]] = {
        n: (f"127.0.0.{10 + i}/32", *((f"127.0.1.{10 + i}/32",) if n in per_address else ()))
        for i, n in enumerate(names)}
    outside = OUTSIDE if OUTSIDE not in nets else f"{OUTSIDE}-all"
    second = {n: Vantage(f"{n}-2", f"127.0.1.{10 + i}") for i, n in enumerate(names) if n in per_address}
    vantages = tuple(v for i, n in enumerate(names)
                     for v in (Vantage(n, f"127.0.0.{10 + i}"), *((second[n],) if n in second else ())))
    return nets, (*vantages, Vantage(outside, "127.0.0.250"))


def setup(inventory: Inventory, policy: Policy, directory: Path, upstream_port: int,
          keys_per_role: int = 1, upstream_key: str = "", grpc_upstream_port: int = 0) -> Setup:
    """The plan and credentials for one run; the keys exist only in memory (and their hashes
    in ``directory``). With the policy's ``upstream.api_key_file``, vLLM's key is ``upstream_key``
    (default: a throwaway one), in a 0600 file in ``directory`` the proxy reads."""
    secrets: dict[str, str] = {}
    specs: list[str] = []
    principals: list[Principal] = []
    for role in roles_of(policy):
        for i in range(keys_per_role):
            key = keys.new_key()
            name = f"verify-{role}-{i + 1}"
            keys.append_principal(directory / "principals.yaml", name, role, key)
            principals.append(Principal(name, role, keys.key_sha256(key)))
            var = f"VERIFY_KEY_{len(specs)}"
            secrets[var] = key
            specs.append(f"{role}=env:{var}")
    nets, vantages = loopback(policy)
    upstream = Upstream("127.0.0.1", upstream_port)
    if not policy.upstream.api_key_file:
        upstream_key = ""
    else:   # the stand-in guards like vLLM's --api-key, with a throwaway key
        upstream_key = upstream_key or keys.new_key()
        key_file = directory / "upstream-api-key"
        write_text(key_file, upstream_key + "\n", mode=0o600)
        upstream = replace(upstream, api_key_file=str(key_file.resolve()))
    body, salt_secret = policy.body, ""
    if body.salted:   # a throwaway cache_salt secret: the prober knows every salt
        salt_file = directory / "cache-salt-secret"
        new_secret(salt_file)
        salt_secret = salt_file.read_text(encoding="utf-8").strip()
        body = replace(body, cache_salt_secret_file=str(salt_file.resolve()))
    owner_secret = ""
    if body.owned:    # a throwaway responses secret: the prober can forge nothing, verify it all
        owner_file = directory / "responses-secret"
        new_secret(owner_file)
        owner_secret = owner_file.read_text(encoding="utf-8").strip()
        body = replace(body, responses_secret_file=str(owner_file.resolve()))
    grpc = policy.grpc and replace(policy.grpc, listen=Listen("127.0.0.1", free_port()),
                                   upstream=GrpcUpstream("127.0.0.1", grpc_upstream_port or free_port()))
    issuer, audiences = None, dict(policy.audiences)
    for name, a in sorted(audiences.items()):
        if a.jwt is not None:   # a throwaway issuer: its JWKS replaces the policy's, the probe signs
            issuer = issuer or Issuer.new()
            audiences[name] = replace(a, jwt=issuer.for_audience(a.jwt, directory / f"jwks-{name}.json"))
    ca, ca_file, tls, client_certs = (make_test_ca(policy, directory) if policy.listen.tls and
                                      policy.listen.tls.client_ca else (None, "", None, ()))
    local = replace(policy, principals=tuple(principals), listen=Listen("127.0.0.1", free_port(), tls),
                    upstream=upstream, body=body, grpc=grpc or None, audiences=audiences)
    plan = build(inventory, local, nets)
    creds = config.credentials(specs, environ=secrets)
    signing_key = ""
    if issuer is not None:
        creds += test_tokens(plan, issuer, keys_per_role)
        key_file = directory / "jwt-signing-key.pem"
        write_text(key_file, issuer.private_pem().decode(), mode=0o600)
        signing_key = str(key_file.resolve())
    creds += tuple(cert_credential(c.role, c.cert, c.key, plan, f"cert:{c.principal}") for c in client_certs)
    cert_ca = f"{ca_file},{Path(ca_file).with_suffix('.key')}" if ca is not None else ""
    return Setup(plan, creds, vantages, nets, upstream_key, salt_secret, issuer, owner_secret,
                 signing_key, ca, ca_file, client_certs, cert_ca)


def test_tokens(plan: Plan, issuer: Issuer, per_role: int) -> tuple[Credential, ...]:
    """A valid token per auth "jwt" audience, role its tokens can give (and the audience
    admits) and principal (``per_role`` each), signed by the test issuer; valid for an hour."""
    out: list[Credential] = []
    seen: set[str] = set()
    for d in plan.allowed:
        t = d.jwt
        if t is None or d.audience in seen:
            continue
        seen.add(d.audience)
        given = sorted({*t.roles.values(), *((t.role,) if t.role else ())})
        for role in given:
            for i in range(per_role):
                who = f"verify-{d.audience}-{role}-{i + 1}"
                claims = {**valid_claims(t, role, who), "exp": int(time.time()) + 3600}
                out.append(config.token_credential(role, issuer.rsa.sign(claims), plan,
                                                   f"token:{d.audience}:{role}" + (f"#{i + 1}" if i else "")))
    return tuple(out)


@contextmanager
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="vllm-perimeter-verify-") as tmp:
        yield Path(tmp)


def probe_options(s: Setup, base: ProbeOptions, witness: str) -> ProbeOptions:
    """The stand-in has no state to change and records what reaches it (vLLM's key included)."""
    return replace(base, allow_state_changes=True, witness=witness,
                   upstream_key=fingerprint(s.upstream_key) if s.upstream_key else "",
                   salt_secret=s.salt_secret, owner_secret=s.owner_secret,
                   jwt_signing_key=s.signing_key, cert_ca=s.cert_ca)


Rewrite = Callable[[Plan], None]


def start_checked(proxy: Proxy, plan: Plan, directory: Path, stack: ExitStack,
                  rewrite: Rewrite | None = None) -> Plan:
    """Validate the written config with the proxy itself, then start it (both or an error). When
    its port was taken after the pick (scanner.net.on_free_port), the plan moves to a fresh port,
    ``rewrite(plan)`` writes the config again (default: ``proxy.write``; a mutant's writes and
    weakens it) and the proxy starts there. The plan the proxy runs: ``plan``, or the moved one."""
    def start(port: int) -> tuple[Plan, ManagedProcess]:
        now = plan if port == plan.listen.port else relisten(plan, port)
        if now is not plan:
            if rewrite is None:
                proxy.write(now, directory)
            else:
                rewrite(now)
        problem = proxy.validate(now, directory)
        if problem:
            raise InternalError(f"{proxy.name} rejected the generated config: {problem}")
        return now, proxy.start(now, directory).start()

    now, process = on_free_port(start, plan.listen.port, plan.listen.address)
    stack.callback(process.stop)
    return now


def target_of(s: Setup) -> Target:
    """The proxy under test: plain HTTP, or HTTPS trusting the test CA (auth "cert" policies)."""
    if s.plan.listen.tls and s.ca_file:
        return Target(f"https://127.0.0.1:{s.plan.listen.port}", ca_bundle=s.ca_file)
    return Target(f"http://127.0.0.1:{s.plan.listen.port}")


def proxy_run(s: Setup, proxy: Proxy, directory: Path, options: ProbeOptions, witness: str,
              rewrite: Rewrite | None = None) -> ProxyRun:
    """Validate and start the config written under ``directory`` (on another port, written
    again by ``rewrite``, when its port was taken: start_checked), probe it, stop it."""
    t0 = time.monotonic()
    with ExitStack() as stack:
        s = replace(s, plan=start_checked(proxy, s.plan, directory, stack, rewrite))
        res = probe(s.plan, target_of(s), s.credentials, s.vantages,
                    probe_options(s, options, witness))
    return ProxyRun(proxy.name, res, round(time.monotonic() - t0, 2))


@contextmanager
def loop(inventory: Inventory, policy: Policy, proxies: Sequence[Proxy],
         keys_per_role: int) -> Iterator[tuple[Setup, str, list[tuple[Proxy, Path]]]]:
    """The setup, the stand-in's (witness) URL, and each proxy's config written in a temporary
    directory; everything is gone when the block ends."""
    with workdir() as work, ExitStack() as stack:
        # the stand-in first, on a port it binds and holds (none to take meanwhile), then the plan
        # naming it; it guards like vLLM's --api-key with the throwaway key setup will use
        upstream_key = keys.new_key() if policy.upstream.api_key_file else ""
        standin = stack.enter_context(StandinThread(inventory, "127.0.0.1", 0,
                                                    api_keys=(upstream_key,) if upstream_key else ()))
        s = setup(inventory, policy, work, standin.port, keys_per_role, upstream_key)
        written = []
        for proxy in proxies:
            proxy.write(s.plan, work / proxy.name)
            written.append((proxy, work / proxy.name))
        if s.plan.grpc is not None and grpc_python():   # else its allowed methods stay unproven
            methods = tuple(d.path for d in s.plan.grpc.decisions)
            stack.enter_context(GrpcStandin(grpc_python(), methods, s.plan.grpc.upstream[1]))
        yield s, standin.url, written


def grpc_python() -> str:
    """A Python with grpcio for the gRPC stand-in: $VLLM_PERIMETER_GRPC_PYTHON, else vLLM's
    ($VLLM_PERIMETER_VLLM_PYTHON); "" none."""
    return os.environ.get("VLLM_PERIMETER_GRPC_PYTHON") or os.environ.get("VLLM_PERIMETER_VLLM_PYTHON", "")


def run(inventory: Inventory, policy: Policy, proxies: Sequence[Proxy], options: ProbeOptions,
        keys_per_role: int = 1, say: Callable[[str], None] = lambda _m: None) -> list[ProxyRun]:
    """The closed loop for each proxy; one probe result per proxy."""
    out = []
    with loop(inventory, policy, proxies, keys_per_role) as (s, witness, written):
        for proxy, directory in written:
            say(f"{proxy.name}: probing {len(s.plan.decisions)} decisions from {len(s.vantages)} "
                f"vantages through 127.0.0.1:{s.plan.listen.port}")
            try:
                out.append(proxy_run(s, proxy, directory, options, witness))
            except KeyboardInterrupt:   # outside the probe's loop (a proxy starting): as below
                stop.interrupted()
            if stop.requested():   # Ctrl-C or SIGTERM: keep what was proven, start nothing new
                break
    return out
