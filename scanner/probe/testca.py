"""A throwaway certificate authority for the identity check's mTLS cases (``auth: cert``):
a CA, client certificates naming a principal by URI SAN or subject, an expired one, and one from
another CA. Made with ``cryptography``; the keys never leave the run's directory.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from scanner.output import write_text

_DAY = dt.timedelta(days=1)


def _name(subject: str) -> x509.Name:
    """An x509 name from an RFC 2253 / 4514 string (``CN=worker,O=Example``)."""
    return x509.Name.from_rfc4514_string(subject)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _ca_cert(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey,
             signer: ec.EllipticCurvePrivateKey, path_length: int | None) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY).not_valid_after(now + 30 * _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                           critical=True)
            .sign(signer, hashes.SHA256()))


@dataclass(frozen=True)
class Leaf:
    """A client (or server) certificate and its key, PEM (the certificate followed by its
    issuer's intermediates, if any: the chain a client presents)."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)

    def write(self, directory: Path, stem: str) -> tuple[str, str]:
        """Write ``stem.crt`` and ``stem.key`` (0600) under ``directory``: their paths."""
        cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
        write_text(cert, self.cert_pem.decode())
        write_text(key, self.key_pem.decode(), mode=0o600)
        return str(cert), str(key)


@dataclass(frozen=True)
class TestCa:
    """A self-signed CA (EC P-256) that issues client and server certificates."""

    __test__ = False   # not a pytest class

    name: str
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey = field(repr=False)
    # an intermediate CA: its certificate and those of the intermediates above it (PEM, nearest
    # first), which a leaf it issues carries after its own; a root: none
    chain: bytes = b""

    @classmethod
    def new(cls, name: str = "vllm-perimeter test CA", path_length: int | None = 0) -> TestCa:
        """A root CA; ``path_length``: the intermediates it may have below it (None: any)."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        return cls(name, _ca_cert(subject, subject, key, key, path_length), key)

    def intermediate(self, name: str) -> TestCa:
        """An intermediate CA issued by this one (which needs a path length allowing it)."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = _ca_cert(subject, self.cert.subject, key, self.key, None)
        return TestCa(name, cert, key, cert.public_bytes(serialization.Encoding.PEM) + self.chain)

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _key_pem(self.key)

    def issue(self, subject: str = "CN=client", san: str = "", dns: tuple[str, ...] = (),
              ips: tuple[str, ...] = (), expired: bool = False, server: bool = False,
              more_sans: tuple[str, ...] = ()) -> Leaf:
        """A certificate for ``subject`` with URI SAN ``san`` (if any; ``more_sans``: further URI
        SANs), DNS / IP SANs (a server's); ``expired``: valid until yesterday."""
        import ipaddress

        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        start, end = (now - 10 * _DAY, now - _DAY) if expired else (now - _DAY, now + 7 * _DAY)
        names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in (san, *more_sans) if u]
        names += [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                         else ExtendedKeyUsageOID.CLIENT_AUTH]),
                                  critical=False))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return Leaf(cert.public_bytes(serialization.Encoding.PEM) + self.chain, _key_pem(key))
