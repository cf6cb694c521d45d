"""How a run stops: on Ctrl-C or SIGTERM, keeping what it proved.

Outside an event loop, SIGTERM's handler (:func:`on_sigterm`, installed by the CLI) interrupts as
Ctrl-C, so every proxy, stand-in and temporary directory the run started is stopped and removed
(they run in sessions of their own and would outlive us). Inside one, :func:`run` lets the loop
handle both signals: the main task is cancelled between callbacks (the probe then ends with its
partial results), never by an exception raised in the middle of an accept or a write (which
leaves a task nobody awaits, and a traceback); a second signal interrupts at once.
:func:`requested` says afterwards that a stop was asked for: a loop over proxies or mutants
stops there (an interrupted mutant is not a caught one), and :func:`terminated` picks the exit
code (143, else 130).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_REQUESTED: list[str] = []   # "interrupted" (SIGINT) or "terminated" (SIGTERM), in order


def requested() -> str:
    """"interrupted" or "terminated" once a stop was asked for, else ""."""
    return _REQUESTED[0] if _REQUESTED else ""


def reset() -> None:
    """Forget a stop asked for earlier: a new command begins (the CLI's main, run in-process by
    tests several times)."""
    _REQUESTED.clear()


def interrupted() -> None:
    """Say a KeyboardInterrupt was caught (Ctrl-C outside an event loop, or SIGTERM's): a stop
    was asked for, if nothing said so yet."""
    if not _REQUESTED:
        _REQUESTED.append("interrupted")


def terminated() -> bool:
    """Whether SIGTERM stopped this run (exit 143 rather than 130)."""
    return "terminated" in _REQUESTED


def on_sigterm(_signum: int, _frame: object) -> None:
    """SIGTERM outside an event loop: interrupt as Ctrl-C."""
    _REQUESTED.append("terminated")
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
        # SIGINT ignored by whoever started us (a service manager, a test runner's worker): its
        # handler would never run; interrupt here
        raise KeyboardInterrupt
    signal.raise_signal(signal.SIGINT)


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` with SIGTERM, and Ctrl-C unless ignored, handled by the loop: the
    first cancels ``main`` (which may end with partial results), a second interrupts at once;
    ``main`` ending cancelled is KeyboardInterrupt."""

    async def guarded() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def stop(why: str) -> None:
            _REQUESTED.append(why)
            if len(_REQUESTED) > 1 or task.done():
                raise KeyboardInterrupt
            task.cancel()

        wanted = [(signal.SIGTERM, "terminated")]
        if signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, signal.SIG_DFL, None):
            wanted.append((signal.SIGINT, "interrupted"))
        added: list[tuple[signal.Signals, Any]] = []
        try:
            for signum, why in wanted:
                before = signal.getsignal(signum)
                loop.add_signal_handler(signum, stop, why)
                added.append((signum, before))
        except (NotImplementedError, RuntimeError, ValueError):   # not the main thread: as before
            pass
        if _REQUESTED:   # asked before this run began: it ends at its first wait, as if cut there
            task.cancel()
        try:
            return await main
        finally:
            for signum, before in added:
                loop.remove_signal_handler(signum)
                signal.signal(signum, before)

    try:
        return asyncio.run(guarded())
    except asyncio.CancelledError:
        if requested():
            raise KeyboardInterrupt from None
        raise
