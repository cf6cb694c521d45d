"""Build and verify an evidence pack.

Layout of a pack directory::

    manifest.json          canonical JSON: files (path, role, sha256, bytes), tool and vLLM
                           version, created time, signer's public key fingerprint
    manifest.sig.json      {"algorithm": "ed25519", "public_key_fingerprint", "signature"}:
                           base64 Ed25519 over the compact canonical JSON of the manifest
    signing-key.pub        the signer's public key (PEM)
    files/<role>/<name>    the copied inputs and results (a policy's principals file, which
                           holds key hashes only, next to the policy as files/policy/<name>)

A pack never holds a private key or an API key: ``build`` refuses inputs that contain PEM
private keys or strings in the API key format, and ``verify`` checks that again.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, ClassVar, Final, Literal

import yaml
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import Field

from scanner import __version__, canonical, jsondoc
from scanner.errors import PerimeterError, UsageError
from scanner.evidence import keys
from scanner.inventory import model as inventory_model
from scanner.jsondoc import CONFIG, Int, Str, Version1
from scanner.output import read_json
from scanner.policy import load as policy_load
from scanner.probe import result as probe_result

MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig.json"
PUBLIC_KEY = "signing-key.pub"
PACK_KIND: Final = "vllm-perimeter-evidence"
SCHEMA_VERSION: Final = 1
Role = Literal["inventory", "policy", "principals", "plan", "config", "probe", "netscan"]
ROLES: tuple[Role, ...] = ("inventory", "policy", "principals", "plan", "config", "probe", "netscan")
# An API key made by `keys new` (vp_ + 43 URL-safe characters), and any PEM private key.
SECRET_PATTERNS: tuple[tuple[str, re.Pattern[bytes]], ...] = (
    ("an API key", re.compile(rb"vp_[A-Za-z0-9_-]{43}")),
    ("a private key", re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")),
)


@dataclass(frozen=True)
class Input:
    role: Role
    path: Path


@dataclass(frozen=True)
class ManifestFile:
    """A file of the pack: where, what it is, its size and digest."""

    __pydantic_config__: ClassVar = CONFIG
    path: Str
    role: Role
    bytes: Int
    sha256: Annotated[Str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


@dataclass(frozen=True)
class Manifest:
    """The manifest of a signed evidence pack (``evidence build``)."""

    __pydantic_config__: ClassVar = CONFIG
    kind: Literal["vllm-perimeter-evidence"]
    schema_version: Version1
    tool: Mapping[Str, Str]
    vllm_version: Str | None
    created: Str
    public_key_fingerprint: Str
    files: tuple[ManifestFile, ...]


@dataclass(frozen=True)
class Check:
    path: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Verification:
    pack: str
    signer: str             # fingerprint the manifest names
    key_source: str         # "--public-key FILE" or "embedded signing-key.pub (integrity only)"
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def first_failure(self) -> Check | None:
        return next((c for c in self.checks if not c.ok), None)


# --- build -----------------------------------------------------------------------------------


def build(out_dir: str | Path, inputs: Sequence[Input], signing_key: str | Path) -> dict[str, Any]:
    """Copy ``inputs`` into a new pack at ``out_dir``, write and sign its manifest."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} exists and is not an empty directory")
    if not out.parent.is_dir():
        raise UsageError(f"cannot create {out}: directory {out.parent} does not exist")
    private = keys.load_private(signing_key)
    everything = _with_principals(inputs)
    _refuse_key_material(everything, Path(signing_key))
    _check_results(everything)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        staging.chmod(0o755)
        files = [_copy(item, staging, i) for i, item in enumerate(everything)]
        public = private.public_key()
        manifest: dict[str, Any] = jsondoc.dump(Manifest(
            kind=PACK_KIND, schema_version=SCHEMA_VERSION,
            tool={"name": "vllm-perimeter", "version": __version__},
            vllm_version=_vllm_version(everything),
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            public_key_fingerprint=keys.fingerprint(public),
            files=tuple(sorted(files, key=lambda f: f.path))))
        (staging / MANIFEST).write_text(canonical.dumps(manifest), encoding="utf-8")
        signature = private.sign(_signed_bytes(manifest))
        (staging / SIGNATURE).write_text(canonical.dumps({
            "algorithm": "ed25519", "public_key_fingerprint": keys.fingerprint(public),
            "signature": base64.b64encode(signature).decode("ascii"),
        }), encoding="utf-8")
        (staging / PUBLIC_KEY).write_bytes(keys.public_pem(public))
        if out.exists():
            out.rmdir()
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def _signed_bytes(manifest: Any) -> bytes:
    return json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _with_principals(inputs: Sequence[Input]) -> list[Input]:
    """The inputs, each validated, plus the principals file a policy references (hashes only)."""
    out: list[Input] = []
    for item in inputs:
        if item.role not in ROLES:
            raise UsageError(f"unknown evidence role {item.role!r}")
        if not item.path.is_file():
            raise UsageError(f"--{item.role} {item.path}: no such file")
        out.append(item)
        if item.role == "inventory":
            inventory_model.load(item.path)
        if item.role == "policy":
            policy_load.load(item.path)
            ref = (yaml.safe_load(item.path.read_text(encoding="utf-8")) or {}).get("principals_file")
            if isinstance(ref, str):
                out.append(Input("principals", item.path.parent / ref))
    return out


def _refuse_key_material(inputs: Sequence[Input], signing_key: Path) -> None:
    for item in inputs:
        if item.path.resolve() == signing_key.resolve():
            raise UsageError(f"--{item.role} {item.path} is the signing key; it never goes in a pack")
        found = secret_in(item.path.read_bytes())
        if found:
            raise UsageError(f"--{item.role} {item.path} contains {found}; a pack never holds secrets "
                             "(principals files hold only key hashes)")


def _check_results(inputs: Sequence[Input]) -> None:
    """A probe result must load; a netscan result must at least be a JSON object."""
    for item in inputs:
        if item.role == "probe":
            probe_result.load(item.path)
        if item.role == "netscan" and not isinstance(read_json(item.path, "netscan result"), dict):
            raise UsageError(f"--netscan {item.path}: not a netscan result (a JSON object)")


def secret_in(data: bytes) -> str | None:
    return next((what for what, pattern in SECRET_PATTERNS if pattern.search(data)), None)


def _copy(item: Input, staging: Path, index: int) -> ManifestFile:
    # A principals file sits next to its policy, so the copied policy's reference resolves.
    folder = "policy" if item.role == "principals" else item.role
    rel = PurePosixPath("files", folder, item.path.name)
    dest = staging / rel
    if dest.exists():  # two --config files with one name
        rel = PurePosixPath("files", folder, f"{index}-{item.path.name}")
        dest = staging / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(item.path, dest)
    dest.chmod(0o644)
    data = dest.read_bytes()
    return ManifestFile(path=str(rel), role=item.role, bytes=len(data), sha256=_sha256(data))


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _vllm_version(inputs: Sequence[Input]) -> str | None:
    for item in inputs:
        if item.role == "inventory":
            inv = inventory_model.load(item.path)
            return inv.vllm.version if inv.vllm is not None else None
    return None


# --- verify ----------------------------------------------------------------------------------


def verify(pack_dir: str | Path, public_key: str | Path | None = None) -> Verification:
    """Check the signature, then every listed file, then that nothing unlisted was added."""
    root = Path(pack_dir)
    if not (root / MANIFEST).is_file():
        raise UsageError(f"{root}: not an evidence pack (no {MANIFEST})")
    trusted = _trusted_key(public_key)
    checks: list[Check] = []
    manifest, check = _manifest(root)
    checks.append(check)
    signer = str(manifest.get("public_key_fingerprint", "?")) if manifest else "?"
    if manifest is not None:
        checks.append(_signature(root, manifest, trusted))
        checks.extend(_files(root, manifest))
    source = (f"--public-key {public_key}" if public_key is not None
              else f"embedded {PUBLIC_KEY} (integrity only; pass --public-key to check the signer)")
    return Verification(pack=str(root), signer=signer, key_source=source, checks=tuple(checks))


def _trusted_key(path: str | Path | None) -> Ed25519PublicKey | None:
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"--public-key {path}: {exc.strerror or exc}") from None
    return keys.load_public(data, f"--public-key {path}")


def _manifest(root: Path) -> tuple[dict[str, Any] | None, Check]:
    try:
        doc = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return None, Check(MANIFEST, False, f"not valid JSON: {exc}")
    if not isinstance(doc, dict) or doc.get("kind") != PACK_KIND or not isinstance(doc.get("files"), list):
        return None, Check(MANIFEST, False, f"not a {PACK_KIND} manifest")
    return doc, Check(MANIFEST, True, f"{len(doc['files'])} files listed")


def _signature(root: Path, manifest: dict[str, Any], trusted: Ed25519PublicKey | None) -> Check:
    try:
        sig_doc = json.loads((root / SIGNATURE).read_text(encoding="utf-8"))
        signature = base64.b64decode(sig_doc["signature"], validate=True)
    except (OSError, ValueError, KeyError, TypeError, binascii.Error) as exc:
        return Check(SIGNATURE, False, f"unreadable signature: {exc}")
    if trusted is None:
        try:
            key = keys.load_public((root / PUBLIC_KEY).read_bytes(), PUBLIC_KEY)
        except (OSError, PerimeterError) as exc:
            return Check(PUBLIC_KEY, False, f"unreadable embedded public key: {exc}")
    else:
        key = trusted
    named = manifest.get("public_key_fingerprint")
    if keys.fingerprint(key) != named:
        return Check(SIGNATURE, False, f"the manifest names signer {named}, but the key is "
                                       f"{keys.fingerprint(key)}")
    try:
        key.verify(signature, _signed_bytes(manifest))
    except InvalidSignature:
        return Check(SIGNATURE, False, f"the signature does not match {MANIFEST} "
                                       f"(key {keys.fingerprint(key)})")
    return Check(SIGNATURE, True, f"ed25519 signature by {keys.fingerprint(key)}")


def _files(root: Path, manifest: dict[str, Any]) -> list[Check]:
    out: list[Check] = []
    listed = {MANIFEST, SIGNATURE, PUBLIC_KEY}
    for entry in manifest["files"]:
        rel = str(entry.get("path", "")) if isinstance(entry, dict) else ""
        listed.add(rel)
        out.append(_file(root, rel, str(entry.get("sha256", "")) if isinstance(entry, dict) else ""))
    for path in sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        if rel not in listed:
            out.append(Check(rel, False, "not listed in the manifest (added after signing)"))
    return out


def _file(root: Path, rel: str, expected: str) -> Check:
    parts = PurePosixPath(rel).parts
    if not rel or PurePosixPath(rel).is_absolute() or ".." in parts or parts[0] != "files":
        return Check(rel or "?", False, "unsafe path in the manifest")
    path = root / rel
    if path.is_symlink() or not path.is_file():
        return Check(rel, False, "missing (or not a regular file)")
    data = path.read_bytes()
    actual = _sha256(data)
    if actual != expected:
        return Check(rel, False, f"sha256 mismatch: manifest {expected[:19]}..., file {actual[:19]}...")
    found = secret_in(data)
    if found:
        return Check(rel, False, f"contains {found}")
    return Check(rel, True, f"sha256 ok ({len(data)} bytes)")
