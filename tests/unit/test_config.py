"""Configuration as the operator meets it: `aiops config check / paths / init`, errors that name the
file and the key, and the system prompt living in the user's config dir, never in the shipped one."""

from __future__ import annotations

import pytest

from aiops.cli import main
from aiops.config import SHIPPED_PROMPT_DIR, ConfigError, load_config, resolve_paths
from aiops.engine.lock import DataDirLock


def write_models(config_dir, base_url: str) -> None:
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "models.toml").write_text(
        'default_model = "local"\n[models.local]\ntype = "openai"\nmodel_id = "m"\n'
        f'base_url = "{base_url}"\n')


def shipped_snapshot() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (SHIPPED_PROMPT_DIR / "default").iterdir()}


@pytest.mark.parametrize("bad", ["not a url", "api.openai.com/v1", "ftp://host/v1", "http://"])
def test_a_base_url_that_is_not_an_http_url_is_refused_naming_file_and_key(tmp_path, bad):
    write_models(tmp_path / "cfg", bad)
    with pytest.raises(ConfigError) as e:
        load_config(resolve_paths(tmp_path / "cfg", tmp_path / "data"), load_dotenv=False)
    message = str(e.value)
    assert str(tmp_path / "cfg" / "models.toml") in message
    assert "models.local.base_url" in message and "http(s) URL" in message and repr(bad) in message


def test_a_disabled_default_model_is_refused_naming_file_and_key(tmp_path):
    """Every new session, and `aiops` on the chat proxies, would otherwise run on a model that
    models.toml says must not run."""
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "models.toml").write_text(
        'default_model = "off"\n[models.off]\ntype = "openai"\nmodel_id = "m"\nenabled = false\n'
        '[models.on]\ntype = "openai"\nmodel_id = "m"\n')
    with pytest.raises(ConfigError) as e:
        load_config(resolve_paths(tmp_path / "cfg", tmp_path / "data"), load_dotenv=False)
    message = str(e.value)
    assert str(tmp_path / "cfg" / "models.toml") in message
    assert "default_model 'off' is disabled" in message and "(on)" in message


@pytest.mark.parametrize(("line", "key", "says"), [
    ("delegation_timeout = 0", "models.helper.delegation_timeout", "greater than 0"),
    ("delegation_timeout = 7200", "models.helper.delegation_timeout", "less than or equal to 3600"),
    ('delegation = "maybe"', "models.helper.delegation", "valid boolean"),
    ("delegate = true", "models.helper.delegate", "unknown key"),
])
def test_bad_delegation_settings_are_refused_naming_file_and_key(tmp_path, line, key, says):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "models.toml").write_text(
        'default_model = "helper"\n[models.helper]\ntype = "openai"\nmodel_id = "m"\n' + line + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(resolve_paths(tmp_path / "cfg", tmp_path / "data"), load_dotenv=False)
    message = str(e.value)
    assert str(tmp_path / "cfg" / "models.toml") in message and key in message and says in message


def test_delegation_targets_are_the_enabled_models_marked_so(tmp_path):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "models.toml").write_text(
        'default_model = "a"\n'
        '[models.a]\ntype = "openai"\nmodel_id = "m"\n'
        '[models.b]\ntype = "openai"\nmodel_id = "m"\ndelegation = true\ndelegation_timeout = 5\n'
        '[models.c]\ntype = "openai"\nmodel_id = "m"\ndelegation = true\nenabled = false\n')
    models = load_config(resolve_paths(tmp_path / "cfg", tmp_path / "data"), load_dotenv=False).models
    assert list(models.delegation_targets()) == ["b"]
    assert (models.models["b"].delegation_timeout, models.models["a"].delegation_timeout) == (5, 60)


def test_config_check_exits_2_on_a_bad_base_url_without_a_traceback(tmp_path, capsys):
    write_models(tmp_path / "cfg", "not a url")
    assert main(["config", "check", "--config-dir", str(tmp_path / "cfg"),
                 "--data-dir", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aiops: ") and "models.local.base_url" in err and "Traceback" not in err


def test_config_check_names_every_error_in_every_file_in_one_run(tmp_path, capsys):
    """Fixing one file only to be told of the next, run after run, is what a newcomer met."""
    cfg = tmp_path / "cfg"
    write_models(cfg, "not a url")
    (cfg / "gates.toml").write_text("[db\n")  # not TOML at all
    (cfg / "aiops.toml").write_text("[server]\nport = 99999999\n")
    (cfg / "plugins.toml").write_text('mysql = "on"\n')
    assert main(["config", "check", "--config-dir", str(cfg), "--data-dir", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert "models.local.base_url" in err
    assert f"{cfg / 'gates.toml'}: invalid TOML" in err
    assert f"{cfg / 'aiops.toml'}: server.port" in err
    assert f"{cfg / 'plugins.toml'}: mysql: expected a table" in err
    assert "Traceback" not in err


def test_config_check_warns_of_a_plugins_table_no_plugin_reads_naming_the_closest(tmp_path, capsys):
    """QA: a misspelled [myslq] passed `config check` as valid while mysql stayed off."""
    cfg = tmp_path / "cfg"
    write_models(cfg, "http://127.0.0.1:9/v1")
    (cfg / "plugins.toml").write_text("[myslq]\nenabled = true\n[zzzzzz]\nenabled = true\n"
                                      "[slack]\nenabled = false\n")
    assert main(["config", "check", "--config-dir", str(cfg), "--data-dir", str(tmp_path / "data")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "warn plugins.toml: [myslq] matches no installed plugin (did you mean [mysql]?); it is ignored" in out
    assert "warn plugins.toml: [zzzzzz] matches no installed plugin; it is ignored" in out
    assert not any("[slack]" in line for line in out)


def test_good_base_urls_pass(tmp_path):
    for url in ("http://127.0.0.1:8080/v1", "https://api.x.ai/v1"):
        write_models(tmp_path / "cfg", url)
        cfg = load_config(resolve_paths(tmp_path / "cfg", tmp_path / "data"), load_dotenv=False)
        assert cfg.models.models["local"].base_url == url


def test_the_prompt_tree_is_copied_to_the_config_dir_on_first_use_and_then_left_alone(tmp_path):
    before = shipped_snapshot()
    paths = resolve_paths(tmp_path / "cfg", tmp_path / "data")
    user = tmp_path / "cfg" / "system_prompt" / "default"
    assert paths.prompt_folder("default") == user and not user.exists()  # resolving writes nothing
    assert paths.ensure_prompt_folder("default") == user
    assert {p.name: p.read_bytes() for p in user.iterdir()} == before
    # the operator's edits survive later uses; the shipped tree never changes
    (user / ".system_prompt_role").write_text("edited\n")
    assert paths.ensure_prompt_folder("default") == user
    assert (user / ".system_prompt_role").read_text() == "edited\n"
    assert shipped_snapshot() == before
    assert not any(p.name.startswith(".default.tmp") for p in user.parent.iterdir())


def test_none_and_absolute_prompt_folders_are_not_copied(tmp_path):
    paths = resolve_paths(tmp_path / "cfg", tmp_path / "data")
    assert paths.ensure_prompt_folder("none") is None
    elsewhere = tmp_path / "mine"
    assert paths.ensure_prompt_folder(str(elsewhere)) == elsewhere and not elsewhere.exists()
    # a name with no shipped tree is the user's to create; nothing is invented
    assert paths.ensure_prompt_folder("custom") == tmp_path / "cfg" / "system_prompt" / "custom"
    assert not (tmp_path / "cfg" / "system_prompt" / "custom").exists()


def test_config_init_copies_the_config_files_and_the_prompt_tree_and_keeps_them_after(tmp_path, capsys):
    dirs = ["--config-dir", str(tmp_path / "cfg"), "--data-dir", str(tmp_path / "data")]
    assert main(["config", "init", *dirs]) == 0
    out = capsys.readouterr().out
    assert f"wrote   {tmp_path / 'cfg' / 'models.toml'}" in out
    user = tmp_path / "cfg" / "system_prompt" / "default"
    assert f"wrote   {user}/" in out
    assert {p.name: p.read_bytes() for p in user.iterdir()} == shipped_snapshot()
    (user / ".system_prompt_role").write_text("mine\n")
    assert main(["config", "init", *dirs]) == 0
    assert f"kept    {user}/" in capsys.readouterr().out
    assert (user / ".system_prompt_role").read_text() == "mine\n"
    # --force replaces the tree with the shipped one, leaving no staging copies behind.
    (user / ".system_prompt_extra").write_text("stray\n")
    assert main(["config", "init", "--force", *dirs]) == 0
    assert {p.name: p.read_bytes() for p in user.iterdir()} == shipped_snapshot()
    assert sorted(p.name for p in user.parent.iterdir()) == ["default"]


def test_config_paths_prints_the_lock_file_and_the_users_prompt_tree(tmp_path, capsys):
    dirs = ["--config-dir", str(tmp_path / "cfg"), "--data-dir", str(tmp_path / "data")]
    assert main(["config", "paths", *dirs]) == 0
    out = capsys.readouterr().out
    lock = tmp_path / "data" / "aiops.lock"
    assert f"lock file      {lock}  (absent" in out
    user = tmp_path / "cfg" / "system_prompt" / "default"
    assert f"system prompts   {tmp_path / 'cfg' / 'system_prompt'}" in out
    assert f"{user}  (absent: copied from {SHIPPED_PROMPT_DIR / 'default'} on first use)" in out
    with DataDirLock(lock) as held:
        held.update(url="http://127.0.0.1:4242")
        assert main(["config", "paths", *dirs]) == 0
        out = capsys.readouterr().out
        assert f"lock file      {lock}  (held by pid {held.info['pid']}, http://127.0.0.1:4242)" in out
    assert main(["config", "paths", *dirs]) == 0
    assert f"lock file      {lock}  (free" in capsys.readouterr().out


@pytest.mark.parametrize(("toml", "key", "says"), [
    *[(f"[server]\nextra_ports = {ports}\n", "server.extra_ports", "") for ports in ("[70000]", "[0]", "[-1]")],
    # A client token's sessions are named `<token>:…`: token `team` would own `team:web`'s.
    *[(f'[auth.tokens.{name}]\ntoken_env = "T"\nrole = "client"\n', "auth.tokens", "without ':'")
      for name in ('"team:web"', '" "')],
    ('[server]\nclient_tools = "maybe"\n', "server.client_tools", "'offer', 'ignore' or 'refuse'"),
])
def test_a_bad_server_setting_is_refused_naming_file_and_key(tmp_path, toml, key, says):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "aiops.toml").write_text(toml)
    with pytest.raises(ConfigError) as e:
        load_config(resolve_paths(tmp_path / "cfg", tmp_path / "data"), load_dotenv=False)
    assert str(tmp_path / "cfg" / "aiops.toml") in str(e.value) and key in str(e.value)
    assert says in str(e.value)


def test_a_model_servers_address_is_shown_without_credentials() -> None:
    """Errors name the model server (and reach chat clients); a key in the URL must not go with it."""
    from aiops.config import ModelConfig

    shown = {u: ModelConfig(type="openai", model_id="m", base_url=u).display_url() for u in (
        "http://user:SECRET@127.0.0.1:9/v1?api-key=SECRET", "http://[::1]:8080/v1", "https://api.x.ai/v1",
        "http://host:99999/v1")}
    assert shown == {"http://user:SECRET@127.0.0.1:9/v1?api-key=SECRET": "http://127.0.0.1:9/v1",
                     "http://[::1]:8080/v1": "http://[::1]:8080/v1", "https://api.x.ai/v1": "https://api.x.ai/v1",
                     "http://host:99999/v1": "(an unreadable base_url)"}
