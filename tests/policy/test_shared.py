"""The ``shared:`` section: one line naming the key for every bad value (exit 2 via PolicyError)."""

from pathlib import Path

import pytest

from scanner.errors import PolicyError
from scanner.policy.load import loads
from scanner.policy.model import Shared

REPO = Path(__file__).resolve().parents[2]
BASE = (REPO / "policies" / "vllm-default.yaml").read_text()


def _load(section: str) -> Shared | None:
    return loads(BASE + "\nshared:\n" + section, source="p.yaml", base_dir=REPO / "policies").shared


def test_defaults_and_full_section() -> None:
    assert _load("  redis: redis://10.0.0.7:6379/0\n") == Shared(
        redis="redis://10.0.0.7:6379/0", line=_line())
    s = _load("  redis: rediss://redis.internal:6380/2\n  limiter: \"limiter.perimeter:9000\"\n"
              "  password_file: /run/secrets/redis\n  tls: {ca: /etc/redis/ca.pem}\n"
              "  on_unavailable: local\n  replicas: 3\n")
    assert s is not None
    assert (s.redis, s.limiter, s.password_file, s.tls_ca, s.on_unavailable, s.replicas) == (
        "rediss://redis.internal:6380/2", ("limiter.perimeter", 9000), "/run/secrets/redis",
        "/etc/redis/ca.pem", "local", 3)
    assert loads(BASE, source="p.yaml", base_dir=REPO / "policies").shared is None


def test_sentinel_and_cluster_urls() -> None:
    for url in ("redis+sentinel://10.0.0.5:26379,10.0.0.6:26379/mymaster/0",
                "rediss+cluster://redis-0.redis.llm.svc:6379,redis-1.redis.llm.svc:6379"):
        s = _load(f"  redis: {url}\n" + ("  tls: {ca: /etc/redis/ca.pem}\n" if url.startswith("rediss") else ""))
        assert s is not None and s.redis == url


def _line() -> int:
    return BASE.count("\n") + 3   # the value mapping starts on the line after "shared:"


@pytest.mark.parametrize(("section", "message"), [
    ("  on_unavailable: deny\n", "missing required key 'redis'"),
    ("  redis: http://10.0.0.7:6379\n", "expected redis://HOST:PORT[/DB], redis+sentinel://"),
    ("  redis: redis+sentinel://10.0.0.7:26379\n", "names its master"),
    ("  redis: redis+cluster://10.0.0.7:7000/1\n", "database 0 only"),
    ("  redis: redis+cluster://10.0.0.7:7000,bad_host!:7000\n", "is not an IP address or DNS name"),
    ("  redis: redis+sentinel://10.0.0.7/m\n  tls: {ca: /etc/ca.pem}\n", "tls needs a rediss:// URL"),
    ("  redis: redis://:secret@10.0.0.7:6379\n", "no user or password in the Redis URL"),
    ("  redis: redis://10.0.0.7:70000\n", "'10.0.0.7:70000' is not HOST[:PORT] (the port 1-65535)"),
    ("  redis: redis://bad_host!:6379\n", "is not an IP address or DNS name"),
    ("  redis: redis://10.0.0.7\n  tls: {ca: /etc/ca.pem}\n", "tls needs a rediss:// URL"),
    ("  redis: rediss://10.0.0.7\n  tls: {ca: ca.pem}\n", "give an absolute path"),
    ("  redis: redis://10.0.0.7\n  password_file: secret.txt\n", "give an absolute path"),
    ("  redis: redis://10.0.0.7\n  on_unavailable: open\n", "'open' is not one of deny, local"),
    ("  redis: redis://10.0.0.7\n  replicas: 0\n", "expected a whole number >= 1"),
    ("  redis: redis://10.0.0.7\n  replicas: 5000\n", "at most 1000 replicas"),
    ("  redis: redis://10.0.0.7\n  limiter: 10.0.0.8\n", "is not host:port"),
    ("  redis: redis://10.0.0.7\n  replica: 2\n", "unknown key 'replica' (did you mean 'replicas'?)"),
])
def test_bad_values_are_one_line_naming_the_key(section: str, message: str) -> None:
    with pytest.raises(PolicyError) as err:
        _load(section)
    text = str(err.value)
    assert message in text and "\n" not in text and text.startswith("p.yaml:")
    assert "shared" in text
