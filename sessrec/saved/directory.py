"""Saved directories whose parts know they belong together.

A saved model or pipeline is a folder of parts (weights, vocabulary, feature state, stage arrays)
described by one JSON file (``config.json``, ``pipeline.json``) that is written last. The
description records the content hash of every part (``"parts": {"model.safetensors":
"sha256:..."}``), so a part copied in from another run, a vocabulary with its rows permuted, or a
truncated file is refused with one line naming it, before anything is built from it. The
description records its own content hash too (``"hash"``: the sha256 of every other key as
canonical JSON, sorted keys and no spaces), so an edited description (a setting changed by hand, a
part's hash replaced) is refused in one line naming the file; spacing and key order are not content.

Examples:
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.bin").write_bytes(b"weights")
    >>> spec = describe(folder, {"format": "demo", "version": 1}, ["a.bin"])
    >>> write_description(folder, "spec.json", spec)
    >>> read_description(folder, "spec.json", "demo", 1)["parts"]["a.bin"][:7]
    'sha256:'
    >>> edited = json.loads((folder / "spec.json").read_text()) | {"version": 1.0}
    >>> _ = (folder / "spec.json").write_text(json.dumps(edited))
    >>> read_description(folder, "spec.json", "demo", 1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: .../spec.json: edited after it was saved (its content hash is sha256:..., it records sha256:...): ...
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sessrec.saved.atomic import digest, write_text

DESCRIPTIONS = ("config.json", "pipeline.json")  # the file that describes a saved folder: a model's, a pipeline's
HASH = "hash"  # the key of a description's own content hash


def loads_no_directory(use: str) -> classmethod:
    """A ``from_pretrained`` for a network or task, which loads no model directory: it refuses in one line
    naming what does (`use`, with ``{cls}`` and ``{directory}`` filled in)."""

    def from_pretrained(cls: type, directory: object) -> None:
        how = use.format(cls=cls.__name__, directory=repr(str(directory)))
        raise TypeError(f"{cls.__name__} loads no model directory: use {how}")

    return classmethod(from_pretrained)


def describe(folder: Path, spec: dict[str, Any], parts: Iterable[str]) -> dict[str, Any]:
    """`spec` with the content hash of each of `parts` (files of `folder`) under ``"parts"``."""
    return {**spec, "parts": {name: digest(folder / name) for name in sorted(parts)}}


def write_description(folder: Path, name: str, spec: dict[str, Any]) -> None:
    """Write the description last, atomically, with its content hash (`content_hash`; a ``"hash"``
    that `spec` holds is replaced): a folder with a description has all its parts."""
    plain = json.loads(json.dumps({k: v for k, v in spec.items() if k != HASH}, default=_json_default))
    write_text(folder / name, json.dumps({**plain, HASH: content_hash(plain)}, indent=1))


def content_hash(spec: dict[str, Any]) -> str:
    """``sha256:<hex>`` of a description's keys but ``"hash"``, as canonical JSON (sorted keys, no spaces)."""
    body = json.dumps({k: v for k, v in spec.items() if k != HASH}, sort_keys=True, separators=(",", ":"))
    return f"sha256:{hashlib.sha256(body.encode()).hexdigest()}"


def check_content_hash(spec: dict[str, Any], path: Path) -> None:
    """Refuse a description (read from `path`) whose content is not what its ``"hash"`` records."""
    recorded = spec.get(HASH)
    if not isinstance(recorded, str):
        raise ValueError(  # noqa: TRY004 - a file's content, not an argument
            f"{path}: records no content hash of itself ({HASH!r}): not written by save_pretrained; save the model again")
    try:
        found = content_hash(spec)
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be a saved description") from None
    if found != recorded:
        raise ValueError(f"{path}: edited after it was saved (its content hash is {found[:19]}..., it records "
                         f"{recorded[:19]}...): a saved description is not edited by hand; save the model again")


def read_description(folder: str | os.PathLike, name: str, format: str, version: int, what: str = "",
                     fix: str = "") -> dict[str, Any]:
    """The checked description `name` of `folder`: valid JSON of the right format and version, its own
    content hash and every listed part's as recorded. One line naming the file for anything else; a
    description of `format` in another version names its version, what it describes (`what`) and
    how to get the version read (`fix`)."""
    folder = Path(folder)
    path = folder / name
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such directory")
    if not path.exists():
        raise FileNotFoundError(f"{folder}: not a saved {format.rpartition('.')[2]} directory (no {name})")
    spec = _parse(path)
    if isinstance(spec, dict) and spec.get("format") == format and spec.get("version") != version and what:
        raise ValueError(f"{path}: a {what} of format version {spec.get('version')!r}, which this sessrec does not "
                         f"read (it reads version {version}): {fix}")
    if not isinstance(spec, dict) or spec.get("format") != format or spec.get("version") != version:
        found = f"{spec.get('format')!r} version {spec.get('version')!r}" if isinstance(spec, dict) else type(spec).__name__
        raise ValueError(f"{path}: format {found} is not {format!r} version {version}")
    check_content_hash(spec, path)
    check_parts(folder, spec.get("parts", {}), path)
    return spec


def check_folder(folder: str | os.PathLike) -> None:
    """Refuse a saved folder whose description (``config.json`` or ``pipeline.json``, `DESCRIPTIONS`)
    was edited or whose parts are not those it records, in one line naming the file; what the
    description says is not read here (its loader reads it)."""
    folder = Path(folder)
    for name in DESCRIPTIONS:
        path = folder / name
        if path.is_file():
            spec = _parse(path)
            if not isinstance(spec, dict):
                raise ValueError(f"{path}: a saved description is a JSON object, got {type(spec).__name__}")
            check_content_hash(spec, path)
            check_parts(folder, spec.get("parts", {}), path)
            return
    raise FileNotFoundError(f"{folder}: holds no {' or '.join(DESCRIPTIONS)}: not a saved model or pipeline")


def recorded_hash(folder: str | os.PathLike) -> str | None:
    """The content hash (``sha256:...``) that the description of saved `folder` records of itself: the same for a
    copy of the folder wherever it lies, another for any other model or pipeline; None for a folder without a
    description or one that records none (its loader refuses it)."""
    for name in DESCRIPTIONS:
        path = Path(folder) / name
        if path.is_file():
            try:
                spec = _parse(path)
            except ValueError:
                return None
            recorded = spec.get(HASH) if isinstance(spec, dict) else None
            return recorded if isinstance(recorded, str) else None
    return None


def vocabulary_record(vocab: Any) -> dict[str, Any]:
    """What a description records of the vocabulary its weights were trained with: its content
    fingerprint and its rows (any object with ``fingerprint()`` and ``to_table()``: `ParquetFile`)."""
    return {"fingerprint": vocab.fingerprint(), "rows": vocab.to_table().num_rows}


def check_vocabulary(vocab: Any, spec: dict[str, Any], source: Path, what: str = "model") -> None:
    """Refuse a vocabulary other than the one `spec` records (by content, not by file); a description
    that records none (an older format) is not checked."""
    recorded = (spec.get("vocab") or {}).get("fingerprint")
    found = vocab.fingerprint() if recorded is not None else None
    if found is not None and found != recorded:
        raise ValueError(
            f"{source}: is not the vocabulary this {what} was trained with ({vocab.to_table().num_rows} rows, fingerprint "
            f"{found[:19]}...; the {what}'s: {spec['vocab'].get('rows')} rows, {recorded[:19]}...)"
        )


def check_parts(folder: Path, parts: Any, source: Path) -> None:
    """Refuse a part that is missing or whose content is not the one `source` recorded."""
    if not isinstance(parts, dict):
        raise ValueError(f"{source}: 'parts' must map file names to content hashes, got {type(parts).__name__}")
    for name, recorded in parts.items():
        part = folder / str(name)
        if Path(str(name)).name != name:
            raise ValueError(f"{source}: part {name!r} is not a file name of the directory")
        if not part.is_file():
            raise FileNotFoundError(f"{folder}: the saved directory lacks {name}, a part that {source.name} lists")
        found = digest(part)
        if found != recorded:
            raise ValueError(
                f"{part}: does not belong to this directory (its content hash is {found[:19]}..., {source.name} "
                f"records {str(recorded)[:19]}...): a part from another run or a changed file; save the model again"
            )


def _parse(path: Path) -> Any:
    """The JSON value of a description file; one line naming it when it is not JSON."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be a saved description") from None


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, (tuple, set)):
        return list(value)
    raise TypeError(f"cannot save a {type(value).__name__} in a saved directory's description")
