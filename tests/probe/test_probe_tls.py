"""HTTPS targets: verification is never turned off; a certificate that does not verify is exit 3."""

from __future__ import annotations

import datetime
import http.server
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from scanner.plan.model import DECISION_HEADER
from scanner.probe.interface import ProbeOptions, Target, Vantage
from scanner.probe.runner import probe
from tests.probe import helpers as h


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    import ipaddress

    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class _Deny(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _deny(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(404)
        self.send_header(DECISION_HEADER, "deny")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = _deny

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    cert, key = _self_signed(tmp_path)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Deny)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"https://127.0.0.1:{srv.server_address[1]}", cert
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("client", ["stream", "httpx"])
def test_unverified_certificate_is_exit_3(tls_server: tuple[str, Path], client: str) -> None:
    url, _cert = tls_server
    r = probe(h.plan(), Target(url), h.creds(), [Vantage()],
              ProbeOptions(rate=0, max_time=20, client=client))  # type: ignore[arg-type]
    assert r.unreachable and r.exit_code() == 3
    assert "tls: certificate verify failed" in r.reason and "--ca-bundle" in r.reason
    assert r.attempts == ()


@pytest.mark.parametrize("client", ["stream", "httpx"])
def test_ca_bundle_verifies(tls_server: tuple[str, Path], client: str) -> None:
    url, cert = tls_server
    r = probe(h.plan(), Target(url, ca_bundle=str(cert)), h.creds(), [Vantage()],
              ProbeOptions(rate=0, max_time=60, checks=("bypass",), client=client))  # type: ignore[arg-type]
    assert not r.unreachable, r.reason
    assert r.attempts and all(a.layer == "proxy" for a in r.attempts)  # raw TLS variants too
    assert any(a.request_line.startswith("POST /v1/../invocations") and a.status == 404 for a in r.attempts)
