"""`aiops` argument parsing: the common options, and the console's (the default sub-command), work
before and after a sub-command alike."""

from __future__ import annotations

import pytest

from aiops.cli import main, parse_args


@pytest.mark.parametrize("argv", [
    ["--config-dir", "C", "--data-dir", "D", "config", "check"],
    ["config", "check", "--config-dir", "C", "--data-dir", "D"],
    ["--config-dir", "C", "config", "check", "--data-dir", "D"],
    ["config", "--config-dir", "C", "check", "--data-dir", "D"],
])
def test_common_options_go_before_or_after_the_sub_command(argv):
    args = parse_args(argv)
    assert (args.command, args.config_command) == ("config", "check")
    assert (args.config_dir, args.data_dir, args.verbose) == ("C", "D", False)


@pytest.mark.parametrize("argv", [
    ["--config-dir", "C", "--data-dir", "D", "--port", "18999"],
    ["--port", "18999", "--config-dir", "C", "--data-dir", "D"],
    ["console", "--config-dir", "C", "--data-dir", "D", "--port", "18999"],
    ["--port", "18999", "console", "--config-dir", "C", "--data-dir", "D"],
])
def test_the_console_options_work_without_naming_the_console(argv):
    args = parse_args(argv)
    assert args.command in (None, "console")
    assert (args.config_dir, args.data_dir, args.port, args.host, args.no_server) == ("C", "D", 18999, None, False)


def test_options_of_every_sub_command_are_accepted_on_either_side():
    args = parse_args(["-v", "chat", "hi", "--session", "101", "--data-dir", "D"])
    assert (args.command, args.text, args.session, args.verbose, args.data_dir) == ("chat", "hi", "101", True, "D")
    args = parse_args(["--host", "0.0.0.0", "serve", "--port", "9"])
    assert (args.command, args.host, args.port) == ("serve", "0.0.0.0", 9)
    args = parse_args(["--no-server"])
    assert args.command is None and args.no_server is True


def test_defaults_when_nothing_is_given():
    args = parse_args(["models"])
    assert (args.config_dir, args.data_dir, args.verbose, args.host, args.port, args.no_server) == \
        (None, None, False, None, None, False)


@pytest.mark.parametrize("argv, wrong", [
    (["--port", "1", "config", "paths"], "'config'"),
    (["--host", "h", "chat", "hi"], "'chat'"),
    (["--no-server", "serve"], "--no-server is an option of the console"),
])
def test_server_options_given_to_a_command_that_has_no_server_are_refused(argv, wrong, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2
    assert wrong in capsys.readouterr().err


@pytest.mark.parametrize("port", ["-1", "70000", "http"])
def test_a_port_out_of_range_is_a_usage_error(port, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["serve", "--port", port])
    assert e.value.code == 2
    assert f"{port!r} is not a port" in capsys.readouterr().err


def test_config_paths_takes_the_dirs_after_the_sub_command(tmp_path, capsys):
    assert main(["config", "paths", "--config-dir", str(tmp_path / "c"), "--data-dir", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert f"config dir       {tmp_path / 'c'}" in out and f"data dir         {tmp_path / 'd'}" in out


@pytest.mark.parametrize(("tool", "tool_type", "operation", "tables", "unknown", "rule"), [
    ("db_query", "db", "read", [], True, None),                       # SHOW TABLES: no table named
    ("db_query", "db", "write", ["shop.orders"], False, None),
    ("db_query", "db", "write", ["shop.orders", "shop.users"], False, None),
    ("db_query", "db", "read", ["shop.orders"], True, None),          # SELECT ... INTO OUTFILE
    ("update_system_prompt", "system", "write", [], False, None),
    # An MCP server's tool: the gate names it as the model does; rules, as mcp:SERVER:TOOL.
    ("fs__write_file", "mcp", "write", [], False, "mcp:fs:write_file"),
])
def test_the_rule_aiops_chat_suggests_after_a_denial_does_allow_the_call(tool, tool_type, operation, tables,
                                                                          unknown, rule):
    # The hint is advice to paste into gates.toml: following it must turn the shipped "ask" into allow.
    import re
    import tomllib

    from aiops.cli import _rule_hint
    from aiops.gates.rules import GatesConfig

    shipped = GatesConfig()
    target = rule or tool  # what the gatekeeper decides on (the tool's gate target)
    assert shipped.decide(target, tool_type, operation, tables, unknown_tables=unknown) == "ask"
    hint = _rule_hint({"tool": tool, "tool_type": tool_type, "operation": operation, "tables": tables}, rule)
    settings = re.findall(r'(\[[^\]]+\]) (read|write) = "allow"', hint)
    if unknown and tables:
        settings.append(("[db.unknown]", operation))  # the hint's "(and [db.unknown] …)" part
    toml = "\n".join(f'{section}\n{op} = "allow"' for section, op in settings)
    followed = GatesConfig.model_validate(tomllib.loads(toml))
    assert followed.decide(target, tool_type, operation, tables, unknown_tables=unknown) == "allow", hint


@pytest.mark.parametrize("text", ["³m", "1.5x", "h", "-1h", "٣h"])
def test_a_bad_since_is_a_clear_error(text):
    from aiops.cli import CliError, parse_since

    with pytest.raises(CliError, match="expected an ISO time"):
        parse_since(text)


def test_since_takes_an_age_or_an_iso_time():
    import time
    from datetime import datetime

    from aiops.cli import parse_since

    assert abs(parse_since("1.5h") - (time.time() - 5400)) < 5
    assert parse_since("2026-01-31T12:00") == datetime.fromisoformat("2026-01-31T12:00").timestamp()
