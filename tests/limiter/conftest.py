from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scanner.runtime.process import ManagedProcess
from tests.limiter.harness import limiter_process, redis_process, url


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    """One redis-server for a module; stopped by its process group at the end."""
    with redis_process(Path(tmp_path_factory.mktemp("redis"))) as proc:
        yield proc


@pytest.fixture(scope="module")
def limiter(redis_server: ManagedProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    """The limiter service in front of the module's redis-server."""
    with limiter_process(Path(tmp_path_factory.mktemp("limiter")), url(redis_server)) as proc:
        yield proc
