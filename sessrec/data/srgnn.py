"""The SR-GNN/GCE-GNN preprocessed pickles (``all_train_seq.txt``, ``test.txt``) into Arrow tables (`read_srgnn`),
loaded with an unpickler that refuses every global, so a hostile file cannot run code (`load_pickle`)."""

from __future__ import annotations

import gzip
import io
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessrec.data import frame
from sessrec.data.columns import SchemaError, no_such


class _NoGlobals(pickle.Unpickler):
    """Unpickler for plain containers of numbers: any class or function reference is refused."""

    def find_class(self, module: str, name: str):  # noqa: ANN201 - pickle API
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a session pickle")


def load_pickle(path: str | Path) -> object:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f, io.BufferedReader(f) as buffered:  # the buffer closed too, not left to the GC
            return _NoGlobals(buffered).load()
    except FileNotFoundError:
        raise
    except Exception as err:  # no global can load, so any failure means a malformed file
        raise SchemaError(f"{path}: not a plain SR-GNN pickle: {type(err).__name__}: {err}") from err


def _int_lists(obj: object, path: Path, what: str) -> pa.ListArray:
    if not isinstance(obj, (list, tuple)):
        raise SchemaError(f"{path}: {what} should be a list of sessions, got {type(obj).__name__}")
    arr = _int_array(obj, path, what, nested=True)
    if arr.null_count or arr.values.null_count:
        raise SchemaError(f"{path}: {what} holds a null session or item id")
    if len(arr.values) and pc.min(arr.values).as_py() < 0:
        raise SchemaError(f"{path}: {what} holds a negative item id {pc.min(arr.values).as_py()}")
    return arr


def _int_array(obj: list | tuple, path: Path, what: str, nested: bool) -> pa.Array:
    """Arrow int64 (or list<int64>) array; types are inferred first, since a cast to int64 truncates 1.5."""
    try:
        arr = pa.array(obj)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as err:
        raise SchemaError(f"{path}: {what} should hold integer item ids: {err}") from err
    if nested:
        typ = arr.type.value_type if pa.types.is_list(arr.type) else None
    else:
        typ = arr.type
    if typ is None or not (pa.types.is_integer(typ) or pa.types.is_null(typ)):
        expected = "lists of integer item ids" if nested else "integer item ids"
        raise SchemaError(f"{path}: {what} should hold {expected}, got {arr.type}")
    return arr.cast(pa.list_(pa.int64()) if nested else pa.int64())


@dataclass
class SRGNNData:
    """The SR-GNN benchmark files: complete training sessions and the shipped test pairs."""

    train: pa.ListArray  # (N,) lists of item ids
    test_prefixes: pa.ListArray  # (P,)
    test_labels: np.ndarray  # (P,)
    source: str = "SR-GNN test pairs"

    def _runs(self) -> tuple[np.ndarray, np.ndarray]:
        """First pair (S,) of each run of pairs that expand one session, and the prefix lengths (P,).

        SR-GNN writes a session longest prefix first: ``s[:-1] -> s[-1]``, ``s[:-2] -> s[-2]``, ...
        Pair ``i`` continues pair ``i - 1`` when its prefix is that prefix without its last item
        and its label is that item. Releases differ in where a run stops (at prefix length 1, or
        at 2 in several later ones) and some order pairs otherwise: a pair that continues nothing
        starts a run of its own, so every layout is read, pair for pair.
        """
        lengths = pc.list_value_length(self.test_prefixes).to_numpy(zero_copy_only=False).astype(np.int64)
        if (lengths == 0).any():
            row = int(np.flatnonzero(lengths == 0)[0])
            raise SchemaError(f"{self.source}: test pair {row} has an empty prefix (label {self.test_labels[row]})")
        values = frame.list_offsets(self.test_prefixes)[0].to_numpy()
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        follows = np.zeros(lengths.size, dtype=bool)  # (P,) continues the pair before it
        follows[1:] = (lengths[1:] == lengths[:-1] - 1) & (self.test_labels[1:] == values[offsets[1:-1] - 1])
        pair_of = np.repeat(np.arange(lengths.size), lengths)  # (E,) pair of each prefix item
        check = follows[pair_of]
        at = np.flatnonzero(check)  # items of the candidate pairs, each against the item before it in the previous prefix
        same = values[at] == values[offsets[pair_of[at] - 1] + at - offsets[pair_of[at]]]
        follows[pair_of[at[~same]]] = False
        return np.flatnonzero(~follows), lengths

    def test_sessions(self) -> pa.ListArray:
        """The test sessions reassembled from the pairs: each run's longest prefix + its label.

        With `test_targets` these give back exactly the shipped pairs: a pair's prefix is its
        session's events before the pair's target.
        """
        starts, lengths = self._runs()
        longest = self.test_prefixes.take(pa.array(starts))
        values, _ = frame.list_offsets(longest)
        out_off = np.concatenate([[0], np.cumsum(lengths[starts] + 1)])
        flat = np.empty(out_off[-1], dtype=np.int64)
        is_label = np.zeros(out_off[-1], dtype=bool)
        is_label[out_off[1:] - 1] = True
        flat[is_label] = self.test_labels[starts]
        flat[~is_label] = values.to_numpy()
        return pa.ListArray.from_arrays(pa.array(out_off.astype(np.int32)), pa.array(flat))

    def test_targets(self) -> np.ndarray | None:
        """(E,) bool over the events of `test_sessions`: True at the shipped pairs' targets.

        None when every event after a session's first is a target (runs down to length-1
        prefixes, the original SR-GNN release), so that every prefix is a pair; otherwise the
        other events are context only (prefixes of length 1 that a release does not ship).
        """
        starts, lengths = self._runs()
        runs = np.diff(np.concatenate([starts, [lengths.size]]))
        if np.array_equal(runs, lengths[starts]):
            return None
        out_off = np.concatenate([[0], np.cumsum(lengths[starts] + 1)])
        flags = np.zeros(out_off[-1], dtype=bool)
        flags[np.repeat(out_off[:-1], runs) + lengths] = True  # a pair's target follows its prefix
        return flags


def read_srgnn(directory: str | Path) -> SRGNNData:
    """Read ``all_train_seq.txt[.gz]`` and ``test.txt[.gz]`` from an SR-GNN dataset folder."""
    directory = Path(directory)
    if not directory.is_dir():
        raise no_such(directory, "folder")

    def find(stem: str) -> Path:
        for name in (f"{stem}.gz", stem):
            if (directory / name).exists():
                return directory / name
        raise FileNotFoundError(f"{directory}: no {stem} or {stem}.gz (SR-GNN dataset folder expected)")

    train_path, test_path = find("all_train_seq.txt"), find("test.txt")
    train = _int_lists(load_pickle(train_path), train_path, "all_train_seq")
    test = load_pickle(test_path)
    if not (isinstance(test, (list, tuple)) and len(test) == 2):
        raise SchemaError(f"{test_path}: expected a (prefixes, labels) pair")
    prefixes = _int_lists(test[0], test_path, "test prefixes")
    if not isinstance(test[1], (list, tuple)):
        kind = type(test[1]).__name__
        raise SchemaError(f"{test_path}: test labels should be a list of item ids, got {kind}")
    label_arr = _int_array(test[1], test_path, "test labels", nested=False)
    if label_arr.null_count:
        raise SchemaError(f"{test_path}: test labels hold a null item id")
    labels = label_arr.to_numpy().astype(np.int64)
    if labels.size and labels.min() < 0:
        raise SchemaError(f"{test_path}: test labels hold a negative item id {labels.min()}")
    if labels.shape != (len(prefixes),):
        raise SchemaError(f"{test_path}: {len(prefixes)} prefixes but {labels.shape} labels")
    return SRGNNData(train=train, test_prefixes=prefixes, test_labels=labels, source=str(test_path))
