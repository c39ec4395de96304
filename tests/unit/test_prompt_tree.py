"""The system prompt as a tree of section files: format, assembly, caching and edits."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from aiops.prompts.ops import TEXT_OPERATIONS, ConfirmationRequired, EditResult, edit_section, read_section
from aiops.prompts.tree import PromptEditError, PromptStore, PromptTree, load_tree

DEFAULT_TREE = Path(__file__).resolve().parents[2] / "system_prompt" / "default"


def write_tree(folder: Path, root: str, **sections: str) -> Path:
    """Write `.system_prompt` and one `.system_prompt_<name>` per keyword."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".system_prompt").write_text(root, encoding="utf-8")
    for name, text in sections.items():
        (folder / f".system_prompt_{name}").write_text(text, encoding="utf-8")
    return folder


def section_file(folder: Path, name: str) -> Path:
    return folder / f".system_prompt_{name}"


@pytest.fixture
def ops_tree(tmp_path: Path) -> Path:
    """Main paragraph, a leaf with a heading, a container with two leaves, a headless leaf."""
    return write_tree(
        tmp_path / "prompt",
        "You are a test agent.\n\n[SECTIONS]\nrole: Behaviour\ntools: Tool use\nnotes: Loose notes\n",
        role="## Role\nBe brief.\nCite data.\n",
        tools="## Tools\nUse tools carefully.\n\n[SECTIONS]\ntools_db: Database\ntools_web: Web\n",
        tools_db="Read before write.\nAlways LIMIT.\n",
        tools_web="Cite URLs.\n",
        notes="First note.\n",
    )


def names(tree: PromptTree) -> list[str]:
    return [s.name for s in tree.sections]


def folder_listing(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in folder.iterdir()}


# ---- format and assembly --------------------------------------------------------------------------


def test_assembly_is_main_then_sections_depth_first_one_hash_per_level(tmp_path: Path) -> None:
    folder = write_tree(
        tmp_path,
        "Main paragraph.\n[SECTIONS]\na: Alpha\nz: Zulu\n",
        a="Alpha preamble.\n[SECTIONS]\nb: Bravo\n",
        b="[SECTIONS]\nc: Charlie\n",
        c="Charlie body.\n",
        z="Zulu body.\n",
    )
    tree = load_tree(folder)

    assert tree.errors == ()
    assert tree.assemble() == (
        "Main paragraph.\n\n"
        "## a: Alpha\nAlpha preamble.\n\n"
        "### b: Bravo\n\n"
        "#### c: Charlie\nCharlie body.\n\n"
        "## z: Zulu\nZulu body."
    )
    assert [(s.name, s.index, s.depth, s.kind) for s in tree.sections] == [
        ("a", 1, 1, "container"), ("b", 2, 2, "container"), ("c", 3, 3, "leaf"), ("z", 4, 1, "leaf"),
    ]
    assert tree.find("b").parent == "a" and tree.find("a").parent is None
    assert tree.find("a").children == ("b",)


def test_a_first_line_heading_is_kept_out_of_the_prompt(tmp_path: Path) -> None:
    folder = write_tree(tmp_path, "Main.\n[SECTIONS]\nrole: Behaviour\n", role="## Role title\n\nBe brief.\n")

    tree = load_tree(folder)

    role = tree.find("role")
    assert role.heading == "Role title"
    assert role.body == "Be brief."
    assert "Role title" not in tree.assemble()
    assert "## role: Behaviour\nBe brief." in tree.assemble()


def test_only_a_first_line_is_a_heading(tmp_path: Path) -> None:
    folder = write_tree(tmp_path, "Main.\n[SECTIONS]\nx: X\n", x="Intro.\n## Not a title\n")

    assert load_tree(folder).find("x").body == "Intro.\n## Not a title"


def test_a_root_without_section_list_is_just_the_main_paragraph(tmp_path: Path) -> None:
    folder = write_tree(tmp_path, "Only a main paragraph.\n")

    tree = load_tree(folder)

    assert tree.assemble() == "Only a main paragraph."
    assert tree.sections == () and tree.errors == ()


def test_sections_are_found_by_name_index_or_numeric_string(ops_tree: Path) -> None:
    tree = load_tree(ops_tree)

    assert names(tree) == ["role", "tools", "tools_db", "tools_web", "notes"]
    assert tree.find(3).name == "tools_db"
    assert tree.find("3").name == "tools_db"
    assert tree.find(" 4 ").name == "tools_web"
    assert tree.find("notes").index == 5


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("nope", "section 'nope' not found; sections: role, tools, tools_db, tools_web, notes"),
        ("tool_db", "did you mean 'tools_db'?"),
        (9, "section index 9 out of range; sections are numbered 1-5"),
        ("0", "section index 0 out of range"),
        ("", "no section given; sections: role"),
    ],
)
def test_find_errors_name_what_exists(ops_tree: Path, ref: str | int, expected: str) -> None:
    with pytest.raises(PromptEditError) as caught:
        load_tree(ops_tree).find(ref)
    assert expected in caught.value.message


def test_render_tree_shows_indexes_containers_and_errors(ops_tree: Path) -> None:
    (ops_tree / ".system_prompt").write_text("Main.\n[SECTIONS]\nrole: Behaviour\ntools: Tool use\nghost: Gone\n")

    listing = load_tree(ops_tree).render_tree()

    assert "  1. role: Behaviour" in listing
    assert "  2. tools [container]: Tool use" in listing
    assert "    3. tools_db: Database" in listing
    assert listing.index("errors:") > listing.index("tools_web")
    assert listing.splitlines()[-1].strip().startswith("missing: root > ghost")


def test_a_missing_folder_or_root_file_is_an_error_not_an_exception(tmp_path: Path) -> None:
    tree = load_tree(tmp_path / "nowhere")

    assert tree.assemble() == ""
    assert [(e.kind, e.name, e.chain) for e in tree.errors] == [("missing", "root", ("root",))]


def test_invalid_list_lines_are_reported_and_skipped(tmp_path: Path) -> None:
    folder = write_tree(tmp_path, "Main.\n[SECTIONS]\n../etc: sneaky\nbad name: spaces\nok: Fine\n", ok="Body.\n")

    tree = load_tree(folder)

    assert names(tree) == ["ok"]
    assert [e.kind for e in tree.errors] == ["invalid", "invalid"]
    assert "line '../etc: sneaky'" in tree.errors[0].message


def test_unreadable_section_file_is_reported(tmp_path: Path) -> None:
    folder = write_tree(tmp_path, "Main.\n[SECTIONS]\nbinary: B\nok: O\n", ok="Fine.\n")
    section_file(folder, "binary").write_bytes(b"\xff\xfe\x00bad")

    tree = load_tree(folder)

    assert names(tree) == ["ok"]
    assert [(e.kind, e.chain) for e in tree.errors] == [("unreadable", ("root", "binary"))]


# ---- loops, duplicates and missing files at several depths ----------------------------------------


@pytest.mark.parametrize(
    ("files", "chain"),
    [
        # direct child lists itself
        ({"a": "[SECTIONS]\na: again\n"}, "root > a > a"),
        # grandchild points back at its grandparent
        ({"a": "[SECTIONS]\nb: B\n", "b": "[SECTIONS]\na: A\n"}, "root > a > b > a"),
        # great-grandchild points back at its parent
        ({"a": "[SECTIONS]\nb: B\n", "b": "[SECTIONS]\nc: C\n", "c": "[SECTIONS]\nb: B\n"}, "root > a > b > c > b"),
    ],
)
def test_loops_are_reported_with_their_chain_and_skipped(tmp_path: Path, files: dict[str, str], chain: str) -> None:
    folder = write_tree(tmp_path, "Main.\n[SECTIONS]\na: A\nlast: Last\n", last="Still here.\n", **files)

    tree = load_tree(folder)

    assert [e.kind for e in tree.errors] == ["loop"]
    assert tree.errors[0].message.startswith(f"loop: {chain} ")
    assert " > ".join(tree.errors[0].chain) == chain
    assert names(tree) == [*files, "last"]  # every section once, the looping entry left out
    assert tree.assemble().endswith("## last: Last\nStill here.")


@pytest.mark.parametrize(
    ("root_list", "files", "chain", "first"),
    [
        ("a: A\na: A again\n", {}, "root > a", "root > a"),
        ("a: A\nb: B\n", {"b": "[SECTIONS]\nc: C\n", "c": "[SECTIONS]\na: A\n"}, "root > b > c > a", "root > a"),
        (
            "b: B\na: A\n",
            {"b": "[SECTIONS]\nc: C\n", "c": "[SECTIONS]\nd: D\n", "d": "[SECTIONS]\nx: X\n",
             "a": "[SECTIONS]\nx: X\n"},
            "root > a > x",
            "root > b > c > d > x",
        ),
    ],
    ids=["direct-child", "grandchild", "great-grandchild-first"],
)
def test_duplicates_are_reported_with_both_places_and_kept_once(
    tmp_path: Path, root_list: str, files: dict[str, str], chain: str, first: str
) -> None:
    folder = write_tree(tmp_path, f"Main.\n[SECTIONS]\n{root_list}", x="Shared.\n", **{"a": "A body.\n", **files})

    tree = load_tree(folder)

    assert [e.kind for e in tree.errors] == ["duplicate"]
    assert tree.errors[0].message.startswith(f"duplicate: {chain} (already at {first}")
    dup = tree.errors[0].name
    assert names(tree).count(dup) == 1
    assert tree.assemble().count(f"{dup}: ") == 1


@pytest.mark.parametrize(
    ("files", "chain"),
    [
        ({}, "root > ghost"),
        ({"a": "[SECTIONS]\nghost: G\nkept: K\n"}, "root > a > ghost"),
        ({"a": "[SECTIONS]\nb: B\n", "b": "[SECTIONS]\nghost: G\nkept: K\n"}, "root > a > b > ghost"),
    ],
    ids=["child", "grandchild", "great-grandchild"],
)
def test_missing_files_are_reported_and_siblings_still_assemble(
    tmp_path: Path, files: dict[str, str], chain: str
) -> None:
    root_list = "ghost: G\nkept: K\n" if not files else "a: A\n"
    folder = write_tree(tmp_path, f"Main.\n[SECTIONS]\n{root_list}", kept="Kept body.\n", **files)

    tree = load_tree(folder)

    assert [(e.kind, " > ".join(e.chain)) for e in tree.errors] == [("missing", chain)]
    assert "no file .system_prompt_ghost" in tree.errors[0].message
    assert "ghost" not in names(tree)
    assert "kept: K\nKept body." in tree.assemble()
    with pytest.raises(PromptEditError, match="section 'ghost' is listed but not loaded: missing"):
        tree.find("ghost")


# ---- reading --------------------------------------------------------------------------------------


def test_read_section_whole_prompt_leaf_and_container(ops_tree: Path) -> None:
    tree = load_tree(ops_tree)

    assert read_section(tree) == tree.assemble()
    assert read_section(tree, "role") == "## role: Behaviour\nBe brief.\nCite data."
    assert read_section(tree, 5) == "## notes: Loose notes\nFirst note."
    assert read_section(tree, "tools") == (
        "## tools: Tool use\nUse tools carefully.\n\n"
        "### tools_db: Database\nRead before write.\nAlways LIMIT.\n\n"
        "### tools_web: Web\nCite URLs."
    )
    with pytest.raises(PromptEditError, match="section 'x' not found"):
        read_section(tree, "x")


# ---- text edits -----------------------------------------------------------------------------------


def test_append_adds_lines_and_keeps_the_heading(ops_tree: Path) -> None:
    result = edit_section(ops_tree, "role", "append", content="Say when unsure.")

    assert section_file(ops_tree, "role").read_text() == "## Role\nBe brief.\nCite data.\nSay when unsure.\n"
    assert result.section == "role"
    assert result.path == section_file(ops_tree, "role")
    assert result.before == "## Role\nBe brief.\nCite data.\n"
    assert result.after == section_file(ops_tree, "role").read_text()
    assert "+Say when unsure.\n" in result.diff
    assert result.diff.startswith("--- a/.system_prompt_role\n+++ b/.system_prompt_role\n")


def test_prepend_goes_after_the_heading(ops_tree: Path) -> None:
    edit_section(ops_tree, 1, "prepend", content="You answer operators.")

    assert section_file(ops_tree, "role").read_text() == "## Role\nYou answer operators.\nBe brief.\nCite data.\n"


def test_prepend_of_a_markdown_heading_to_a_headless_file_stays_content(ops_tree: Path) -> None:
    edit_section(ops_tree, "notes", "prepend", content="## Important\nCheck twice.")

    tree = load_tree(ops_tree)
    assert tree.find("notes").heading is None
    assert "## notes: Loose notes\n## Important\nCheck twice.\nFirst note." in tree.assemble()


def test_replace_changes_only_the_first_occurrence(ops_tree: Path) -> None:
    section_file(ops_tree, "notes").write_text("a cat\na cat\n")

    edit_section(ops_tree, "notes", "replace", target="cat", content="dog")

    assert section_file(ops_tree, "notes").read_text() == "a dog\na cat\n"


def test_replace_never_touches_the_heading(ops_tree: Path) -> None:
    with pytest.raises(PromptEditError, match="target text not found in section 'role'"):
        edit_section(ops_tree, "role", "replace", target="## Role", content="x")


def test_delete_lines_removes_every_line_containing_the_target(ops_tree: Path) -> None:
    section_file(ops_tree, "notes").write_text("keep\ndrop me\nkeep too\nalso drop\n")

    result = edit_section(ops_tree, "notes", "delete_lines", target="drop")

    assert section_file(ops_tree, "notes").read_text() == "keep\nkeep too\n"
    assert "-drop me\n" in result.diff and "-also drop\n" in result.diff


def test_overwrite_needs_confirm_then_replaces_the_body(ops_tree: Path) -> None:
    # How to confirm (confirm=true or --confirm) is worded by the caller, which knows who it talks to.
    with pytest.raises(ConfirmationRequired, match="needs an explicit confirmation"):
        edit_section(ops_tree, "role", "overwrite", content="New text.")
    assert section_file(ops_tree, "role").read_text() == "## Role\nBe brief.\nCite data.\n"

    edit_section(ops_tree, "role", "overwrite", content="New text.", confirm=True)

    assert section_file(ops_tree, "role").read_text() == "## Role\nNew text.\n"


def test_edits_show_up_in_the_assembled_prompt(ops_tree: Path) -> None:
    edit_section(ops_tree, "tools_db", "append", content="Explain every write.")

    assert "### tools_db: Database\nRead before write.\nAlways LIMIT.\nExplain every write." in (
        load_tree(ops_tree).assemble()
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"operation": "replace", "target": "absent", "content": "x"}, "target text not found in section 'notes'"),
        ({"operation": "replace", "content": "x"}, "replace needs a target text"),
        ({"operation": "delete_lines", "target": "absent"}, "no line in section 'notes' contains the target"),
        ({"operation": "delete_lines"}, "delete_lines needs a target text"),
        ({"operation": "append"}, "append needs content"),
        ({"operation": "prepend", "content": "  \n"}, "prepend needs content"),
        ({"operation": "overwrite", "confirm": True}, "overwrite needs content; use remove"),
        ({"operation": "append", "content": "x\n[SECTIONS]\ny: z"}, "may not contain a [SECTIONS] line"),
        ({"operation": "rename"}, "unknown operation 'rename'; operations: append, prepend"),
    ],
)
def test_refused_edits_explain_and_leave_the_file_alone(ops_tree: Path, kwargs: dict[str, object], message: str) -> None:
    before = folder_listing(ops_tree)

    with pytest.raises(PromptEditError) as caught:
        edit_section(ops_tree, "notes", **kwargs)  # type: ignore[arg-type]

    assert message in caught.value.message
    assert folder_listing(ops_tree) == before


def test_editing_an_unknown_section_lists_the_sections(ops_tree: Path) -> None:
    with pytest.raises(PromptEditError, match="section 'nope' not found; sections: role, tools, tools_db"):
        edit_section(ops_tree, "nope", "append", content="x")


@pytest.mark.parametrize("operation", TEXT_OPERATIONS)
def test_containers_cannot_be_edited_as_text(ops_tree: Path, operation: str) -> None:
    before = folder_listing(ops_tree)

    with pytest.raises(PromptEditError) as caught:
        edit_section(ops_tree, "tools", operation, content="x", target="Use", confirm=True)

    assert caught.value.message == (
        "section 'tools' is a container and cannot be edited as text; "
        "edit one of its children instead: tools_db, tools_web"
    )
    assert folder_listing(ops_tree) == before


def test_an_edit_that_changes_nothing_reports_unchanged(ops_tree: Path) -> None:
    result = edit_section(ops_tree, "notes", "replace", target="First", content="First")

    assert not result.changed and result.diff == ""
    assert "unchanged" in result.summary


# ---- create and remove ----------------------------------------------------------------------------


def test_create_under_the_root_appends_to_the_list_and_writes_the_file(ops_tree: Path) -> None:
    result = edit_section(ops_tree, "gates", "create", content="Never retry a denied call.",
                          description="Operator approval")

    assert (ops_tree / ".system_prompt").read_text() == (
        "You are a test agent.\n\n[SECTIONS]\nrole: Behaviour\ntools: Tool use\nnotes: Loose notes\n"
        "gates: Operator approval\n"
    )
    assert section_file(ops_tree, "gates").read_text() == "Never retry a denied call.\n"
    tree = load_tree(ops_tree)
    assert tree.errors == () and names(tree)[-1] == "gates"
    assert tree.assemble().endswith("## gates: Operator approval\nNever retry a denied call.")
    assert (result.before, result.path) == ("", section_file(ops_tree, "gates"))
    assert "+gates: Operator approval\n" in result.diff
    assert "+Never retry a denied call.\n" in result.diff


def test_create_under_a_container_keeps_its_preamble_and_heading(ops_tree: Path) -> None:
    edit_section(ops_tree, "tools_prompt", "create", content="Edits need approval.",
                 description="Prompt tools", parent="tools")

    assert section_file(ops_tree, "tools").read_text() == (
        "## Tools\nUse tools carefully.\n\n[SECTIONS]\ntools_db: Database\ntools_web: Web\n"
        "tools_prompt: Prompt tools\n"
    )
    tree = load_tree(ops_tree)
    assert names(tree) == ["role", "tools", "tools_db", "tools_web", "tools_prompt", "notes"]
    assert tree.find("tools_prompt").depth == 2


def test_create_under_an_empty_nested_container_and_by_index(tmp_path: Path) -> None:
    folder = write_tree(tmp_path, "Main.\n[SECTIONS]\na: A\n", a="[SECTIONS]\nb: B\n", b="B intro.\n[SECTIONS]\n\n")

    edit_section(folder, "c", "create", content="Deep.", description="C", parent=2)

    tree = load_tree(folder)
    assert tree.errors == ()
    assert "#### c: C\nDeep." in tree.assemble()


def test_create_accepts_root_as_the_parent_and_starts_a_list_when_there_is_none(tmp_path: Path) -> None:
    folder = write_tree(tmp_path, "Just a main paragraph.\n")

    edit_section(folder, "first", "create", description="First section", parent="root")

    assert (folder / ".system_prompt").read_text() == "Just a main paragraph.\n\n[SECTIONS]\nfirst: First section\n"
    assert load_tree(folder).assemble() == "Just a main paragraph.\n\n## first: First section"


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("notes", {}, "section 'notes' already exists"),
        ("tools_db", {"parent": "tools"}, "section 'tools_db' already exists"),
        ("bad name", {}, "invalid section name 'bad name'"),
        ("../escape", {}, "invalid section name '../escape'"),
        ("42", {}, "all digits and would read as an index"),
        ("new", {"description": ""}, "create needs a one-line description"),
        ("new", {"description": "two\nlines"}, "create needs a one-line description"),
        ("new", {"parent": "role"}, "section 'role' is a leaf; new sections go under the root or a container (tools)"),
        ("new", {"parent": "missing"}, "section 'missing' not found"),
        ("new", {"content": "[SECTIONS]\nx: y"}, "may not contain a [SECTIONS] line"),
    ],
)
def test_create_refusals(ops_tree: Path, name: str, kwargs: dict[str, str], message: str) -> None:
    before = folder_listing(ops_tree)
    arguments = {"description": "Something", **kwargs}

    with pytest.raises(PromptEditError) as caught:
        edit_section(ops_tree, name, "create", **arguments)  # type: ignore[arg-type]

    assert message in caught.value.message
    assert folder_listing(ops_tree) == before


def test_create_refuses_a_name_whose_file_already_exists_unlisted(ops_tree: Path) -> None:
    section_file(ops_tree, "orphan").write_text("left over\n")

    with pytest.raises(PromptEditError, match="file .system_prompt_orphan already exists"):
        edit_section(ops_tree, "orphan", "create", description="Orphan")


def test_create_refuses_a_name_that_is_listed_but_missing(ops_tree: Path) -> None:
    section_file(ops_tree, "notes").unlink()

    with pytest.raises(PromptEditError, match="section 'notes' is already listed \\(missing: root > notes"):
        edit_section(ops_tree, "notes", "create", description="Again")


def test_remove_takes_a_leaf_out_of_its_parents_list_and_off_disk(ops_tree: Path) -> None:
    result = edit_section(ops_tree, "tools_db", "remove")

    assert not section_file(ops_tree, "tools_db").exists()
    assert section_file(ops_tree, "tools").read_text() == (
        "## Tools\nUse tools carefully.\n\n[SECTIONS]\ntools_web: Web\n"
    )
    tree = load_tree(ops_tree)
    assert tree.errors == () and "tools_db" not in names(tree)
    assert (result.before, result.after) == ("Read before write.\nAlways LIMIT.\n", "")
    assert "-tools_db: Database\n" in result.diff and "-Always LIMIT.\n" in result.diff


def test_remove_a_top_level_leaf_by_index(ops_tree: Path) -> None:
    edit_section(ops_tree, "5", "remove")

    assert names(load_tree(ops_tree)) == ["role", "tools", "tools_db", "tools_web"]
    assert not section_file(ops_tree, "notes").exists()


def test_remove_refuses_containers(ops_tree: Path) -> None:
    before = folder_listing(ops_tree)

    with pytest.raises(PromptEditError, match="section 'tools' is a container; only leaf sections can be removed"):
        edit_section(ops_tree, "tools", "remove")

    assert folder_listing(ops_tree) == before


def test_create_then_remove_round_trips_the_files(ops_tree: Path) -> None:
    before = folder_listing(ops_tree)

    edit_section(ops_tree, "tmp", "create", content="x", description="Temporary", parent="tools")
    edit_section(ops_tree, "tmp", "remove")

    assert folder_listing(ops_tree) == before


# ---- atomic writes --------------------------------------------------------------------------------


def test_a_write_interrupted_before_the_rename_leaves_the_old_file_whole(
    ops_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = folder_listing(ops_tree)

    def power_cut(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", power_cut)

    with pytest.raises(PromptEditError, match="could not write .system_prompt_role: Input/output error"):
        edit_section(ops_tree, "role", "append", content="Lost line.")

    assert folder_listing(ops_tree) == before  # old content intact, no temp file left behind


def test_a_create_whose_list_update_fails_leaves_no_orphan_file(
    ops_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = folder_listing(ops_tree)
    real_replace = os.replace
    calls: list[str] = []

    def fail_second(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        calls.append(os.fspath(dst))
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_second)

    with pytest.raises(PromptEditError, match="could not write .system_prompt: No space left on device"):
        edit_section(ops_tree, "extra", "create", content="x", description="Extra")

    assert folder_listing(ops_tree) == before


def test_writes_keep_the_file_mode(ops_tree: Path) -> None:
    path = section_file(ops_tree, "notes")
    path.chmod(0o600)

    edit_section(ops_tree, "notes", "append", content="More.")

    assert stat.S_IMODE(path.stat().st_mode) == 0o600


# ---- caching --------------------------------------------------------------------------------------


def test_store_returns_the_same_tree_while_nothing_changes(ops_tree: Path) -> None:
    store = PromptStore()

    assert store.get(ops_tree) is store.get(ops_tree)


def test_store_reloads_after_an_edit_through_the_api(ops_tree: Path) -> None:
    store = PromptStore()
    first = store.get(ops_tree)

    # Same length on purpose: the atomic replace must be noticed even when the size is unchanged.
    edit_section(ops_tree, "notes", "replace", target="First", content="Other")

    second = store.get(ops_tree)
    assert second is not first
    assert second.find("notes").body == "Other note."
    assert store.get(ops_tree) is second


def test_store_reloads_after_a_hand_edit_on_disk(ops_tree: Path) -> None:
    store = PromptStore()
    first = store.get(ops_tree)
    path = section_file(ops_tree, "notes")
    stamp = path.stat().st_mtime_ns

    path.write_text("Edited by hand.\n")
    os.utime(path, ns=(stamp + 1_000_000_000, stamp + 1_000_000_000))

    assert store.get(ops_tree) is not first
    assert store.get(ops_tree).find("notes").body == "Edited by hand."


def test_store_reloads_when_a_missing_file_appears(ops_tree: Path) -> None:
    section_file(ops_tree, "notes").unlink()
    store = PromptStore()
    assert [e.kind for e in store.get(ops_tree).errors] == ["missing"]

    section_file(ops_tree, "notes").write_text("Back.\n")

    assert store.get(ops_tree).errors == ()


def test_store_ignores_unrelated_files_and_reload_forgets(ops_tree: Path) -> None:
    store = PromptStore()
    first = store.get(ops_tree)

    (ops_tree / "README.md").write_text("not a prompt file\n")
    assert store.get(ops_tree) is first

    store.reload(ops_tree)
    second = store.get(ops_tree)
    assert second is not first
    store.reload()
    assert store.get(ops_tree) is not second


def test_store_keeps_folders_apart(tmp_path: Path) -> None:
    one = write_tree(tmp_path / "one", "One.\n")
    two = write_tree(tmp_path / "two", "Two.\n")
    store = PromptStore()

    assert store.get(one).assemble() == "One."
    assert store.get(two).assemble() == "Two."


# ---- the shipped default tree ---------------------------------------------------------------------


def test_default_tree_loads_without_errors_and_assembles_every_section() -> None:
    tree = load_tree(DEFAULT_TREE)

    assert tree.errors == ()
    assert "operations assistant" in tree.main
    assert names(tree) == ["role", "tools", "tools_db", "tools_prompt", "tools_ddgs_search", "tools_tavily_search",
                           "tools_xai_search", "tools_google_search", "tools_url_extract", "tools_google_drive",
                           "tools_delegation", "tools_agent_call", "gates", "memory"]
    assert tree.find("tools").kind == "container"
    prompt = tree.assemble()
    for section in tree.sections:
        assert f"{'#' * (section.depth + 1)} {section.name}: {section.description}\n" in prompt
        assert section.description and section.body
    assert "db_query" in prompt and "LIMIT" in prompt
    assert "read_system_prompt" in prompt and "update_system_prompt" in prompt
    assert "[REQUIRES" not in prompt


def test_default_tree_guides_only_the_tools_that_exist() -> None:
    tree = load_tree(DEFAULT_TREE)
    core = ["read_system_prompt", "update_system_prompt"]  # registered by every engine

    without_db = tree.assemble(core)
    with_db = tree.assemble([*core, "db_query"])

    assert tree.find("tools_db").requires == ("db_query",)
    assert tree.find("tools_agent_call").requires == ("agent_call",)
    assert "db_query" not in without_db and "LIMIT" not in without_db
    assert "agent_call" not in without_db and "agent_call(peer, message)" in tree.assemble([*core, "agent_call"])
    assert "### tools_db: Querying databases with db_query\n" in with_db
    assert "update_system_prompt" in without_db
    # No section talks about tools that no plugin provides.
    for prompt in (without_db, with_db):
        for claim in ("web search", "page", "extract", "URL of", "Slack"):
            assert claim not in prompt, claim


def test_edit_result_is_a_plain_value() -> None:
    result = EditResult("append", "x", Path("/p/.system_prompt_x"), "a\n", "a\nb\n")

    assert result.changed
    assert result.diff == "--- a/.system_prompt_x\n+++ b/.system_prompt_x\n@@ -1 +1,2 @@\n a\n+b\n"
    assert result.summary == "append: section 'x' (.system_prompt_x), +1 -0 lines"


# ---- sections that require tools ------------------------------------------------------------------


@pytest.fixture
def conditional_tree(tmp_path: Path) -> Path:
    """A leaf that needs db_query (after its title), a container that needs `web` (first line)."""
    return write_tree(
        tmp_path / "prompt",
        "Main.\n[SECTIONS]\nrole: Behaviour\ndb: Database\nweb: Web tools\n",
        role="Be brief.\n",
        db="## Database\n[REQUIRES db_query]\nAlways LIMIT.\n",
        web="[REQUIRES web_search, web_fetch]\nWeb preamble.\n[SECTIONS]\nweb_cite: Citing\n",
        web_cite="Cite URLs.\n",
    )


def test_a_requires_line_is_not_content_and_names_the_tools(conditional_tree: Path) -> None:
    tree = load_tree(conditional_tree)

    assert tree.errors == ()
    assert tree.find("db").requires == ("db_query",)
    assert tree.find("db").heading == "Database" and tree.find("db").body == "Always LIMIT."
    assert tree.find("web").requires == ("web_search", "web_fetch") and tree.find("web").is_container
    assert tree.find("web_cite").requires == ()
    assert "REQUIRES" not in tree.assemble()


def test_assembly_leaves_out_sections_whose_tools_are_missing(conditional_tree: Path) -> None:
    tree = load_tree(conditional_tree)

    assert tree.assemble([]) == "Main.\n\n## role: Behaviour\nBe brief."
    assert tree.assemble(["db_query", "web_search"]) == (
        "Main.\n\n## role: Behaviour\nBe brief.\n\n## db: Database\nAlways LIMIT."
    )
    # Every named tool is needed; a container's condition covers its children.
    full = tree.assemble(["db_query", "web_search", "web_fetch"])
    assert full.endswith("## web: Web tools\nWeb preamble.\n\n### web_cite: Citing\nCite URLs.")
    # Without a tool list nothing is judged (an editor's view of every section).
    assert tree.assemble() == full
    # Indexes do not move when a section is inactive.
    assert [s.index for s in tree.active([])] == [1]
    assert tree.find(4).name == "web_cite"


def test_the_tree_listing_marks_inactive_sections(conditional_tree: Path) -> None:
    listing = load_tree(conditional_tree).render_tree(["db_query"])

    assert listing.splitlines() == [
        f"system prompt: {conditional_tree}",
        "  1. role: Behaviour",
        "  2. db: Database  [requires db_query]",
        "  3. web [container]: Web tools  [inactive: needs web_search, web_fetch]",
        "    4. web_cite: Citing  [inactive: needs web_search, web_fetch]",
    ]


def test_reading_an_inactive_section_says_why_it_is_not_in_the_prompt(conditional_tree: Path) -> None:
    tree = load_tree(conditional_tree)

    assert read_section(tree, "db", ["db_query"]) == "## db: Database\nAlways LIMIT."
    assert read_section(tree, "db", []) == (
        "(inactive: section 'db' is left out of the prompt: tool db_query is not available)\n"
        "## db: Database\nAlways LIMIT."
    )
    assert read_section(tree, "web_cite", ["db_query"]).startswith(
        "(inactive: section 'web_cite' is left out of the prompt: tools web_search, web_fetch are not "
        "available)\n"
    )
    assert read_section(tree, "", []) == tree.assemble([])


def test_reading_a_container_notes_its_inactive_children(tmp_path: Path) -> None:
    folder = write_tree(tmp_path, "Main.\n[SECTIONS]\ntools: Tools\n",
                        tools="Use tools.\n[SECTIONS]\ntdb: Db\ntp: Prompt\n",
                        tdb="[REQUIRES db_query]\nLIMIT.\n", tp="Read first.\n")

    text = read_section(load_tree(folder), "tools", ["read_system_prompt"])

    assert text == ("## tools: Tools\nUse tools.\n\n### tp: Prompt\nRead first.\n\n"
                    "(not part of the prompt: tdb (needs tool db_query))")


def test_text_edits_keep_the_requires_line(conditional_tree: Path) -> None:
    edit_section(conditional_tree, "db", "append", content="Explain writes.")
    edit_section(conditional_tree, "db", "overwrite", content="Only SELECT.", confirm=True)

    assert section_file(conditional_tree, "db").read_text() == "## Database\n[REQUIRES db_query]\nOnly SELECT.\n"
    assert load_tree(conditional_tree).find("db").requires == ("db_query",)


@pytest.mark.parametrize("text", ["[REQUIRES db_query]\nLiteral.", "## Title-like\n[REQUIRES x]"])
def test_content_that_looks_like_a_condition_stays_content(tmp_path: Path, text: str) -> None:
    folder = write_tree(tmp_path, "Main.\n[SECTIONS]\nn: Notes\nh: Headed\n", n="Old.\n", h="## H\nOld.\n")

    edit_section(folder, "n", "overwrite", content=text, confirm=True)
    edit_section(folder, "h", "overwrite", content=text, confirm=True)
    edit_section(folder, "fresh", "create", content=text, description="Fresh")

    tree = load_tree(folder)
    for name in ("n", "h", "fresh"):
        assert tree.find(name).requires == () and tree.find(name).body == text, name
    assert tree.assemble([]).count(text) == 3


def test_a_requires_line_later_in_the_file_is_plain_content(tmp_path: Path) -> None:
    folder = write_tree(tmp_path, "Main.\n[SECTIONS]\nx: X\n", x="Intro.\n[REQUIRES db_query]\n")

    section = load_tree(folder).find("x")

    assert section.requires == () and section.body == "Intro.\n[REQUIRES db_query]"
