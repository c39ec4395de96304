"""limits.toml and the per-session sliding-window rate limiter, on a fake clock."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import tomli_w
from pydantic import ValidationError

from aiops.gates.limits import LimitsConfig, RateLimiter, RateUsage

SHIPPED = Path(__file__).resolve().parents[2] / "config" / "limits.toml"


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(text: str, clock: FakeClock) -> RateLimiter:
    return RateLimiter(LimitsConfig.model_validate(tomllib.loads(text)), clock=clock)


def test_shipped_file_is_the_model_default() -> None:
    shipped = LimitsConfig.model_validate(tomllib.loads(SHIPPED.read_text()))
    assert shipped == LimitsConfig()
    assert shipped.max_tool_iterations == 10
    assert shipped.max_agent_call_depth == 1
    assert (shipped.rate["db"].calls, shipped.rate["db"].window_seconds) == (20, 60)
    assert shipped.rate["db"].auto_disable is False
    assert (shipped.rate["search"].calls, shipped.rate["search"].window_seconds) == (5, 10)
    assert (shipped.rate["agent_call"].calls, shipped.rate["agent_call"].window_seconds) == (5, 60)


@pytest.mark.parametrize(
    "text",
    [
        "max_tool_iteration = 10\n",
        "[rate.db]\ncalls = 5\nwindow = 10\n",
        "[rate.db]\ncalls = 0\nwindow_seconds = 10\n",
        "[rate.db]\ncalls = 5\nwindow_seconds = 0\n",
        "[rates.db]\ncalls = 5\nwindow_seconds = 10\n",
    ],
)
def test_typos_and_bad_values_are_rejected(text: str) -> None:
    with pytest.raises(ValidationError):
        LimitsConfig.model_validate(tomllib.loads(text))


def test_config_round_trips_through_toml() -> None:
    cfg = LimitsConfig()
    assert LimitsConfig.model_validate(tomllib.loads(tomli_w.dumps(cfg.to_toml_dict()))) == cfg


def test_exactly_n_calls_in_a_window_and_slot_freed_at_window_end() -> None:
    clock = FakeClock()
    rl = make("[rate.search]\ncalls = 3\nwindow_seconds = 10\n", clock)
    assert rl.check("s1", "search") is None  # t=1000
    clock.now = 1004
    assert rl.check("s1", "search") is None
    assert rl.check("s1", "search") is None
    assert rl.check("s1", "search") == "rate limit exceeded: 3 calls in 10 s for search"
    clock.now = 1009.999
    assert rl.check("s1", "search") is not None
    # Exactly one window after the first call its slot is free again — and only that one.
    clock.now = 1010
    assert rl.check("s1", "search") is None
    assert rl.check("s1", "search") is not None
    clock.now = 1014
    assert rl.check("s1", "search") is None
    assert rl.check("s1", "search") is None
    assert rl.check("s1", "search") is not None


def test_refused_calls_do_not_consume_slots() -> None:
    clock = FakeClock()
    rl = make("[rate.db]\ncalls = 2\nwindow_seconds = 60\n", clock)
    assert rl.check("s1", "db") is None
    assert rl.check("s1", "db") is None
    for t in range(1, 60):
        clock.now = 1000 + t
        assert rl.check("s1", "db") is not None
    # Had the refusals counted, the window would still be full at t=60.
    clock.now = 1060
    assert rl.check("s1", "db") is None
    assert rl.check("s1", "db") is None
    assert rl.usage("s1")[0].used == 2


def test_sessions_and_tool_types_are_counted_separately() -> None:
    clock = FakeClock()
    rl = make("[rate.db]\ncalls = 1\nwindow_seconds = 60\n[rate.search]\ncalls = 1\nwindow_seconds = 60\n",
              clock)
    assert rl.check("s1", "db") is None
    assert rl.check("s2", "db") is None
    assert rl.check("s1", "search") is None
    assert rl.check("s1", "db") is not None


def test_tool_types_without_a_rule_are_unlimited() -> None:
    rl = make("[rate.db]\ncalls = 1\nwindow_seconds = 60\n", FakeClock())
    assert all(rl.check("s1", "extract") is None for _ in range(1000))


def test_auto_disable_is_confined_to_one_session_until_re_enabled() -> None:
    clock = FakeClock()
    changes: list[str] = []
    rl = make("[rate.db]\ncalls = 2\nwindow_seconds = 10\nauto_disable = true\n", clock)
    rl.on_change = changes.append
    assert rl.check("s1", "db") is None
    assert rl.check("s1", "db") is None
    refusal = rl.check("s1", "db")
    assert refusal is not None
    assert refusal.startswith("rate limit exceeded: 2 calls in 10 s for db")
    assert "disabled" in refusal
    assert rl.is_disabled("s1", "db")
    assert changes == ["s1", "s1", "s1"]  # two consumes, one disable

    # Long after the window, s1 stays disabled; s2 is untouched.
    clock.now += 3600
    later = rl.check("s1", "db")
    assert later is not None and "disabled" in later and "operator" in later
    assert rl.check("s2", "db") is None
    assert not rl.is_disabled("s2", "db")

    assert rl.enable("s1", "db") is True
    assert rl.enable("s1", "db") is False
    assert changes[-2:] == ["s2", "s1"]
    # Re-enabled with a fresh window.
    assert rl.check("s1", "db") is None
    assert rl.check("s1", "db") is None
    assert rl.check("s1", "db") is not None


def test_without_auto_disable_exceeding_only_refuses() -> None:
    clock = FakeClock()
    rl = make("[rate.db]\ncalls = 1\nwindow_seconds = 10\n", clock)
    assert rl.check("s1", "db") is None
    assert rl.check("s1", "db") is not None
    assert not rl.is_disabled("s1", "db")
    clock.now += 10
    assert rl.check("s1", "db") is None


def test_usage_reports_what_a_console_draws() -> None:
    clock = FakeClock()
    rl = make("[rate.db]\ncalls = 3\nwindow_seconds = 60\nauto_disable = true\n"
              "[rate.search]\ncalls = 5\nwindow_seconds = 10\n", clock)
    for _ in range(2):
        rl.check("s1", "db")
    rl.check("s1", "search")
    for _ in range(4):
        rl.check("s2", "db")  # the fourth disables

    assert rl.usage("s1") == [
        RateUsage("s1", "db", 2, 3, 60, False),
        RateUsage("s1", "search", 1, 5, 10, False),
    ]
    # A session that never called anything still gets a row per limited type.
    assert rl.usage("s9") == [
        RateUsage("s9", "db", 0, 3, 60, False),
        RateUsage("s9", "search", 0, 5, 10, False),
    ]
    assert rl.usage() == [
        RateUsage("s1", "db", 2, 3, 60, False),
        RateUsage("s1", "search", 1, 5, 10, False),
        RateUsage("s2", "db", 3, 3, 60, True),
    ]
    # Calls age out of the reported usage with the window.
    clock.now += 10
    assert [u.used for u in rl.usage("s1")] == [2, 0]
    clock.now += 50
    assert rl.usage() == [RateUsage("s2", "db", 0, 3, 60, True)]


def test_set_rule_changes_limits_at_runtime() -> None:
    clock = FakeClock()
    rl = make("[rate]\n", clock)
    assert rl.check("s1", "search") is None
    rl.set_rule("search", 2, 30)
    assert rl.check("s1", "search") is None
    assert rl.check("s1", "search") is None
    assert rl.check("s1", "search") == "rate limit exceeded: 2 calls in 30 s for search"
    # Tightening counts calls already made in the new window.
    rl.set_rule("search", 1, 30)
    clock.now += 29
    assert rl.check("s1", "search") is not None
    assert rl.config.rate["search"].calls == 1
    assert rl.remove_rule("search") is True
    assert rl.check("s1", "search") is None


def test_on_change_errors_do_not_break_checks() -> None:
    def boom(_: str) -> None:
        raise RuntimeError("subscriber broke")

    rl = RateLimiter(LimitsConfig(), clock=FakeClock(), on_change=boom)
    assert rl.check("s1", "db") is None
