"""Run a worker (``_worker.py``, or ``_grpc_worker.py``) in a target Python and read its result
file (never its stdout)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scanner.errors import (
    AppLoadError,
    GrpcInventoryError,
    InternalError,
    InventoryError,
    OtherServerError,
    PerimeterError,
    ServeArgsError,
    TargetUnreachableError,
    UnsupportedVllmError,
    UsageError,
    VllmNotFoundError,
)
from scanner.secrets import scrub

WORKER = Path(__file__).with_name("_worker.py")
_ERRORS: dict[str, type[PerimeterError]] = {
    "VllmNotFound": VllmNotFoundError,
    "UnsupportedVllm": UnsupportedVllmError,
    "ServeArgs": ServeArgsError,
    "OtherServer": OtherServerError,
    "AppLoad": AppLoadError,
    "Usage": UsageError,
    "GrpcInventory": GrpcInventoryError,
    "Unreachable": TargetUnreachableError,
}


def run_worker(
    python: str,
    request: Mapping[str, Any],
    env: Mapping[str, str],
    secrets: tuple[str, ...] = (),
    timeout: float = 300.0,
    worker: Path = WORKER,
    what: str = "route extraction",
) -> dict[str, Any]:
    """Run ``worker``; return its ``data`` or raise the matching :class:`PerimeterError`.

    ``secrets`` are scrubbed from any message before it is raised; ``what`` names the work in
    messages ("route extraction").
    """
    with tempfile.TemporaryDirectory(prefix="vllm-perimeter-") as tmp:
        req_path = Path(tmp, "request.json")
        res_path = Path(tmp, "result.json")
        fd = os.open(req_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(dict(request), fh)
        try:
            proc = subprocess.run(
                [python, str(worker), str(req_path), str(res_path)],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # vLLM logs to stdout: never parsed
                stderr=subprocess.PIPE,
                timeout=timeout,
                check=False,
            )
        except FileNotFoundError:
            raise VllmNotFoundError(f"python interpreter not found: {python}") from None
        except PermissionError:
            raise VllmNotFoundError(f"python interpreter is not executable: {python}") from None
        except subprocess.TimeoutExpired:
            raise InternalError(f"{what} in {python} did not finish in {timeout:.0f}s") from None
        if not res_path.exists():
            stderr = proc.stderr.decode("utf-8", "replace").strip().splitlines()
            tail = [scrub(line, secrets) for line in stderr[-1:]]
            raise InternalError(
                f"{what} in {python} exited {proc.returncode} without a result"
                + (f": {tail[0]}" if tail else "")
            )
        result = json.loads(res_path.read_text(encoding="utf-8"))
    if result.get("ok"):
        data: dict[str, Any] = result["data"]
        return data
    err = result.get("error", {})
    message = scrub(str(err.get("message", "unknown error")), secrets)
    cls = _ERRORS.get(str(err.get("kind")))
    if cls is None:
        where = " | ".join(scrub(str(w).strip(), secrets) for w in err.get("where", []))
        raise InventoryError(f"{what} failed: {message}" + (f" [{where}]" if where else ""))
    raise cls(message)

