"""The S3-Rec data fragments (recipes/data/s3rec_*.yaml) load their files as SOURCE.md counts them, leave-one-out.

Each fragment's data section builds its data module; the users, interactions and distinct items are those of
``../shared/data/s3rec_seq/SOURCE.md``, the vocabulary holds the items of the training split, and the validation
and test targets are each user's second to last and last item (a few users read by hand from the file, then every
user against the file's lines). Skipped where the shared data is absent.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import yaml

from sessrec.data import UserSequenceSource
from sessrec.data.vocab import NUM_SPECIAL
from sessrec.tasks import SessionDataModule

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

# fragment -> (file, users, interactions, distinct items): SOURCE.md's table
COUNTS = {
    "s3rec_beauty": ("Beauty", 22_363, 198_502, 12_101),
    "s3rec_sports": ("Sports_and_Outdoors", 35_598, 296_337, 18_357),
    "s3rec_toys": ("Toys_and_Games", 19_412, 167_597, 11_924),
    "s3rec_yelp": ("Yelp", 30_431, 316_354, 20_033),
}
# the first users of Beauty.txt (SOURCE.md's sample): user -> (validation target, test target, last input of the test)
BEAUTY_BY_HAND = {1: (4, 5, 4), 2: (4, 11, 4), 3: (18, 19, 18), 4: (4, 24, 4), 5: (31, 32, 31)}


def data_module(fragment: str) -> SessionDataModule:
    data = yaml.safe_load((ROOT / "recipes" / "data" / f"{fragment}.yaml").read_text())["data"]
    source = data["source"]
    assert source["class_path"] == "sessrec.data.UserSequenceSource"
    path = ROOT / source["init_args"]["path"]  # ../shared/data/...: from the repository root
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    return SessionDataModule(
        source=UserSequenceSource(str(path), layout=source["init_args"]["layout"]),
        max_length=data["max_length"], eval_protocol=data["eval_protocol"],
    )


def file_lines(path: str) -> list[list[int]]:
    with gzip.open(path, "rt") as f:
        return [[int(v) for v in line.split()] for line in f if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("fragment", sorted(COUNTS))
def test_fragment_loads_source_counts_leave_one_out(fragment):
    name, users, interactions, items = COUNTS[fragment]
    dm = data_module(fragment)
    assert Path(dm.source.path).name == f"{name}.txt.gz"
    splits = dm.splits
    assert dm.stats["test_sessions"] == dm.stats["valid_sessions"] == dm.stats["train_sessions"] == users
    assert dm.stats["test_events"] == interactions
    assert dm.stats["valid_events"] == interactions - users and dm.stats["train_events"] == interactions - 2 * users
    test_items = np.unique(splits.test.column("item_id").combine_chunks().flatten().to_numpy())
    assert len(test_items) == items
    # the vocabulary: the items of the training split (every user's sequence without its last two)
    lines = file_lines(dm.source.path)
    assert len(dm.vocab) == NUM_SPECIAL + len({i for line in lines for i in line[1:-2]})

    # every user's targets: the second to last item (validation), the last (test); inputs end just before
    for split, offset in (("valid", 2), ("test", 1)):
        pairs = dm.pairs(split)
        assert len(pairs) == users
        users_of_rows = getattr(splits, split).column("session_id").to_numpy()[pairs.sessions.numpy()]
        by_user = {line[0]: line[1:] for line in lines}
        expected = [by_user[u][-offset] for u in users_of_rows]
        encoded = dm.vocab.encode(pa.array(expected, type=dm.vocab.raw_ids.type)).ids
        assert np.array_equal(pairs.targets.numpy(), encoded), split
        before = [by_user[u][-offset - 1] for u in users_of_rows]
        assert np.array_equal(pairs.items[:, -1].numpy(), dm.vocab.encode(
            pa.array(before, type=dm.vocab.raw_ids.type)).ids), split


def test_beauty_targets_by_hand():
    """SOURCE.md's first lines: ``1 1 2 3 4 5``, ``2 6 7 8 9 10 4 11``, ``3 4 12 .. 19``, ``4 20 21 22 23 4 24``, ``5 4 25 .. 32``."""
    dm = data_module("s3rec_beauty")
    for user, (valid, test, last_test_input) in BEAUTY_BY_HAND.items():
        row = int(np.flatnonzero(dm.splits.test.column("session_id").to_numpy() == user)[0])
        for split, target in (("valid", valid), ("test", test)):
            pairs = dm.pairs(split)
            at = int(np.flatnonzero(pairs.sessions.numpy() == row)[0])
            assert dm.vocab.decode(pairs.targets[at : at + 1].numpy()).to_pylist() == [target], (user, split)
        pairs = dm.pairs("test")
        at = int(np.flatnonzero(pairs.sessions.numpy() == row)[0])
        inputs = dm.vocab.decode(pairs.items[at].numpy()).drop_null().to_pylist()
        assert inputs[-1] == last_test_input and len(inputs) == {1: 4, 2: 6, 3: 8, 4: 5, 5: 8}[user]
    # user 2 by hand: the test reads 6 7 8 9 10 4, validation 6 7 8 9 10
    row = int(np.flatnonzero(dm.splits.test.column("session_id").to_numpy() == 2)[0])
    for split, inputs in (("valid", [6, 7, 8, 9, 10]), ("test", [6, 7, 8, 9, 10, 4])):
        pairs = dm.pairs(split)
        at = int(np.flatnonzero(pairs.sessions.numpy() == row)[0])
        assert dm.vocab.decode(pairs.items[at].numpy()).drop_null().to_pylist() == inputs
