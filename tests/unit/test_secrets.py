"""Secret config keys from the environment, a file or a systemd credential; the check's audit.

* ``K_env``/``K_file``/``K_credential`` resolve into ``K``; exactly one form;
  every failure is a ConfigError naming the dotted key of the form.
* Inside ``deferred()`` an unreadable source is recorded, not raised.
* A provider key variable that is not set is read from the credential of the same name.
* The audit warns about an inline secret in a file others can read, a readable
  secret file and directories with loose modes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from brisvox.config.audit import dir_warnings, secret_warnings
from brisvox.config.daemon import parse_config
from brisvox.config.errors import ConfigError
from brisvox.config.secrets import UNRESOLVED, credential, deferred, resolve_secrets
from brisvox.providers.registry import ProviderDef, resolve_key

KEYS = ("native_secret", "twilio_auth_token")


def ws(table: dict, env: dict | None = None) -> dict:
    return resolve_secrets(table, "websocket", KEYS, env=env or {})


def test_inline_and_absent_pass_through():
    assert ws({"native_secret": "s", "port": 1}) == {"native_secret": "s", "port": 1}
    assert ws({}) == {}


def test_env_form(monkeypatch):
    assert ws({"native_secret_env": "NS"}, {"NS": " abc \n"}) == {"native_secret": "abc"}
    with pytest.raises(ConfigError) as ei:
        ws({"native_secret_env": "NS"})
    assert ei.value.key == "websocket.native_secret_env" and "NS is not set" in ei.value.message
    with pytest.raises(ConfigError) as ei:
        ws({"twilio_auth_token_env": "T"}, {"T": "  "})
    assert ei.value.key == "websocket.twilio_auth_token_env" and "empty" in ei.value.message
    with pytest.raises(ConfigError, match="name of an environment variable"):
        ws({"native_secret_env": ""})
    # through the real [websocket] parser
    monkeypatch.setenv("BV_TEST_NS", "from-env")
    cfg = parse_config({"websocket": {"native_secret_env": "BV_TEST_NS"}})
    assert cfg.section("websocket").native_secret == "from-env"


def test_file_form(tmp_path):
    f = tmp_path / "secret"
    f.write_text("tok\n")
    f.chmod(0o600)
    assert ws({"native_secret_file": str(f)}) == {"native_secret": "tok"}
    with pytest.raises(ConfigError) as ei:
        ws({"native_secret_file": "relative/path"})
    assert ei.value.key == "websocket.native_secret_file" and "absolute" in ei.value.message
    with pytest.raises(ConfigError) as ei:
        ws({"native_secret_file": str(tmp_path / "missing")})
    assert "cannot read" in ei.value.message and "missing" in ei.value.message
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        ws({"native_secret_file": str(tmp_path / "empty")})


def test_credential_form(tmp_path):
    (tmp_path / "twilio").write_text("abc")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path)}
    assert ws({"twilio_auth_token_credential": "twilio"}, env) == {"twilio_auth_token": "abc"}
    with pytest.raises(ConfigError) as ei:
        ws({"twilio_auth_token_credential": "twilio"})
    assert "$CREDENTIALS_DIRECTORY is not set" in ei.value.message and "LoadCredential=" in ei.value.message
    with pytest.raises(ConfigError, match="no '/'"):
        ws({"twilio_auth_token_credential": "../etc/passwd"}, env)
    with pytest.raises(ConfigError, match="cannot read"):
        ws({"twilio_auth_token_credential": "other"}, env)


def test_exactly_one_form():
    with pytest.raises(ConfigError) as ei:
        ws({"native_secret": "x", "native_secret_env": "A"}, {"A": "y"})
    assert ei.value.key == "websocket.native_secret_env" and "only one of" in ei.value.message
    with pytest.raises(ConfigError) as ei:
        ws({"native_secret_env": "A", "native_secret_file": "/x"}, {"A": "y"})
    assert ei.value.key == "websocket.native_secret_file"
    # an empty inline value means "not set": it may stay next to another form
    assert ws({"native_secret": "", "native_secret_env": "A"}, {"A": "y"}) == {"native_secret": "y"}


def test_unknown_form_is_still_an_unknown_key():
    with pytest.raises(ConfigError) as ei:
        parse_config({"websocket": {"native_secret_vault": "x"}})
    assert ei.value.key == "websocket.native_secret_vault"


def test_deferred_records_unreadable_sources_but_not_structural_errors():
    with deferred() as problems:
        out = ws({"native_secret_env": "NOPE", "twilio_auth_token_credential": "t"})
    assert out == {"native_secret": UNRESOLVED, "twilio_auth_token": UNRESOLVED}
    assert len(problems) == 2 and "NOPE is not set" in problems[0]
    with deferred(), pytest.raises(ConfigError):
        ws({"native_secret_file": "relative"})
    with pytest.raises(ConfigError):  # outside the block: strict again
        ws({"native_secret_env": "NOPE"})


def test_provider_key_from_a_credential(tmp_path):
    (tmp_path / "OPENAI_API_KEY").write_text("sk-test\n")
    leg = ProviderDef("openai")
    assert resolve_key(leg, {"CREDENTIALS_DIRECTORY": str(tmp_path)}) == "sk-test"
    assert resolve_key(leg, {"OPENAI_API_KEY": "env-wins", "CREDENTIALS_DIRECTORY": str(tmp_path)}) == "env-wins"
    assert resolve_key(leg, {}) is None
    assert credential("MISSING", {"CREDENTIALS_DIRECTORY": str(tmp_path)}) is None
    assert credential("../x", {"CREDENTIALS_DIRECTORY": str(tmp_path)}) is None


def _config_file(tmp_path: Path, body: str, mode: int) -> Path:
    p = tmp_path / "brisvoxd.toml"
    p.write_text(body)
    p.chmod(mode)
    return p


def test_audit_inline_secret_in_a_readable_file(tmp_path):
    p = _config_file(tmp_path, '[websocket]\nnative_secret = "s3cret"\ntwilio_auth_token = ""\n', 0o644)
    lines = secret_warnings(p)
    assert len(lines) == 1 and "websocket.native_secret is inline" in lines[0] and "0644" in lines[0]
    assert "s3cret" not in lines[0]
    p.chmod(0o600)
    assert secret_warnings(p) == []
    f = tmp_path / "tok"
    f.write_text("x")
    f.chmod(0o640)
    p = _config_file(tmp_path, f'[websocket]\ntwilio_auth_token_file = "{f}"\n', 0o644)
    lines = secret_warnings(p)
    assert len(lines) == 1 and "twilio_auth_token_file" in lines[0] and "0640" in lines[0]


def test_audit_loose_directories(tmp_path):
    run, state = tmp_path / "run", tmp_path / "state"
    run.mkdir(mode=0o700)
    state.mkdir()
    os.chmod(state, 0o755)
    (state / "calls").mkdir()
    os.chmod(state / "calls", 0o750)
    cfg = parse_config({"daemon": {"runtime_dir": str(run), "state_dir": str(state)}})
    lines = dir_warnings(cfg)
    assert [line.split(":")[0] for line in lines] == ["daemon.state_dir", "calls.path"]
    assert "0755" in lines[0] and f"chmod go= {state}" in lines[0]
    os.chmod(state, 0o700)
    os.chmod(state / "calls", 0o700)
    os.chmod(run, 0o770)
    assert [line.split(":")[0] for line in dir_warnings(cfg)] == ["daemon.runtime_dir"]
