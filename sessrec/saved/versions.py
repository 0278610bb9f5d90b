"""Versioned directories: every save an immutable version, one atomic pointer to the current one.

A model or pipeline directory ``D`` that has been saved into more than once, or promoted into by
``sessrec retrain``, looks like this::

    D/
      CURRENT            the current version's name, one line, replaced atomically
      versions/v000001/  one complete version: every part written and fsynced before it got its name
      versions/v000002/
      promotions.jsonl   the log: one JSON line per decision, fsynced before the pointer moves
      .lock              held (flock) by the one process that writes D

A reader calls `resolve(D)` and reads the directory it returns; a directory without ``CURRENT``
(written by `write_directory`'s first save) is read as it is. A writer
goes through `VersionedDirectory`: `add` writes a version under a staging name and renames it
into ``versions/`` only when every byte is on disk; `promote` appends the decision to the log,
then moves the pointer. A crash at any point therefore leaves the old version current or the new
one, never a mix: before the rename a staging folder that nobody reads; after it a complete
version that the pointer names or not; between the log and the pointer, a log that is one step
ahead, which `recover` (run by every writer before it writes) completes.

The promotion history (`VersionedDirectory.line`) is read from the log: every save and promotion
puts its version on top, every rollback takes versions off down to the one it makes current. A
rollback without a target therefore walks one step back each time (v3, v2, v1), and refuses in one
line at the first version; a promotion after rollbacks goes on from the version rolled back to, and
the versions rolled back from are out of the history (still reachable by ``rollback(to=...)`` while
they are kept). ``rollback(to=V)`` walks back to V when V is in the history, and otherwise puts V on
top, as a promotion would.

A **canary** (`VersionedDirectory.start_canary`) is another version that serves a share of the sessions
beside the current one: ``CANARY`` holds its name, share and the live version it runs beside (one JSON
line, replaced atomically) after the log records it. It ends at the next move of the pointer: a promotion
of the canary makes it current for every session; any other move (a save, another promotion, a rollback
with ``to``) drops it. A ``rollback()`` without a target while a canary runs drops the canary and leaves the
pointer where it is. The log says whether a canary runs (its last ``canary`` entry with no ``canary_end`` or
pointer move after it); `recover` brings ``CANARY`` in line with it after a crash, and `canary` ignores a
``CANARY`` whose live version is not the current one (the pointer moved and ``CANARY`` is not yet removed:
a promotion in progress, or one that crashed before removing it). `served_state` reads the current
version and its canary as one state, for a server that follows the directory.

Old versions are kept up to `keep`, and never the current one, the `keep` before it in the
promotion history (where a rollback walks) or the best promoted so far (the ``best`` the log names
last).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sessrec.saved.atomic import (
    fsync_dir,
    fsync_tree,
    new_folders,
    normal_modes,
    reached_path,
    remove_abandoned,
    stage_name,
    write_text,
)
from sessrec.saved.directory import DESCRIPTIONS, check_folder
from sessrec.saved.registry import check_integers

POINTER, VERSIONS, LOG, LOCK, CANARY = "CURRENT", "versions", "promotions.jsonl", ".lock", "CANARY"
_NAME = re.compile(r"^v(\d{6,})$")
_STAGING, _TRASH = ".staging-", ".trash-"
POINTER_EVENTS = ("save", "promote", "rollback")  # log entries that move the pointer
SAVED_MARKERS = (POINTER, *DESCRIPTIONS)  # what makes a folder a saved directory


def resolve(directory: str | os.PathLike) -> Path:
    """The directory to read now: the current version of a versioned directory, else `directory` itself."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such model directory")
    return _folder(directory, current_version(directory))


def served_state(directory: str | os.PathLike) -> tuple[Path, tuple[str, float] | None]:
    """The directory to read now (`resolve`) and the canary served beside it (`canary`), as one state: ``CANARY``
    read before ``CURRENT``, and ``CURRENT`` read once. A promotion moves the pointer, then removes ``CANARY``: a
    record read between the two names the old live version and is none, so the state read is the old one or the
    new one, never the new live version beside the old canary."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such model directory")
    record = _canary_record(directory)
    current = current_version(directory)
    return _folder(directory, current), _running(record, current)


def _folder(directory: Path, name: str | None) -> Path:
    """The folder of version `name` of `directory` (read from its pointer); `directory` itself when None."""
    if name is None:
        return directory
    pointer = directory / POINTER
    if not _NAME.match(name):
        raise ValueError(f"{pointer}: names version {name!r}, not a version of the form v000001")
    version = directory / VERSIONS / name
    if not version.is_dir():
        raise FileNotFoundError(f"{pointer}: names version {name}, which {directory / VERSIONS} does not hold")
    return version


def version_of(folder: str | os.PathLike) -> str | None:
    """The version a folder that `resolve` returned holds: its name when it is a version's folder
    (``runs/x/model/versions/v000003``, the current one or one given directly), else None (a directory
    without versions)."""
    folder = Path(folder)
    return folder.name if folder.parent.name == VERSIONS and _NAME.match(folder.name) else None


def current_version(directory: str | os.PathLike) -> str | None:
    """The current version's name, or None for a directory without versions."""
    pointer = Path(directory) / POINTER
    return pointer.read_text().strip() if pointer.exists() else None


def canary(directory: str | os.PathLike) -> tuple[str, float] | None:
    """The canary of a versioned directory (its version's name and the share of sessions it serves), or None
    when none runs (a ``CANARY`` recorded beside another live version than the current one, left by a promotion
    in progress or one that crashed before removing it, is none)."""
    record = _canary_record(Path(directory))
    return _running(record, current_version(directory))


def _canary_record(directory: Path) -> dict[str, Any] | None:
    """``CANARY`` of `directory`, checked, or None when there is none."""
    path = directory / CANARY
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as err:
        raise ValueError(f"{path}: not a canary record ({err}); run sessrec rollback to drop it") from None
    if not (isinstance(record, dict) and all(isinstance(record.get(key), str) and _NAME.match(record[key])
                                             for key in ("version", "live"))
            and isinstance(record.get("share"), float) and 0 < record["share"] < 1):
        raise ValueError(f"{path}: not a canary record ({str(record)[:80]}); run sessrec rollback to drop it")
    return record


def _running(record: dict[str, Any] | None, current: str | None) -> tuple[str, float] | None:
    """The canary a ``CANARY`` `record` names, when it runs beside the `current` version."""
    if record is None or record["live"] != current:
        return None
    return record["version"], record["share"]


def check_share(share: object) -> float:
    """`share` as a float strictly between 0 and 1 (a canary's share of the sessions); ValueError otherwise."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 1:
        raise ValueError(f"canary_share must be a fraction of the sessions strictly between 0 and 1, got {share!r}")
    return float(share)


def write_directory(directory: str | os.PathLike, write: Callable[[Path], Any], keep: int = 5) -> Path:
    """Save a new version of `directory` written by ``write(folder)`` and make it current; returns the
    folder that holds it (`resolve(directory)` from now on).

    The first save into a new or empty folder writes it in place (a plain directory, nothing to
    replace); every later save adds a version and moves the pointer (`VersionedDirectory.publish`).
    """
    directory = _reached(directory)
    if check_writable(directory):
        return _write_plain(directory, write)
    return VersionedDirectory(directory, keep=keep).publish(write)


def check_writable(directory: str | os.PathLike) -> bool:
    """Whether `write_directory` writes `directory` anew (True: it does not exist or is empty) or adds a version
    to a saved one (False); refused in one line, so that a command can check before any work: a file, a folder
    that holds something other than a saved model or pipeline, or a path under a file."""
    directory = _reached(directory)
    if not directory.exists() or (directory.is_dir() and not any(directory.iterdir())):
        above = next((p for p in directory.parents if p.exists()), None)
        if above is not None and not above.is_dir():
            raise NotADirectoryError(f"{directory}: {above} is a file, not a folder; save into a new or empty folder")
        return True
    if not directory.is_dir() or not any((directory / name).exists() for name in SAVED_MARKERS):
        raise FileExistsError(
            f"{directory}: exists and is not a saved model or pipeline directory; save into a new or empty folder"
        )
    return False


def _reached(directory: str | os.PathLike) -> Path:
    """`directory`, its ``..`` resolved where it has one (`reached_path`: ``new/../model`` is ``model`` whether
    ``new`` exists or not), else as given."""
    return reached_path(directory) if ".." in Path(directory).parts else Path(directory)


def _write_plain(directory: Path, write: Callable[[Path], Any]) -> Path:
    """Write a new directory under a temporary sibling name (``.<name>.tmp-<host>-<pid>-<random>``, `stage_name`),
    fsync it, rename it into place. A temporary folder of `directory` whose writer was killed on this host is
    removed first (`remove_abandoned`); a write that fails removes its own and the folders above `directory` it
    created (`new_folders`)."""
    prefix = f".{directory.name}.tmp-"
    with new_folders(directory.parent):
        remove_abandoned(directory.parent, prefix)
        staging = Path(tempfile.mkdtemp(prefix=f"{stage_name(prefix)}-", dir=directory.parent))
        _write_folder(staging, write, directory)
    return directory


def _write_folder(staging: Path, write: Callable[[Path], Any], target: Path) -> None:
    """``write(staging)``, then give it plain modes, fsync it and rename it to `target` (an empty folder
    there is replaced); `staging` is removed when any step fails."""
    try:
        write(staging)
        normal_modes(staging)  # mkdtemp's 0700 and safetensors' 0600 would make the model private to this user
        fsync_tree(staging)
        emptied = target.exists()
        if emptied:
            target.rmdir()  # empty (checked by the caller); a folder that filled meanwhile makes this fail
        try:
            os.replace(staging, target)
        except BaseException:
            if emptied:
                target.mkdir(exist_ok=True)  # the empty folder the caller gave, as it was
            raise
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


class VersionedDirectory:
    """The writer of a versioned directory (see the module docstring).

    Args:
        root: the directory (created when missing).
        keep: versions kept at least (the newest ones); the current one, the `keep` before it in
            the promotion history and the best promoted are kept besides.
    """

    def __init__(self, root: str | os.PathLike, keep: int = 5) -> None:
        check_integers({"keep": keep})
        self.root, self.keep = Path(root), keep
        self._lock_fd: int | None = None

    # -- reading --------------------------------------------------------------------------------
    def path(self, version: str) -> Path:
        return self.root / VERSIONS / version

    def versions(self) -> list[str]:
        """The complete versions, oldest first."""
        folder = self.root / VERSIONS
        names = [p.name for p in folder.iterdir() if p.is_dir() and _NAME.match(p.name)] if folder.is_dir() else []
        return sorted(names, key=lambda n: int(_NAME.match(n).group(1)))

    def current_version(self) -> str | None:
        return current_version(self.root)

    def check_saved(self) -> None:
        """Refuse in one line, before anything is written into it (its lock, its log), a folder that is not a
        saved model or pipeline directory: one that does not exist, a version folder or the ``versions``
        folder of a versioned directory (which name the directory to give instead), or any other folder
        without ``CURRENT``, ``config.json`` or ``pipeline.json``."""
        if not self.root.is_dir():
            raise FileNotFoundError(f"{self.root}: no such model directory")
        above = self.root.parent if self.root.name == VERSIONS else self.root.parent.parent
        if (self.root.name == VERSIONS or (_NAME.match(self.root.name) and self.root.parent.name == VERSIONS)) and (
                above / POINTER).exists():
            raise ValueError(f"{self.root}: a folder inside the versioned directory {above}, whose versions are never "
                             f"changed in place; give the directory itself: --model_dir {above}")
        if not any((self.root / marker).exists() for marker in SAVED_MARKERS):
            raise FileNotFoundError(f"{self.root}: not a saved model or pipeline directory (no "
                                    f"{', '.join(SAVED_MARKERS)})")

    def check_versioned(self, nothing: str) -> None:
        """`check_saved`, and refuse in one line, before its lock is taken, a directory saved once (no
        ``CURRENT``, no ``versions``, no log): ``{root}: holds one model and no versions (it was saved once):
        {nothing}``."""
        self.check_saved()
        if not any((self.root / name).exists() for name in (POINTER, VERSIONS, LOG)):
            raise ValueError(f"{self.root}: holds one model and no versions (it was saved once): {nothing}")

    def history(self) -> list[dict[str, Any]]:
        """The log's entries, oldest first (a last line cut short by a crash is left out)."""
        path = self.root / LOG
        if not path.exists():
            return []
        entries = []
        for number, line in enumerate(path.read_text().split("\n")[:-1], 1):  # text after the last newline is cut short
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: line {number} is not JSON ({err}); the log was edited by hand") from None
        return entries

    # -- writing --------------------------------------------------------------------------------
    @contextmanager
    def lock(self) -> Iterator[VersionedDirectory]:
        """Hold the directory's write lock (non-blocking: another writer holding it is an error)."""
        if self._lock_fd is not None:  # re-entered by this writer
            yield self
            return
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RuntimeError(
                f"{self.root}: another process (pid {holder}) is writing this model directory (a retrain, save "
                "or rollback); wait for it to finish"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd
        try:
            yield self
        finally:
            self._lock_fd = None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def add(self, write: Callable[[Path], Any]) -> str:
        """Write a new version with ``write(folder)``; returns its name. The pointer does not move."""
        with self.lock():
            self._adopt_plain()
            existing = [int(_NAME.match(n).group(1)) for n in self.versions()]
            name = f"v{max(existing, default=0) + 1:06d}"
            staging = self.root / f"{_STAGING}{name}-{os.getpid()}"
            staging.mkdir(mode=0o755)
            _write_folder(staging, write, self.path(name))
            return name

    def promote(self, version: str, record: dict[str, Any] | None = None, event: str = "promote") -> Path:
        """Log the move to `version` (fsynced), then point at it; returns its folder.

        A promotion or a rollback first checks the description of `version` and every part of it
        against the hashes the description records (`check_folder`), and refuses a version that
        fails in one line naming the file and both hashes; the pointer does not move then. A save
        (`publish`) has just written and hashed its parts.
        """
        if event not in POINTER_EVENTS:
            raise ValueError(f"event must be one of {POINTER_EVENTS}, got {event!r}")
        with self.lock():
            if version not in self.versions():
                raise FileNotFoundError(f"{self.root}: no complete version {version!r}; it holds {self.versions()}")
            previous = self.current_version()
            if previous is None and self._plain_files() and version != "v000001":
                previous = "v000001"  # the plain directory's model, adopted as the first version
            if event != "save":
                self._check(version, previous)
            running = self._canary_from_log()
            if running is not None:  # a move of the pointer ends the canary: promoted, or dropped
                record = {**(record or {}), "canary": running[0],
                          "canary_ended": "promoted" if running[0] == version else "dropped"}
            self.log({**(record or {}), "event": event, "version": version, "previous": previous})
            self._point(version)
            (self.root / CANARY).unlink(missing_ok=True)
            self._tidy()
            return self.path(version)

    def publish(self, write: Callable[[Path], Any], record: dict[str, Any] | None = None) -> Path:
        """`add` a version and make it current (a save); returns its folder."""
        with self.lock():
            self.recover()
            return self.promote(self.add(write), record, event="save")

    def log(self, record: dict[str, Any]) -> None:
        """Append one entry to the log, durably (a decision is never lost to a crash)."""
        entry = {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), **record}
        with self.lock():
            path = self.root / LOG
            with open(path, "a") as fh:
                fh.write(json.dumps(entry) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            fsync_dir(self.root)

    def recover(self) -> str | None:
        """Bring the directory in line with its log after a crash; returns the current version.

        Removes staging folders and deleted versions left by a crash, cuts a log line the crash cut
        short, and moves the pointer to the version of the log's last pointer move when it lags.
        """
        with self.lock():
            for leftover in self.root.iterdir():
                if leftover.name.startswith((_STAGING, _TRASH)):
                    shutil.rmtree(leftover, ignore_errors=True)
            log = self.root / LOG
            if log.exists():
                data = log.read_bytes()
                if data and not data.endswith(b"\n"):
                    with open(log, "r+b") as fh:
                        fh.truncate(data.rfind(b"\n") + 1)
                        os.fsync(fh.fileno())
            moves = [e for e in self.history() if e.get("event") in POINTER_EVENTS]
            if moves and moves[-1]["version"] != self.current_version() and moves[-1]["version"] in self.versions():
                self._point(moves[-1]["version"])
            running = self._canary_from_log()
            if running is None:
                (self.root / CANARY).unlink(missing_ok=True)
            elif canary(self.root) != running:
                self._write_canary(*running, self.current_version())
            if self.current_version() is not None:
                self._remove_adopted()
            return self.current_version()

    def line(self) -> list[str]:
        """The promotion history, oldest first, its last entry the current version: the versions made
        current by saves and promotions, less those that rollbacks walked back from (module docstring)."""
        line: list[str] = []
        for entry in self.history():
            if entry.get("event") not in POINTER_EVENTS:
                continue
            version, previous = entry.get("version"), entry.get("previous")
            if not line and previous is not None:
                line.append(previous)  # the plain directory's model, adopted as the first version
            if entry["event"] == "rollback" and version in line:
                del line[len(line) - line[::-1].index(version):]
            elif not line or line[-1] != version:
                line.append(version)
        return line

    def promoted_canary(self, version: str) -> bool:
        """Whether `version` is current because it was promoted from a canary (``sessrec promote`` of the canary) and
        nothing moved the pointer or started a canary since: a server restarted with the ``--canary`` flags it
        was started with finds its canary answering every session."""
        if self.current_version() != version:
            return False
        last = next((e for e in reversed(self.history()) if e.get("event") in (*POINTER_EVENTS, "canary")), None)
        return (last is not None and last.get("event") in POINTER_EVENTS and last.get("version") == version
                and last.get("canary") == version and last.get("canary_ended") == "promoted")

    def start_canary(self, version: str, share: float) -> bool:
        """Serve `version` to `share` of the sessions beside the current version (logged, then ``CANARY``
        written); False when that canary already runs (nothing written, and the lock not taken: another writer may
        hold it).

        Refused in one line: a directory without versions, a version it does not hold or that fails its
        hashes, the current version, a share outside (0, 1), and another canary running (end it first).
        """
        share = check_share(share)
        self.check_saved()
        if canary(self.root) == (version, share) == self._canary_from_log():
            return False  # a server restarted with its flags: nothing to write, so no lock to wait for (a retrain holds
            # it for hours, and the server would not start meanwhile); the record and the log agree that it runs
        if not any((self.root / name).exists() for name in (POINTER, VERSIONS, LOG)):
            raise ValueError(f"{self.root}: has no versions (no {POINTER}); a canary is another version of a "
                             "versioned model directory")
        with self.lock():
            current = self.recover()
            if current is None:
                raise ValueError(f"{self.root}: has no versions (no {POINTER}); a canary is another version of a "
                                 "versioned model directory")
            if version not in self.versions():
                raise ValueError(f"{self.root}: no version {version!r} to serve as a canary; it holds {self.versions()}")
            if version == current:
                raise ValueError(f"{self.root}: {version} is the current version; a canary is another version, served "
                                 "beside it")
            running = self._canary_from_log()
            if running == (version, share):
                return False
            if running is not None and running[0] != version:
                raise ValueError(f"{self.root}: canary {running[0]} is running; end it first (sessrec promote, or "
                                 "sessrec rollback to drop it)")
            self._check(version, current)
            self.log({"event": "canary", "version": version, "share": share, "live": current})
            self._write_canary(version, share, current)
            return True

    def rollback(self, to: str | None = None) -> str:
        """Make `to` current again (default: the version before the current one in the promotion
        history, `line`); returns its name. While a canary runs, a rollback without `to` drops the
        canary and the pointer stays (returns the current version)."""
        self.check_versioned("nothing to roll back to")
        with self.lock():
            current = self.recover()
            running = self._canary_from_log()
            if running is not None and to is None:
                self.log({"event": "canary_end", "version": running[0], "canary_ended": "dropped", "live": current})
                (self.root / CANARY).unlink(missing_ok=True)
                fsync_dir(self.root)
                return current
            if current is None:
                raise ValueError(f"{self.root}: holds one model and no versions (it was saved once): nothing to roll back to")
            if to is None:
                to = self._step_back(current)
            if to not in self.versions():
                raise ValueError(f"{self.root}: no version {to!r}; it holds {self.versions()}")
            if to == current:
                raise ValueError(f"{self.root}: {to} is already the current version")
            self.promote(to, {"reason": f"rollback from {current}"}, event="rollback")
            return to

    # -- internals --------------------------------------------------------------------------------
    def _canary_from_log(self) -> tuple[str, float] | None:
        """The canary the log says runs: its last ``canary`` entry, unless a ``canary_end`` or a pointer move follows."""
        running = None
        for entry in self.history():
            if entry.get("event") == "canary":
                running = (entry["version"], float(entry["share"]))
            elif entry.get("event") == "canary_end" or entry.get("event") in POINTER_EVENTS:
                running = None
        return running

    def _write_canary(self, version: str, share: float, live: str) -> None:
        write_text(self.root / CANARY, json.dumps({"version": version, "share": share, "live": live}) + "\n")

    def _step_back(self, current: str) -> str:
        """The version before `current` in the promotion history; one line when there is none to go to."""
        line = self.line()
        if not line or line[-1] != current:
            raise ValueError(f"{self.root}: the promotion history in {LOG} does not end at the current version "
                             f"{current}; give --to VERSION")
        if len(line) == 1:
            raise ValueError(f"{self.root}: {current} is the first version of its promotion history: there is no "
                             "version before it to roll back to")
        if line[-2] not in self.versions():
            raise ValueError(f"{self.root}: the version before {current} in the promotion history, {line[-2]}, was "
                             f"deleted when old versions were pruned; give --to one of {self.versions()}")
        return line[-2]

    def _check(self, version: str, current: str | None) -> None:
        """Refuse to make `version` current when its description or a part fails its hash (`check_folder`)."""
        try:
            check_folder(self.path(version))
        except (ValueError, OSError) as err:
            stays = f"{current} stays current" if current else "the current model stays as it is"
            raise type(err)(f"{err}; {version} is not made current, {stays}") from None

    def _point(self, version: str) -> None:
        write_text(self.root / POINTER, version + "\n")

    def _plain_files(self) -> list[Path]:
        """The files of a plain (unversioned) directory's one model, at the top of `root`."""
        reserved = {POINTER, VERSIONS, LOG, LOCK, CANARY}
        return [p for p in self.root.iterdir()
                if p.name not in reserved and not p.name.startswith((_STAGING, _TRASH)) and p.is_file()]

    def _adopt_plain(self) -> None:
        """Before the first version of a plain directory: its files become version v000001 (linked,
        not moved, so the plain directory stays readable until the pointer exists)."""
        if self.current_version() is not None or self.versions() or not self._plain_files():
            (self.root / VERSIONS).mkdir(exist_ok=True)
            return
        (self.root / VERSIONS).mkdir(exist_ok=True)
        staging = self.root / f"{_STAGING}v000001-{os.getpid()}"
        staging.mkdir(mode=0o755)
        for path in self._plain_files():
            try:
                os.link(path, staging / path.name)
            except OSError:
                shutil.copy2(path, staging / path.name)
        fsync_tree(staging)
        os.replace(staging, self.path("v000001"))
        fsync_dir(self.root / VERSIONS)
        self.log({"event": "adopt", "version": "v000001", "reason": "the plain directory's model, kept as a version"})

    def _remove_adopted(self) -> None:
        """Once a pointer exists, the plain files it replaced (kept in v000001) go."""
        adopted = self.path("v000001")
        for path in self._plain_files():
            if (adopted / path.name).exists():
                path.unlink()

    def _tidy(self) -> None:
        self._remove_adopted()
        names = self.versions()
        history = self.history()
        keep = set(names[-self.keep :]) | {self.current_version()} | set(self.line()[-self.keep - 1 :])
        running = self._canary_from_log()
        if running is not None:
            keep.add(running[0])
        best = [e["best"] for e in history if e.get("best")]
        if best:
            keep.add(best[-1])
        for name in names:
            if name not in keep:
                trash = self.root / f"{_TRASH}{name}"
                os.replace(self.path(name), trash)  # out of versions/ in one step, then deleted
                shutil.rmtree(trash, ignore_errors=True)
