"""The real proxies for probe tests: one by name, and one probe of a freshly generated config
(optionally weakened by a mutation operator) in front of the stand-in and its witness."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import pytest

from scanner import mutate
from scanner.errors import UsageError
from scanner.inventory.catalog import load_ref
from scanner.plan.inputs import load_policy
from scanner.plan.model import Plan
from scanner.policy.model import Limits, Policy, Rate
from scanner.probe.interface import Attempt, ProbeOptions, ProbeResult
from scanner.probe.runner import probe
from scanner.runtime import nginx
from scanner.runtime.proxy import EnvoyProxy, NginxProxy, Proxy, get
from scanner.standin.serve import StandinThread
from scanner.verify import loop


def proxy_named(name: str) -> Proxy:
    """"envoy", "nginx" (the static build, else Debian's), "nginx-debian" or "nginx-lua"; skipped if
    missing."""
    if name == "envoy":
        return EnvoyProxy()
    if name == "nginx-lua":
        try:
            return get(name)
        except UsageError as exc:
            pytest.skip(str(exc))
    build = nginx.debian_build() if name == "nginx-debian" else (nginx.static_build() or nginx.debian_build())
    if build is None:
        pytest.skip(f"no {name}")
    return NginxProxy(build, name)


def unpaced(policy: Policy, factor: int = 20) -> Policy:
    """``policy`` with every rate limit ``factor`` times higher: for tests about what reaches the
    upstream, not about rates, the probe's pacing (scanner.probe.pace) then takes seconds less.
    Rates and concurrency are tested with the policy's own limits elsewhere."""
    def faster(limits: Limits | None) -> Limits | None:
        if limits is None or limits.rate is None:
            return limits
        return replace(limits, rate=Rate(limits.rate.rps * factor, limits.rate.burst * factor))

    return replace(policy,
                   audiences={n: replace(a, limits=faster(a.limits) or a.limits) for n, a in policy.audiences.items()},
                   rules=tuple(replace(r, limits=faster(r.limits)) for r in policy.rules))


def but_rates(options: ProbeOptions) -> ProbeOptions:
    """``options`` with every check but those of rates, concurrency and timeouts: for a whole run
    under unpaced() (whose rate limits the probe cannot meet: rightly not proven; the timeouts
    hold requests for seconds and are tested in tests/probe/test_timeouts.py)."""
    import scanner.probe.checks  # noqa: F401  (registers them)
    from scanner.probe import registry

    rates = {"rate", "concurrency", "token-budget", "timeout"}
    return replace(options, checks=tuple(c for c in registry.ids() if c not in rates))


def probe_through(tmp_path: Path, proxy: Proxy, policy: Policy, catalog: str, options: ProbeOptions,
                  mutant: str = "", keys_per_role: int = 1, paced: bool = False,
                  fetch_media: bool = False, witness: bool = True, state_changes: bool = True) -> ProbeResult:
    """``policy``'s plan generated for ``proxy`` (weakened by ``mutant``), started in front of the
    stand-in (``fetch_media``: fetching media URLs as vLLM does) and probed (with the stand-in's
    witness unless ``witness`` is false; ``state_changes`` false: without --allow-state-changes,
    which verify gives its stand-in, as ``probe`` with default flags); ``paced``: under the policy's
    own rate limits, else under unpaced()."""
    inventory = load_ref(catalog)
    directory = tmp_path / "proxy"

    def written(plan: Plan) -> None:   # again on another port, when the proxy's was taken
        files = proxy.write(plan, directory)
        if mutant:
            mutate.OPERATORS[f"{proxy.kind}.{mutant}"].apply(files, plan)

    # the stand-in on a port it binds itself, then the plan naming it (as loop.loop)
    with StandinThread(inventory, "127.0.0.1", 0, fetch_media=fetch_media) as standin:
        s = loop.setup(inventory, policy if paced else unpaced(policy), tmp_path, standin.port,
                       keys_per_role=keys_per_role)
        written(s.plan)
        if state_changes:
            return loop.proxy_run(s, proxy, directory, options, standin.url if witness else "", written).result
        with ExitStack() as stack:   # loop.proxy_run, its options as given
            s = replace(s, plan=loop.start_checked(proxy, s.plan, directory, stack, written))
            opts = replace(loop.probe_options(s, options, standin.url if witness else ""),
                           allow_state_changes=False)
            return probe(s.plan, loop.target_of(s), s.credentials, s.vantages, opts)


def decided(attempts: Sequence[Attempt]) -> list[Attempt]:
    """The decided sends among ``attempts``: a case throttled before it was decided (a 429 the
    schedule did not expect, verdict inconclusive) is sent again; every case must have one."""
    out = [a for a in attempts if a.verdict != "inconclusive"]
    assert {(a.method, a.path, a.credential, a.vantage, a.note) for a in out} == \
        {(a.method, a.path, a.credential, a.vantage, a.note) for a in attempts}, "a case was never decided"
    return out


Edit = Callable[[Path], None]


def sub(name: str, old: str, new: str, count: int = 0) -> Edit:
    """A reviewer's hand edit: the regex ``old`` replaced by ``new`` in the written file ``name``
    (it must change)."""
    def edit(conf: Path) -> None:
        f = conf / name
        text = f.read_text()
        changed = re.sub(old, new, text, count=count)
        assert changed != text, (name, old)
        f.write_text(changed)
    return edit


def probe_edited(tmp_path: Path, proxy: Proxy, options: ProbeOptions, edit: Edit | None = None,
                 catalog: str = "vllm-0.29.0-default", witness: bool = True,
                 policy: Policy | None = None) -> ProbeResult:
    """The bundled policy's plan (or ``policy``'s; unpaced()) generated for ``proxy``, edited by hand
    (``edit`` gets the written config directory), started in front of the stand-in and probed with
    ``options`` (with the stand-in's witness unless ``witness`` is false)."""
    inventory = load_ref(catalog)
    directory = tmp_path / "proxy"

    def written(plan: Plan) -> None:   # again on another port, when the proxy's was taken
        files = proxy.write(plan, directory)
        if edit is not None:
            edit(files)

    with StandinThread(inventory, "127.0.0.1", 0) as standin:
        s = loop.setup(inventory, unpaced(policy or load_policy(None)), tmp_path, standin.port)
        written(s.plan)
        return loop.proxy_run(s, proxy, directory, options, standin.url if witness else "", written).result
