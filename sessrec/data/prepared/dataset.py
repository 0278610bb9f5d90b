"""A prepared dataset: the sessions of a source, split, in parquet parts, with its vocabulary and a manifest.

Layout of a prepared directory::

    manifest.json                 format, version, the source's config, the settings, each split's files
                                  and counts, the sha256 of every file, and its own content hash
    train/part-00000.parquet ...  session tables (the columns of `SessionSplits`' tables, raw item ids);
    valid/part-*.parquet          the parts of a split, concatenated in file order, are the split, sessions
    test/part-*.parquet           in session-id order; each part holds `Layout.part_sessions` sessions (the
                                  last fewer; an empty split one empty part), in row groups of
                                  `Layout.row_group_sessions`
    vocab.parquet                 `ItemVocab.save` of the vocabulary fitted on the training split

`PreparedWriter` writes one into a temporary directory and renames it into place; `PreparedSource` reads
one (the manifest checked against its own content hash, every file against the manifest's hash first) and
is a `SessionSource` like any other. It parses each split's parts and the vocabulary from the bytes it
checks against the manifest's hash, so a dataset replaced while it is read (``sessrec prepare --overwrite``
meanwhile) is refused in one line rather than read as the new files under the old manifest.
Side-feature transforms are not part of it: they depend on the data module's side-feature settings,
and the data module fits them on the training split as it does for every source.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sessrec.data import frame
from sessrec.data.columns import no_such
from sessrec.data.sources import SessionSource, SessionSplits
from sessrec.data.vocab import ItemVocab
from sessrec.saved.atomic import (
    fsync_dir,
    fsync_tree,
    normal_modes,
    reached_path,
    remove_abandoned,
    stage_name,
)
from sessrec.saved.directory import HASH, content_hash

FORMAT = "sessrec-prepared"
VERSION = 2
SPLITS = ("train", "valid", "test")
MANIFEST = "manifest.json"
VOCAB = "vocab.parquet"


@dataclass(frozen=True)
class Layout:
    """How a prepared dataset cuts its splits into files.

    Args:
        part_sessions: sessions in each part file of a split (the last part holds the rest).
        row_group_sessions: sessions in each parquet row group (what a streaming reader reads at a time).
    """

    part_sessions: int = 1_000_000
    row_group_sessions: int = 65_536

    def __post_init__(self) -> None:
        if self.part_sessions < 1 or self.row_group_sessions < 1:
            raise ValueError(f"part_sessions and row_group_sessions must be >= 1, got {self.part_sessions}, "
                             f"{self.row_group_sessions}")

    def parts(self, sessions: int) -> int:
        """Number of part files of a split of `sessions` sessions (an empty split has one, empty)."""
        return max(1, -(-sessions // self.part_sessions))


def part_name(split: str, index: int) -> str:
    """The path of a part file relative to the dataset's directory."""
    return f"{split}/part-{index:05d}.parquet"


def sha256_of(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class PartWritten:
    """What writing one part file gave: its name, its counts and its hash."""

    name: str
    sessions: int
    events: int
    sha256: str


def write_part(table: pa.Table, directory: Path, split: str, index: int, layout: Layout) -> PartWritten:
    """Write part `index` of `split` under `directory` (the temporary directory of a `PreparedWriter`)."""
    name = part_name(split, index)
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    table = table.combine_chunks()
    # zstd without dictionaries: against parquet's defaults (snappy, dictionaries), a third smaller, and
    # faster to write and to read (list columns of a million distinct items make large dictionaries)
    pq.write_table(table, path, row_group_size=layout.row_group_sessions, compression="zstd", use_dictionary=False)
    events = int(frame.session_lengths(table).sum()) if table.num_rows else 0
    return PartWritten(name, table.num_rows, events, sha256_of(path))


class PreparedWriter:
    """Writes a prepared dataset into a temporary directory beside `out`, renamed to `out` by `finish`.

    Args:
        out: the dataset's directory; it must not exist unless `overwrite`.
        layout: how splits are cut into files.
        overwrite: replace an existing dataset at `out` (only once the new one is complete).
        inputs: the files the preparation reads: an `out` holding one is not replaced.
    """

    def __init__(self, out: str | os.PathLike, layout: Layout = Layout(), overwrite: bool = False,
                 inputs: Sequence[str | os.PathLike] = ()) -> None:
        self.out, self.layout, self.overwrite = reached_path(out), layout, overwrite  # `new/../data` is `data`
        if self.out.exists() and not self.out.is_dir():
            raise FileExistsError(f"{self.out}: is a file, not a folder; choose another --out")
        if self.out.exists() and not overwrite:
            raise FileExistsError(f"{self.out}: exists; remove it, choose another --out, or pass --overwrite true")
        if self.out.exists() and not (self.out / MANIFEST).is_file():  # never replace the folder of something else
            raise FileExistsError(f"{self.out}: exists and is not a prepared dataset (no {MANIFEST}); --overwrite "
                                  "replaces a prepared dataset only: choose another --out")
        for read in inputs:  # a source file inside the dataset would go with the dataset it replaces
            file = Path(os.path.realpath(read))
            if self.out.exists() and overwrite and (file == self.out or self.out in file.parents):
                raise ValueError(f"{self.out}: holds {file}, a file the preparation reads, which replacing the dataset "
                                 "would delete; move the file out of it or choose another --out")
        for left in (".tmp-", ".old-"):  # what a preparation killed on this host left beside `out`
            remove_abandoned(self.out.parent, f".{self.out.name}{left}")
        self.tmp = self.out.with_name(stage_name(f".{self.out.name}.tmp-"))
        self.made = [p for p in reversed(self.out.absolute().parents) if not p.exists()]  # removed by `abort`
        shutil.rmtree(self.tmp, ignore_errors=True)
        try:
            self.tmp.mkdir(parents=True)
        except OSError as err:
            raise PermissionError(f"--out {out}: cannot write there ({err.strerror or err}: "
                                  f"{err.filename or self.tmp})") from None
        self.parts: dict[str, list[PartWritten]] = {split: [] for split in SPLITS}

    @property
    def directory(self) -> Path:
        """Where the parts are written until `finish` (a task may write parts here itself: `write_part`)."""
        return self.tmp

    def add(self, split: str, written: PartWritten) -> None:
        self.parts[split].append(written)

    def write_split(self, split: str, table: pa.Table) -> None:
        """Cut a whole split into its parts and write them."""
        for k in range(self.layout.parts(table.num_rows)):
            chunk = table.slice(k * self.layout.part_sessions, self.layout.part_sessions)
            self.add(split, write_part(chunk, self.tmp, split, k, self.layout))

    def finish(self, vocab: ItemVocab, source: dict[str, Any], settings: dict[str, Any]) -> Path:
        """Write the vocabulary and the manifest, then rename the directory into place."""
        vocab.save(self.tmp / VOCAB)
        hashes = {VOCAB: sha256_of(self.tmp / VOCAB)}
        splits = {}
        for split in SPLITS:
            parts = sorted(self.parts[split], key=lambda p: p.name)
            if [p.name for p in parts] != [part_name(split, k) for k in range(len(parts))] or not parts:
                raise RuntimeError(f"{self.out}: the {split} split's parts are not complete: {[p.name for p in parts]}")
            splits[split] = {"files": [p.name for p in parts], "sessions": sum(p.sessions for p in parts),
                             "events": sum(p.events for p in parts)}
            hashes.update({p.name: p.sha256 for p in parts})
        manifest = {"format": FORMAT, "version": VERSION, "source": source,
                    "settings": {**asdict(self.layout), **settings}, "splits": splits, "sha256": hashes}
        manifest = json.loads(json.dumps(manifest))  # plain JSON values, as read back, before hashing
        manifest[HASH] = content_hash(manifest)
        (self.tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        normal_modes(self.tmp)
        fsync_tree(self.tmp)
        if not self.overwrite:  # a rename onto a dataset that another preparation finished meanwhile fails
            try:
                os.rename(self.tmp, self.out)
            except OSError as err:
                self.abort()
                raise FileExistsError(f"{self.out}: another preparation wrote a dataset there while this one ran; "
                                      "choose another --out, or pass --overwrite true to replace it") from err
            fsync_dir(self.out.parent)
            return self.out
        old = self.out.with_name(stage_name(f".{self.out.name}.old-"))
        if self.out.exists():
            os.replace(self.out, old)
        os.replace(self.tmp, self.out)
        fsync_dir(self.out.parent)
        shutil.rmtree(old, ignore_errors=True)
        return self.out

    def abort(self) -> None:
        """Remove the temporary directory and the folders made for it (nothing is left behind by a
        failed preparation)."""
        shutil.rmtree(self.tmp, ignore_errors=True)
        for folder in reversed(self.made):
            try:
                folder.rmdir()
            except OSError:  # something else was written there meanwhile: kept
                break


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a prepared dataset; one-line errors for a directory that is not one, and for a manifest
    edited after `PreparedWriter` wrote it (its content is not what its ``"hash"`` records: a split's files,
    counts or settings changed by hand)."""
    file = Path(path) / MANIFEST
    if not Path(path).exists():
        raise no_such(path, "folder")
    if not file.is_file():
        raise FileNotFoundError(f"{path}: not a prepared dataset (no {MANIFEST}); write one with sessrec prepare")
    try:
        manifest = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{file}: not a readable manifest: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{file}: not a sessrec prepared dataset (format {manifest.get('format') if isinstance(manifest, dict) else None!r})")
    if manifest.get("version") != VERSION:
        raise ValueError(f"{file}: version {manifest.get('version')!r}; this sessrec reads version {VERSION}: "
                         "prepare the dataset again")
    found = content_hash(manifest)
    if found != manifest.get(HASH):
        raise ValueError(f"{file}: edited after sessrec prepare wrote it (its content hash is {found[:19]}..., it "
                         f"records {str(manifest.get(HASH))[:19]}...): a split's files, counts or settings are not "
                         "changed by hand; prepare the dataset again")
    return manifest


def verify(path: str | os.PathLike, manifest: dict[str, Any]) -> None:
    """Check every file the manifest lists against its sha256; refuse the first that differs or is missing, and a
    parquet file in a split's folder that it does not list (a part that would not be read)."""
    root = Path(path)
    for split in SPLITS:
        for file in sorted((root / split).glob("*.parquet")) if (root / split).is_dir() else []:
            if file.relative_to(root).as_posix() not in manifest["sha256"]:
                raise ValueError(f"{file}: a part the manifest of the prepared dataset {root} does not list, so it "
                                 "would not be read; remove it, or prepare the dataset again with it in the source")
    for name, expected in manifest["sha256"].items():
        file = root / name
        if not file.is_file():
            raise FileNotFoundError(f"{file}: missing from the prepared dataset {root} (its manifest lists it)")
        if sha256_of(file) != expected:
            raise ValueError(f"{file}: its content differs from the manifest's sha256 (changed or damaged since "
                             "sessrec prepare wrote it); prepare the dataset again")


def read_checked(root: Path, name: str, manifest: dict[str, Any]) -> pa.Table:
    """The table of the dataset's file `name`, parsed from bytes whose sha256 is the one `manifest` records; a file
    replaced since the manifest was read and checked (by another ``sessrec prepare``) is refused in one line."""
    file = root / name
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{file}: missing from the prepared dataset {root} (being replaced by another sessrec "
                                "prepare?); read the dataset again") from None
    if hashlib.sha256(data).hexdigest() != manifest["sha256"][name]:
        raise ValueError(f"{file}: replaced since its manifest was read (by another sessrec prepare?); read the dataset "
                         "again")
    return pq.read_table(pa.BufferReader(data))


class PreparedSource(SessionSource):
    """The sessions of a prepared dataset (``sessrec prepare``): read, not computed again.

    The data module takes the dataset's vocabulary (`vocab`) instead of fitting one, and refuses a
    dataset prepared with other vocabulary settings than its own.

    Args:
        path: the prepared dataset's directory.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._manifest: dict[str, Any] | None = None

    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest, with every file checked against its hash (once)."""
        if self._manifest is None:
            manifest = read_manifest(self.path)
            verify(self.path, manifest)
            self._manifest = manifest
        return self._manifest

    def load(self) -> SessionSplits:
        manifest, root = self.manifest, Path(self.path)
        tables = {split: pa.concat_tables([read_checked(root, name, manifest) for name in manifest["splits"][split]["files"]])
                  for split in SPLITS}
        return SessionSplits(**tables, source=str(self.path))

    def vocab(self, min_item_count: int, max_vocab_size: int | None) -> ItemVocab:
        """The dataset's vocabulary; refused when it was fitted with other settings than these."""
        settings = self.manifest["settings"]
        stored = (settings.get("min_item_count"), settings.get("max_vocab_size"))
        if stored != (min_item_count, max_vocab_size):
            raise ValueError(
                f"{self.path}: prepared with min_item_count {stored[0]}, max_vocab_size {stored[1]}, but the data module "
                f"has {min_item_count}, {max_vocab_size}; set those, or prepare the dataset again with its settings"
            )
        return ItemVocab.from_table(read_checked(Path(self.path), VOCAB, self.manifest), Path(self.path) / VOCAB)
