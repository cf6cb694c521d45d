"""Object ownership of stored responses (``body: responses: owned``), the one definition.

vLLM keeps every stored response (``store``) in one dictionary and answers ``GET
/v1/responses/{id}``, ``POST /v1/responses/{id}/cancel`` and ``previous_response_id`` for any
caller that names the id (OWASP API1). The perimeter binds each id it hands out to the principal
that received it, with no state of its own:

* **out**: every response id in an answer (a JSON answer, or each ``data:`` line of a stream) is
  sealed: ``ID~TAG``, TAG = base64url (no padding) of the first 16 bytes (128 bits) of
  HMAC-SHA256(secret, ``"response:" + principal + "\\n" + ID``). The ids are read where vLLM
  puts them (:data:`ANSWER_IDS`); each is then replaced wherever it is a whole JSON string of
  the answer's text (the bytes otherwise as vLLM wrote them).
* **in**: the path parameter (:data:`OWNED_PARAMS`) and the body fields (:func:`is_owned_field`)
  that name a response must hold a seal the requesting principal's MAC verifies; the seal is
  removed and vLLM receives its own id. Anything else (a raw id, another principal's seal, a
  forged tag, a non-string): 403 ``not-owner``.

``~`` separates: vLLM's ids (``resp_`` and 16 hex digits) never hold one, base64url never
does, it is unreserved in URLs (no client escapes it) and the route regexes' path parameter
already admits it (:data:`scanner.patterns.PARAM_REGEX`). The secret (``responses_secret_file``)
is read by the proxy at run time and never written into a generated config. The MAC is
stateless: a reload or restart, another replica of the proxy, NGINX or Envoy with the same
secret, all accept the same seals; rotating the secret revokes every seal handed out.

njs (``templates/nginx-perimeter.js``: ownerTag, sealAnswer) and Lua
(``templates/envoy_perimeter.lua.j2``: owner_tag, seal_answer) implement exactly this.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Iterable

SEPARATOR = "~"
TAG_BYTES = 16                      # 128 bits of the HMAC
TAG_CHARS = 22                      # base64url of 16 bytes, no padding
# the path parameters that name a stored response (vLLM: /v1/responses/{response_id}[/cancel])
OWNED_PARAMS: tuple[str, ...] = ("response_id",)
# an id the perimeter seals (vLLM's own: resp_ + 16 hex; anything of the path parameter's
# characters less the separator, bounded)
ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,199}")
_SEALED = re.compile(r"(" + ID.pattern + r")" + re.escape(SEPARATOR) + r"([A-Za-z0-9_-]{22})")
# where vLLM writes a response id into an answer: (container, key) pairs read by seal_answer
ANSWER_IDS: tuple[str, ...] = ("id", "previous_response_id", "response.id", "response.previous_response_id")


def is_owned_field(name: str) -> bool:
    """Does a top-level request field name a stored response (``previous_response_id``; any
    ``*_response_id`` a later vLLM adds)? Decided from the inventory's request models."""
    return name == "response_id" or name.endswith("_response_id")


def tag(secret: bytes, principal: str, rid: str) -> str:
    """The MAC of ``rid`` for ``principal``: 22 base64url characters."""
    mac = hmac.new(secret, f"response:{principal}\n{rid}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac[:TAG_BYTES]).decode("ascii").rstrip("=")


def seal(secret: bytes, principal: str, rid: str) -> str:
    """``rid`` as the perimeter hands it to ``principal``: ``rid~TAG``."""
    return rid + SEPARATOR + tag(secret, principal, rid)


def unseal(secret: bytes, principal: str, value: object) -> str | None:
    """vLLM's own id in a sealed ``value`` when its tag is ``principal``'s; None otherwise
    (``not-owner``: not a string, no seal, a malformed one, another principal's, a forgery)."""
    if not isinstance(value, str):
        return None
    m = _SEALED.fullmatch(value)
    if m is None:
        return None
    rid = m.group(1)
    return rid if hmac.compare_digest(m.group(2), tag(secret, principal, rid)) else None


def answer_ids(doc: object) -> tuple[str, ...]:
    """The response ids an answer (or one event's data) carries where vLLM writes them: the
    ``id`` of a response object (``"object": "response"``) and its ``previous_response_id``, at the
    top or in the ``response`` of a streamed event. Only ids of :data:`ID`'s shape, in order."""
    out: list[str] = []
    for obj in (doc, doc.get("response") if isinstance(doc, dict) else None):
        if not isinstance(obj, dict):
            continue
        if obj.get("object") == "response" and isinstance(obj.get("id"), str):
            out.append(obj["id"])
        if isinstance(obj.get("previous_response_id"), str):
            out.append(obj["previous_response_id"])
    return tuple(dict.fromkeys(i for i in out if ID.fullmatch(i)))


def seal_text(text: str, ids: Iterable[str], secret: bytes, principal: str) -> str:
    """``text`` (JSON) with every whole string token ``"ID"`` of ``ids`` sealed."""
    for rid in ids:
        text = text.replace(f'"{rid}"', f'"{seal(secret, principal, rid)}"')
    return text


def seal_answer(text: str, secret: bytes, principal: str) -> str:
    """A JSON answer (or one ``data:`` payload) as the perimeter passes it on; text that is not
    JSON passes unchanged."""
    try:
        doc = json.loads(text)
    except ValueError:
        return text
    return seal_text(text, answer_ids(doc), secret, principal)


def seal_line(line: str, secret: bytes, principal: str) -> str:
    """One line of an event stream (without its newline) as passed on: a ``data:`` line's JSON
    sealed (its prefix and any ``\\r`` kept), every other line unchanged."""
    if not line.startswith("data:"):
        return line
    cr = "\r" if line.endswith("\r") else ""
    body = line[5:len(line) - len(cr)]
    return "data:" + seal_answer(body, secret, principal) + cr


def seal_stream(data: str, secret: bytes, principal: str) -> str:
    """A whole event stream as passed on, line by line."""
    return "\n".join(seal_line(line, secret, principal) for line in data.split("\n"))
