import os
from pathlib import Path

import pytest

from storage.config import ConfigError, ModelPathError, load_config, resolve_model_path


def test_defaults_put_everything_under_data_in_the_working_directory(tmp_path):
    config = load_config(env={}, cwd=tmp_path)
    assert config.data_dir == tmp_path / "data"
    assert config.model_roots == [tmp_path / "data" / "models"]
    assert (config.address, config.port) == ("127.0.0.1", 8501)
    assert config.db_path == tmp_path / "data" / "drainboard.db"


def test_the_config_file_is_read_and_the_environment_wins(tmp_path):
    (tmp_path / "drainboard.toml").write_text(
        'data_dir = "state"\nmodel_roots = ["m1", "/abs/m2"]\nport = 9000\naddress = "0.0.0.0"\n'
    )
    config = load_config(env={}, cwd=tmp_path)
    assert config.data_dir == tmp_path / "state"
    assert config.model_roots == [tmp_path / "m1", Path("/abs/m2")]
    assert (config.address, config.port) == ("0.0.0.0", 9000)
    env = {"DRAINBOARD_DATA": "other", "DRAINBOARD_MODEL_ROOTS": os.pathsep.join(["a", "b"]), "DRAINBOARD_PORT": "7000"}
    config = load_config(env=env, cwd=tmp_path)
    assert config.data_dir == tmp_path / "other"
    assert config.model_roots == [tmp_path / "a", tmp_path / "b"]
    assert config.port == 7000


def test_drainboard_config_names_the_file_to_read(tmp_path):
    file = tmp_path / "elsewhere.toml"
    file.write_text('data_dir = "/srv/db"\n')
    assert str(load_config(env={"DRAINBOARD_CONFIG": str(file)}, cwd=tmp_path).data_dir) == "/srv/db"


@pytest.mark.parametrize(
    "content, message",
    [("colour = 1\n", "unknown keys 'colour'"), ('"a\\u001b[2J\\nb" = 1\n', r"unknown keys 'a\\x1b\[2J\\nb';"),
     ("model_roots = 'x'\n", "model_roots must be a list"),
     ("port = 'web'\n", "port must be an integer"), ("data_dir = [\n", "not valid TOML")],
)
def test_a_bad_config_file_is_refused_naming_the_problem(tmp_path, content, message):
    (tmp_path / "drainboard.toml").write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_config(env={}, cwd=tmp_path)


def test_a_model_path_must_lie_under_a_root_after_resolving_links(tmp_path):
    root, outside = tmp_path / "models", tmp_path / "secret"
    (root / "ok").mkdir(parents=True)
    outside.mkdir()
    (root / "sneaky").symlink_to(outside)
    assert resolve_model_path(root / "ok", [root]) == root / "ok"
    with pytest.raises(ModelPathError, match="outside the model roots"):
        resolve_model_path(root / "sneaky", [root])
    with pytest.raises(ModelPathError, match="outside the model roots"):
        resolve_model_path(root / ".." / "secret", [root])
    with pytest.raises(ModelPathError, match="does not exist"):
        resolve_model_path(root / "missing", [root])


def test_the_hugging_face_cache_is_a_model_root_when_it_exists_unless_turned_off(tmp_path):
    hub = tmp_path / "hf" / "hub"
    env = {"HF_HOME": str(tmp_path / "hf")}
    assert load_config(env=env, cwd=tmp_path).hub_cache is None  # not there yet: no root
    hub.mkdir(parents=True)
    config = load_config(env=env, cwd=tmp_path)
    assert config.hub_cache == hub and config.model_roots == [tmp_path / "data" / "models", hub]
    off = load_config(env={**env, "DRAINBOARD_HUB_CACHE": "off"}, cwd=tmp_path)
    assert off.hub_cache is None and off.model_roots == [tmp_path / "data" / "models"]
    (tmp_path / "drainboard.toml").write_text("hub_cache = false\n")
    assert load_config(env=env, cwd=tmp_path).model_roots == [tmp_path / "data" / "models"]
    assert load_config(env={**env, "DRAINBOARD_HUB_CACHE": "on"}, cwd=tmp_path).hub_cache == hub
    (tmp_path / "drainboard.toml").write_text('hub_cache = "sometimes"\n')
    with pytest.raises(ConfigError, match="hub_cache must be true or false"):
        load_config(env=env, cwd=tmp_path)
    (tmp_path / "drainboard.toml").unlink()
    with pytest.raises(ConfigError, match="DRAINBOARD_HUB_CACHE must be on or off, got 'maybe'"):
        load_config(env={**env, "DRAINBOARD_HUB_CACHE": "maybe"}, cwd=tmp_path)


def test_a_file_in_a_hub_snapshot_keeps_its_name_and_a_refusal_names_the_root_that_would_hold_it(tmp_path):
    from tests.hub_layout import hub_snapshot

    source = tmp_path / "dit.safetensors"
    source.write_bytes(b"x" * 16)
    snapshot = hub_snapshot(source, tmp_path / "hub")
    hub = tmp_path / "hub"
    assert resolve_model_path(snapshot / "dit.safetensors", [hub]) == snapshot / "dit.safetensors"
    assert resolve_model_path(snapshot, [hub]) == snapshot
    with pytest.raises(ModelPathError) as refused:
        resolve_model_path(snapshot, [tmp_path / "models"])
    message = str(refused.value)
    assert f"a root holding it: {hub}." in message and "DRAINBOARD_MODEL_ROOTS" in message
