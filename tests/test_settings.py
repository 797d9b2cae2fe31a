"""producerkit.settings: overrides > environment > TOML file > Producer defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

import producerkit as pk
from producerkit import settings

TOML = """
url = "kafka://file:9092"
topic = "from-file"
max_in_flight_messages = 500
timeout = 10

[options]
linger_ms = 5
acks = "all"
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "producerkit.toml"
    path.write_text(TOML)
    return path


def test_file_only(config_file: Path) -> None:
    assert settings.load(config_file, environ={}) == {
        "url": "kafka://file:9092",
        "topic": "from-file",
        "max_in_flight_messages": 500,
        "timeout": 10,
        "linger_ms": 5,
        "acks": "all",
    }


def test_precedence_overrides_env_file(config_file: Path) -> None:
    env = {
        "PRODUCERKIT_TOPIC": "from-env",
        "PRODUCERKIT_TIMEOUT": "2.5",
        "PRODUCERKIT_MAX_IN_FLIGHT_MESSAGES": "250",
        "PRODUCERKIT_OPTION_ACKS": "1",
    }
    loaded = settings.load(config_file, environ=env, topic="from-flag", timeout=None)
    assert loaded["topic"] == "from-flag"  # override beats env and file
    assert loaded["timeout"] == 2.5  # env beats file; a None override is "not given"
    assert loaded["max_in_flight_messages"] == 250
    assert loaded["url"] == "kafka://file:9092"  # only the file names it
    assert loaded["acks"] == "1" and loaded["linger_ms"] == 5  # options merge key by key


def test_config_from_env_variable_and_cwd(
    config_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert settings.load(environ={"PRODUCERKIT_CONFIG": str(config_file)})["topic"] == "from-file"
    monkeypatch.chdir(tmp_path)  # ./producerkit.toml is found without being named
    assert settings.load(environ={})["topic"] == "from-file"
    monkeypatch.chdir(tmp_path.parent)
    assert settings.load(environ={}, require_url=False) == {}


def test_result_builds_a_producer(config_file: Path) -> None:
    loaded = settings.load(config_file, environ={}, url="memory://", linger_ms=None)
    loaded.pop("linger_ms")
    loaded.pop("acks")  # kafka options; memory:// would reject them
    producer = pk.Producer(**loaded)
    assert producer.topic == "from-file"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("urll = 'x'", "unknown setting 'urll'"),
        ("timeout = 'soon'", "timeout = 'soon' must be a float"),
        ("max_in_flight_messages = true", "must be a int"),
        ("options = 3", "[options] must be a table"),
        ("url = ", "invalid TOML"),
    ],
)
def test_bad_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(pk.ConfigurationError, match=message.replace("[", r"\[")):
        settings.load(path, environ={})


def test_bad_env_and_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(pk.ConfigurationError, match="PRODUCERKIT_TIMEOUT='soon'"):
        settings.load(environ={"PRODUCERKIT_TIMEOUT": "soon", "PRODUCERKIT_URL": "null://"})
    with pytest.raises(pk.ConfigurationError, match="no producer URL"):
        settings.load(environ={})
    with pytest.raises(pk.ConfigurationError, match="does not exist"):
        settings.load(environ={"PRODUCERKIT_CONFIG": "/nonexistent/producerkit.toml"})
