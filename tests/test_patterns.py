import pytest

from scanner import patterns


@pytest.mark.parametrize(
    ("rule", "route", "expected"),
    [
        ("/v1/models", "/v1/models", True),
        ("/v1/models", "/v1/model", False),
        ("/v1/**", "/v1/chat/completions", True),
        ("/v1/**", "/v2/rerank", False),
        ("/v1/responses/{id}", "/v1/responses/{response_id}", True),
        ("/v1/responses/*", "/v1/responses/{response_id}", True),
        ("/v1/responses/x", "/v1/responses/{response_id}", False),
        ("/reset_*_cache", "/reset_mm_cache", True),
        ("/reset_*_cache", "/reset_mm", False),
        ("/**", "/", True),
    ],
)
def test_covers(rule: str, route: str, expected: bool) -> None:
    assert patterns.covers(rule, route) is expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("/v1/**", "/v1/models", True),
        ("/v1/models", "/v1/model", False),
        ("/a/*", "/a/{x}", True),
        ("/a/*", "/a/b/c", False),
        ("/**/x", "/a/b/x", True),
        ("/reset_*", "/reset_mm_cache", True),
        ("/reset_*", "/start_*", False),
    ],
)
def test_overlaps(a: str, b: str, expected: bool) -> None:
    assert patterns.overlaps(a, b) is expected
    assert patterns.overlaps(b, a) is expected


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [("v1/models", "start"), ("/a//b", "//"), ("/a/../b", "dot"), ("/a/{b", "parameter"),
     ("/a/x**", "whole segment"), ("/a%2fb", "percent")],
)
def test_validate_rejects(pattern: str, problem: str) -> None:
    why = patterns.validate(pattern)
    assert why is not None and problem in why


def test_regex_is_anchored_and_narrow() -> None:
    import re

    rx = re.compile(patterns.to_regex("/v1/responses/{response_id}/cancel"))
    assert rx.match("/v1/responses/resp_123/cancel")
    for bad in ("/v1/responses/a/b/cancel", "/v1/responses//cancel", "/v1/responses/%2e/cancel",
                "/v1/responses/x/cancel/", "x/v1/responses/a/cancel", "/v1/responses/../cancel"):
        assert not rx.match(bad), bad
    assert patterns.to_regex("/openapi.json") == r"^/openapi\.json$"
