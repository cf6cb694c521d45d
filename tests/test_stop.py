"""scanner.stop: Ctrl-C and SIGTERM inside an event loop cancel the main task between callbacks
(partial results kept), a second signal interrupts at once, and the stop is remembered."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import pytest

from scanner import stop


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    stop.reset()
    yield
    stop.reset()
    for s, h in before.items():
        signal.signal(s, h)


def _kill_soon(signum: int, after: float = 0.05) -> None:
    asyncio.get_running_loop().call_later(after, os.kill, os.getpid(), signum)


async def _partial(signum: int) -> str:
    """Ends with what it has when cancelled, as the probe does."""
    _kill_soon(signum)
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        return "partial"
    return "complete"


@pytest.mark.parametrize(("signum", "why"), [(signal.SIGTERM, "terminated"), (signal.SIGINT, "interrupted")])
def test_a_signal_cancels_the_main_task_which_keeps_its_partial_result(signum: int, why: str) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    assert stop.run(_partial(signum)) == "partial"
    assert stop.requested() == why and stop.terminated() is (why == "terminated")


def test_a_main_task_ending_cancelled_is_keyboard_interrupt() -> None:
    async def plain() -> None:
        _kill_soon(signal.SIGTERM)
        await asyncio.sleep(10)

    with pytest.raises(KeyboardInterrupt):
        stop.run(plain())
    assert stop.terminated()


def test_a_second_signal_interrupts_a_main_task_stuck_in_its_cleanup() -> None:
    async def stubborn() -> None:
        _kill_soon(signal.SIGTERM)
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            _kill_soon(signal.SIGTERM)
            await asyncio.sleep(10)    # a cleanup that hangs: cancelled once only

    with pytest.raises(KeyboardInterrupt):
        stop.run(stubborn())


def test_ignored_sigint_stays_ignored_and_handlers_are_given_back() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, stop.on_sigterm)

    async def quick() -> int:
        os.kill(os.getpid(), signal.SIGINT)   # ignored, as the parent asked
        await asyncio.sleep(0.05)
        return 1

    assert stop.run(quick()) == 1 and stop.requested() == ""
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is stop.on_sigterm


def test_sigterm_outside_a_loop_interrupts_as_ctrl_c_even_with_sigint_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, stop.on_sigterm)
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)
    assert stop.terminated()


def test_a_run_begun_after_a_stop_was_asked_for_ends_at_its_first_wait() -> None:
    stop.interrupted()

    async def later() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "cut at once"
        return "ran"

    t0 = time.monotonic()
    assert stop.run(later()) == "cut at once" and time.monotonic() - t0 < 5
    assert stop.requested() == "interrupted" and not stop.terminated()
