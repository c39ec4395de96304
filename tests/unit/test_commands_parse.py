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
