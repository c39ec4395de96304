"""mcp.toml: validation with file and key named, tool names for the model, `aiops mcp import`."""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from aiops.cli import main
from aiops.config import ConfigError, load_config, resolve_paths
from aiops.integrations.mcp.naming import model_tool_name
from aiops.integrations.mcp.results import cut_for_model
from aiops.mcp_config import McpConfig, McpServerConfig, expand

PROVIDER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def load_with(tmp_path, text: str):
    cfg = tmp_path / "config"
    cfg.mkdir(exist_ok=True)
    (cfg / "mcp.toml").write_text(text)
    return load_config(resolve_paths(cfg, tmp_path / "data"), load_dotenv=False)


def test_shipped_mcp_toml_enables_no_server(tmp_path):
    assert load_with(tmp_path, "").mcp.servers == {}
    shipped = load_config(resolve_paths(tmp_path / "none", tmp_path / "data"), load_dotenv=False)
    assert shipped.mcp.servers == {} and shipped.sources["mcp.toml"].name == "mcp.toml"


@pytest.mark.parametrize(("text", "key", "says"), [
    ('[servers.a]\ncommand = "x"\nurl = "http://h/mcp"\n', "servers.a", "either command"),
    ('[servers.a]\nargs = ["x"]\n', "servers.a", "either command"),
    ('[servers.a]\nurl = "ftp://h"\n', "servers.a", "http://"),
    ('[servers.a]\ncommand = "x"\ncolour = "red"\n', "servers.a.colour", "unknown key"),
    ('[servers."a__b"]\ncommand = "x"\n', "servers", "no '__'"),
    ('[servers.a]\ncommand = "x"\ntimeout = 0\n', "servers.a.timeout", "greater than 0"),
])
def test_a_bad_mcp_toml_is_refused_naming_file_and_key(tmp_path, text, key, says):
    with pytest.raises(ConfigError) as e:
        load_with(tmp_path, text)
    msg = str(e.value)
    assert f"mcp.toml: {key}:" in msg and says in msg


def test_tool_globs():
    cfg = McpConfig.model_validate({"servers": {"f": {"url": "http://h/mcp", "enabled_tools": ["read_*", "list_*"],
                                                      "disabled_tools": ["read_secret*"]}}}).servers["f"]
    assert cfg.tool_allowed("read_file") and cfg.tool_allowed("list_dir")
    assert not cfg.tool_allowed("write_file") and not cfg.tool_allowed("read_secrets")


def test_env_references_expand_and_a_missing_one_is_named():
    assert expand("Bearer ${TOKEN}", {"TOKEN": "t1"}) == "Bearer t1"
    with pytest.raises(KeyError, match="NOPE"):
        expand("${NOPE}", {})


def test_model_tool_names_are_valid_stable_and_distinct():
    assert model_tool_name("time", "get_current_time") == "time__get_current_time"
    long_a = model_tool_name("server", "a" * 80 + "_one")
    long_b = model_tool_name("server", "a" * 80 + "_two")
    dotted, slashed = model_tool_name("fs", "read.file"), model_tool_name("fs", "read/file")
    for name in (long_a, long_b, dotted, slashed):
        assert PROVIDER_NAME.fullmatch(name), name
    assert len({long_a, long_b, dotted, slashed}) == 4
    assert long_a == model_tool_name("server", "a" * 80 + "_one")  # the same every time
    # Server `x` with tool `_t`, server `x_` with tool `t`: one name each, never `x___t` for both.
    ambiguous = {model_tool_name("x", "_t"), model_tool_name("x_", "t"), model_tool_name("x__", ""),
                 model_tool_name("a__b", "c"), model_tool_name("a", "b__c")}
    assert len(ambiguous) == 5 and all(PROVIDER_NAME.fullmatch(n) for n in ambiguous), ambiguous


def test_the_tool_list_cache_hashes_no_literal_secret_of_the_config():
    """A reader of the data dir must not be able to check a guess of a token in mcp.toml against
    tools.json: literal env and header values are not part of the hash; what names the server is."""
    from aiops.integrations.mcp.tool_cache import fingerprint

    def server(**kw: object) -> McpServerConfig:
        return McpServerConfig(url="https://mcp.example/mcp", **kw)  # type: ignore[arg-type]

    base = fingerprint(server(headers={"Authorization": "Bearer sk-one"}))
    assert fingerprint(server(headers={"Authorization": "Bearer sk-two"})) == base
    assert fingerprint(server(headers={"Authorization": "Bearer ${TOKEN}"})) != base
    assert fingerprint(server(headers={"Authorization": "Bearer ${OTHER}"})) != fingerprint(
        server(headers={"Authorization": "Bearer ${TOKEN}"}))
    assert fingerprint(McpServerConfig(url="https://elsewhere.example/mcp",
                                       headers={"Authorization": "Bearer sk-one"})) != base
    assert fingerprint(server(headers={"Authorization": "Bearer sk-one"}, disabled_tools=["rm_*"])) != base


def test_cut_keeps_head_and_tail_within_the_limit():
    text = "HEAD" + "x" * 50_000 + "TAIL"
    cut = cut_for_model(text, 1000)
    assert len(cut) <= 1000 and cut.startswith("HEAD") and cut.endswith("TAIL")
    assert f"{len(text) - 880} characters cut" in cut  # the model is told how much it misses
    assert cut_for_model("short", 1000) == "short"


CLAUDE = {"mcpServers": {
    "time": {"command": "uvx", "args": ["mcp-server-time"]},
    "git.hub": {"command": "npx", "args": ["-y", "@mcp/github"], "env": {"GITHUB_TOKEN": "${GITHUB_TOKEN}"}},
    "remote": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${R}"}},
}}


def test_mcp_import_writes_a_valid_mcp_toml_and_keeps_existing_servers(tmp_path, capsys):
    src = tmp_path / "claude_desktop_config.json"
    src.write_text(json.dumps(CLAUDE))
    cfg_dir = tmp_path / "config"
    cfg_dir.mkdir()
    (cfg_dir / "mcp.toml").write_text('[servers.time]\ncommand = "mcp-server-time"\n')
    rc = main(["--config-dir", str(cfg_dir), "--data-dir", str(tmp_path / "d"), "mcp", "import", str(src)])
    out = capsys.readouterr().out
    assert rc == 0 and "kept     time" in out and "added    git-hub" in out and "secrets" in out
    written = tomllib.loads((cfg_dir / "mcp.toml").read_text())
    assert written["servers"]["time"] == {"command": "mcp-server-time"}
    assert written["servers"]["git-hub"]["env"] == {"GITHUB_TOKEN": "${GITHUB_TOKEN}"}
    assert written["servers"]["remote"]["headers"] == {"Authorization": "Bearer ${R}"}
    loaded = load_config(resolve_paths(cfg_dir, tmp_path / "d"), load_dotenv=False)
    assert set(loaded.mcp.servers) == {"time", "git-hub", "remote"}


def test_mcp_import_refuses_a_bad_file_and_writes_nothing(tmp_path, capsys):
    src = tmp_path / "bad.json"
    src.write_text(json.dumps({"mcpServers": {"x": {"args": ["no command"]}}}))
    rc = main(["--config-dir", str(tmp_path / "config"), "--data-dir", str(tmp_path / "d"), "mcp", "import",
               str(src)])
    err = capsys.readouterr().err
    assert rc == 2 and "mcpServers.x: neither command nor url" in err
    assert not (tmp_path / "config" / "mcp.toml").exists()
