"""Options and small parsers shared by commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from scanner.errors import UsageError
from scanner.inventory.catalog import load_ref
from scanner.inventory.diff import InventoryDiff, diff
from scanner.severity import FAIL_ON_DEFAULT, SEVERITIES

F = TypeVar("F", bound=Callable[..., Any])


def output_options(func: F) -> F:
    func = click.option("-o", "--output", default=None, metavar="FILE",
                        help="Write to FILE (atomically) instead of stdout.")(func)
    func = click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
                        show_default=True, help="Output format.")(func)
    return func


def parse_pairs(flag: str, pairs: tuple[str, ...]) -> dict[str, str]:
    """``K=V`` values of a repeatable option; the error names the option, never the value
    (it may be a secret)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} expects K=V, got {pair.split('=')[0]!r}")
        out[key] = value
    return out


class DefaultGroup(click.Group):
    """A group whose first argument, when it is not a subcommand, goes to its ``run`` command
    (``probe URL``, ``audit BASELINE URL``). An argument named like a subcommand but followed by a
    URL is an argument too (``audit baseline http://...``: a baseline directory named so)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        url_second = len(args) > 1 and args[1].startswith(("http://", "https://"))
        if args and (args[0] not in self.commands or url_second) and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


def report_options(formats: tuple[str, ...], fail_on: str = FAIL_ON_DEFAULT,
                   fail_help: str = "Exit 1 when a deviation from the plan is at least this severe "
                                    "(default: every deviation fails; raising it loosens the verdict).",
                   require_proof: bool | None = False) -> Callable[[F], F]:
    """``--format``, ``-o``, ``--fail-on``, ``--require-proof`` (unless ``require_proof`` is None)
    and ``--diff`` (an upgrade diff in the HTML report)."""
    def apply(func: F) -> F:
        if require_proof is not None:
            func = click.option("--require-proof/--no-require-proof", "require_proof", default=require_proof,
                                show_default=True,
                                help="Also exit 1 when a subject the plan decides could not be proven "
                                     "(VP011: not sent in production, or no answer proved it).")(func)
        func = click.option("--diff", "diff_refs", nargs=2, default=None, metavar="OLD NEW",
                            help="With --format html: add this upgrade diff (inventories or catalogs).")(func)
        func = click.option("--fail-on", type=click.Choice(SEVERITIES), default=fail_on, show_default=True,
                            help=fail_help)(func)
        func = click.option("-o", "--output", default=None, metavar="FILE",
                            help="Write the report to FILE.")(func)
        func = click.option("--format", "fmt", type=click.Choice(formats), default="table",
                            show_default=True)(func)
        return func
    return apply


def network_option(func: F) -> F:
    return click.option("--network", "networks", multiple=True, metavar="NAME=CIDR[,CIDR]",
                        help="Override a policy network (repeatable), e.g. admin=10.9.0.0/24.")(func)


def checks_option(func: F) -> F:
    from scanner.probe import runner  # noqa: F401  (registers the built-in checks)
    from scanner.probe.registry import ids

    return click.option("--check", "checks", multiple=True, type=click.Choice(ids()),
                        help="Run only these checks (repeatable; default: all).")(func)


def plan_inputs(func: F) -> F:
    func = network_option(func)
    func = click.option("--policy", "policy", default=None, metavar="FILE",
                        help="Policy YAML (default: the bundled vllm-default policy).")(func)
    func = click.option("--inventory", "inventory", required=True, metavar="FILE|CATALOG",
                        help="Inventory JSON from `inventory ...`, or a bundled catalog name "
                             "such as vllm-0.29.0-default.")(func)
    return func


def load_diff(refs: tuple[str, str] | None) -> InventoryDiff | None:
    """``--diff OLD NEW`` (files or catalog names) into an inventory diff for the HTML report."""
    if not refs:
        return None
    return diff(load_ref(refs[0]), load_ref(refs[1]), refs[0], refs[1])


def credential_options(func: F) -> F:
    """``--key ROLE=env:VAR|file:PATH`` (never the key itself) and ``--vantage NAME=ADDRESS``."""
    func = click.option("--vantage", "vantage_specs", multiple=True, metavar="NAME=SOURCE_ADDRESS",
                        help="Send from this local address too (repeatable).")(func)
    func = click.option("--key", "keys", multiple=True, metavar="ROLE=env:VAR|ROLE=file:PATH",
                        help="A role's API key, by reference only (repeatable). Never the key itself. "
                             "Whitespace around it (a trailing newline, CRLF) is ignored.")(func)
    return func


class MaxTime(click.ParamType[float | None, Any]):
    """``--max-time``: seconds (at least 1), or ``auto`` (None: derived from the plan's lower bound)."""

    name = "SECONDS|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float | None:
        if value is None or isinstance(value, float):
            return value
        if str(value).strip().lower() == "auto":
            return None
        try:
            seconds = float(value)
        except ValueError:
            self.fail(f"{value!r} is neither a number of seconds nor auto", param, ctx)
        if not seconds >= 1:
            self.fail(f"{value!r}: at least 1 second", param, ctx)
        return seconds


def bound_options(max_time: float | None) -> Callable[[F], F]:
    """How hard and how long a probe may push a live target; ``max_time`` None: ``--max-time
    auto`` by default (twice the run's lower bound from the plan, plus a minute)."""
    def apply(func: F) -> F:
        if max_time is None:
            func = click.option("--max-time", type=MaxTime(), default="auto", show_default=True,
                                metavar="SECONDS|auto",
                                help="Seconds for the whole run, then partial results and exit 3; auto: "
                                     "2 x the run's lower bound (cases / --rate, and each rate-limited "
                                     "lane at the plan's rate) + 60 s.")(func)
        else:
            func = click.option("--max-time", type=click.FloatRange(1), default=max_time, show_default=True,
                                help="Seconds for the whole run; then partial results and exit 3.")(func)
        func = click.option("--timeout", type=click.FloatRange(0.1), default=5.0, show_default=True,
                            help="Seconds per request.")(func)
        func = click.option("--rate", type=click.FloatRange(0), default=50.0, show_default=True,
                            help="Requests per second (0: unlimited); rate-limit bursts are exempt.")(func)
        func = click.option("--concurrency", type=click.IntRange(1, 256), default=8, show_default=True)(func)
        return func
    return apply
