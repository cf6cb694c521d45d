"""``vllm-perimeter limiter``: the shared limiter service (scanner.limiter) on Redis."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from scanner import stop
from scanner.errors import StoreUnavailableError, UsageError

if TYPE_CHECKING:   # redis, h2 and h11 are imported when the command runs, not with the CLI
    from scanner.limiter import server


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--listen {text!r}: expected HOST:PORT (e.g. 127.0.0.1:8081)")
    return host, int(port)


@click.command("limiter")
@click.option("--redis", "redis_url", required=True, metavar="URL",
              help="redis://HOST:PORT[/DB] (rediss://: TLS); Sentinel: redis+sentinel://HOST:PORT"
                   "[,HOST:PORT...]/MASTER[/DB]; Redis Cluster: redis+cluster://HOST:PORT[,HOST:PORT...]. "
                   "No password in the URL.")
@click.option("--redis-password-file", type=click.Path(path_type=Path), default=None, metavar="FILE",
              help="A file holding the Redis password (AUTH); never printed.")
@click.option("--redis-ca-file", type=click.Path(path_type=Path), default=None, metavar="FILE",
              help="With rediss://: the CA bundle that signs Redis's certificate.")
@click.option("--zones", "zones_file", required=True, type=click.Path(path_type=Path), metavar="FILE",
              help="The zones file (YAML or JSON: version, domain, zones).")
@click.option("--listen", default="127.0.0.1:8081", show_default=True, metavar="HOST:PORT",
              help="Where to serve gRPC (Envoy's rate limit service, h2c) and HTTP/1.1 (njs) together.")
def command(redis_url: str, redis_password_file: Path | None, redis_ca_file: Path | None,
            zones_file: Path, listen: str) -> None:
    """Serve the shared limiter until Ctrl-C: Envoy's rate limit service protocol and an HTTP
    JSON API for NGINX's njs on one port, every decision an atomic script in Redis.

    \b
    Examples:
      vllm-perimeter limiter --redis redis://127.0.0.1:6379/0 --zones limiter.yaml
      vllm-perimeter limiter --redis rediss://redis.internal:6380/0 --redis-ca-file ca.pem \\
          --redis-password-file /run/secrets/redis --zones limiter.yaml --listen 0.0.0.0:8081
    """
    from scanner.limiter import config as zones_config
    from scanner.limiter import server, store

    host, port = _listen(listen)
    config = zones_config.load(zones_file)
    spec = store.StoreSpec(redis_url, redis_password_file, redis_ca_file)
    redis = store.connect(spec)

    def ready(h: str, p: int) -> None:
        click.echo(f"limiter: {len(config.zones)} zones, domain {config.domain}, "
                   f"gRPC and HTTP/1.1 on {h}:{p}", err=True)

    stop.run(_run(server.Service(redis, config), host, port, ready))


async def _run(service: server.Service, host: str, port: int, ready: server.Ready) -> None:
    from scanner.limiter import server, store

    try:
        await store.ping(service.redis)
    except StoreUnavailableError as exc:   # start anyway: every answer says so until Redis is back
        click.echo(f"limiter: warning: {exc}", err=True)
    try:
        await server.serve(service, host, port, ready)
    except OSError as exc:
        raise UsageError(f"--listen {host}:{port}: cannot listen ({exc.strerror or exc})") from None
    finally:
        await service.redis.aclose()
