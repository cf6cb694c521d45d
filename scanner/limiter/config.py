"""The limiter's zones file: which zones exist, of which kind, with which values.

The zones are the plan's (scanner.plan.zones: RateZone, ConcurrencyZone, TokenZone, made once
from the plan's decisions); this module is the service's own configuration around them: the
file (read, checked, written), its Envoy domain and failure policy, the slot lease and the
replicas' heartbeat. ``generate`` writes it beside the proxy configs (one file for the fleet);
the service reads it at start. YAML or JSON (JSON is YAML)::

    version: 1
    domain: vllm-perimeter            # the Envoy rate limit domain the service answers for
    zones:
      "inference:key:10/20":          # a rate zone: Plan's Decision.rate_zone
        kind: rate
        rps: 10                       # refill, requests per second (> 0)
        burst: 20                     # NGINX limit_req burst: burst + 1 admitted at once
      "inference:key:conc:4":
        kind: concurrency
        limit: 4                      # live slots per key
        slot_ttl_s: 330               # a slot not released lives this long (the route's timeout + margin)
      "inference:tokens:200000":
        kind: tokens
        per_minute: 200000            # refilled continuously at per_minute / 60 a second
        burst: 50000                  # bucket size (the plan's; optional: per_minute; at most per_minute)
    slot_lease_s: 10                  # optional: a slot's lease, renewed while its request runs
    on_unavailable: local             # optional (deny): Envoy's local shares decide without Redis
    local_after_s:                    # optional, with local: seconds of an outage before a zone's
      "inference:key:10/20": 1.5      #   requests go to the local shares (503 before; the plan's)

Zone names are the plan's zone names: 1 to 200 printable ASCII characters without spaces or
braces (braces would break the Redis hash tag, scanner.limiter.keys). Every value is checked
here; a bad file is one line naming the zone and the field (ConfigError, exit 2).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from scanner.errors import ConfigError
from scanner.plan.zones import (
    DEFAULT_DOMAIN,
    ZONE_KINDS,
    ConcurrencyZone,
    RateZone,
    TokenZone,
    Zone,
    zone_json,
)

OnUnavailable = Literal["deny", "local"]
CONFIG_VERSION = 1
# a zone name or a key: printable ASCII, no space, no braces (the Redis hash tag)
NAME = re.compile(r"^[!-z|~]{1,200}$")
# a key (a principal or a client address): as a name, up to 300 (a token principal is up to 269:
# scanner.plan.jwt.PRINCIPAL_MAX)
KEY = re.compile(r"^[!-z|~]{1,300}$")
MAX_VALUE = (1 << 31) - 1     # Envoy counts hits in 32 bits; njs in doubles
MAX_SLOT_TTL_S = 24 * 3600.0
# a concurrency slot is a lease this long, renewed by the limiters while its request is in flight
# and the proxy that holds it may be alive (scanner.limiter.store.Owners, renew)
SLOT_LEASE_S = 10.0
# NGINX (njs >= 0.8): each replica says it is alive this often (js_periodic, POST /v1/alive);
# a replica not heard from for OWNER_SILENT_S is gone: its slots are no longer renewed, so they
# come back within OWNER_SILENT_S + the lease of its last word (15 s with the defaults)
HEARTBEAT_S = 2.0
OWNER_SILENT_S = 5.0


@dataclass(frozen=True)
class LimiterConfig:
    zones: Mapping[str, Zone]
    domain: str = DEFAULT_DOMAIN
    version: int = CONFIG_VERSION
    # the fleet's failure policy (policy shared.on_unavailable): "local" makes a gRPC answer
    # without Redis OK with {shared: unavailable} in Envoy's metadata (its local share decides);
    # "deny" (and the HTTP door always) answers unavailable
    on_unavailable: OnUnavailable = "deny"
    # a slot's lease (scanner.limiter.store.renew): a slot not renewed comes back after this long
    slot_lease_s: float = SLOT_LEASE_S
    # on_unavailable: local: how long an outage lasts before a zone's requests are sent to the
    # proxies' local shares (503 until then), so shares that start full hand out only what the
    # policy refilled meanwhile (scanner.plan.zones.local_after); zones not named: at once
    local_after_s: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        """The file's content (what ``generate`` writes): sorted, deterministic."""
        return {"version": self.version, "domain": self.domain,
                **({"on_unavailable": self.on_unavailable} if self.on_unavailable != "deny" else {}),
                **({"slot_lease_s": self.slot_lease_s} if self.slot_lease_s != SLOT_LEASE_S else {}),
                **({"local_after_s": dict(sorted(self.local_after_s.items()))} if self.local_after_s else {}),
                "zones": {n: zone_json(z) for n, z in sorted(self.zones.items())}}

    def local_after(self, zone_names: Iterable[str]) -> float:
        """Seconds of an outage before a request of these zones goes to the local shares."""
        return max((self.local_after_s.get(z, 0.0) for z in zone_names), default=0.0)


def per_unit(zone: Zone) -> tuple[int, Literal["second", "minute"]] | None:
    """A rate or token zone as a count per second or minute (Envoy's rate limit units): a whole
    rps per second, any other rate rounded per minute (at least 1), tokens per minute; None for a
    concurrency zone."""
    if isinstance(zone, RateZone):
        if zone.rps >= 1 and zone.rps == int(zone.rps):
            return int(zone.rps), "second"
        return max(1, round(zone.rps * 60)), "minute"
    if isinstance(zone, TokenZone):
        return zone.per_minute, "minute"
    return None


def load(path: Path) -> LimiterConfig:
    """The zones file at ``path``; ConfigError (one line) when it is missing or wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"limiter zones file {path}: cannot read it ({exc.__class__.__name__})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"limiter zones file {path}:{where} not YAML or JSON") from None
    return parse(data, str(path))


def dumps(config: LimiterConfig) -> str:
    return json.dumps(config.to_json(), indent=2, sort_keys=True) + "\n"


def parse(data: object, where: str = "zones file") -> LimiterConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping with version, domain and zones")
    top = {"version", "domain", "zones", "on_unavailable", "slot_lease_s", "local_after_s"}
    unknown = sorted(set(map(str, data)) - top)
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r} ({', '.join(sorted(top))})")
    on_unavailable = data.get("on_unavailable", "deny")
    if on_unavailable not in ("deny", "local"):
        raise ConfigError(f"{where}: on_unavailable {on_unavailable!r} is not deny or local")
    if data.get("version", CONFIG_VERSION) != CONFIG_VERSION:
        raise ConfigError(f"{where}: version {data.get('version')!r} is not {CONFIG_VERSION}")
    domain = data.get("domain", DEFAULT_DOMAIN)
    if not isinstance(domain, str) or not NAME.match(domain):
        raise ConfigError(f"{where}: domain {domain!r} is not 1-200 printable characters")
    zones = data.get("zones")
    if not isinstance(zones, dict) or not zones:
        raise ConfigError(f"{where}: zones must be a non-empty mapping of zone name -> limits")
    parsed = {str(n): _zone(str(n), z, where) for n, z in zones.items()}
    lease = SLOT_LEASE_S
    if "slot_lease_s" in data:
        lease = _number(data, "slot_lease_s", where, 1.0, MAX_SLOT_TTL_S)
    after = data.get("local_after_s", {})
    if not isinstance(after, dict) or not all(str(n) in parsed for n in after):
        raise ConfigError(f"{where}: local_after_s must map zone names of zones to seconds")
    return LimiterConfig(zones=parsed, domain=domain, on_unavailable=on_unavailable, slot_lease_s=lease,
                         local_after_s={str(n): _number(after, n, f"{where}: local_after_s", 0.0, 3600.0)
                                        for n in after})


def _zone(name: str, raw: object, where: str) -> Zone:
    at = f"{where}: zone {name!r}"
    if not NAME.match(name):
        raise ConfigError(f"{at}: a name is 1-200 printable ASCII characters, no space or braces")
    if not isinstance(raw, dict):
        raise ConfigError(f"{at}: expected a mapping with kind and its values")
    kind = raw.get("kind")
    fields = {"rate": {"kind", "rps", "burst"}, "concurrency": {"kind", "limit", "slot_ttl_s"},
              "tokens": {"kind", "per_minute", "burst"}}
    if kind not in fields:
        raise ConfigError(f"{at}: kind {kind!r} is not one of {', '.join(ZONE_KINDS)}")
    extra = sorted(set(map(str, raw)) - fields[kind])
    if extra:
        raise ConfigError(f"{at}: unknown field {extra[0]!r} for kind {kind}")
    if kind == "rate":
        return RateZone(name, rps=_number(raw, "rps", at, 1e-6, 1e6), burst=_int(raw, "burst", at, 0))
    if kind == "concurrency":
        return ConcurrencyZone(name, limit=_int(raw, "limit", at, 1),
                               slot_ttl_s=_number(raw, "slot_ttl_s", at, 1.0, MAX_SLOT_TTL_S))
    per_minute = _int(raw, "per_minute", at, 1)
    burst = _int(raw, "burst", at, 1) if "burst" in raw else 0
    if burst > per_minute:
        raise ConfigError(f"{at}: burst {burst} is more than per_minute {per_minute}")
    return TokenZone(name, per_minute=per_minute, burst=burst)


def _int(raw: Mapping[str, object], key: str, at: str, low: int) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_VALUE:
        raise ConfigError(f"{at}: {key} must be a whole number from {low} to {MAX_VALUE}, not {value!r}")
    return value


def _number(raw: Mapping[str, object], key: str, at: str, low: float, high: float) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not low <= value <= high:
        raise ConfigError(f"{at}: {key} must be a number from {low:g} to {high:g}, not {value!r}")
    return float(value)
