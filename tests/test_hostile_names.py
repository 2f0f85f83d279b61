"""Names read from a file reach a terminal only quoted (`core.echo`): a checkpoint whose tensor, shard,
component, class and config-key names hold terminal escapes and newlines, through every command that
prints them (`python -m loader inspect/load/forecast/models`, `python -m jobs submit/show/list`, a failed job's
error), prints no control character and no forged line."""

from __future__ import annotations

import json
import math
import struct
import time
from pathlib import Path

import pytest

from jobs.supervisor import Supervisor
from storage.queries import get_job
from storage.schema import FINAL_STATUSES

REPO = Path(__file__).resolve().parents[1]
HOSTILE = '\x1b]0;pwned\x07\x1b[2J\u202e\nFORGED-LINE @drainboard ["exit",0]\n'
"""Retitles the terminal, clears it, flips the text's direction and forges a line of its own."""


def _shard(path: Path, tensors: dict[str, tuple[str, list[int]]], data: int | None = None) -> None:
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = 4 * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset if data is None else data))


@pytest.fixture
def hostile_root(tmp_path: Path) -> Path:
    """A model root holding: `sound/` (a model folder whose component, class, config key and tensor names are
    hostile, and that loads), `broken/` (shards with hostile names, truncated, a duplicate, an unknown dtype)."""
    root = tmp_path / "models"
    model = root / "sound"
    component = model / f"comp{HOSTILE}".replace("/", "_")
    component.mkdir(parents=True)
    (model / "model_index.json").write_text(json.dumps({"_class_name": f"Pipe{HOSTILE}",
                                                        component.name: ["diffusers", f"Cls{HOSTILE}"]}))
    (component / "config.json").write_text(json.dumps({"_class_name": f"Cls{HOSTILE}", f"key{HOSTILE}": 1}))
    _shard(component / f"weights{HOSTILE}.safetensors", {f"blocks.0{HOSTILE}.weight": ("F32", [2, 2]),
                                                         "ok.weight": ("F32", [1])})
    broken = root / "broken"
    broken.mkdir()
    _shard(broken / f"a{HOSTILE}.safetensors", {f"t{HOSTILE}": ("F32", [2]), f"x{HOSTILE}": (f"Q{HOSTILE}", [1])}, 4)
    _shard(broken / f"b{HOSTILE}.safetensors", {f"t{HOSTILE}": ("F32", [2])})
    return root


def _clean(text: str, what: str) -> None:
    """No control character but newlines, no character that does not print, no forged line."""
    bad = sorted({c for c in text if (not c.isprintable() and c not in "\n\t")})
    assert not bad, f"{what} printed {bad!r}:\n{text[-3000:]}"
    assert not any(line.startswith(("FORGED-LINE", "@drainboard")) for line in text.splitlines()), text[-3000:]


def _run(capsys, args: list[str]) -> tuple[int, str, str]:
    """`python -m loader|jobs ARGS` in this process (the mains `__main__` calls); its exit code and output."""
    import jobs.cli
    import loader.cli

    main = {"loader": lambda argv: loader.cli.main(argv, builder_plugins=True), "jobs": jobs.cli.main}[args[0]]
    code = main(args[1:])
    out, err = capsys.readouterr()
    _clean(out + err, " ".join(args[:2]))
    return code, out, err


@pytest.mark.parametrize("command", [["loader", "inspect"], ["loader", "forecast"], ["loader", "load", "--skeleton"],
                                     ["loader", "load"]])
@pytest.mark.parametrize("checkpoint", ["sound", "broken"])
def test_the_loader_cli_quotes_every_name_it_prints(hostile_root, command, checkpoint, capsys):
    path = str(hostile_root / checkpoint)
    options = _component_option(hostile_root, checkpoint) if command[1] != "inspect" else []
    code, out, err = _run(capsys, [*command, path, *options])
    if checkpoint == "broken":
        assert code == 2 and err.count("\n") == 1, err  # one line
        assert "a\\x1b]0;pwned\\x07\\x1b[2J\\u202e\\nFORGED-LINE" in err
    else:
        assert code == 0, err
        assert "\\x1b]0;pwned" in out or command[1] != "inspect", out  # the class name, quoted
        json.loads(_run(capsys, [*command, path, *options, "--json"])[1])


def test_the_loader_cli_lists_hostile_models_quoted(hostile_root, capsys):
    folder = hostile_root / f"model{HOSTILE}"
    folder.mkdir()
    _shard(folder / f"w{HOSTILE}.safetensors", {f"t{HOSTILE}": ("F32", [2])})
    code, out, err = _run(capsys, ["loader", "models", str(hostile_root), "--no-hub-cache"])
    assert code == 0 and "'model\\x1b]0;pwned" in out, out


def _component_option(root: Path, checkpoint: str) -> list[str]:
    if checkpoint != "sound":
        return []
    [component] = [p.name for p in (root / "sound").iterdir() if p.is_dir()]
    return ["--component", component]


def test_a_jobs_error_list_and_show_quote_every_name(hostile_root, tmp_path, monkeypatch, capsys):
    """A load job on the hostile checkpoint whose shard is truncated after submit: its error names the
    shard and the tensor, and `jobs submit/show/list` print them quoted."""
    monkeypatch.setenv("DRAINBOARD_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("DRAINBOARD_MODEL_ROOTS", str(hostile_root))
    monkeypatch.delenv("DRAINBOARD_CONFIG", raising=False)
    component = hostile_root / "job"
    component.mkdir()
    shard = component / f"weights{HOSTILE}.safetensors"
    _shard(shard, {f"blocks.0{HOSTILE}.weight": ("F32", [2, 2]), f"blocks.1{HOSTILE}.weight": ("F32", [64])})
    code, out, err = _run(capsys, ["jobs", "submit", "load", "--model", str(component), "--skeleton"])
    assert code == 0, err
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 8)
    from storage.config import load_config
    from storage.schema import open_database

    config = load_config()
    db = open_database(config.db_path)
    sup = Supervisor(config, start_method="spawn")
    sup.start()
    try:
        deadline = time.time() + 240
        while get_job(db, 1)["status"] not in FINAL_STATUSES:
            assert time.time() < deadline
            sup.tick()
            time.sleep(0.05)
    finally:
        sup.stop()
    job = get_job(db, 1)
    assert job["status"] == "failed" and "\\x1b]0;pwned" in job["error"], job["error"]
    _clean(job["error"], "the job's error")
    for args in (["jobs", "show", "1"], ["jobs", "list"]):
        assert _run(capsys, args)[0] == 0
