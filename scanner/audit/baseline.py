"""A baseline: what a deployment looked like when it was last reviewed.

Layout of a baseline directory (``audit baseline DIR ...`` writes one)::

    inventory.json     the route inventory the plan was built from
    policy.yaml        the policy (+ the principals file it names, key hashes only)
    plan.json          the plan (its networks are reused; its digest is checked)
    nginx/             the generated NGINX config (nginx.conf + included files), optional
    probe.json         the last probe result, optional
    netscan.json       the last netscan result, optional

An evidence pack (``evidence build``) is a baseline too: its signature and every file are
verified first, then ``files/inventory``, ``files/policy``, ``files/plan``, ``files/config``,
``files/probe`` and ``files/netscan`` are read the same way.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from scanner.errors import ConfigError, PerimeterError, UsageError
from scanner.evidence import pack
from scanner.inventory import catalog
from scanner.inventory.model import Inventory
from scanner.inventory.model import load as load_inventory
from scanner.output import make_dir, read_json
from scanner.plan.build import build
from scanner.plan.model import Plan
from scanner.policy import load as policy_load
from scanner.policy.model import Policy
from scanner.probe import result as probe_result
from scanner.probe.interface import ProbeResult

INVENTORY = "inventory.json"
POLICY = "policy.yaml"
PLAN = "plan.json"
NGINX_DIR = "nginx"
NGINX_MAIN = "nginx.conf"
PROBE = "probe.json"
NETSCAN = "netscan.json"


@dataclass(frozen=True)
class Baseline:
    root: Path
    inventory: Inventory
    policy: Policy
    plan: Plan
    plan_digest_recorded: str          # the digest plan.json states ("" without plan.json)
    nginx_main: Path | None
    probe: ProbeResult | None
    open_ports: tuple[int, ...] | None  # from netscan.json; None without one
    signed_by: str = ""                 # evidence pack signer fingerprint; "" for a directory

    @property
    def plan_matches(self) -> bool:
        return not self.plan_digest_recorded or self.plan_digest_recorded == self.plan.digest

    @property
    def release(self) -> str:
        return self.inventory.vllm.version if self.inventory.vllm else "unknown"


@dataclass(frozen=True)
class _Files:
    inventory: Path
    policy: Path
    plan: Path | None
    nginx_main: Path | None
    probe: Path | None
    netscan: Path | None


def load(root: str | Path, public_key: str | None = None,
         networks: Mapping[str, tuple[str, ...]] | None = None) -> Baseline:
    """Load a baseline directory or a verified evidence pack; ConfigError/UsageError if invalid."""
    path = Path(root)
    if not path.is_dir():
        raise UsageError(f"baseline {path}: no such directory")
    signer = ""
    if (path / pack.MANIFEST).is_file():
        signer = _verify_pack(path, public_key)
        files = _pack_files(path)
    else:
        files = _dir_files(path)
    inventory = load_inventory(files.inventory)
    recorded, plan_networks = _plan_facts(files.plan)
    policy = policy_load.load(files.policy)
    plan = build(inventory, policy, {**plan_networks, **(networks or {})})
    return Baseline(root=path, inventory=inventory, policy=policy, plan=plan, plan_digest_recorded=recorded,
                    nginx_main=files.nginx_main,
                    probe=probe_result.load(files.probe) if files.probe else None,
                    open_ports=open_ports(files.netscan) if files.netscan else None, signed_by=signer)


def _verify_pack(path: Path, public_key: str | None) -> str:
    v = pack.verify(path, public_key)
    if not v.ok:
        bad = v.first_failure
        raise ConfigError(f"baseline {path}: evidence pack verification failed: "
                          f"{bad.path if bad else '?'}: {bad.detail if bad else ''}")
    return v.signer


def _dir_files(path: Path) -> _Files:
    for required in (INVENTORY, POLICY):
        if not (path / required).is_file():
            raise ConfigError(f"baseline {path}: missing {required}")
    return _Files(inventory=path / INVENTORY, policy=path / POLICY, plan=_opt(path / PLAN),
                  nginx_main=_opt(path / NGINX_DIR / NGINX_MAIN), probe=_opt(path / PROBE),
                  netscan=_opt(path / NETSCAN))


def _pack_files(path: Path) -> _Files:
    manifest = json.loads((path / pack.MANIFEST).read_text(encoding="utf-8"))
    by_role: dict[str, list[Path]] = {}
    for f in manifest.get("files", []):
        by_role.setdefault(str(f["role"]), []).append(path / str(f["path"]))
    if "inventory" not in by_role or "policy" not in by_role:
        raise ConfigError(f"baseline {path}: the evidence pack has no inventory or no policy")
    configs = by_role.get("config", [])
    main = next((p for p in configs if p.name == NGINX_MAIN), None)
    return _Files(inventory=by_role["inventory"][0], policy=by_role["policy"][0],
                  plan=_first(by_role, "plan"), nginx_main=main, probe=_first(by_role, "probe"),
                  netscan=_first(by_role, "netscan"))


def _first(by_role: Mapping[str, list[Path]], role: str) -> Path | None:
    return by_role[role][0] if by_role.get(role) else None


def _opt(p: Path) -> Path | None:
    return p if p.is_file() else None


def _plan_facts(p: Path | None) -> tuple[str, dict[str, tuple[str, ...]]]:
    """(recorded digest, networks) of a plan.json."""
    if p is None:
        return "", {}
    data = read_json(p, "plan")
    nets = data.get("networks") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(data.get("digest"), str) or not isinstance(nets, dict):
        raise ConfigError(f"{p}: not a plan (no digest or networks)")
    return data["digest"], {str(k): tuple(str(c) for c in v) for k, v in nets.items()}


def open_ports(p: Path) -> tuple[int, ...]:
    """Open ports of a netscan JSON result."""
    data = read_json(p, "netscan result")
    try:
        return tuple(sorted(int(a["port"]) for a in data["attempts"] if a["state"] == "open"))
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{p}: not a netscan result") from None


# --- create ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BaselineInputs:
    inventory: str                     # file or catalog name
    policy: Path
    networks: Mapping[str, tuple[str, ...]]
    nginx_config_dir: Path | None = None
    probe: Path | None = None
    netscan: Path | None = None


def create(out: str | Path, given: BaselineInputs) -> list[str]:
    """Write a baseline directory; returns the files written (relative)."""
    root = Path(out)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise UsageError(f"{root} exists and is not an empty directory")
    inventory = catalog.load_ref(given.inventory)
    policy = policy_load.load(given.policy)
    plan = build(inventory, policy, given.networks)
    for item in (given.probe, given.netscan):
        if item is not None and not item.is_file():
            raise UsageError(f"{item}: no such file")
    if given.probe is not None:
        probe_result.load(given.probe)
    if given.netscan is not None:
        open_ports(given.netscan)
    make_dir(root)
    written = [_write(root / INVENTORY, inventory.to_json()), *_copy_policy(given.policy, root),
               _write(root / PLAN, plan.to_json())]
    if given.nginx_config_dir is not None:
        written += _copy_nginx(given.nginx_config_dir, root / NGINX_DIR)
    if given.probe is not None:
        written.append(_write(root / PROBE, given.probe.read_text(encoding="utf-8")))
    if given.netscan is not None:
        written.append(_write(root / NETSCAN, given.netscan.read_text(encoding="utf-8")))
    return [str(Path(w).relative_to(root)) for w in written]


def _write(p: Path, text: str) -> str:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return str(p)


def _copy_policy(policy: Path, root: Path) -> list[str]:
    shutil.copyfile(policy, root / POLICY)
    out = [str(root / POLICY)]
    ref = (yaml.safe_load(policy.read_text(encoding="utf-8")) or {}).get("principals_file")
    if isinstance(ref, str):
        if Path(ref).is_absolute() or ".." in Path(ref).parts:
            raise UsageError(f"{policy}: principals_file {ref!r} must be a relative path inside "
                             "the policy's directory to be copied into a baseline")
        (root / ref).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(policy.parent / ref, root / ref)
        out.append(str(root / ref))
    return out


def _copy_nginx(src: Path, dest: Path) -> list[str]:
    if not (src / NGINX_MAIN).is_file():
        raise UsageError(f"--nginx-config-dir {src}: no {NGINX_MAIN} in it")
    out = []
    for f in sorted(src.iterdir()):
        if f.is_file() and f.suffix in (".conf", ".js"):
            found = pack.secret_in(f.read_bytes())
            if found:
                raise UsageError(f"{f} contains {found}; a baseline never holds secrets")
            out.append(_write(dest / f.name, f.read_text(encoding="utf-8")))
    return out


def load_or_exit(root: str | Path, public_key: str | None,
                 networks: Mapping[str, tuple[str, ...]] | None) -> Baseline:
    """:func:`load`, with any unexpected validation error turned into a one-line ConfigError."""
    try:
        return load(root, public_key, networks)
    except PerimeterError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"baseline {root}: invalid: {exc}") from None
