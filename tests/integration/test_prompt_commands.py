"""The operator's `!prompt` and per-model prompt folders, through the engine."""

from __future__ import annotations

import shutil

import pytest

from aiops.config import SHIPPED_PROMPT_DIR
from tests.fakes.fixtures import openai_model_entry


@pytest.fixture
def prompt_copy(tmp_path):
    folder = tmp_path / "prompt"
    shutil.copytree(SHIPPED_PROMPT_DIR / "default", folder)
    return folder


async def op(engine, text: str, kind: str = "console") -> str:
    return (await engine.run(f"{kind}-1", text, kind=kind, is_operator=kind == "console")).text


async def test_prompt_tree_read_edit_reload(engine_factory, fake_openai, prompt_copy):
    engine = await engine_factory(models={"m": openai_model_entry(fake_openai,
                                                                  system_prompt_folder=str(prompt_copy))})
    tree = await op(engine, "!prompt")
    assert "1" in tree and "role" in tree and "tools_db" in tree and "container" in tree
    assert "Always cite" not in await op(engine, "!prompt read role")
    out = await op(engine, "!prompt edit role append Always cite the query you ran.")
    assert "append: section 'role'" in out
    assert "Always cite the query you ran." in (prompt_copy / ".system_prompt_role").read_text()
    assert "Always cite the query you ran." in await op(engine, "!prompt read role")
    out = await op(engine, "!prompt edit role replace Always cite => Never forget to cite")
    assert "Never forget to cite the query" in await op(engine, "!prompt read role")
    out = await op(engine, "!prompt edit tools append nope")
    assert "container" in out  # containers are edited through their children
    out = await op(engine, '!prompt create oncall "who is on call" --parent root Page Alice first.')
    assert "create" in out and (prompt_copy / ".system_prompt_oncall").exists()
    # an edit made on disk by hand shows after !prompt reload (and the mtime check)
    (prompt_copy / ".system_prompt_oncall").write_text("Page Bob first.\n")
    assert "reloaded" in await op(engine, "!prompt reload")
    assert "Page Bob first." in await op(engine, "!prompt read oncall")
    audit = [a for a in await engine.store.audit() if a.event == "prompt_edit"]
    assert len(audit) == 3 and all(a.actor == "operator" for a in audit)


async def test_prompt_errors_are_shown_not_silent(engine_factory, fake_openai, prompt_copy):
    root = prompt_copy / ".system_prompt"
    root.write_text(root.read_text() + "ghost: a section whose file is missing\n")
    engine = await engine_factory(models={"m": openai_model_entry(fake_openai,
                                                                  system_prompt_folder=str(prompt_copy))})
    tree = await op(engine, "!prompt")
    assert "ghost" in tree and "missing" in tree
    await engine.run("api-x", "hi", kind="api", timeout=10)  # assembly goes on without it
    assert "role:" in fake_openai.requests[-1].json["messages"][0]["content"]


async def test_prompt_edit_is_operator_only(engine_factory, fake_openai, prompt_copy):
    engine = await engine_factory(models={"m": openai_model_entry(fake_openai,
                                                                  system_prompt_folder=str(prompt_copy))})
    before = (prompt_copy / ".system_prompt_role").read_text()
    out = await op(engine, "!prompt edit role append hacked", kind="proxy")
    assert out.startswith("not permitted")
    assert (prompt_copy / ".system_prompt_role").read_text() == before
    assert "role" in await op(engine, "!prompt", kind="proxy")  # reading is fine


async def test_model_with_no_prompt_sends_no_system_message(engine_factory, fake_openai):
    engine = await engine_factory(models={"m": openai_model_entry(fake_openai, system_prompt_folder="none")})
    await engine.run("api-n", "hi", kind="api", timeout=10)
    assert [m["role"] for m in fake_openai.requests[-1].json["messages"]] == ["user"]
