"""Client certificates for the mtls check (``auth: cert``): the certificates ``--cert`` gives
(read for the name they carry: which certificate principal of the plan they are), and the ones
the check issues itself: from a CA of its own (another CA), and, with the listener's CA
(``--cert-ca``, verify's test CA), an expired one, an unknown name, each principal's."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from scanner.errors import UsageError
from scanner.plan.credential import cert_principal
from scanner.plan.model import Plan
from scanner.policy.model import CertPrincipal
from scanner.probe.interface import Credential
from scanner.probe.testca import TestCa

UNKNOWN_SAN = "spiffe://perimeter-probe.invalid/unknown"
# an unlisted (revoked) SPIFFE ID, sent beside a listed subject principal's subject
REVOKED_SAN = "spiffe://perimeter-probe.invalid/revoked"
_DIR = Path(tempfile.mkdtemp(prefix="vllm-perimeter-certs-"))   # this process's certificates (0600 keys)


def names_of(pem: bytes) -> tuple[tuple[str, ...], str]:
    """(URI SANs, subject in RFC 4514 form) of a PEM certificate."""
    cert = x509.load_pem_x509_certificate(pem)
    try:
        sans = tuple(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                     .get_values_for_type(x509.UniformResourceIdentifier))
    except x509.ExtensionNotFound:
        sans = ()
    return sans, cert.subject.rfc4514_string()


def principal_of(plan: Plan, sans: tuple[str, ...], subject: str) -> CertPrincipal | None:
    """The certificate principal a certificate names, as both proxies decide it (the reference,
    scanner/plan/credential.py): with any URI SAN its one SAN (several, or one not listed:
    nobody), without its subject."""
    return cert_principal(plan.certs, sans, subject)


def cert_credential(role: str, cert: str, key: str, plan: Plan, label: str = "") -> Credential:
    """A client certificate credential (its files; the key never read here but by TLS)."""
    try:
        pem = Path(cert).read_bytes()
        sans, subject = names_of(pem)
    except (OSError, ValueError):
        raise UsageError(f"--cert {role}=...: {cert} is not a readable PEM certificate") from None
    if not Path(key).is_file():
        raise UsageError(f"--cert {role}=...: no key file {key}")
    p = principal_of(plan, sans, subject)
    fp = x509.load_pem_x509_certificate(pem).fingerprint(hashes.SHA256()).hex()
    return Credential(label=label or f"cert:{role}", kind="cert", role=role, fingerprint="cert:" + fp[:12],
                      principal=p.name if p else "", cert_file=cert, key_file=key)


def certs(specs: Sequence[str], plan: Plan) -> tuple[Credential, ...]:
    """``--cert ROLE=CERT,KEY`` (PEM files; repeatable): client certificates of auth "cert"."""
    out: list[Credential] = []
    for spec in specs:
        role, eq, files = spec.partition("=")
        cert, comma, key = files.partition(",")
        if not eq or not comma or not role or not cert or not key:
            raise UsageError(f"--cert {spec.partition('=')[0]}=...: expected ROLE=CERT_FILE,KEY_FILE")
        n = sum(1 for c in out if c.role == role) + 1
        out.append(cert_credential(role, cert, key, plan, f"cert:{role}" + (f"#{n}" if n > 1 else "")))
    return tuple(out)


@dataclass(frozen=True)
class Issued:
    """A certificate the check made: its files and what it names."""

    cert: str
    key: str


def _write(ca: TestCa, stem: str, subject: str, san: str, expired: bool = False) -> Issued:
    cert, key = ca.issue(subject, san=san, expired=expired).write(_DIR, stem)
    return Issued(cert, key)


@cache
def _other_ca() -> TestCa:
    return TestCa.new("perimeter-probe other CA")


def other_ca(p: CertPrincipal | None) -> Issued:
    """A certificate naming ``p`` (or nobody) from a CA the listener does not trust."""
    if p is None:
        return _write(_other_ca(), "other-ca", "CN=perimeter-probe", UNKNOWN_SAN)
    return _write(_other_ca(), f"other-ca-{p.name}", p.subject or f"CN={p.name}", p.san)


@cache
def listener_ca(spec: str) -> TestCa:
    """The listener's client CA from ``CERT,KEY`` PEM files (--cert-ca)."""
    cert, _, key = spec.partition(",")
    try:
        c = x509.load_pem_x509_certificate(Path(cert).read_bytes())
        k = serialization.load_pem_private_key(Path(key).read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        raise UsageError("--cert-ca: expected CERT,KEY: the listener's client CA certificate and its "
                         "private key (PEM, unencrypted)") from None
    return TestCa(c.subject.rfc4514_string(), c, k)   # type: ignore[arg-type]


def issued(ca: TestCa, p: CertPrincipal, expired: bool = False) -> Issued:
    """A certificate of the listener's CA naming ``p`` (expired: valid until yesterday)."""
    stem = f"{'expired' if expired else 'valid'}-{p.name}"
    return _write(ca, stem, p.subject or f"CN={p.name}", p.san, expired)


def unknown(ca: TestCa) -> Issued:
    """A certificate of the listener's CA naming no principal."""
    return _write(ca, "unknown", "CN=perimeter-probe-unknown", UNKNOWN_SAN)


def revoked(ca: TestCa, p: CertPrincipal) -> Issued:
    """A certificate of the listener's CA whose URI SAN names nobody (a revoked SPIFFE ID) and whose
    subject is ``p``'s (a subject principal): it names nobody (SPIFFE: a URI SAN alone names)."""
    return _write(ca, f"revoked-san-{p.name}", p.subject, REVOKED_SAN)
