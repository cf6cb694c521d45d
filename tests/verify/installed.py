"""The proxies verify's tests run: one by its proxy id, skipped when it is not installed (never in
CI, where .ci/run installs every one: there a missing proxy fails the test)."""

from __future__ import annotations

import os

import pytest

from scanner.errors import UsageError
from scanner.runtime.proxy import Proxy, get


def installed(name: str) -> Proxy:
    try:
        return get(name)
    except UsageError:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"{name} is not installed")
