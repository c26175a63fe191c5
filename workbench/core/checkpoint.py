"""Atomic file writes and checkpoints that never need a pickle to load."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from workbench.core.errors import UserError, disk_error


def is_temporary(name: str) -> bool:
    """Whether the file or folder ``name`` is what an interrupted `atomic_path` or `atomic_folder` left behind (a
    hidden ``.NAME.<random>.tmp...`` file, ``.NAME.tmp-<random>`` or ``.NAME.old-<pid>`` folder): never content."""
    return name.startswith(".") and any(mark in name for mark in (".tmp", ".old-"))


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` in one rename.

    The temporary name ends with ``path``'s suffixes, for writers that choose a format from them. A full disk, a
    read-only file system or a missing permission, when the folder or file is created, written or renamed, is a
    `workbench.core.errors.DiskError` naming ``path`` (``path`` is then left as it was).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{''.join(path.suffixes)}"
        )
    except OSError as error:
        problem = disk_error(error, path)
        if problem is None:
            raise
        raise problem from None
    os.close(handle)
    try:
        yield Path(temporary)
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
        os.replace(temporary, path)
    except Exception as error:
        problem = disk_error(error, path)
        if problem is None:
            raise
        raise problem from None
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


class atomic_folder:
    """``with atomic_folder(out, overwrite) as work:`` — write into ``work`` beside ``out``, moved in at the end (a
    full disk, a read-only file system or a missing permission: a `workbench.core.errors.DiskError` naming ``out``)."""

    def __init__(self, out_dir: str | Path, overwrite: bool):
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not overwrite:
            raise UserError(f"{self.out_dir}: already exists; pass overwrite=True to replace it")

    def __enter__(self) -> Path:
        try:
            self.out_dir.parent.mkdir(parents=True, exist_ok=True)
            self.work = Path(tempfile.mkdtemp(dir=self.out_dir.parent, prefix=f".{self.out_dir.name}.tmp-"))
        except OSError as error:
            problem = disk_error(error, self.out_dir)
            if problem is None:
                raise
            raise problem from None
        return self.work

    def __exit__(self, exc_type, exc, traceback) -> None:
        try:
            if exc_type is None:
                old = None
                if self.out_dir.exists():
                    old = self.out_dir.with_name(f".{self.out_dir.name}.old-{os.getpid()}")
                    os.replace(self.out_dir, old)
                os.replace(self.work, self.out_dir)
                if old is not None:
                    shutil.rmtree(old)
        except OSError as error:
            problem = disk_error(error, self.out_dir)
            if problem is None:
                raise
            raise problem from None
        finally:
            if self.work.exists():
                shutil.rmtree(self.work)
        problem = disk_error(exc, self.out_dir) if isinstance(exc, Exception) else None
        if problem is not None:  # what the block wrote into the folder did not fit (or was refused)
            raise problem from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as temporary:
        temporary.write_text(text)


def write_json(path: str | Path, content: Any) -> None:
    write_text(path, json.dumps(content, indent=2, sort_keys=False) + "\n")


def save_tensors(
    path: str | Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> None:
    """Write tensors as safetensors, atomically."""
    with atomic_path(path) as temporary:
        save_file(
            {k: v.detach().contiguous().cpu() for k, v in tensors.items()},
            str(temporary),
            metadata=dict(metadata or {}),
        )


def load_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file; a missing or corrupt file is a `UserError` naming it."""
    return _read_safetensors(path, load_file)


def _read_safetensors(path: str | Path, read):
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        return read(str(path))
    except Exception as error:  # safetensors raises several kinds for a damaged header or body
        raise UserError(
            f"{path}: not a readable safetensors file ({error}); the file is damaged or of another format"
        ) from None


def read_metadata(path: str | Path) -> dict[str, str]:
    """The string metadata of a safetensors file (what wrote it, with which configuration)."""

    def read(name: str) -> dict[str, str]:
        with safe_open(name, framework="pt") as handle:
            return dict(handle.metadata() or {})

    return _read_safetensors(path, read)


def save_checkpoint(path: str | Path, state: Mapping[str, Any]) -> None:
    """Write a training checkpoint (tensors, numbers, strings, lists, dicts) atomically (a full disk: a
    `workbench.core.errors.DiskError` naming ``path``)."""
    with atomic_path(path) as temporary, open(temporary, "wb") as stream:
        writer = _RecordingWriter(stream)
        try:
            torch.save(dict(state), writer)
        except RuntimeError as error:  # torch's writer reports a failed write without its reason: give the reason
            if writer.error is None:
                raise
            raise writer.error from error


class _RecordingWriter:
    """A binary file for `torch.save` that keeps the first `OSError` of its writes (torch replaces it with its own
    RuntimeError that no longer says "no space left on device")."""

    def __init__(self, stream: Any):
        self.stream, self.error = stream, None

    def write(self, data: Any) -> int:
        try:
            return self.stream.write(data)
        except OSError as error:
            self.error = self.error or error
            raise

    def flush(self) -> None:
        self.stream.flush()


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by `save_checkpoint` with ``weights_only=True`` (no arbitrary code)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise UserError(
            f"{path}: damaged training checkpoint ({error}); delete it to start that method afresh"
        ) from None


def check_state_fits(
    expected: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor], source: str | Path, what: str
) -> None:
    """Every tensor of ``expected`` is in ``state`` with the same shape, and nothing else is.

    The message counts the matches and names the first mismatches (a state that loads "0 of 99" tensors
    is an error here, never a silent partial load).
    """
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise UserError(
            f"{source}: {what} ({len(expected) - len(missing)} of {len(expected)} tensors matched; "
            f"missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    for name, value in state.items():
        if expected[name].shape != value.shape:
            raise UserError(
                f"{source}: tensor '{name}': expected shape {tuple(expected[name].shape)}, found {tuple(value.shape)}"
            )


def check_architecture(
    source: str | Path, architecture: Mapping[str, Any], sizes: Mapping[str, Any], keys: Sequence[str]
) -> None:
    """A loaded checkpoint fits the sizes the data fixes: every one of ``keys`` given in ``sizes`` equals the
    architecture's (a `UserError` naming each that does not)."""
    wrong = {k: (sizes[k], architecture[k]) for k in keys if k in sizes and architecture[k] != sizes[k]}
    if wrong:
        found = ", ".join(f"{k} {have} (the data needs {need})" for k, (need, have) in wrong.items())
        raise UserError(f"{source}: the model has {found}")


def read_json_object(path: str | Path, expected: str) -> dict[str, Any]:
    """The JSON object in ``path``; anything else (not UTF-8, not JSON, a list) is a `UserError` naming the file
    and ``expected`` (what the object should hold, in words)."""
    try:
        content = json.loads(Path(path).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"{path}: expected {expected}: not JSON ({error})") from None
    if not isinstance(content, dict):
        raise UserError(f"{path}: expected {expected}, found a JSON {type(content).__name__}")
    return content


def saved_model_files(path: str | Path) -> list[Path]:
    """The two files of a model saved by `save_model`: the weights and the architecture beside them."""
    return [Path(path), Path(path).with_suffix(".json")]


def save_model(model: torch.nn.Module, path: str | Path, kind: str) -> None:
    """Weights to ``path`` (.safetensors, metadata ``model: kind``) and ``model.architecture`` to the ``.json``
    beside it: what `load_model` needs to rebuild the model without a pickle. A model that carries adapters
    (modules wrapping a ``base_layer``, the convention every adapter layer here follows) is a `UserError`: its
    architecture does not describe them."""
    adapted = [name for name, module in model.named_modules() if hasattr(module, "base_layer")]
    if adapted:
        raise UserError(
            f"this {kind} model carries adapters ({', '.join(adapted[:3])}); merge them first (the adapting method's "
            "merge) and save the result"
        )
    path = Path(path)
    save_tensors(path, {k: v.detach().cpu() for k, v in model.state_dict().items()}, metadata={"model": kind})
    write_json(path.with_suffix(".json"), model.architecture)


def load_model(
    path: str | Path, build: Callable[[dict[str, Any]], torch.nn.Module], what: str, expected: str
) -> torch.nn.Module:
    """A model saved by `save_model`: ``build(architecture)``, then its weights, checked tensor by tensor.

    Args:
        path: the ``.safetensors`` file (its ``.json`` architecture beside it).
        build: architecture dict → the untrained model; any error there means an architecture it cannot build (the
            file is the user's), reported as a `UserError` naming the ``.json``.
        what: the checkpoint's kind in messages ("a classifier checkpoint").
        expected: the architecture's expected fields in messages (``{'in_features': int, ...}``).
    """
    path = Path(path)
    architecture_path = path.with_suffix(".json")
    if path.suffix != ".safetensors" or not path.is_file() or not architecture_path.is_file():
        raise UserError(f"{path}: expected {what} (.safetensors with its .json architecture beside it)")
    state = load_tensors(path)  # first: a damaged file is refused before any model is built
    architecture = read_json_object(architecture_path, expected)
    try:
        model = build(architecture)
    except UserError as error:
        raise UserError(f"{architecture_path}: {error}") from None
    except Exception as error:  # a field of another type or value fails somewhere in the builder
        raise UserError(f"{architecture_path}: expected {expected} ({type(error).__name__}: {error})") from None
    check_state_fits(model.state_dict(), state, path, "checkpoint does not fit its architecture")
    model.load_state_dict(state)
    return model
