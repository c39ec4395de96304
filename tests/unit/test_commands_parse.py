from aiops.engine.commands import parse_input


def test_command_lines_run_and_plain_lines_go_to_the_model():
    p = parse_input("!model gpt\nwhat is up\n!session\nand more")
    assert p.commands == ["!model gpt", "!session"]
    assert p.text == "what is up\nand more"
    assert p.model is None


def test_at_model_switch():
    p = parse_input("@gemini summarise this\nsecond line")
    assert p.model == "gemini" and p.text == "summarise this\nsecond line"


def test_plain_exclamation_inside_text_is_not_a_command():
    p = parse_input("hello! how are you\n  x != y")
    assert p.commands == [] and p.text.startswith("hello!")


def test_a_raw_command_takes_the_rest_of_the_message() -> None:
    p = parse_input("!model gpt\n!db SELECT *\nFROM t\n\nWHERE name = 'x'\n", raw_commands={"db"})
    assert p.commands == ["!model gpt", "!db SELECT *\nFROM t\n\nWHERE name = 'x'"]
    assert p.text == ""
    # Only commands the registry marks raw do so.
    p = parse_input("!model gpt\nwhat now", raw_commands={"db"})
    assert p.commands == ["!model gpt"] and p.text == "what now"
    p = parse_input("!db SELECT 1\nFROM t")
    assert p.commands == ["!db SELECT 1"] and p.text == "FROM t"


async def test_a_raw_command_gets_its_text_verbatim_and_others_are_shell_split() -> None:
    from aiops.engine.commands import Command, CommandContext, CommandRegistry

    seen: list[tuple[list[str], str]] = []

    async def handler(ctx: CommandContext, argv: list[str], raw: str) -> str:
        seen.append((argv, raw))
        return "ok"

    reg = CommandRegistry()
    reg.register(Command("db", "!db SQL", "", handler, raw=True))
    reg.register(Command("say", "!say WORDS", "", handler))
    assert reg.raw_names() == frozenset({"db"})
    ctx = CommandContext(engine=None, session_id="s", client_kind="console", is_operator=True)  # type: ignore[arg-type]
    assert await reg.run(ctx, "!db SELECT 1 -- don't") == "ok"
    assert await reg.run(ctx, "!db\nSELECT 'O\\'Brien'\nFROM t") == "ok"
    assert seen == [(["SELECT", "1", "--", "don't"], "SELECT 1 -- don't"),
                    (["SELECT", "'O\\'Brien'", "FROM", "t"], "SELECT 'O\\'Brien'\nFROM t")]
    # A command that is not raw keeps shell quoting, and an unbalanced quote is a clear error.
    assert await reg.run(ctx, "!say 'two words' three") == "ok"
    assert seen[-1][0] == ["two words", "three"]
    assert (await reg.run(ctx, "!say don't")).startswith("!say: No closing quotation")


def test_lines_that_name_no_command_are_text() -> None:
    text = "!!! ALERT disk at 98%\n![graph](http://x/g.png)\n!= 0\n!\n!  \n!42 is not a name"
    p = parse_input(text)
    assert p.commands == [] and p.text == text


def test_with_known_names_only_real_commands_leading_the_message_are_commands() -> None:
    p = parse_input("\n!model\n!important paged\nwhat now", known={"model", "help"})
    assert p.commands == ["!model"] and p.text == "!important paged\nwhat now"
    # A document a chat UI put in the message, and whatever follows the first text: text.
    p = parse_input("### Task:\n<context>\n!reset\n!model cheap\n</context>\nq", known={"model", "reset"})
    assert p.commands == [] and "!reset\n!model cheap" in p.text
    # Without them (the console, the API) an unknown name is a command, answered "unknown".
    assert parse_input("!important paged").commands == ["!important paged"]


def test_a_command_whose_name_could_never_be_typed_is_refused_at_registration() -> None:
    import pytest

    from aiops.engine.commands import Command, CommandRegistry

    async def handler(ctx: object, argv: list[str], raw: str) -> str:
        return "ok"

    reg = CommandRegistry()
    for name in ("2fa", "_debug", "k8s:pods", "db/query", "Upper"):
        with pytest.raises(ValueError, match="is not a name"):
            reg.register(Command(name, f"!{name}", "", handler))  # type: ignore[arg-type]
    reg.register(Command("k8s-pods", "!k8s-pods", "", handler))  # type: ignore[arg-type]
    assert parse_input("!K8S-pods now").commands == ["!K8S-pods now"]
