"""API keys: made here, shown once, stored only as sha256; files and logs see fingerprints."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

from scanner.errors import ConfigError, UsageError
from scanner.output import read_text, write_text
from scanner.secrets import fingerprint

__all__ = ["KEY_PREFIX", "Changed", "append_principal", "fingerprint", "hash_fingerprint", "key_sha256",
           "new_key", "read_upstream_key", "revoke_principal", "rotate_principal"]

KEY_PREFIX = "vp_"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def new_key() -> str:
    """A fresh API key: ``vp_`` + 256 random bits, URL-safe."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_sha256(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def append_principal(path: str | Path, name: str, role: str, key: str) -> None:
    """Append a principal (name, role, key hash) to a principals YAML file, keeping its comments."""
    if not _NAME.match(name):
        raise UsageError(f"principal name {name!r}: use letters, digits, '.', '_' or '-'")
    if not _NAME.match(role):
        raise UsageError(f"role {role!r}: use letters, digits, '.', '_' or '-'")
    p = Path(path)
    text = read_text(p, "principals file", UsageError) if p.exists() else ""
    if re.search(rf"^\s*-\s*name:\s*{re.escape(name)}\s*$", text, re.MULTILINE):
        raise UsageError(f"{p}: principal {name!r} already exists; pick another name or remove it")
    if not text.strip():
        text = "# Principals for vllm-perimeter: key hashes only, never keys.\nprincipals:\n"
    elif "principals:" not in text:
        raise UsageError(f"{p}: not a principals file (no 'principals:' key)")
    # an emptied list (`keys revoke` of the last principal) takes block items again
    text = re.sub(r"^(principals:)[ \t]*\[\][ \t]*(#.*)?$", lambda m: m[1] + (f"  {m[2]}" if m[2] else ""),
                  text, count=1, flags=re.MULTILINE)
    if not text.endswith("\n"):
        text += "\n"
    text += f"  - name: {name}\n    role: {role}\n    key_sha256: {key_sha256(key)}\n"
    write_text(p.absolute(), text, mode=0o600)   # a file named "-" too, never stdout


def hash_fingerprint(digest: str) -> str:
    """:func:`fingerprint` of a key known only by its sha256 hex (the same ``sha256:`` + 12)."""
    return "sha256:" + digest.lower()[:12]


@dataclass(frozen=True)
class Changed:
    """A principal changed in a principals file: what it had, and who is left in its role."""

    name: str
    role: str
    old_sha256: str
    left_in_role: int   # principals of the same role in the file afterwards


@dataclass(frozen=True)
class _Entry:
    item: yaml.MappingNode
    name: str
    role: str
    digest: yaml.ScalarNode


def _entries(text: str, p: Path) -> tuple[int, yaml.SequenceNode, list[_Entry]]:
    """The principals of a principals file (or a policy with ``principals:``), with the YAML nodes
    that say where each is in the text. Any problem: a UsageError naming the file."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise UsageError(f"{p}:{mark.line + 1 if mark else '?'}: not valid YAML") from None
    key, seq = None, None
    if isinstance(root, yaml.MappingNode):
        key, seq = next(((k, v) for k, v in root.value
                         if isinstance(k, yaml.ScalarNode) and k.value == "principals"), (None, None))
    if key is None or seq is None:
        raise UsageError(f"{p}: not a principals file (no 'principals:' key)")
    colon = text.find(":", int(key.end_mark.index))   # where an emptied list gets its "[]"
    if isinstance(seq, yaml.ScalarNode) and seq.value in ("", "~", "null"):
        return colon, yaml.SequenceNode("tag:yaml.org,2002:seq", []), []
    if not isinstance(seq, yaml.SequenceNode):
        raise UsageError(f"{p}:{seq.start_mark.line + 1}: principals: expected a list")
    out = []
    for item in seq.value:
        fields = {k.value: v for k, v in item.value if isinstance(k, yaml.ScalarNode)} \
            if isinstance(item, yaml.MappingNode) else {}
        name, role, digest = fields.get("name"), fields.get("role"), fields.get("key_sha256")
        if not (isinstance(item, yaml.MappingNode) and isinstance(name, yaml.ScalarNode)
                and isinstance(role, yaml.ScalarNode) and isinstance(digest, yaml.ScalarNode)):
            raise UsageError(f"{p}:{item.start_mark.line + 1}: a principal needs name, role and key_sha256")
        out.append(_Entry(item, name.value, role.value, digest))
    return colon, seq, out


def _find(path: str | Path, name: str) -> tuple[Path, str, int, yaml.SequenceNode, list[_Entry], _Entry]:
    p = Path(path)
    text = read_text(p, "principals file", UsageError)
    colon, seq, entries = _entries(text, p)
    found = [e for e in entries if e.name == name]
    if not found:
        known = ", ".join(sorted(e.name for e in entries)) or "none"
        raise UsageError(f"{p}: no principal {name!r} (known: {known})")
    if len(found) > 1:
        raise UsageError(f"{p}:{found[1].item.start_mark.line + 1}: principal {name!r} is listed twice")
    return p, text, colon, seq, entries, found[0]


def _end(node: yaml.Node) -> int:
    """Where a node's own text ends: a block mapping's end mark lies past what follows it."""
    if isinstance(node, yaml.MappingNode) and not node.flow_style and node.value:
        return _end(node.value[-1][1])
    if isinstance(node, yaml.SequenceNode) and not node.flow_style and node.value:
        return _end(node.value[-1])
    return int(node.end_mark.index)


def revoke_principal(path: str | Path, name: str) -> Changed:
    """Remove principal ``name`` from a principals file, keeping every other line (comments
    included); the file is rewritten atomically, mode 0600."""
    p, text, colon, seq, entries, entry = _find(path, name)
    start = int(entry.item.start_mark.index)
    line_start = text.rfind("\n", 0, start) + 1
    if seq.flow_style or not re.fullmatch(r"[ \t]*-[ \t]*", text[line_start:start]):
        raise UsageError(f"{p}:{entry.item.start_mark.line + 1}: cannot remove {name!r} in place: write "
                         "principals as a block list, one '- ' item per principal")
    end = text.find("\n", _end(entry.item))
    text = text[:line_start] + (text[end + 1:] if end >= 0 else "")
    if len(entries) == 1:   # the list is now empty: say so, or it would read as null
        text = text[:colon + 1] + " []" + text[colon + 1:]
    write_text(p.absolute(), text, mode=0o600)
    left = sum(1 for e in entries if e.role == entry.role and e is not entry)
    return Changed(name, entry.role, entry.digest.value.lower(), left)


def rotate_principal(path: str | Path, name: str, key: str) -> Changed:
    """Replace the key hash of principal ``name`` with that of ``key`` (role and every other line
    kept); the file is rewritten atomically, mode 0600."""
    p, text, _, _, entries, entry = _find(path, name)
    digest = key_sha256(key)
    if any(e.digest.value.lower() == digest for e in entries):
        raise UsageError(f"{p}: the new key's hash is already in the file")   # 2**-256: never
    a, b = int(entry.digest.start_mark.index), int(entry.digest.end_mark.index)
    write_text(p.absolute(), text[:a] + digest + text[b:], mode=0o600)
    left = sum(1 for e in entries if e.role == entry.role)
    return Changed(name, entry.role, entry.digest.value.lower(), left)


# vLLM's --api-key as a proxy writes it into a header: a token NGINX and Lua take as it is.
UPSTREAM_KEY = re.compile(r"^[A-Za-z0-9._~+/=:-]{1,1024}$")


def read_upstream_key(path: str) -> str:
    """vLLM's own key from the policy's ``upstream.api_key_file`` (surrounding whitespace ignored).
    Never echoed: errors name the file only."""
    key = read_text(path, "upstream.api_key_file").strip()
    if not UPSTREAM_KEY.match(key):
        raise ConfigError(f"{path}: upstream.api_key_file must hold one key (letters, digits and "
                          ". _ ~ + / = : -, at most 1024)")
    return key
