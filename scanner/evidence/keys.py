"""Ed25519 signing keys: the private key in a 0600 file (never printed), the public key in FILE.pub."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from scanner.errors import UsageError


def fingerprint(public: Ed25519PublicKey) -> str:
    """``sha256:`` + 16 hex digits of the raw 32-byte public key."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:16]


def public_pem(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def new_signing_key(path: str | Path) -> tuple[Path, str]:
    """Write a new private key to ``path`` (0600, refusing to overwrite) and ``path``.pub.

    Returns the public key file and the fingerprint.
    """
    target = Path(path)
    pub_path = target.with_name(target.name + ".pub")
    for p in (target, pub_path):
        if p.exists():
            raise UsageError(f"{p} exists; refusing to overwrite a key (remove it first)")
    if not target.parent.is_dir():
        raise UsageError(f"cannot write {target}: directory {target.parent} does not exist")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), 0o600)   # whatever the umask
        fh.write(pem)
    pub_path.write_bytes(public_pem(key.public_key()))
    pub_path.chmod(0o644)
    return pub_path, fingerprint(key.public_key())


def load_private(path: str | Path) -> Ed25519PrivateKey:
    p = Path(path)
    try:
        mode = p.stat().st_mode
        data = p.read_bytes()
    except OSError as exc:
        raise UsageError(f"--signing-key {p}: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError(f"--signing-key {p}: permissions {stat.S_IMODE(mode):04o} are too open; "
                         f"chmod 600 {p}")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise UsageError(f"--signing-key {p}: not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise UsageError(f"--signing-key {p}: not an Ed25519 key (make one with "
                         "`vllm-perimeter keys signing-key --out FILE`)")
    return key


def load_public(data: bytes, name: str) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise UsageError(f"{name}: not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise UsageError(f"{name}: not an Ed25519 public key")
    return key
