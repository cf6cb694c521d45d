"""The HTTP route list of a ``vllm-rs`` binary, read from its bytes (nothing is executed).

vLLM 0.28+ wheels ship a Rust binary, ``vllm/vllm-rs`` (``frontend``, ``serve``, ``render``):
an axum server with its own routes. The route strings are ``&'static str`` literals, merged
by the compiler into one run of bytes without separators (``/health/load/kv_event_sources/
v1/models/...``), so a plain ``strings`` cannot say where one route ends. Two readers:

* ``code`` (x86-64 ELF with a symbol table, as the wheels ship): the functions named
  ``...::routes::...::*router*`` (``vllm_server::routes::build_router``, ``vllm_server::
  routes::render::build_router``) load each route literal with a RIP-relative ``lea`` and
  its length with a ``mov`` of an immediate a few instructions later. Both are read from the
  machine code: exact strings, grouped by the router function that registers them.
* ``strings`` (any other binary): the run of route-shaped bytes that holds ``/health`` and
  ``/v1/models`` is split where a known route starts (``known``: e.g. every path of the
  bundled catalogs), else before each ``/v1``; a best effort, marked as such.

Either way the list is a list of candidates: ``inventory live`` asks the running server
about each one, so a wrong split shows up as an absent route, never as a served one.
"""

from __future__ import annotations

import re
import struct
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from scanner.errors import InventoryError, UsageError

BINARY_NAME = "vllm-rs"
MAX_BINARY_BYTES = 512 * 1024 * 1024
# A route literal: what axum accepts and vLLM uses (lower-case words, {param} / :param, *rest).
_ROUTE = re.compile(rb"/[A-Za-z0-9_.~{}:*/-]*")
_ROUTE_FULL = re.compile(r"/(?:[A-Za-z0-9_.~{}:*-]+(?:/[A-Za-z0-9_.~{}:*-]+)*)?")
# lea r64, [rip + disp32]
_LEA_RIP = re.compile(rb"[\x48\x4c]\x8d[\x05\x0d\x15\x1d\x25\x2d\x35\x3d]")
# mov r32, imm32 (b8+r, 41 b8+r) or mov r64, imm32 (48/49 c7 c0+r)
_MOV_IMM = re.compile(rb"(?:[\xb8-\xbf]|\x41[\xb8-\xbf]|[\x48\x49]\xc7[\xc0-\xc7])(.{4})", re.S)
LENGTH_WINDOW = 48  # bytes after the lea where its length is looked for
STRING_ANCHORS = (b"/health", b"/v1/models")


@dataclass(frozen=True)
class RustRoutes:
    """Route paths per router function, in registration order (duplicates removed)."""

    binary: str
    reader: str                                   # "code" | "strings"
    routers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(sorted({p for ps in self.routers.values() for p in ps}))

    def routers_of(self, path: str) -> tuple[str, ...]:
        return tuple(sorted(r for r, ps in self.routers.items() if path in ps))

    def to_dict(self) -> dict[str, object]:
        return {"binary": self.binary, "reader": self.reader,
                "routers": {k: list(v) for k, v in sorted(self.routers.items())}}


def locate(python: str, timeout: float = 60.0) -> Path:
    """``vllm/vllm-rs`` of the vLLM installed for ``python`` (vLLM itself is not imported)."""
    code = ("import importlib.util as u; s = u.find_spec('vllm'); "
            "print(s.submodule_search_locations[0] if s and s.submodule_search_locations else '')")
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--python {python}: cannot run: {exc}") from None
    where = proc.stdout.strip()
    if proc.returncode != 0 or not where:
        raise UsageError(f"--python {python}: no vLLM installed there")
    binary = Path(where) / BINARY_NAME
    if not binary.is_file():
        raise UsageError(f"--python {python}: this vLLM ships no {BINARY_NAME} binary ({binary})")
    return binary


def read(path: str | Path, known: Iterable[str] = ()) -> RustRoutes:
    """The route list of the binary at ``path``; ``known`` paths guide the ``strings`` reader."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_BINARY_BYTES:
            raise UsageError(f"{p}: larger than {MAX_BINARY_BYTES} bytes; not a vllm-rs binary")
        data = p.read_bytes()
    except OSError as exc:
        raise UsageError(f"{p}: cannot read: {exc.strerror or exc}") from None
    routers = from_code(data)
    if routers:
        return RustRoutes(str(p), "code", routers)
    routers = from_strings(data, known)
    if not routers:
        raise InventoryError(f"{p}: no HTTP route list found (is it a vllm-rs binary?)")
    return RustRoutes(str(p), "strings", routers)


# --- the code reader ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Section:
    addr: int
    offset: int
    size: int
    link: int


def _sections(data: bytes) -> dict[str, _Section] | None:
    """Sections of a little-endian x86-64 ELF64 file, by name; None for anything else."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    if struct.unpack_from("<H", data, 18)[0] != 62:  # EM_X86_64
        return None
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shentsize < 64 or shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
        return None
    raw = [struct.unpack_from("<IIQQQQI", data, shoff + i * shentsize) for i in range(shnum)]
    names = raw[shstrndx][4]
    out: dict[str, _Section] = {}
    for name, _type, _flags, addr, offset, size, link in raw:
        end = data.find(b"\0", names + name)
        out[data[names + name:end].decode("latin-1")] = _Section(addr, offset, size, link)
    return out


def demangle(symbol: str) -> str:
    """A legacy-mangled Rust symbol (``_ZN11vllm_server6routes12build_router17h...E``) as a
    path (``vllm_server::routes::build_router``); other names are returned unchanged."""
    if not symbol.startswith("_ZN"):
        return symbol
    parts: list[str] = []
    i = 3
    while i < len(symbol) and symbol[i].isdigit():
        j = i
        while j < len(symbol) and symbol[j].isdigit():
            j += 1
        n = int(symbol[i:j])
        part = symbol[j:j + n]
        if len(part) != n:
            return symbol
        parts.append(part)
        i = j + n
    if parts and re.fullmatch(r"h[0-9a-f]{16}", parts[-1]):
        parts.pop()
    return "::".join(parts) if parts else symbol


def _is_router(name: str) -> bool:
    segments = name.split("::")
    return "routes" in segments[:-1] and "router" in segments[-1]


def _router_functions(data: bytes, secs: Mapping[str, _Section]) -> list[tuple[str, int, int]]:
    """(demangled name, address, size) of every function that looks like a route table."""
    symtab = secs.get(".symtab")
    if symtab is None or symtab.link >= len(secs):
        return []
    strtab = list(secs.values())[symtab.link]
    out: list[tuple[str, int, int]] = []
    for i in range(symtab.size // 24):
        name_off, info, _other, _shndx, value, size = struct.unpack_from("<IBBHQQ", data,
                                                                          symtab.offset + i * 24)
        if info & 0xF != 2 or not size:  # STT_FUNC with a body
            continue
        start = strtab.offset + name_off
        raw = data[start:data.find(b"\0", start)]
        if b"routes" not in raw or b"router" not in raw:
            continue
        name = demangle(raw.decode("latin-1"))
        if _is_router(name):
            out.append((name, value, size))
    return sorted(out)


def from_code(data: bytes) -> dict[str, tuple[str, ...]]:
    """Route literals loaded by the router functions' machine code (empty if not x86-64 ELF
    with symbols, or no such function)."""
    secs = _sections(data)
    if not secs or ".text" not in secs or ".rodata" not in secs:
        return {}
    text, ro = secs[".text"], secs[".rodata"]
    routers: dict[str, tuple[str, ...]] = {}
    for name, addr, size in _router_functions(data, secs):
        if not text.addr <= addr < text.addr + text.size:
            continue
        start = text.offset + (addr - text.addr)
        code = data[start:start + size]
        found: list[str] = []
        for m in _LEA_RIP.finditer(code):
            if m.start() + 7 > len(code):
                break
            disp = struct.unpack_from("<i", code, m.start() + 3)[0]
            target = addr + m.start() + 7 + disp
            if not ro.addr <= target < ro.addr + ro.size:
                continue
            at = ro.offset + (target - ro.addr)
            if data[at:at + 1] != b"/":
                continue
            route = _literal(data, at, code[m.start() + 7:m.start() + 7 + LENGTH_WINDOW])
            if route and route not in found:
                found.append(route)
        if found:
            routers[name] = tuple(found)
    return routers


def _literal(data: bytes, at: int, after: bytes) -> str | None:
    """The route literal at ``at`` whose length a following ``mov imm`` states."""
    run = _ROUTE.match(data, at, at + 256)
    if run is None:
        return None
    n = _length_immediate(after, run.end() - at)
    if n is None:
        return None
    text = data[at:at + n].decode("ascii")
    return text if _ROUTE_FULL.fullmatch(text) else None


def _length_immediate(code: bytes, longest: int) -> int | None:
    """The first ``mov reg, imm32`` (1 <= imm <= longest) in ``code``, stepping over the
    instructions compilers put between a string's ``lea`` and its length: more RIP-relative
    ``lea``, register moves, register ``xor``. None at any other instruction."""
    i = 0
    while i < len(code):
        m = _MOV_IMM.match(code, i)
        if m is not None:
            n = int(struct.unpack("<I", m.group(1))[0])
            if 1 <= n <= longest:
                return n
            i = m.end()
            continue
        step = _skip(code, i)
        if step is None:
            return None
        i += step
    return None


def _skip(code: bytes, i: int) -> int | None:
    """Length of the instruction at ``i`` if it is one :func:`_length_immediate` steps over."""
    if _LEA_RIP.match(code, i):
        return 7
    b = code[i:i + 3]
    if len(b) == 3 and b[0] in (0x48, 0x49, 0x4C, 0x4D) and b[1] in (0x89, 0x8B, 0x31) and b[2] >= 0xC0:
        return 3  # mov/xor r64, r64
    if len(b) >= 2 and b[0] in (0x89, 0x8B, 0x31) and b[1] >= 0xC0:
        return 2  # mov/xor r32, r32
    if len(b) == 3 and b[0] in (0x41, 0x44, 0x45) and b[1] in (0x89, 0x8B, 0x31) and b[2] >= 0xC0:
        return 3  # the same with r8d-r15d
    return None


# --- the strings reader ---------------------------------------------------------------------


def from_strings(data: bytes, known: Iterable[str] = ()) -> dict[str, tuple[str, ...]]:
    """Best effort for a binary the code reader cannot read: every run of route-shaped bytes
    holding both anchors, split at known routes (longest first), else before each ``/v1``."""
    lexicon = sorted({k for k in known if _ROUTE_FULL.fullmatch(k)}, key=len, reverse=True)
    routers: dict[str, tuple[str, ...]] = {}
    for n, m in enumerate(re.finditer(rb"(?:/[a-z0-9_{}:.-]+)+", data)):
        run = m.group(0)
        if not all(a in run for a in STRING_ANCHORS):
            continue
        routes = split_run(run.decode("ascii"), lexicon)
        if routes:
            routers[f"strings@{m.start():#x}" if n else "strings"] = routes
    return routers


def split_run(run: str, lexicon: Iterable[str] = ()) -> tuple[str, ...]:
    """``/health/load/v1/models`` -> ``/health``, ``/load``, ``/v1/models`` (see :func:`from_strings`)."""
    words = sorted(set(lexicon), key=len, reverse=True)
    out: list[str] = []
    i = 0
    while i < len(run):
        hit = next((w for w in words if run.startswith(w, i)
                    and (i + len(w) == len(run) or run[i + len(w)] == "/")), None)
        if hit is not None:
            out.append(hit)
            i += len(hit)
            continue
        # an unknown route: up to the next known route, or the next "/v1" segment
        j = i + 1
        while j < len(run):
            if run[j] == "/" and (run.startswith("/v1/", j) or any(
                    run.startswith(w, j) and (j + len(w) == len(run) or run[j + len(w)] == "/")
                    for w in words)):
                break
            j += 1
        out.append(run[i:j])
        i = j
    return tuple(dict.fromkeys(out))
