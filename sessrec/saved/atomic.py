"""Files written under a temporary name, fsynced and renamed into place: readers never see half a file,
and a crash or a power loss leaves the old file or the new one.

A temporary entry is named for its host and process (`stage_name`), so that the next write into the same place
removes one that a killed process left behind (`remove_abandoned`).

`lock_folder` gives a folder to one writing process at a time (a run folder, an output's parts); `new_folders`
creates the folders a write needs and removes them again when it fails.

`ParquetFile` gives an object that is one table its parquet file, on disk and in a state dict; `digest`
and `fingerprint` name a file's or a table's content.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def reached_path(path: str | os.PathLike) -> Path:
    """`path`, absolute, as the file system reaches it once the missing folders on its way are created: its
    folder's symbolic links and ``..`` resolved (``new/../data`` is ``data``, whether ``new`` exists or not), its
    last name kept as given. Every check of a path a command writes (exists, is the input, is a dataset) is of this
    one, never of the text given, which ``..`` after a missing folder makes name no file yet."""
    given = Path(path).absolute()
    return Path(os.path.realpath(given.parent)) / given.name


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a written file's data to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory's entries (a rename, a new or removed file) to the disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError:  # some file systems do not fsync directories; their renames are as durable as they get
        pass
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every file and directory under `root` (itself included), files first."""
    root = Path(root)
    for folder, dirs, files in os.walk(root, topdown=False):
        for name in files:
            fsync_file(Path(folder) / name)
        fsync_dir(folder)


def current_umask() -> int:
    """The process's umask (read from /proc where it can be, else set and restored at once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def normal_modes(root: str | os.PathLike) -> None:
    """Give `root` and everything under it the mode a plain ``open`` or ``mkdir`` would (0644 and 0755
    under umask 022), whatever a writer chose: safetensors and temporary folders write 0600 / 0700,
    which a server running as another user cannot read."""
    mask = current_umask()
    root = Path(root)
    if root.is_file():
        root.chmod(0o666 & ~mask)
        return
    for folder, _, files in os.walk(root):
        Path(folder).chmod(0o777 & ~mask)
        for name in files:
            (Path(folder) / name).chmod(0o666 & ~mask)


def stage_name(prefix: str) -> str:
    """`prefix`, this host and this process: ``<prefix><host>-<pid>``, the name of a temporary file or folder (a
    writer may add ``-<anything>``) that `remove_abandoned` removes once its process is gone."""
    return f"{prefix}{socket.gethostname()}-{os.getpid()}"


def remove_abandoned(folder: str | os.PathLike, prefix: str) -> None:
    """Remove the temporary files and folders of `folder` named by `stage_name` with `prefix` whose process was
    killed (SIGKILL, a crash) before it could remove them: this host's, whose process is gone. Another host's,
    or a live process's, are left alone."""
    start = f"{prefix}{socket.gethostname()}-"
    for entry in Path(folder).glob(glob.escape(start) + "*"):
        pid = entry.name[len(start):].partition("-")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)  # signal 0: is the process there
        except ProcessLookupError:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        except PermissionError:  # there, another user's
            continue


def lock_folder(folder: str | os.PathLike, busy: str) -> int:
    """Create `folder` (with the folders above it) and lock it: an exclusive ``flock`` of the folder itself, held
    until the descriptor returned is closed or the process ends (killed or not). Refused with RuntimeError `busy`
    (one line) while another process holds it. A folder that its holder removed meanwhile is locked where it is now."""
    folder = Path(folder)
    while True:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(busy) from None
        try:
            if os.path.samestat(os.fstat(fd), os.stat(folder)):
                return fd
        except FileNotFoundError:  # removed by the process that held it
            pass
        os.close(fd)


@contextmanager
def new_folders(folder: str | os.PathLike) -> Iterator[Path]:
    """Create `folder` and the folders above it that are missing; when the block raises, remove again those it
    created (innermost first; one that is not empty, where another writer put something meanwhile, is left), so
    that a failed write leaves no empty folders behind."""
    folder = Path(folder)
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    except BaseException:
        remove_created(missing)
        raise


def remove_created(folders: list[Path]) -> None:
    """Remove the empty `folders`, innermost first, stopping at one that is not empty (where another writer put
    something meanwhile) or already gone."""
    for created in folders:
        try:
            created.rmdir()
        except OSError:
            break


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success give it the umask's mode (`normal_modes`), fsync
    it and rename it to `path`; on failure remove it. A temporary path of `path` that a killed writer left
    is removed first (`remove_abandoned`).

    Examples:
        >>> with atomic_path("out.parquet") as tmp:  # doctest: +SKIP
        ...     pq.write_table(table, tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(path.parent, f".{path.name}.tmp-")
    tmp = path.with_name(stage_name(f".{path.name}.tmp-"))
    try:
        yield tmp
        normal_modes(tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)  # only still there when writing failed


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Replace `path` by `text` atomically and durably."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def digest(path: str | os.PathLike) -> str:
    """``sha256:<hex>`` of a file's bytes (what a saved directory records of each of its parts)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return f"sha256:{h.hexdigest()}"


def fingerprint(table: pa.Table) -> str:
    """``sha256:<hex>`` of a table's content (schema, values and row order), whatever file holds it."""
    h = hashlib.sha256(table.schema.remove_metadata().to_string().encode())
    for batch in table.combine_chunks().to_batches():
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema.remove_metadata()) as writer:
            writer.write_batch(batch.replace_schema_metadata(None))
        h.update(sink.getvalue().to_pybytes())
    return f"sha256:{h.hexdigest()}"


class ParquetFile:
    """Mixin of an object that is one table (`to_table` / `from_table`): `save` and `load` it as a
    parquet file (written atomically), `state_dict` / `load_state_dict` the same file in memory
    (what a checkpoint carries), and `fingerprint` its content."""

    STATE_KEY = "parquet"  # the one entry of the state dict: the bytes of the parquet file

    def to_table(self) -> pa.Table:
        raise NotImplementedError

    @classmethod
    def from_table(cls, table: pa.Table, source: str | os.PathLike) -> Any:
        """The object `table` holds; `source` names it in errors."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """``sha256:<hex>`` of the content: equal for equal objects, different when any row moves."""
        return fingerprint(self.to_table())

    def save(self, path: str | os.PathLike) -> Path:
        with atomic_path(path) as tmp:
            pq.write_table(self.to_table(), tmp)
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Any:
        try:
            table = pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as err:
            if not Path(path).exists():
                raise FileNotFoundError(f"{path}: no such file") from None
            raise ValueError(f"{path}: not a readable parquet file, truncated or corrupt ({err})") from None
        return cls.from_table(table, path)

    def state_dict(self) -> dict[str, np.ndarray]:
        """``{"parquet": uint8 array}``: the bytes of the file `save` writes."""
        sink = pa.BufferOutputStream()
        pq.write_table(self.to_table(), sink)
        return {self.STATE_KEY: np.frombuffer(sink.getvalue().to_pybytes(), dtype=np.uint8).copy()}

    def load_state_dict(self, state: Mapping[str, Any], source: str = "the state dict") -> Any:
        """Take the content of a `state_dict` (its ``parquet`` bytes as a uint8 array or tensor); returns self.

        `source` names the state in errors.
        """
        if not isinstance(state, Mapping) or self.STATE_KEY not in state:
            found = sorted(map(str, state)) if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"{source}: expected a state dict with the key {self.STATE_KEY!r}, got {found}")
        data = np.asarray(state[self.STATE_KEY])
        if data.dtype != np.uint8 or data.ndim != 1:
            raise ValueError(f"{source}: {self.STATE_KEY!r} must be the file's bytes (uint8, 1-d), got {data.dtype} {data.shape}")
        try:
            table = pq.read_table(pa.BufferReader(data.tobytes()))
        except (pa.ArrowInvalid, OSError) as err:
            raise ValueError(f"{source}: not a readable parquet file, truncated or corrupt ({err})") from None
        self.__dict__.update(type(self).from_table(table, source).__dict__)
        return self
