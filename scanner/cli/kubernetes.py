"""``generate nginx|envoy --kubernetes``: the flags, and the bundle added to the generated files."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import click

from scanner.errors import UsageError
from scanner.generate import kubernetes
from scanner.generate.interface import GeneratedConfig, GenerateOptions
from scanner.netscan.ports import KNOWN_PORTS
from scanner.plan import inputs
from scanner.plan.model import Plan

F = TypeVar("F", bound=Callable[..., Any])

# flag -> click parameter name; every one but --kubernetes itself needs --kubernetes
FLAGS = {"--k8s-namespace": "k8s_namespace", "--k8s-name": "k8s_name", "--k8s-image": "k8s_image",
         "--k8s-replicas": "k8s_replicas", "--vllm-selector": "vllm_selector",
         "--vllm-namespace": "vllm_namespace", "--k8s-audit-image": "k8s_audit_image"}


def kubernetes_options(func: F) -> F:
    defaults = kubernetes.Settings()
    opts = [
        click.option("--kubernetes", "kubernetes", is_flag=True,
                     help="Also write DIR/kubernetes/: ConfigMap, Secret (0600), Deployment, Service, "
                          "NetworkPolicies for the proxy and vLLM, and the nightly audit CronJob "
                          "(docs/kubernetes.md). The config is rendered for the pod's paths "
                          f"(config_dir {kubernetes.CONFIG_DIR} unless --set config_dir=...)."),
        click.option("--k8s-namespace", default=None, metavar="NS",
                     help=f"Namespace of the proxy and the audit (default {defaults.namespace})."),
        click.option("--k8s-name", default=None, metavar="NAME",
                     help=f"Name (and prefix) of the objects (default {defaults.name})."),
        click.option("--k8s-image", default=None, metavar="IMAGE",
                     help="Proxy image (default " + ", ".join(f"{k}: {p.image}" for k, p in
                                                            sorted(kubernetes.PROXIES.items())) + ")."),
        click.option("--k8s-replicas", default=None, type=int, metavar="N",
                     help="Proxy pods (default 1); without the policy's shared: section rate, concurrency "
                          "and token limits hold per pod; with it (default: shared.replicas) for the fleet."),
        click.option("--vllm-selector", multiple=True, metavar="KEY=VALUE[,KEY=VALUE]",
                     help="Labels of vLLM's pods (repeatable; default "
                          + ",".join(f"{k}={v}" for k, v in kubernetes.DEFAULT_VLLM_SELECTOR) + ")."),
        click.option("--vllm-namespace", default=None, metavar="NS",
                     help="vLLM's namespace, where its NetworkPolicy goes (default: --k8s-namespace)."),
        click.option("--k8s-audit-image", default=None, metavar="IMAGE",
                     help="Image with vllm-perimeter for the audit CronJob "
                          f"(default {kubernetes.AUDIT_IMAGE})."),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func


def settings(kube: Mapping[str, Any]) -> kubernetes.Settings | None:
    """The bundle's settings from the flags, checked; None without ``--kubernetes``."""
    if not kube.get("kubernetes"):
        given = [flag for flag, key in FLAGS.items() if kube.get(key) not in (None, ())]
        if given:
            raise UsageError(f"{given[0]} needs --kubernetes")
        return None
    base = kubernetes.Settings()
    selector = kube.get("vllm_selector") or ()
    return kubernetes.Settings(
        namespace=kube.get("k8s_namespace") or base.namespace,
        name=kube.get("k8s_name") or base.name,
        image=kube.get("k8s_image") or "",
        replicas=kube["k8s_replicas"] if kube.get("k8s_replicas") is not None else base.replicas,
        vllm_selector=kubernetes.parse_selector(selector) if selector else base.vllm_selector,
        vllm_namespace=kube.get("vllm_namespace") or "",
        audit_image=kube.get("k8s_audit_image") or base.audit_image,
    ).check()


def with_bundle(plan: Plan, config: GeneratedConfig, options: GenerateOptions, policy_ref: str | None,
                chosen: kubernetes.Settings) -> GeneratedConfig:
    """``config`` plus its manifests under ``kubernetes/`` (written with it: every file or none)."""
    ports = inputs.load_policy(policy_ref).ports
    internal = [(k.port, k.name) for k in KNOWN_PORTS if k.internal]
    bundle = kubernetes.render(plan, config, options, ports, chosen, internal)
    return replace(config, files=config.files + bundle.files)


def notes(out: Path) -> list[str]:
    where = out / kubernetes.SUBDIR
    return [f"apply: kubectl apply -f {where}/ ({where / 'secret.yaml'} holds the key hashes and any "
            "upstream key: mode 0600, keep it out of version control); docs/kubernetes.md"]
