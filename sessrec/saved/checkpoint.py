"""Reading Lightning checkpoints safely: ``torch.load(weights_only=True)`` and one clear line on failure.

A checkpoint's bytes are checked against the CRC-32 its zip archive records for each entry before it is read:
``torch.load`` does not check them, and a changed byte in a tensor would be read as a weight.

A checkpoint written by sessrec holds only tensors and plain values: the task's
hyper-parameters are configs (``class_path``/``init_args``), and the data module's state (the
state dicts of the vocabulary and of the fitted side-feature transforms, restored when `fit`
resumes) sits under the data module's class name. Nothing in it is unpickled as an object, so a
checkpoint from elsewhere cannot run code when it is read.
"""

from __future__ import annotations

import functools
import os
import pickle
import re
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint at `path`, read with ``weights_only=True``; a one-line error for anything else."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: a directory, not a checkpoint file (a model directory loads with from_pretrained)")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such checkpoint")
    damaged = _damaged_entry(path)
    if damaged is not None:
        raise ValueError(f"{path}: not a readable PyTorch checkpoint, truncated or corrupt ({damaged})")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        if found:  # torch's own message goes on to advise weights_only=False: the one thing not to do here
            raise ValueError(
                f"{path}: holds a pickled {found.group(1)} object, which sessrec does not load (a checkpoint is read as "
                "tensors and plain values only, so it cannot run code); re-save it with this sessrec version"
            ) from None
        raise ValueError(f"{path}: not a readable PyTorch checkpoint, truncated or corrupt") from None
    except Exception as err:  # noqa: BLE001 - torch's unpickler raises anything on bytes that are not a checkpoint
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{path}: not a readable PyTorch checkpoint, truncated or corrupt ({first})") from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ValueError(f"{path}: a PyTorch file but not a Lightning checkpoint (no 'state_dict')")
    return checkpoint


def _damaged_entry(path: Path) -> str | None:
    """What is damaged in a checkpoint of torch's zip format: an entry whose bytes fail the CRC-32 the archive
    records (a changed byte in a tensor, which ``torch.load`` reads as a weight without a check) or an archive that
    cannot be read; None for an intact one, or a file of another format (``torch.load`` judges it)."""
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            name = archive.testzip()  # reads every entry and checks its CRC-32
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as err:
        return f"its zip archive: {str(err).strip() or type(err).__name__}"
    return None if name is None else f"its entry {name} fails its CRC-32 check"


def checkpoint_summary(path: str | os.PathLike) -> dict[str, Any]:
    """What a checkpoint says of itself, without its weights and loop state: ``hyper_parameters``,
    ``sessrec`` (the task's class and format), the ``epoch`` and ``global_step`` it was saved at, and
    ``epochs_done``: the epochs its fit finished (`epochs_done`; None without the fit loop's state).

    Kept for the file as it is now (path, size, modification time): the command line asks for it
    several times, and a checkpoint is read once for them all.
    """
    path = Path(path)
    stat = path.stat() if path.is_file() else None
    return _summary(str(path.resolve()), stat.st_size if stat else -1, stat.st_mtime_ns if stat else -1)


@functools.lru_cache(maxsize=4)
def _summary(path: str, size: int, mtime_ns: int) -> dict[str, Any]:
    checkpoint = read_checkpoint(path)
    return {"hyper_parameters": checkpoint.get("hyper_parameters") or {}, "sessrec": checkpoint.get("sessrec") or {},
            "epoch": checkpoint.get("epoch"), "global_step": checkpoint.get("global_step"),
            "epochs_done": epochs_done(checkpoint)}


def epochs_done(checkpoint: dict[str, Any]) -> int | None:
    """The epochs a checkpoint's fit finished, as Lightning's fit loop counts them when it resumes (and stops at
    ``max_epochs``): its ``processed`` epochs (raised before the epoch-end hooks that save checkpoints), and one
    more when it was saved after the last batch of an epoch not yet processed; None without the loop's state."""
    loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
    epochs = (loop.get("epoch_progress") or {}).get("current")
    if not epochs:
        return None
    ended = (loop.get("epoch_loop.batch_progress") or {}).get("is_last_batch") and epochs["processed"] < epochs["started"]
    return int(epochs["processed"]) + int(bool(ended))


def as_tensors(state: Any) -> Any:
    """A state dict with every numpy array as a tensor (what a weights-only checkpoint holds); dicts
    and lists recurse, plain values stay."""
    if isinstance(state, np.ndarray):
        return torch.from_numpy(np.require(state, requirements=["C", "W"]))
    if isinstance(state, dict):
        return {k: as_tensors(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [as_tensors(v) for v in state]
    return state


def as_arrays(state: Any) -> Any:
    """A state dict with every tensor as a numpy array (the inverse of `as_tensors`)."""
    if isinstance(state, torch.Tensor):
        return state.detach().cpu().numpy()
    if isinstance(state, dict):
        return {k: as_arrays(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [as_arrays(v) for v in state]
    return state
