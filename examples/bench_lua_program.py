"""Benchmark (not a test): Envoy's Lua rule program alone, under the system's LuaJIT, per step.

Takes the Lua of the perimeter ``examples/bench_envoy.py`` generates (the chat route of the
default policy's inference audience, its field, count and media rules), appends a timing loop
and runs it in Debian's ``libluajit-5.1.so.2`` through ctypes (there is no ``luajit`` binary
here; Envoy 1.40 runs LuaJIT 2.1 with the JIT on too). Prints the time per request of
``parse`` alone, of ``parse`` + the rule program, and of each kind of step (each step timed with
``os.clock``, which adds about 0.4 µs per step to those figures).

    .venv/bin/python examples/bench_lua_program.py [--requests 20000] [--body-bytes 4096]
        [--without-fastpaths]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_envoy

LIBLUAJIT = "/usr/lib/x86_64-linux-gnu/libluajit-5.1.so.2"

HARNESS = """
do
local body = {body}
local group = GROUPS["g1"]
local prog = PROGRAMS[group.program]
local N = {requests}
local function once()
  local r = {{doc = parse(body), size = #body, who = "bench", strip = {{}}}}
  return run_program(prog, r), r
end
local why, r = once()
print("verdict: " .. (why or "admitted") .. (r.doc.dirty and ", body rewritten" or ""))
for i = 1, N / 10 do once() end
local t = os.clock()
for i = 1, N do once() end
print(string.format("parse + program %.2f us", (os.clock() - t) / N * 1e6))
t = os.clock()
for i = 1, N do parse(body) end
print(string.format("parse           %.2f us", (os.clock() - t) / N * 1e6))
t = os.clock()
for i = 1, N do utf8_valid(body) end
print(string.format("utf8_valid      %.2f us", (os.clock() - t) / N * 1e6))
local by_op, order = {{}}, {{}}
for i = 1, N do
  local run = {{doc = parse(body), size = #body, who = "bench", strip = {{}}}}
  for j = 1, #prog do
    local op = prog[j].op
    local t0 = os.clock()
    OPS[op](prog[j], run)
    if by_op[op] == nil then
      by_op[op], order[#order + 1] = 0, op
    end
    by_op[op] = by_op[op] + os.clock() - t0
  end
end
for _, op in ipairs(order) do
  print(string.format("  step %-9s %.2f us", op, by_op[op] / N * 1e6))
end
end
"""


def run_lua(source: str) -> None:
    lib = ctypes.CDLL(LIBLUAJIT)
    lib.luaL_newstate.restype = ctypes.c_void_p
    lib.luaL_openlibs.argtypes = [ctypes.c_void_p]
    lib.luaL_loadbuffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p]
    lib.lua_pcall.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.lua_tolstring.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.lua_tolstring.restype = ctypes.c_char_p
    lib.lua_close.argtypes = [ctypes.c_void_p]
    state = lib.luaL_newstate()
    lib.luaL_openlibs(state)
    code = source.encode()
    try:
        if lib.luaL_loadbuffer(state, code, len(code), b"=perimeter") or lib.lua_pcall(state, 0, 0, 0):
            raise SystemExit(f"lua: {lib.lua_tolstring(state, -1, None).decode()}")
    finally:
        lib.lua_close(state)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--body-bytes", type=int, default=4096)
    ap.add_argument("--without-fastpaths", action="store_true",
                    help="the media walk and element counts without their fast paths (before 2026-12-06)")
    args = ap.parse_args()
    if not Path(LIBLUAJIT).exists():
        raise SystemExit(f"{LIBLUAJIT} not found (Debian: apt-get install libluajit-5.1-2)")
    with tempfile.TemporaryDirectory(prefix="bench-lua-") as tmp:
        config, _ = bench_envoy.perimeter_config(Path(tmp), 10000, 10001)
        doc = yaml.safe_load(config.read_text(encoding="utf-8"))
    if args.without_fastpaths:
        doc = bench_envoy.ablate(doc, "fastpaths")
    lua = bench_envoy._lua_source(doc)["inline_string"]
    body = bench_envoy.chat_body(args.body_bytes)
    print(f"body {len(body)} bytes, {args.requests} runs")
    run_lua(lua + HARNESS.format(body=json.dumps(body), requests=args.requests))


if __name__ == "__main__":
    main()
