"""vllm-perimeter: a default-deny perimeter for vLLM's OpenAI-compatible server.

Data flows one way::

    inventory -> plan (inventory + policy) -> generate (NGINX, Envoy)
                                           -> probe -> findings + coverage -> report
    verify = plan -> generate -> runtime (the proxy) + standin (upstream, witness) -> probe
    audit  = probe + netscan + config drift against a baseline (evidence packs)

The plan (:mod:`scanner.plan.model`) is the single truth: the generators render it, the prober
takes its expectations from it. A seam has an interface only where it has several
implementations: inventory sources (:mod:`scanner.inventory.interface`), generators
(:mod:`scanner.generate.interface`), the proxies ``verify`` runs (:mod:`scanner.runtime.proxy`),
probe checks (:mod:`scanner.probe.registry`) and writers (:mod:`scanner.report.probe_writers`).
Shared vocabularies live in flat modules: :mod:`scanner.reasons` (why a proxy refused),
:mod:`scanner.severity` (finding severities and the exit-code rule), :mod:`scanner.errors`
(the exception tree; every error derives from ``PerimeterError``).
"""

__version__ = "0.1.0"
