"""Secrets never leave the process in clear: serve args, env, URLs, worker errors."""

from __future__ import annotations

import pytest

from scanner import secrets
from scanner.inventory.vllm_app import VllmExtraction, recorded_env


@pytest.mark.parametrize(("args", "expected"), [
    (["--api-key", "s3cret"], ["--api-key", "<redacted>"]),
    (["--api-key=s3cret"], ["--api-key=<redacted>"]),
    (["--api_key", "s3cret"], ["--api_key", "<redacted>"]),
    (["--hf-token", "hf_abc", "--model", "m"], ["--hf-token", "<redacted>", "--model", "m"]),
    (["--ssl-keyfile-password=pw"], ["--ssl-keyfile-password=<redacted>"]),
    (["--model", "m", "--port", "8000"], ["--model", "m", "--port", "8000"]),
    (["--ssl-keyfile", "/k.pem"], ["--ssl-keyfile", "/k.pem"]),  # a path, not a secret
])
def test_redact_args(args: list[str], expected: list[str]) -> None:
    assert secrets.redact_args(args) == expected


def test_redact_env_hides_secret_names_only() -> None:
    env = {"VLLM_API_KEY": "k", "HF_TOKEN": "t", "VLLM_SERVER_DEV_MODE": "1", "X_PASSWORD": ""}
    assert secrets.redact_env(env) == {
        "HF_TOKEN": "<redacted>", "VLLM_API_KEY": "<redacted>",
        "VLLM_SERVER_DEV_MODE": "1", "X_PASSWORD": "",
    }


def test_recorded_env_keeps_vllm_vars_only() -> None:
    env = {"VLLM_API_KEY": "k", "HOME": "/root", "VLLM_PERIMETER_DEBUG": "1", "VLLM_X": "y"}
    assert recorded_env(env) == {"VLLM_API_KEY": "<redacted>", "VLLM_X": "y"}


def test_secret_values_collects_every_form() -> None:
    spec = VllmExtraction(serve_args=("--api-key", "key-one", "--hf-token=tok-two", "--model", "m"))
    found = spec.secret_values({"VLLM_API_KEY": "key-three", "PATH": "/bin"})
    assert set(found) == {"key-one", "tok-two", "key-three"}


def test_scrub_replaces_secret_values() -> None:
    assert secrets.scrub("bad value 'key-one' for x", ("key-one",)) == "bad value '<redacted>' for x"
    # the longer secret first, so a secret that contains another is hidden whole
    assert secrets.scrub("k=abc-long", ("abc", "abc-long")) == "k=<redacted>"


def test_redact_url() -> None:
    assert secrets.redact_url("https://user:pw@h:8443/openapi.json?api_key=abc&x=1") == \
        "https://h:8443/openapi.json?api_key=<redacted>&x=1"
    assert secrets.redact_url("http://127.0.0.1:8000/openapi.json") == \
        "http://127.0.0.1:8000/openapi.json"


def test_fingerprint_is_stable_and_short() -> None:
    assert secrets.fingerprint("abc") == secrets.fingerprint("abc")
    assert secrets.fingerprint("abc") != secrets.fingerprint("abd")
    assert len(secrets.fingerprint("abc")) == len("sha256:") + 12
    assert "abc" not in secrets.fingerprint("abc")


def test_url_secrets_and_scrub() -> None:
    url = "https://admin:pw-1234@h/x?token=tok-5678&page=2"
    found = secrets.url_secrets(url)
    assert set(found) == {"admin", "pw-1234", "tok-5678"}
    assert secrets.scrub(f"cannot reach {url}", found) == \
        "cannot reach https://<redacted>:<redacted>@h/x?token=<redacted>&page=2"
    assert secrets.url_secrets("http://h/openapi.json") == ()
