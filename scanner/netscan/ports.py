"""The default port set: vLLM's documented default ports, as data, with where each comes from.

Sources (checked against vLLM 0.29.0's installed sources, ``vllm/envs.py`` and
``vllm/config/*.py``; Ray's from docs.ray.io):

* ``vllm/entrypoints/launchers/cli_args.py``: ``port: int = 8000`` (``vllm serve --port``)
* ``vllm/config/parallel.py``: ``data_parallel_master_port: int = 29500``,
  ``master_port: int = 29501`` (multi-node ``mp`` backend), ``data_parallel_rpc_port`` default 29550
* ``vllm/config/kv_transfer.py``: ``kv_port: int = 14579``; ``vllm/config/ec_transfer.py``: ``ec_port``
* ``vllm/envs.py``: ``VLLM_NIXL_SIDE_CHANNEL_PORT`` "5600", ``VLLM_EC_SIDE_CHANNEL_PORT`` "5601",
  ``VLLM_P2P_SIDE_CHANNEL_PORT`` "5710", ``VLLM_MOONCAKE_BOOTSTRAP_PORT`` "8998";
  ``VLLM_DP_MASTER_PORT`` and ``VLLM_PORT`` have no fixed default (0 / unset: a free port)
* Ray (``ray start``): GCS ``--port`` 6379, dashboard ``--dashboard-port`` 8265,
  client server ``--ray-client-server-port`` 10001 (docs.ray.io cluster/cli.html)

vLLM's Prometheus ``/metrics`` is served on the API port (8000), not a port of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from scanner.errors import UsageError
from scanner.netscan.model import Severity

DEFAULT_MAX_PORTS = 1024
HARD_MAX_PORTS = 65535


@dataclass(frozen=True)
class KnownPort:
    port: int
    name: str
    internal: bool      # never meant to face clients (rendezvous, ZMQ, KV transfer, Ray)
    note: str

    @property
    def severity(self) -> Severity:
        """High for internal ports, and for the vLLM API itself (reaching it bypasses the proxy)."""
        return "high" if self.internal or self.name == "vllm-api" else "medium"


KNOWN_PORTS: tuple[KnownPort, ...] = (
    KnownPort(8000, "vllm-api", False,
              "vLLM OpenAI-compatible API (`vllm serve --port`, default 8000); also serves /metrics. "
              "Should answer only behind the perimeter proxy."),
    KnownPort(29500, "torch-master", True,
              "torch.distributed MASTER_PORT / TCPStore (torchrun default 29500); vLLM's "
              "ParallelConfig.data_parallel_master_port default. Unauthenticated rendezvous."),
    KnownPort(29501, "vllm-mp-master", True,
              "ParallelConfig.master_port (multi-node `mp` executor TCPStore), default 29501."),
    KnownPort(29550, "vllm-dp-rpc", True,
              "ParallelConfig.data_parallel_rpc_port (ZMQ data-parallel messaging), default 29550."),
    KnownPort(14579, "vllm-kv-transfer", True,
              "KVTransferConfig.kv_port / ECTransferConfig.ec_port, default 14579 (KV cache transfer)."),
    KnownPort(5600, "nixl-side-channel", True,
              "VLLM_NIXL_SIDE_CHANNEL_PORT, default 5600 (NIXL handshake, ZMQ, no auth)."),
    KnownPort(5601, "ec-side-channel", True,
              "VLLM_EC_SIDE_CHANNEL_PORT, default 5601 (EC connector ZMQ side channel)."),
    KnownPort(5710, "p2p-side-channel", True,
              "VLLM_P2P_SIDE_CHANNEL_PORT, default 5710 (P2P KV-offload control socket)."),
    KnownPort(8998, "mooncake-bootstrap", True,
              "VLLM_MOONCAKE_BOOTSTRAP_PORT, default 8998 (Mooncake handshake)."),
    KnownPort(6379, "ray-gcs", True, "Ray GCS (`ray start --port`, default 6379)."),
    KnownPort(8265, "ray-dashboard", True,
              "Ray dashboard and job submission API (default 8265): remote code execution if exposed."),
    KnownPort(10001, "ray-client", True, "Ray client server (default 10001)."),
)

_BY_PORT = {k.port: k for k in KNOWN_PORTS}


def known(port: int) -> KnownPort | None:
    return _BY_PORT.get(port)


def default_ports() -> tuple[int, ...]:
    return tuple(sorted(_BY_PORT))


def parse_ports(spec: str, max_ports: int = DEFAULT_MAX_PORTS) -> tuple[int, ...]:
    """``"8000,29500-29510"`` -> sorted unique ports; at most ``max_ports`` of them."""
    if not 1 <= max_ports <= HARD_MAX_PORTS:
        raise UsageError(f"--max-ports must be 1-{HARD_MAX_PORTS}, got {max_ports}")
    out: set[int] = set()
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            raise UsageError(f"--ports {spec!r}: empty item")
        low_text, sep, high_text = part.partition("-")
        low = _port(low_text, spec)
        high = _port(high_text, spec) if sep else low
        if high < low:
            raise UsageError(f"--ports {spec!r}: range {part!r} runs backwards")
        if high - low + 1 + len(out) > max_ports:
            raise UsageError(f"--ports {spec!r} names more than --max-ports {max_ports} ports")
        out.update(range(low, high + 1))
    return tuple(sorted(out))


def _port(text: str, spec: str) -> int:
    text = text.strip()
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise UsageError(f"--ports {spec!r}: {text!r} is not a TCP port (1-65535)")
    return int(text)
