"""Checkpoint discovery: find the components and shards of a checkpoint and
describe every tensor from the safetensors headers alone.

Accepted layouts:

- a model folder: `modular_model_index.json` (diffusers' modular pipelines,
  entries `[library, class, {"subfolder": ..., "type_hint": ...}]`) or
  `model_index.json` (entries `[library, class]`), one folder per entry.
  Folders with safetensors files are weight components (diffusers'
  `diffusion_pytorch_model*.safetensors`, transformers'
  `model-0000i-of-0000n.safetensors`, each with its index); the others
  (tokenizer, processor, scheduler, ...) are listed as non-weight folders;
- a component folder (sharded `*.safetensors` with a `*.safetensors.index.json`,
  or one or more files);
- one `.safetensors` file.

Every file opened (index files, configs, shards, component folders) must
resolve under a model root first (`roots.ModelRoots`), and every JSON is
parsed with bounds (`jsonfile`). Nothing here reads a tensor byte: shard
headers are `safetensors_file`'s, what is found is described by `metadata`'s
dataclasses, `validate.validate_checkpoint` checks it, and
`discover_checkpoint` raises one CheckpointError listing every problem
(`checkpoint_problems` returns them instead). `checked_checkpoint` remembers a
discovery by the files' identity (path, size, mtime_ns, inode), so a page
that asks again on every rerun parses a large header once.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

from .confined import check_name, read_json_checked
from core.echo import NAME_LIMIT, echo, echo_name
from core.errors import CheckpointError, DrainboardError, first_of
from .metadata import AuxFolder, CheckpointIndex, ComponentMeta
from .roots import ModelRoots, RootEscape, RootsArg
from .safetensors_file import HeaderBudget, read_shard_header
from .validate import validate_checkpoint

MODEL_INDEX_FILES = ("modular_model_index.json", "model_index.json")
"""Model-index file names, in the order diffusers looks for them."""


def _read_json(path: Path, roots: ModelRoots, entry: str, problems: list[str]) -> object | None:
    """The parsed file (opened confined to `roots`), or None with a problem naming it (never its contents)."""
    try:
        return read_json_checked(path, roots, entry)
    except RootEscape:
        raise
    except CheckpointError as exc:
        problems.extend(exc.messages())
    except OSError as exc:
        problems.append(f"{entry}: cannot read: {exc.strerror}")
    return None


def _listing(folder: Path, pattern: str, name: str) -> list[Path]:
    """`folder`'s entries matching `pattern`, sorted; a folder that cannot be listed is one CheckpointError."""
    try:
        if not os.access(folder, os.R_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
        return sorted(folder.glob(pattern))
    except OSError as exc:
        raise CheckpointError(f"{name}: cannot list the folder {echo_name(folder)}: {exc.strerror}") from None


def _has_weights(folder: Path, name: str) -> bool:
    return bool(_listing(folder, "*.safetensors", name) or _listing(folder, "*.safetensors.index.json", name))


def _discover_component(name: str, folder: Path, roots: ModelRoots, budget: HeaderBudget,
                        entries: bool = True) -> ComponentMeta:
    """Config, index and shard headers of one folder; every file opened confined to `roots`."""
    label = echo_name(name)
    roots.check(folder, f"component {echo(name, NAME_LIMIT)} folder {echo_name(folder)}")
    component = ComponentMeta(name=name, path=folder)
    indexes = _listing(folder, "*.safetensors.index.json", f"component {echo(name, NAME_LIMIT)}")
    config_path = folder / "config.json"
    if os.path.lexists(config_path):
        config = _read_json(config_path, roots, f"{label}/config.json", component.problems)
        component.config = config if isinstance(config, dict) else {}
    if len(indexes) > 1:
        component.problems.append(
            f"{echo_name(folder)}: several index files ({', '.join(echo_name(p.name) for p in indexes[:5])}"
            f"{', ...' if len(indexes) > 5 else ''}); keep one"
        )
        return component
    if indexes:
        shard_paths = _index_shards(component, indexes[0], roots)
    else:
        shard_paths = [roots.check(p, f"{label}/{echo_name(p.name)}") for p in _listing(folder, "*.safetensors", label)]
        if not shard_paths:
            component.problems.append(f"{echo_name(folder)}: no *.safetensors files")
    for path in shard_paths:
        shard, problems = read_shard_header(path, roots, budget, entries=entries)
        component.problems.extend(problems)
        if shard is not None:
            component.shards.append(shard)
    return component


def _index_shards(component: ComponentMeta, index_path: Path, roots: ModelRoots) -> list[Path]:
    """Read the index's weight_map into `component`; the shard files it names (checked against `roots`).

    Linear in the index's entries: tensors are grouped by file once, not searched per file.
    """
    folder = component.path
    component.index_file = index_path
    index_label = f"{echo_name(component.name)}/{echo_name(index_path.name)}"
    index = _read_json(index_path, roots, index_label, component.problems)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if index is not None and not (
        isinstance(weight_map, dict) and all(isinstance(v, str) for v in weight_map.values())
    ):
        component.problems.append(f"{echo_name(index_path.name)}: expected an object with a weight_map of name -> file")
        return []
    if weight_map is None:
        return []
    component.weight_map = dict(weight_map)
    by_file: dict[str, list[str]] = {}
    for tensor, file in weight_map.items():
        by_file.setdefault(file, []).append(tensor)
    shard_paths, problems = [], []
    for file in sorted(by_file):
        tensors = by_file[file]
        named = echo(min(tensors), NAME_LIMIT) + (f" (and {len(tensors) - 1} more)" if len(tensors) > 1 else "")
        where = f"{index_label} maps {named} to {echo(file, NAME_LIMIT)}"
        try:
            check_name(file, where)
            path = roots.check(folder / file, f"{where}, which")
            present = os.path.lexists(path)
        except RootEscape:
            raise
        except CheckpointError as exc:
            problems.extend(exc.messages())
            continue
        except (OSError, ValueError) as exc:
            problems.append(f"{where}, which cannot be looked up: {exc}")
            continue
        if present:
            shard_paths.append(path)
        else:
            problems.append(f"{echo_name(index_path.name)} maps {named} to {echo(file, NAME_LIMIT)}, which is not in "
                            f"{echo_name(folder)}")
    component.problems.extend(problems)
    return shard_paths


def _index_entry(name: str, value: object) -> tuple[str, str | None, str | None] | None:
    """(subfolder, library, class) of one model-index entry, or None for a config value.

    `model_index.json` entries are `[library, class]`; `modular_model_index.json`
    entries are `[library, class, spec]` where `spec` may name a `subfolder` and a
    `type_hint` `[library, class]` (used when the first two are null).
    """
    if not isinstance(value, list) or len(value) not in (2, 3):
        return None
    library, class_name = (v if isinstance(v, str) else None for v in value[:2])
    subfolder = name
    if len(value) == 3:
        spec = value[2]
        if not isinstance(spec, dict):
            return None
        hint = spec.get("type_hint")
        if (library is None or class_name is None) and isinstance(hint, list) and len(hint) == 2:
            library = library or (hint[0] if isinstance(hint[0], str) else None)
            class_name = class_name or (hint[1] if isinstance(hint[1], str) else None)
        if isinstance(spec.get("subfolder"), str) and spec["subfolder"]:
            subfolder = spec["subfolder"]
    return subfolder, library, class_name


def _discover_model(root: Path, index_path: Path, roots: ModelRoots, budget: HeaderBudget,
                    entries: bool = True) -> CheckpointIndex:
    """A model folder: every entry of its model index, as a weight component or a non-weight folder."""
    problems: list[str] = []
    model_index = _read_json(index_path, roots, index_path.name, problems)
    if problems:
        raise CheckpointError(problems)
    if not isinstance(model_index, dict):
        raise CheckpointError(f"{index_path}: expected a JSON object")
    pipeline_class = model_index.get("_class_name")
    index = CheckpointIndex(
        root, "model", {}, index_file=index_path,
        pipeline_class=pipeline_class if isinstance(pipeline_class, str) else None,
    )
    for name in sorted(model_index):
        entry = _index_entry(name, model_index[name]) if not name.startswith("_") else None
        if entry is None:
            continue
        subfolder, library, class_name = entry
        where = f"{echo_name(index_path.name)} entry {echo(name, NAME_LIMIT)}" + (
            f" (subfolder {echo(subfolder, NAME_LIMIT)})" if subfolder != name else "")
        check_name(name, where)
        check_name(subfolder, where)
        folder = roots.check(root / subfolder, where)
        if not folder.is_dir():
            index.absent.append(name)
        elif _has_weights(folder, where):
            component = _discover_component(name, folder, roots, budget, entries)
            component.library, component.declared_class = library, class_name
            index.components[name] = component
        else:
            files = tuple(p.name for p in _listing(folder, "*", where))
            index.aux[name] = AuxFolder(name, folder, library, class_name, files)
    if not index.components:
        raise CheckpointError(f"{echo_name(root)}: {index_path.name} lists no component folder with *.safetensors files")
    return index


def discover_checkpoint(
    path: str | os.PathLike, *, validate: bool = True, roots: RootsArg = None, entries: bool = True
) -> CheckpointIndex:
    """Describe the checkpoint at `path` from headers only.

    `roots`: folders every file opened must resolve under, links resolved
    (default: the checkpoint's own root, i.e. `path` itself, or a lone file's
    folder); an escape raises CheckpointError naming the entry whatever
    `validate` says. With `validate` (the default) every problem found by
    reading and by `validate_checkpoint` is raised as one CheckpointError.
    Without `entries`, each shard's header is only summed per dtype (`read_shard_header(entries=False)`):
    a listing's description, never validated, never loaded.
    """
    root = Path(path)
    if not root.exists():
        raise CheckpointError(f"{root}: no such file or directory")
    confined = ModelRoots.for_checkpoint(root, roots)
    confined.check(root, str(root))
    budget = HeaderBudget()
    if not root.is_dir():
        if not root.name.endswith(".safetensors"):
            raise CheckpointError(f"{root}: expected a .safetensors file, a component folder or a model folder")
        component = ComponentMeta(name=root.name.removesuffix(".safetensors"), path=root)
        shard, problems = read_shard_header(root, confined, budget, entries=entries)
        component.problems.extend(problems)
        if shard is not None:
            component.shards.append(shard)
        index = CheckpointIndex(root, "file", {component.name: component})
    else:
        _listing(root, "*", str(root))  # an unreadable folder is one line, not a traceback further down
        index_path = next((root / n for n in MODEL_INDEX_FILES if os.path.lexists(root / n)), None)
        if index_path is not None:
            index = _discover_model(root, index_path, confined, budget, entries)
        else:
            component = _discover_component(root.name, root, confined, budget, entries)
            index = CheckpointIndex(root, "component", {root.name: component})
    if validate and entries:
        problems = validate_checkpoint(index)
        if problems:
            raise CheckpointError(problems)
    return index


def checkpoint_problems(path: str | Path, roots: RootsArg) -> tuple[CheckpointIndex | None, list[str]]:
    """(what discovery found, the problems that keep it from loading), bounded ("and N more").

    The one check every submitter runs before a job is queued (the Run page,
    `jobs submit`): discovery confined to `roots`, then `validate_checkpoint`,
    remembered by the files' identity (`checked_checkpoint`). The index is None
    when discovery itself failed.
    """
    index, problems = checked_checkpoint(path, roots)
    return index, first_of(list(problems)) if index is not None else list(problems)


IDENTITY_ENTRIES = 4096
"""Files and folders a checkpoint's identity stats at most; a larger tree is discovered anew every time."""
CHECKED_KEPT = 4
"""Checkpoints whose discovery is remembered (the most recently asked; an index of 200,000 tensors holds
about 150 MB)."""
SETTLED_NS = 2 * 10**9
"""How old (by mtime) the newest file must be before the tree has an identity (before anything is remembered)."""
_checked: OrderedDict[tuple, tuple[tuple, CheckpointIndex | None, tuple[str, ...]]] = OrderedDict()
_checked_lock = threading.Lock()


def checkpoint_identity(path: str | os.PathLike) -> tuple | None:
    """(name, size, mtime_ns, inode) of `path` and of every entry under it, links followed, three levels down
    (a model folder, its component folders, their shards and configs): equal identities, equal discoveries.
    None when the tree holds more than `IDENTITY_ENTRIES` entries, cannot be listed, or changed in the last
    `SETTLED_NS` (a file written again within the clock's granularity, a few milliseconds, could keep its size
    and mtime: a tree that fresh is not to be remembered yet)."""
    found: list[tuple] = []
    folders = [(Path(path), 0)]
    try:
        while folders:
            folder, depth = folders.pop()
            st = folder.stat()
            found.append((str(folder), st.st_size, st.st_mtime_ns, st.st_ino))
            if depth < 3 and folder.is_dir():
                folders.extend((entry, depth + 1) for entry in sorted(folder.iterdir()))
            if len(found) > IDENTITY_ENTRIES:
                return None
    except OSError:
        return None
    if time.time_ns() - max(entry[2] for entry in found) <= SETTLED_NS:
        return None
    return tuple(found)


def checked_checkpoint(path: str | os.PathLike, roots: RootsArg) -> tuple[CheckpointIndex | None, tuple[str, ...]]:
    """(what discovery found, every problem `validate_checkpoint` finds in it), or (None, why discovery failed).

    Remembered for the last `CHECKED_KEPT` checkpoints by their files' identity (`checkpoint_identity`), so
    asking again about files that did not change costs a few `stat`s: a page rerun, a submit check and a
    forecast of one checkpoint of 200,000 tensors parse its 18 MB header once. A checkpoint whose shards lie
    outside its own folder is not remembered (its identity would not cover them), nor one without an identity
    (changed in the last `SETTLED_NS`). The index is shared between callers: read it, never change it.
    """
    key = (str(path), None if roots is None else tuple(str(r) for r in roots))
    identity = checkpoint_identity(path)
    with _checked_lock:
        kept = _checked.get(key)
        if kept is not None and identity is not None and kept[0] == identity:
            _checked.move_to_end(key)
            return kept[1], kept[2]
    try:
        index = discover_checkpoint(path, validate=False, roots=roots)
    except DrainboardError as exc:
        index, problems = None, tuple(exc.messages())
    else:
        problems = tuple(validate_checkpoint(index))
    if identity is not None and (index is None or _shards_inside(index, Path(path))):
        with _checked_lock:
            _checked[key] = (identity, index, problems)
            _checked.move_to_end(key)
            while len(_checked) > CHECKED_KEPT:
                _checked.popitem(last=False)
    return index, problems


def _shards_inside(index: CheckpointIndex, path: Path) -> bool:
    """Whether every shard the index names lies in the tree `checkpoint_identity` covers (by the names as
    given: a link in the tree is followed by the identity's `stat`s, wherever it points)."""
    def plain(p: Path) -> Path:
        return Path(os.path.normpath(p.absolute()))

    top = plain(path if path.is_dir() else path.parent)
    return all(plain(shard.path).is_relative_to(top)
               for component in index.components.values() for shard in component.shards)
