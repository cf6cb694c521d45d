"""Workload identity (``auth: cert``): the names a client certificate may carry, and the CA bundle
client certificates are verified against.

A certificate principal is named by its URI SAN (a SPIFFE ID: ``spiffe://TRUST-DOMAIN/PATH``) or
by its subject DN in RFC 2253 form (``CN=worker,O=Example``), the form NGINX's
``$ssl_client_s_dn`` and Envoy's ``subjectPeerCertificate()`` print. Both are written into the
generated configs (NGINX js_var, Envoy Lua) and compared exactly (case-sensitive), so only
characters no config can misread are taken.
"""

from __future__ import annotations

import re
from pathlib import Path

from cryptography import x509

from scanner.errors import ConfigError

# A URI SAN: scheme "://" then URI characters without quotes, backslashes, '$', braces, ';' or
# spaces (NGINX would read '$' as a variable; Lua and JSON quote the rest).
SAN_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]{0,31}://[A-Za-z0-9._~:/?#\[\]@!&()*+,=%-]{1,2000}$")
# A subject DN (RFC 2253): attribute=value pairs separated by commas, no escapes or quotes.
SUBJECT_DN = re.compile(r"^[A-Za-z][A-Za-z0-9.]{0,63}=[A-Za-z0-9 ._@:/+-]{1,256}"
                        r"(,[A-Za-z][A-Za-z0-9.]{0,63}=[A-Za-z0-9 ._@:/+-]{1,256}){0,15}$")
MAX_VERIFY_DEPTH = 8
MAX_CA_CERTS = 64


def san_problem(text: str) -> str:
    """Why ``text`` cannot name a certificate principal by its URI SAN ("" it can)."""
    if not SAN_URI.match(text):
        return (f"san {text!r} is not a URI (scheme://..., such as spiffe://example.org/ns/app/sa/worker; "
                "no spaces, quotes, backslashes, '$', ';' or braces)")
    return ""


def subject_problem(text: str) -> str:
    """Why ``text`` cannot name a certificate principal by its subject DN ("" it can)."""
    if not SUBJECT_DN.match(text) or text != text.strip() or ", " in text:
        return (f"subject {text!r} is not a subject DN in RFC 2253 form (CN=worker,O=Example: "
                "attribute=value pairs joined by ',' without spaces around it, no escapes or quotes)")
    return ""


def read_ca_bundle(path: str | Path) -> int:
    """How many CA certificates the PEM bundle at ``path`` holds; any problem: a ConfigError naming
    the file (one line)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the client CA bundle ({exc.strerror})") from None
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise ConfigError(f"{path}: not a PEM bundle of CA certificates") from None
    if len(certs) > MAX_CA_CERTS:
        raise ConfigError(f"{path}: {len(certs)} certificates (at most {MAX_CA_CERTS})")
    for i, cert in enumerate(certs):
        try:
            ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            ca = False
        if not ca:
            raise ConfigError(f"{path}: certificate {i + 1} ({cert.subject.rfc4514_string()}) is not a CA "
                              "(basicConstraints CA:TRUE): the bundle holds the CAs client certificates "
                              "chain to")
    return len(certs)
