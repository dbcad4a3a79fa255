"""The chat's slash-command parser, completion, settings and conversation files (no model needed)."""

import json

import pytest

from mlx_spec.app.chat.commands import Command, CommandError, complete, is_command, parse, unquote
from mlx_spec.app.chat.conversation import Conversation
from mlx_spec.app.chat.prompt import message_text, open_block
from mlx_spec.app.chat.settings import Settings
from mlx_spec.errors import MlxSpecError


@pytest.mark.parametrize("line, expected", [
    ("/help", Command("help")),
    ("/?", Command("help")),
    ("/help set", Command("help", ("set",))),
    ("/help /quit", Command("help", ("bye",))),
    ("/bye", Command("bye")),
    ("/exit", Command("bye")),
    ("/QUIT", Command("bye")),
    ("  /clear  ", Command("clear")),
    ("/regen", Command("regen")),
    ("/system", Command("system")),
    ("/system You are terse.", Command("system", ("You are terse.",))),
    ('/system """Line one\nline two"""', Command("system", ("Line one\nline two",))),
    ("/system off", Command("system", (None,))),
    ("/set", Command("set")),
    ("/set temp 0.7", Command("set", ("temp", 0.7))),
    ("/set temperature 1", Command("set", ("temp", 1.0))),
    ("/set top_p 0.9", Command("set", ("top_p", 0.9))),
    ("/set top-k 40", Command("set", ("top_k", 40))),
    ("/set max_tokens 64", Command("set", ("max_tokens", 64))),
    ("/set block_size 4", Command("set", ("block_size", 4))),
    ("/set block_size default", Command("set", ("block_size", None))),
    ("/set seed none", Command("set", ("seed", None))),
    ("/set verbose", Command("set", ("verbose", True))),
    ("/set verbose off", Command("set", ("verbose", False))),
    ("/set markdown no", Command("set", ("markdown", False))),
    ("/draft", Command("draft")),
    ("/draft off", Command("draft", (False,))),
    ("/draft ON", Command("draft", (True,))),
    ("/stats", Command("stats")),
    ("/save chat.json", Command("save", ("chat.json",))),
    ('/save "my chats/a b.json"', Command("save", ("my chats/a b.json",))),
    ("/load ~/x.json", Command("load", ("~/x.json",))),
    ("/model", Command("model")),
])
def test_parse(line, expected):
    assert parse(line) == expected


@pytest.mark.parametrize("line, hint", [
    ("/foo", "unknown command /foo"),
    ("/hlep", "did you mean /help?"),
    ("/", "unknown command"),
    ("/bye now", "/bye takes no arguments"),
    ("/help nothing", "no command /nothing"),
    ("/set temp", "give a value"),
    ("/set temp hot", "temp needs a number, not 'hot'"),
    ("/set max_tokens 1.5", "max_tokens needs a whole number"),
    ("/set block_size big", "or 'default'"),
    ("/set tmep 1", "did you mean temp?"),
    ("/set colour red", "no setting 'colour'"),
    ("/set verbose maybe", "verbose is on or off"),
    ("/draft maybe", "/draft takes on or off"),
    ("/save", "usage: /save FILE"),
    ("/load ''", "usage: /load FILE"),
])
def test_parse_errors_are_one_line_hints(line, hint):
    with pytest.raises(CommandError) as e:
        parse(line)
    assert hint in str(e.value)
    assert "\n" not in str(e.value)


def test_is_command():
    assert is_command("/help")
    assert not is_command("hello /help")
    assert not is_command("//etc/hosts is a file")
    assert message_text("//etc/hosts is a file") == "/etc/hosts is a file"
    assert message_text('"""\nfirst\nsecond\n"""') == "first\nsecond"
    assert message_text('"""unclosed') == "unclosed"
    assert open_block('"""a') and not open_block('"""a"""') and not open_block("plain")
    assert unquote("'x'") == "x" and unquote('"') == '"'


@pytest.mark.parametrize("text, candidates", [
    ("/", None),
    ("/he", ["/help"]),
    ("/s", ["/system", "/set", "/stats", "/save"]),
    ("/set ", None),
    ("/set t", ["temp", "top_p", "top_k"]),
    ("/set verbose o", ["on", "off"]),
    ("/set temp ", []),
    ("/draft o", ["on", "off"]),
    ("/help dr", ["draft"]),
    ("hello", []),
])
def test_complete(text, candidates):
    got = complete(text)
    if candidates is None:
        assert len(got) > 5
    else:
        assert got == candidates


def test_settings_check_ranges():
    s = Settings()
    assert s.with_value("temp", 0.5).sampling.temperature == 0.5
    assert s.with_value("block_size", 4).block_size == 4
    assert s.with_value("verbose", True).get("verbose") is True
    for key, bad in [("temp", -1.0), ("top_p", 0.0), ("top_p", 1.5), ("max_tokens", 0), ("block_size", 0),
                     ("min_p", 2.0), ("top_k", -3)]:
        with pytest.raises(MlxSpecError):
            s.with_value(key, bad)
    assert dict(s.describe())["block_size"] == "default"


def test_conversation_round_trip(tmp_path):
    c = Conversation(system="Be brief.")
    c.add("user", "hi")
    c.add("assistant", "hello ✓")
    f = tmp_path / "c.json"
    c.save(f, model="m")
    data = json.loads(f.read_text())
    assert data["format"] == "mlx-spec-chat/1" and data["model"] == "m"
    assert data["messages"][0] == {"role": "system", "content": "Be brief."}
    back = Conversation.load(f)
    assert back.messages() == c.messages()
    # A bare OpenAI-style list loads too.
    f.write_text(json.dumps([{"role": "user", "content": "q"}]))
    assert Conversation.load(f).turns == [{"role": "user", "content": "q"}]


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ('{"messages": 3}', "'messages' list"),
    ('[{"role": "robot", "content": "x"}]', "message 1 needs a role"),
    ('[{"role": "user"}]', "message 1 needs a role"),
])
def test_conversation_load_errors(tmp_path, content, message):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(ValueError, match=message):
        Conversation.load(f)
