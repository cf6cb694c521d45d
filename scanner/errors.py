"""The exception tree of vllm-perimeter, in one place.

Every error the tool raises on purpose derives from :class:`PerimeterError`
and carries the process exit code the CLI turns it into::

    PerimeterError                     exit 3 unless a subclass says otherwise
    ├── UsageError                     exit 2: bad flags, bad arguments
    ├── ConfigError                    exit 2: a file the user gave is invalid
    │   ├── InventoryFormatError       an inventory JSON that fails validation
    │   └── PolicyError                a policy YAML that fails validation (with its line)
    ├── InventoryError                 exit 2: extraction could not run (seam: scanner.inventory)
    │   ├── VllmNotFoundError          the given Python has no vLLM
    │   ├── UnsupportedVllmError       a vLLM layout this tool does not know
    │   ├── ServeArgsError             vLLM rejected the serve arguments
    │   ├── OtherServerError           `vllm serve` would not serve the Python app (gRPC, Rust, headless)
    │   └── AppLoadError               module:attr is missing or not an ASGI app
    ├── PlanError                      exit 2: inventory + policy cannot make a plan
    ├── GenerateError                  exit 2: a plan cannot be rendered
    ├── TargetUnreachableError         exit 3: a live target did not answer
    ├── LimiterError                   the shared limiter (scanner.limiter), exit 3
    │   ├── StoreUnavailableError      the shared store (Redis) did not answer: the service says
    │   │                              "shared-store-unavailable", never "allow"
    │   └── LimiterCallError           exit 2: a limiter call that cannot be read (an unknown zone,
    │                                  a bad key, cost or slot): answered 400 / INVALID_ARGUMENT
    └── InternalError                  exit 3: a bug or an environment failure
        └── PortInUse                  a process could not bind its loopback port (taken
                                       after the pick): scanner.net.on_free_port retries

Findings are data, not exceptions: a probe that finds an open route returns
records, and the exit code (0 clean, 1 findings at or above ``--fail-on``) is
decided once, at the end, by the CLI.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


class PerimeterError(Exception):
    """Base of every error this tool raises on purpose."""

    exit_code: int = EXIT_UNREACHABLE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(PerimeterError):
    exit_code = EXIT_USAGE


class ConfigError(PerimeterError):
    exit_code = EXIT_USAGE


class InventoryFormatError(ConfigError):
    pass


class PolicyError(ConfigError):
    pass


class InventoryError(PerimeterError):
    exit_code = EXIT_USAGE


class VllmNotFoundError(InventoryError):
    pass


class UnsupportedVllmError(InventoryError):
    pass


class ServeArgsError(InventoryError):
    pass


class OtherServerError(InventoryError):
    """With these arguments and this environment ``vllm serve`` runs another server (the gRPC
    launcher, the Rust frontend) or none: the Python app's route table would not describe it."""


class AppLoadError(InventoryError):
    pass


class PlanError(PerimeterError):
    exit_code = EXIT_USAGE


class GenerateError(PerimeterError):
    exit_code = EXIT_USAGE


class TargetUnreachableError(PerimeterError):
    exit_code = EXIT_UNREACHABLE


class LimiterError(PerimeterError):
    exit_code = EXIT_UNREACHABLE


class StoreUnavailableError(LimiterError):
    """Redis refused, reset or timed out: nothing was decided (the caller must not admit)."""


class LimiterCallError(LimiterError):
    exit_code = EXIT_USAGE


class InternalError(PerimeterError):
    exit_code = EXIT_UNREACHABLE


class PortInUse(InternalError):
    """A server we start could not bind its port: another process took it between the pick
    (scanner.net.free_port) and the bind. :func:`scanner.net.on_free_port` starts it again on
    another port."""


class GrpcInventoryError(InventoryError):
    """The gRPC surface could not be read: a proto module or descriptor set that is missing or
    invalid, a server without reflection, a bad ``HOST:PORT`` or gRPC catalog (exit 2; a
    target that does not answer is :class:`TargetUnreachableError`, exit 3)."""
