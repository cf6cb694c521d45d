"""inventory diff: added, removed, changed (methods, guard, kind); outside-guard first."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from scanner.inventory import catalog
from scanner.inventory.diff import diff
from scanner.inventory.model import (
    Inventory,
    NestedField,
    RequestBody,
    RequestField,
    Route,
    Source,
    VllmFacts,
)
from scanner.report import inventory_diff
from tests.inventory.conftest import CliResult


def inv(*routes: Route, prefixes: tuple[str, ...] = ("/v1",), mw: tuple[str, ...] = ()) -> Inventory:
    return Inventory(source=Source("vllm", "t"), routes=routes,
                     vllm=VllmFacts(version="1", guarded_prefixes=prefixes), middleware=mw)


def r(path: str, *methods: str, kind: str = "http", guarded: bool | None = None) -> Route:
    g = path.startswith("/v1") if guarded is None else guarded
    return Route(path, tuple(methods) or ("GET",), kind, f"e{path}", g)  # type: ignore[arg-type]


OLD = inv(r("/health"), r("/v1/models"), r("/tokenize", "POST"), r("/v1/old", "POST"),
          r("/ping", "GET"), r("/ping", "POST"), r("/metrics", "*", kind="mount"),
          r("/v1/realtime", kind="websocket"), r("/moved", "GET"), mw=("a.A", "b.B"))
NEW = inv(r("/health"), r("/v1/models", "GET", "POST"), r("/tokenize", "POST"),
          r("/pause", "POST"), r("/v1/new", "POST"), r("/ping", "GET"),
          r("/metrics", "*", kind="mount"), r("/metrics", "GET"),
          r("/v1/realtime", "GET"), r("/moved", "GET", guarded=True), mw=("b.B", "c.C"))


def test_added_removed_changed() -> None:
    d = diff(OLD, NEW, "old.json", "new.json")
    by_path = {c.path: c for c in d.changes}
    assert {p for p, c in by_path.items() if c.change == "added"} == {"/pause", "/v1/new"}
    assert {p for p, c in by_path.items() if c.change == "removed"} == {"/v1/old"}
    changed = {p: c.fields for p, c in by_path.items() if c.change == "changed"}
    assert changed == {
        "/v1/models": ("methods",),
        "/ping": ("methods",),           # two routes on one path: union of methods compared
        "/metrics": ("methods", "kind"),  # a GET route now sits beside the mount
        "/v1/realtime": ("kind",),        # websocket -> http
        "/moved": ("guard",),
    }
    assert "/health" not in by_path and "/tokenize" not in by_path
    assert by_path["/v1/models"].methods_added == ("POST",)
    assert by_path["/ping"].methods_removed == ("POST",)
    assert d.middleware_added == ("c.C",) and d.middleware_removed == ("a.A",)


def test_outside_guard_changes_come_first() -> None:
    d = diff(OLD, NEW)
    flags = [c.outside_guard for c in d.changes]
    assert flags == sorted(flags, reverse=True)  # all True before all False
    outside = [c.path for c in d.outside_guard]
    assert outside == ["/pause", "/metrics", "/moved", "/ping"]  # added, then changed; by path
    assert [c.path for c in d.inside_guard] == ["/v1/new", "/v1/old", "/v1/models", "/v1/realtime"]
    s = d.summary()
    assert (s["added"], s["added_outside_guard"], s["removed"], s["changed"]) == (2, 1, 1, 5)


def test_identical_inventories_have_no_diff() -> None:
    d = diff(OLD, OLD)
    assert d.empty and d.changes == ()
    assert "no route differences" in inventory_diff.to_table(d)


def test_guarded_prefix_change_is_flagged() -> None:
    d = diff(inv(r("/v1/a")), inv(r("/v1/a"), prefixes=("/v1", "/v3")))
    assert d.guard_prefixes_changed and not d.empty
    assert "guarded prefixes changed: /v1 -> /v1, /v3" in inventory_diff.to_table(d)


def test_table_and_json_rendering() -> None:
    d = diff(OLD, NEW, "old.json", "new.json")
    table = inventory_diff.to_table(d)
    assert table.index("Outside vLLM's --api-key guard") < table.index("Inside the guard")
    assert "old: old.json (vLLM 1, 9 routes, 6 outside the guard)" in table
    assert "guarded -> OPEN" not in table and "OPEN -> guarded" in table  # /moved
    assert "GET -> GET,POST" in table
    data = d.to_dict()
    assert data["summary"]["changed_outside_guard"] == 3
    assert data["changes"][0]["path"] == "/pause" and data["changes"][0]["outside_guard"]
    assert data["old"]["content_hash"] == OLD.content_hash
    assert inventory_diff.render(d, "json").startswith("{\n")


def test_bundled_028_to_029_default(run_cli: Callable[..., CliResult]) -> None:
    res = run_cli("inventory", "diff", "vllm-0.28.0-default", "vllm-0.29.0-default",
                  "--format", "json")
    assert res.rc == 0
    data = res.json()
    assert data["old"]["version"] == "0.28.0" and data["new"]["version"] == "0.29.0"
    added = [c["path"] for c in data["changes"] if c["change"] == "added"]
    assert "/v1/messages/render" in added


def test_diff_files_and_catalog_names_mix(run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    p = tmp_path / "mine.json"
    p.write_text(catalog.load_catalog("vllm-0.29.0-default").to_json(), encoding="utf-8")
    res = run_cli("inventory", "diff", str(p), "vllm-0.29.0-default")
    assert res.rc == 0
    assert "no route differences" in res.out


def test_diff_with_invalid_file_is_exit_2(run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    p = tmp_path / "bad.json"
    p.write_text('{"schema_version": 1, "source": {"kind": "vllm"}, "routes": [{}]}', "utf-8")
    line = run_cli("inventory", "diff", str(p), "vllm-0.29.0-default").assert_one_line_error(2)
    assert "bad.json: invalid inventory: routes[0].path: Field required" in line


def test_diff_with_unknown_name_is_exit_2(run_cli: Callable[..., CliResult]) -> None:
    line = run_cli("inventory", "diff", "vllm-9.9.9-default", "vllm-0.29.0-default") \
        .assert_one_line_error(2)
    assert "neither an inventory file nor a bundled catalog" in line
    assert "vllm-0.29.0-default" in line  # lists what is bundled


# --- request fields ------------------------------------------------------------------------------


def body(*fields: RequestField, source: str = "fastapi", models: tuple[str, ...] = ("a.M",)) -> RequestBody:
    return RequestBody(source, "application/json", models, ("object",), "allow", fields)  # type: ignore[arg-type]


def with_body(path: str, b: RequestBody | None, guarded: bool = True) -> Route:
    return Route(path, ("POST",), "http", f"e{path}", guarded, request=b)


CHAT_OLD = body(
    RequestField("messages", ("array",), True, nested=(
        NestedField("messages[]", ("object",)),
        NestedField("messages[].content", ("string", "array")),
        NestedField("messages[].content[]", ("object",)),
        NestedField("messages[].content[].type", ("string",), True, enum=('"image_url"', '"text"')),
    )),
    RequestField("max_tokens", ("integer", "null"), default_json="16"),
    RequestField("best_of", ("integer",)),
    RequestField("old_obj", ("object",), nested=(NestedField("old_obj.a", ("string",)),
                                                NestedField("old_obj.b", ("object",)),
                                                NestedField("old_obj.b.c", ("string",)))),
)
CHAT_NEW = body(
    RequestField("messages", ("array",), True, nested=(
        NestedField("messages[]", ("object",)),
        NestedField("messages[].content", ("string", "null", "array")),
        NestedField("messages[].content[]", ("object",)),
        NestedField("messages[].content[].type", ("string",), True,
                    enum=('"image_url"', '"text"', '"video_url"')),
        NestedField("messages[].content[].video_url", ("object",)),
        NestedField("messages[].content[].video_url.url", ("string",), True),
    )),
    RequestField("max_tokens", ("integer", "null"), default_json="null"),
    RequestField("kv_transfer_params", ("null", "object"), default_json="null"),
    models=("b.M",),  # moved module: not a change
)


def test_request_fields_added_removed_changed_per_route() -> None:
    old = inv(with_body("/v1/chat", CHAT_OLD), with_body("/tokenize", body(), guarded=False))
    new = inv(with_body("/v1/chat", CHAT_NEW), with_body("/tokenize", body(), guarded=False))
    d = diff(old, new)
    assert d.changes == () and d.fields_compared and not d.empty
    (chat,) = d.bodies
    assert (chat.path, chat.method, chat.outside_guard, chat.aspects) == ("/v1/chat", "POST", False, ())
    got = {(c.path, c.change): c for c in chat.fields}
    assert set(got) == {
        ("messages[].content", "changed"),
        ("messages[].content[].type", "changed"),
        ("messages[].content[].video_url", "added"),  # its .url folded into it
        ("max_tokens", "changed"),
        ("kv_transfer_params", "added"),
        ("best_of", "removed"),
        ("old_obj", "removed"),
    }
    assert got[("messages[].content[].video_url", "added")].nested == 1
    assert got[("old_obj", "removed")].nested == 3
    assert got[("messages[].content", "changed")].aspects == ("types",)
    assert got[("messages[].content[].type", "changed")].aspects == ("enum",)
    assert got[("max_tokens", "changed")].aspects == ("default",)
    assert (chat.count("added"), chat.count("removed"), chat.count("changed")) == (2, 2, 3)
    assert d.field_summary() == {"routes": 1, "fields_added": 2, "fields_removed": 2, "fields_changed": 3}

    table = inventory_diff.to_table(d)
    assert "POST /v1/chat (guarded; M): 2 added, 2 removed, 3 changed" in table
    assert "enum +\"video_url\"" in table
    assert "default 16 -> null" in table
    assert "types string,array -> string,null,array" in table
    assert "old_obj (+3 nested)" in table and "kv_transfer_params" in table
    data = d.to_dict()["request_fields"]
    assert data["compared"] and data["summary"]["fields_added"] == 2
    assert data["routes"][0]["fields"][0]["field"] == "messages[].content"
    assert "request fields" not in inventory_diff.to_table(d, fields=False).lower()
    assert "request_fields" not in inventory_diff.render(d, "json", fields=False)


def test_body_that_stops_being_validated_is_one_change() -> None:
    raw = RequestBody("none", note="nothing reads the body")
    d = diff(inv(with_body("/v1/render", CHAT_OLD), with_body("/open", CHAT_OLD, guarded=False)),
             inv(with_body("/v1/render", raw), with_body("/open", CHAT_OLD, guarded=False)))
    (change,) = d.bodies
    assert change.aspects == ("source", "media_type", "models", "types", "extra")
    assert change.fields == ()  # not 4 removed fields
    table = inventory_diff.to_table(d)
    assert "POST /v1/render (guarded; none): the body changed" in table
    assert "fastapi application/json M extra=allow 4 fields -> none" in table


def test_fields_are_not_compared_with_an_inventory_that_has_no_bodies() -> None:
    old = inv(with_body("/v1/chat", None))
    d = diff(old, inv(with_body("/v1/chat", CHAT_NEW)))
    assert not d.fields_compared and d.bodies == () and d.empty
    assert "request fields: not compared" in inventory_diff.to_table(d)
    same = diff(inv(with_body("/v1/chat", CHAT_NEW)), inv(with_body("/v1/chat", CHAT_NEW)))
    assert same.fields_compared and same.empty
    assert "request fields: no differences" in inventory_diff.to_table(same)


def test_bundled_catalogs_request_field_review(run_cli: Callable[..., CliResult]) -> None:
    res = run_cli("inventory", "diff", "vllm-0.29.0-everything", "vllm-0.33.0-everything",
                  "--format", "json")
    assert res.rc == 0
    data = res.json()["request_fields"]
    assert data["compared"]
    routes = {(r["path"], r["method"]): r for r in data["routes"]}
    completions = {f["field"]: f for f in routes[("/v1/completions", "POST")]["fields"]}
    assert completions["mm_payload"]["change"] == "added"
    assert completions["skip_special_tokens"]["aspects"] == ["types", "default"]
    chat = {f["field"]: f for f in routes[("/v1/chat/completions", "POST")]["fields"]}
    assert chat["return_assistant_tokens_mask"]["change"] == "removed"
    assert chat["messages[].reasoning"]["aspects"] == ["types"]
    scoring = routes[("/generative_scoring", "POST")]  # 0.29 parsed it raw, 0.33 validates it
    assert scoring["aspects"][0] == "source" and scoring["old"]["source"] == "unknown"
    assert scoring["new"]["source"] == "fastapi" and scoring["fields"] == []
    table = run_cli("inventory", "diff", "vllm-0.28.0-everything", "vllm-0.29.0-everything")
    assert table.rc == 0
    assert "POST /v1/chat/completions (guarded; ChatCompletionRequest)" in table.out
    assert "messages[].content[].video_embeds (+1 nested)" in table.out
    quiet = run_cli("inventory", "diff", "vllm-0.28.0-everything", "vllm-0.29.0-everything",
                    "--no-fields")
    assert quiet.rc == 0 and "Request fields" not in quiet.out
