"""Load a policy YAML into its models (scanner/policy/model.py validates it); every error names
its file, line and key: ``p.yaml:15: routes[0].audience: unknown audience 'inferense'``."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import ValidationError

from scanner.errors import PolicyError
from scanner.output import read_text
from scanner.policy.base import Path_, YamlMap, explain, replace, shown, validate
from scanner.policy.model import Policy, PrincipalsFile

T = TypeVar("T")


def load(path: str | Path) -> Policy:
    p = Path(path)
    return loads(read_text(p, "policy", PolicyError), source=str(p), base_dir=p.parent)


def loads(text: str, source: str = "<policy>", base_dir: Path | None = None) -> Policy:
    base = base_dir or Path(".")
    data, lines = _read(text, source, "the policy is empty")
    ref = data.get("principals_file") if isinstance(data, dict) else None
    if ref is not None:
        if not isinstance(ref, str) or not ref:
            raise _at(source, lines, ("principals_file",), f"expected a non-empty string, got {ref!r}")
        path = base / ref
        file_text = read_text(path, "principals file",
                              lambda why: _at(source, lines, ("principals_file",), why))
        more = (_model(PrincipalsFile, *_read(file_text, str(path), ""), str(path), base)
                if file_text.strip() else PrincipalsFile())
        own = data.get("principals", [])
        data["principals"] = [*(own if isinstance(own, list) else [own]), *more.principals, *more.certs]
    policy = _model(Policy, data, lines, source, base)
    return replace(policy, source=source, digest="sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest())


def _model(cls: type[T], data: Any, lines: dict[Path_, int], source: str, base: Path) -> T:
    try:
        return validate(cls, data, {"base_dir": base, "lines": lines})
    except ValidationError as exc:
        path, where, message = explain(exc, cls)
        raise _at(source, lines, path, message, where) from None


def _at(source: str, lines: dict[Path_, int], path: Path_, message: str,
        where: str | None = None) -> PolicyError:
    """``source:line: key.path: message``: the line of ``path``, or of the nearest key above it."""
    line = next((lines[path[:n]] for n in range(len(path), -1, -1) if path[:n] in lines), None)
    where = shown(path) if where is None else where
    return PolicyError(f"{source}{f':{line}' if line else ''}: {f'{where}: ' if where else ''}{message}")


def _read(text: str, source: str, empty: str) -> tuple[Any, dict[Path_, int]]:
    """The YAML document as values (mappings as :class:`YamlMap`), and the line of each path's
    value (``("routes", 0, "audience")``)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"{mark.line + 1}" if mark is not None else "?"
        raise PolicyError(f"{source}:{line}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if root is None:
        if empty:
            raise PolicyError(f"{source}: {empty}")
        return YamlMap({}, (), 1), {(): 1}
    lines: dict[Path_, int] = {}
    return _value(root, (), lines, source), lines


def _value(node: yaml.Node, path: Path_, lines: dict[Path_, int], source: str) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.SequenceNode):
        return [_value(child, (*path, i), lines, source) for i, child in enumerate(node.value)]
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            if key in out:
                raise _at(source, {(*path, key): key_node.start_mark.line + 1}, (*path, key), "duplicate key")
            out[key] = _value(value_node, (*path, key), lines, source)
        return YamlMap(out, path, lines[path])
    try:
        return yaml.safe_load(yaml.serialize(node))
    except yaml.YAMLError as exc:  # an unknown tag (!foo) or a bad !!binary
        raise _at(source, lines, path, f"not a plain value: {getattr(exc, 'problem', None) or exc}") from None
