"""Versioned directories: saves and promotions that survive a crash at any point, rollback, the lock,
and parts that must belong together."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import torch

from sessrec.artifacts import SessionRecommender
from sessrec.data import ItemVocab
from sessrec.models import CausalLanguageModeling, GRU4RecEncoder
from sessrec.saved import versions
from sessrec.saved.atomic import write_text
from sessrec.saved.directory import describe, write_description
from sessrec.saved.versions import VersionedDirectory, resolve, write_directory
from sessrec.tasks import NextItemTask

torch.set_num_threads(1)
VOCAB = ItemVocab(pa.array(np.arange(100, 130)), np.arange(30, 0, -1))


def tiny_task(seed: int) -> SessionRecommender:
    """The artifact of a tiny, untrained task (`NextItemTask.recommender`)."""
    torch.manual_seed(seed)
    task = NextItemTask(num_items=len(VOCAB), max_length=8, encoder=GRU4RecEncoder(d_model=8),
                        objective=CausalLanguageModeling()).eval()
    task.vocab = VOCAB
    return task.recommender()


def weights_of(directory) -> torch.Tensor:
    return SessionRecommender.from_pretrained(directory).model.item_embedding.weight.detach()


def write_file(text: str):
    """A writer of a saved folder of one part, ``part.txt`` holding `text`, and its description."""

    def write(folder):
        (folder / "part.txt").write_text(text)
        write_description(folder, "config.json", describe(folder, {"format": "test"}, ["part.txt"]))

    return write


def read_part(root) -> str:
    return (resolve(root) / "part.txt").read_text()


# -- the store ----------------------------------------------------------------------------------

def test_saving_again_adds_a_version_and_moves_the_pointer(tmp_path):
    root = tmp_path / "model"
    store = VersionedDirectory(root)
    store.publish(write_file("one"))
    store.publish(write_file("two"))
    assert store.versions() == ["v000001", "v000002"] and store.current_version() == "v000002"
    assert read_part(root) == "two" and resolve(root) == root / "versions" / "v000002"
    moves = [(e["event"], e["version"], e["previous"]) for e in store.history()]
    assert moves == [("save", "v000001", None), ("save", "v000002", "v000001")]


def test_rollback_goes_back_one_version_or_to_the_one_named(tmp_path):
    store = VersionedDirectory(tmp_path / "m")
    for text in ("one", "two", "three"):
        store.publish(write_file(text))
    assert store.rollback() == "v000002" and read_part(store.root) == "two"
    assert store.rollback(to="v000003") == "v000003" and read_part(store.root) == "three"
    with pytest.raises(ValueError, match="no version 'v000009'"):
        store.rollback(to="v000009")
    with pytest.raises(ValueError, match="already the current version"):
        store.rollback(to="v000003")


def test_old_versions_are_pruned_but_the_current_the_history_before_it_and_the_best_stay(tmp_path):
    store = VersionedDirectory(tmp_path / "m", keep=2)
    store.publish(write_file("one"))
    store.log({"event": "decision", "best": "v000001"})
    for text in ("two", "three", "four", "five"):
        store.publish(write_file(text))
    assert store.versions() == ["v000001", "v000003", "v000004", "v000005"]  # the best, the current and the 2 before it
    store.log({"event": "decision", "best": "v000004"})
    store.publish(write_file("six"))
    store.rollback()
    store.log({"event": "decision", "best": "v000004"})
    store.publish(write_file("seven"))  # the history: ... v000004 v000005 v000007; v000006 was rolled back from
    assert store.versions() == ["v000004", "v000005", "v000006", "v000007"]  # v000006 among the newest 2
    assert not [p for p in store.root.iterdir() if p.name.startswith(".trash")]


def test_a_version_rolled_back_from_is_no_longer_the_best_a_retrain_compares_with(tmp_path):
    from sessrec.lifecycle.retrain import Standing

    store = VersionedDirectory(tmp_path / "m")
    store.publish(write_file("one"))
    store.log({"event": "decision", "best": "v000001"})
    store.publish(write_file("two"))
    store.log({"event": "decision", "best": "v000002"})
    store.publish(write_file("three"))
    assert Standing.read(store) == Standing("v000003", "v000002")
    store.rollback()  # v000003 -> v000002: the best is still in the history
    assert Standing.read(store) == Standing("v000002", "v000002")
    store.rollback()  # v000002 -> v000001: the operator walked back from the best
    assert Standing.read(store) == Standing("v000001", "v000001")


def test_a_second_writer_is_refused_while_the_first_holds_the_lock(tmp_path):
    first, second = VersionedDirectory(tmp_path / "m"), VersionedDirectory(tmp_path / "m")
    with first.lock():
        with pytest.raises(RuntimeError, match=rf"another process \(pid {os.getpid()}\) is writing"):
            with second.lock():
                pass
    with second.lock():  # released
        pass


def test_recover_completes_a_promotion_whose_pointer_did_not_move(tmp_path):
    store = VersionedDirectory(tmp_path / "m")
    store.publish(write_file("one"))
    version = store.add(write_file("two"))
    store.log({"event": "promote", "version": version, "previous": "v000001"})  # the crash came before the pointer
    assert read_part(store.root) == "one"
    with open(store.root / "promotions.jsonl", "a") as fh:
        fh.write('{"event": "promote", "vers')  # and a line cut short by a later crash
    assert store.recover() == "v000002" and read_part(store.root) == "two"
    assert [e["version"] for e in store.history()] == ["v000001", "v000002"]


def test_a_plain_directory_is_adopted_as_the_first_version(tmp_path):
    root = tmp_path / "m"
    write_directory(root, write_file("plain"))
    assert (root / "config.json").exists() and not (root / "CURRENT").exists()  # the first save is a plain folder
    write_directory(root, write_file("second"))
    assert read_part(root) == "second" and not (root / "config.json").exists()
    assert VersionedDirectory(root).rollback() == "v000001" and read_part(root) == "plain"


def test_saving_into_a_folder_of_other_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="is not a saved model or pipeline directory"):
        write_directory(tmp_path, write_file("x"))
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_pointer_to_a_missing_version_is_one_line(tmp_path):
    store = VersionedDirectory(tmp_path / "m")
    store.publish(write_file("one"))
    (store.root / "CURRENT").write_text("v000007\n")
    with pytest.raises(FileNotFoundError, match="names version v000007, which .* does not hold"):
        resolve(store.root)
    (store.root / "CURRENT").write_text("../../etc\n")
    with pytest.raises(ValueError, match="not a version of the form"):
        resolve(store.root)


# -- crashes ------------------------------------------------------------------------------------

FS_EVENTS = ("open", "os.rename", "os.replace", "os.remove", "os.unlink", "os.rmdir", "os.mkdir", "os.link",
             "os.symlink", "os.chmod", "os.truncate", "shutil.rmtree", "shutil.copyfile", "tempfile.mkdtemp",
             "os.listdir", "os.scandir", "os.fsync")


def on_fs_call(count) -> None:
    """In a forked child: call `count()` before each filesystem call (the audit events of FS_EVENTS, and
    ``os.fsync``, which raises none)."""
    real_fsync = os.fsync

    def fsync(fd):
        count()
        return real_fsync(fd)

    os.fsync = fsync
    sys.addaudithook(lambda event, args: count() if event in FS_EVENTS else None)


def crash_at(n: int, action) -> bool:
    """Run `action` in a forked child that dies (``os._exit``) just before its `n`-th filesystem call;
    True when the action finished before reaching it."""
    pid = os.fork()
    if pid == 0:  # the child: count the filesystem calls, die before the n-th
        calls = [0]

        def count():
            calls[0] += 1
            if calls[0] == n:
                os._exit(17)

        on_fs_call(count)
        try:
            action()
        except BaseException:
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 17), f"the action failed on its own (exit {code}) at crash point {n}"
    return code == 0


def fs_calls(action) -> int:
    """How many filesystem calls `action` makes when nothing kills it (run in a forked child, as `crash_at`)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        calls = [0]
        on_fs_call(lambda: calls.__setitem__(0, calls[0] + 1))
        try:
            action()
        except BaseException:
            os._exit(3)
        os.write(write, str(calls[0]).encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the action failed on its own"
    with os.fdopen(read) as f:
        return int(f.read())


@pytest.mark.slow
@pytest.mark.parametrize("start", ["plain", "versioned"])
def test_a_save_killed_before_any_filesystem_call_leaves_the_old_or_the_new_model(tmp_path, start):
    old, new = tiny_task(0), tiny_task(1)
    old_w, new_w = old.model.item_embedding.weight.detach(), new.model.item_embedding.weight.detach()
    points = 0
    while True:
        points += 1
        root = tmp_path / f"m{points}"
        old.save_pretrained(root)
        if start == "versioned":
            old.save_pretrained(root)  # two saves: a pointer and versions exist before the crash
        finished = crash_at(points, lambda: new.save_pretrained(root))
        loaded = weights_of(root)  # as a server would read it, before any writer recovers anything
        assert torch.equal(loaded, new_w if finished else old_w) or torch.equal(loaded, new_w), points
        VersionedDirectory(root).recover()
        after = weights_of(root)
        assert torch.equal(after, old_w) or torch.equal(after, new_w), points
        if finished:
            break
    assert points > 20  # every call of the save was a crash point: links, writes, fsyncs, renames, the log


@pytest.mark.slow
def test_a_promotion_killed_at_random_moments_keeps_log_and_pointer_in_agreement(tmp_path):
    rng = np.random.default_rng(0)
    store = VersionedDirectory(tmp_path / "m")
    store.publish(write_file("v1"))
    for turn in range(24):
        text = f"turn {turn}"

        def promote():
            with store.lock():
                store.recover()
                version = store.add(write_file(text))
                store.promote(version, {"reason": text})

        crash_at(int(rng.integers(1, 40)), promote)
        current = store.recover()
        moves = [e for e in store.history() if e["event"] in versions.POINTER_EVENTS]
        assert moves[-1]["version"] == current  # the log's last move is what the pointer names
        assert read_part(store.root) == (moves[-1].get("reason") or "v1")
        assert not [p for p in store.root.iterdir() if p.name.startswith((".staging", ".trash"))]


# -- parts that belong together -----------------------------------------------------------------

def test_a_vocabulary_swapped_or_permuted_is_refused(tmp_path):
    tiny_task(0).save_pretrained(tmp_path / "m")
    other = ItemVocab(pa.array(np.arange(200, 230)), np.arange(30, 0, -1))
    other.save(tmp_path / "m" / "vocab.parquet")
    with pytest.raises(ValueError, match=r"vocab.parquet: does not belong to this directory"):
        SessionRecommender.from_pretrained(tmp_path / "m")
    permuted = ItemVocab(pa.array(np.arange(100, 130)[::-1].copy()), np.arange(30, 0, -1))
    permuted.save(tmp_path / "m" / "vocab.parquet")
    with pytest.raises(ValueError, match=r"vocab.parquet: does not belong to this directory"):
        SessionRecommender.from_pretrained(tmp_path / "m")


def test_a_vocabulary_whose_hash_was_edited_in_is_refused_by_the_description_hash_and_its_fingerprint(tmp_path):
    from sessrec.saved.atomic import digest

    tiny_task(0).save_pretrained(tmp_path / "m")
    permuted = ItemVocab(pa.array(np.arange(100, 130)[::-1].copy()), np.arange(30, 0, -1))
    permuted.save(tmp_path / "m" / "vocab.parquet")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["parts"]["vocab.parquet"] = digest(tmp_path / "m" / "vocab.parquet")
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="config.json: edited after it was saved"):
        SessionRecommender.from_pretrained(tmp_path / "m")
    write_description(tmp_path / "m", "config.json", config)  # its own hash recomputed as well
    with pytest.raises(ValueError, match="is not the vocabulary this model was trained with"):
        SessionRecommender.from_pretrained(tmp_path / "m")


def test_weights_from_another_run_are_refused(tmp_path):
    tiny_task(0).save_pretrained(tmp_path / "a")
    tiny_task(1).save_pretrained(tmp_path / "b")
    (tmp_path / "a" / "model.safetensors").write_bytes((tmp_path / "b" / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match=r"model.safetensors: does not belong to this directory"):
        SessionRecommender.from_pretrained(tmp_path / "a")


def test_sessrec_rollback_on_the_command_line(tmp_path, capsys):
    from sessrec.cli import run

    store = VersionedDirectory(tmp_path / "m")
    for text in ("one", "two"):
        store.publish(write_file(text))
    assert run(["rollback", "--model_dir", str(store.root)]) == "v000001" and read_part(store.root) == "one"
    assert "v000001 is current (was v000002)" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="no such model directory"):
        run(["rollback", "--model_dir", str(tmp_path / "none")])
    assert not (tmp_path / "none").exists()
    write_directory(tmp_path / "plain", write_file("once"))
    with pytest.raises(ValueError, match="holds one model and no versions"):
        run(["rollback", "--model_dir", str(tmp_path / "plain")])


def test_promote_and_rollback_of_a_folder_inside_a_versioned_directory_are_refused_and_write_nothing(tmp_path):
    """A version folder, the versions folder or any folder that is not a saved directory is named in one line,
    before the move takes a lock: nothing (no ``.lock``) is written into an immutable version."""
    from sessrec.cli import run

    store = VersionedDirectory(tmp_path / "m")
    for text in ("one", "two"):
        store.publish(write_file(text))
    before = {p: p.stat().st_mtime_ns for p in store.root.rglob("*")}
    version, folder = store.path("v000001"), store.root / "versions"
    for command in (["rollback"], ["promote", "--version", "v000002"]):
        for inside in (version, folder):
            with pytest.raises(ValueError, match=rf"^{inside}: a folder inside the versioned directory {store.root}, "
                                                 rf"whose versions are never changed in place; give the directory "
                                                 rf"itself: --model_dir {store.root}$"):
                run([command[0], "--model_dir", str(inside), *command[1:]])
    (tmp_path / "other").mkdir()
    for command in (["rollback"], ["promote", "--version", "v000001"]):
        with pytest.raises(FileNotFoundError, match=r"other: not a saved model or pipeline directory \(no CURRENT, "
                                                    r"config\.json, pipeline\.json\)"):
            run([command[0], "--model_dir", str(tmp_path / "other"), *command[1:]])
    with pytest.raises(ValueError, match="a folder inside the versioned directory"):
        VersionedDirectory(version).start_canary("v000002", 0.5)
    assert {p: p.stat().st_mtime_ns for p in store.root.rglob("*")} == before
    assert list((tmp_path / "other").iterdir()) == [] and store.current_version() == "v000002"


@pytest.mark.slow
def test_a_retrain_promotion_killed_at_random_moments_keeps_record_pointer_and_model_in_agreement(tmp_path):
    """`settle`, the decision and promotion of a `sessrec retrain` turn, on real model directories, killed
    before a random filesystem call (or by SIGKILL after a random delay) in 24 turns: after each, the
    record's last pointer move is what the pointer names, and the model loads with that version's weights."""
    import signal
    import time

    from sessrec.lifecycle.gate import Gate
    from sessrec.lifecycle.paired_ranks import PairRanks
    from sessrec.lifecycle.retrain import Standing, settle

    rng = np.random.default_rng(0)
    n = 2000
    pairs = dict(sessions=np.arange(n), positions=np.zeros(n, dtype=np.int64))
    current_ranks = PairRanks(ranks=rng.integers(1, 60, n).astype(float), metrics={}, **pairs)
    better = PairRanks(ranks=np.minimum(current_ranks.ranks, 3.0), metrics={}, **pairs)  # passes the gate every turn
    candidates = {}
    for seed in range(4):
        candidates[seed] = tiny_task(seed + 10).save_pretrained(tmp_path / f"candidate{seed}")
    expected = {str(c): weights_of(c) for c in candidates.values()}
    root = tmp_path / "served"
    tiny_task(0).save_pretrained(root)
    store = VersionedDirectory(root)
    gate = Gate(metric="recall@20", tolerance=0.005, min_pairs=1000, samples=200)

    def turn(candidate, store=store):
        with store.lock():
            store.recover()
            settle(store, Standing.read(store), gate, {"candidate": lambda: better, "current": lambda: current_ranks},
                   candidate, True, {"train_seconds": 0.0})

    # the crash points cover a whole promotion and as much again: about a third of the turns get through
    shutil.copytree(root, tmp_path / "measured")
    per_turn = fs_calls(lambda: turn(candidates[0], VersionedDirectory(tmp_path / "measured")))

    for number in range(24):
        candidate = candidates[number % 4]
        if number % 3 == 2:  # a real SIGKILL after a random delay
            pid = os.fork()
            if pid == 0:
                try:
                    turn(candidate)
                finally:
                    os._exit(0)
            time.sleep(float(rng.uniform(0.0, 0.05)))
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        else:
            crash_at(int(rng.integers(1, 2 * per_turn)), lambda: turn(candidate))
        with store.lock():
            current = store.recover()
        moves = [e for e in store.history() if e["event"] in versions.POINTER_EVENTS]
        if current is None:  # killed before the first promotion: still the plain directory's model
            assert not moves and torch.equal(weights_of(root), tiny_task(0).model.item_embedding.weight.detach())
            continue
        assert moves[-1]["version"] == current, number
        if moves[-1]["event"] == "promote":
            assert moves[-1]["promoted"] and torch.equal(weights_of(root), expected[moves[-1]["candidate"]]), number
    assert len([e for e in store.history() if e["event"] == "promote"]) >= 5  # most turns got through


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_saved_files_take_the_mode_of_the_umask_not_0600(tmp_path, mask):
    old = os.umask(mask)
    try:
        first = tiny_task(0).save_pretrained(tmp_path / "model")  # a plain directory (safetensors writes 0600)
        second = tiny_task(1).save_pretrained(tmp_path / "model")  # a version of it
        vocab = VOCAB.save(tmp_path / "vocab.parquet")  # one file written atomically
    finally:
        os.umask(old)
    assert first != second
    paths = [tmp_path / "model", *(tmp_path / "model").rglob("*"), vocab]
    assert any(p.suffix == ".safetensors" for p in paths)
    for path in paths:
        expected = (0o777 if path.is_dir() else 0o666) & ~mask
        assert path.stat().st_mode & 0o777 == expected, f"{path}: {oct(path.stat().st_mode & 0o777)}"


# -- walking the promotion history ----------------------------------------------------------------

def test_two_rollbacks_walk_two_steps_back(tmp_path):
    store = VersionedDirectory(tmp_path / "m")
    for text in ("one", "two", "three"):
        store.publish(write_file(text))
    assert store.rollback() == "v000002" and read_part(store.root) == "two"
    assert store.rollback() == "v000001" and read_part(store.root) == "one"
    assert store.current_version() == "v000001"


def test_rolling_back_past_the_first_version_is_refused_in_one_line(tmp_path):
    store = VersionedDirectory(tmp_path / "m")
    for text in ("one", "two"):
        store.publish(write_file(text))
    store.rollback()
    with pytest.raises(ValueError) as info:
        store.rollback()
    assert str(info.value) == (f"{store.root}: v000001 is the first version of its promotion history: there is no "
                               "version before it to roll back to")
    assert store.current_version() == "v000001" and read_part(store.root) == "one"


def test_a_promotion_after_rollbacks_starts_from_the_version_rolled_back_to(tmp_path):
    """v1 v2 v3, two rollbacks (v1), a promotion of v4: the history is v1 v4, and v2 v3 are out of it."""
    store = VersionedDirectory(tmp_path / "m")
    for text in ("one", "two", "three"):
        store.publish(write_file(text))
    store.rollback()
    store.rollback()
    store.publish(write_file("four"))
    assert store.rollback() == "v000001" and read_part(store.root) == "one"
    with pytest.raises(ValueError, match="v000001 is the first version of its promotion history"):
        store.rollback()
    store.publish(write_file("five"))
    assert store.line() == ["v000001", "v000005"]


def test_rollback_to_a_version_of_the_history_walks_there_and_to_another_makes_it_current(tmp_path):
    store = VersionedDirectory(tmp_path / "m")
    for text in ("one", "two", "three", "four"):
        store.publish(write_file(text))
    assert store.rollback(to="v000002") == "v000002"
    assert store.rollback(to="v000004") == "v000004"
    assert store.rollback() == "v000002" and store.rollback() == "v000001"  # v000003 is out of the history
    assert store.line() == ["v000001"]


def test_the_walk_back_keeps_its_versions_and_refuses_one_that_was_pruned(tmp_path):
    store = VersionedDirectory(tmp_path / "m", keep=2)
    for text in ("one", "two", "three", "four", "five"):
        store.publish(write_file(text))
    assert store.versions() == ["v000003", "v000004", "v000005"]  # the current one and the two before it
    assert store.rollback() == "v000004" and store.rollback() == "v000003"
    with pytest.raises(ValueError, match=r"the version before v000003 in the promotion history, v000002, was deleted "
                                         r"when old versions were pruned; give --to one of \['v000003', 'v000004', "
                                         r"'v000005'\]$"):
        store.rollback()


# -- a version must be whole before it is made current ----------------------------------------------

def test_a_tampered_version_is_refused_by_rollback_naming_the_part_and_both_hashes(tmp_path):
    from sessrec.cli import run
    from sessrec.saved.atomic import digest

    root = tmp_path / "m"
    tiny_task(0).save_pretrained(root)
    tiny_task(1).save_pretrained(root)
    tiny_task(2).save_pretrained(tmp_path / "other")
    recorded = digest(root / "versions" / "v000001" / "model.safetensors")
    part = root / "versions" / "v000001" / "model.safetensors"
    part.unlink()  # a hard link of the first save's file: replaced, not written through
    shutil.copy(tmp_path / "other" / "model.safetensors", part)
    found = digest(part)
    for roll in (lambda: VersionedDirectory(root).rollback(), lambda: run(["rollback", "--model_dir", str(root)])):
        with pytest.raises(ValueError) as info:
            roll()
        message = str(info.value)
        assert message.startswith(f"{part}: does not belong to this directory") and "\n" not in message, message
        assert found[:19] in message and recorded[:19] in message and "v000002 stays current" in message, message
    assert versions.current_version(root) == "v000002"
    assert torch.equal(weights_of(root), tiny_task(1).model.item_embedding.weight.detach())


def test_a_version_whose_description_was_edited_is_refused_by_promote(tmp_path):
    root = tmp_path / "m"
    tiny_task(0).save_pretrained(root)
    store = VersionedDirectory(root)
    version = store.add(lambda folder: shutil.copytree(root, folder, dirs_exist_ok=True,
                                                        ignore=shutil.ignore_patterns("versions", "promotions.jsonl", ".lock")))
    config = store.path(version) / "config.json"
    edited = json.loads(config.read_text())
    edited["model"]["init_args"]["score_scale"] = 2.0
    config.write_text(json.dumps(edited))
    with pytest.raises(ValueError, match=rf"^{config}: edited after it was saved"):
        store.promote(version)
    assert store.current_version() is None and not any(e.get("version") == version and e["event"] == "promote"
                                                       for e in store.history())


# -- the description is covered by a hash -------------------------------------------------------------

def test_an_edited_config_json_is_refused_at_load_naming_the_file(tmp_path):
    from sessrec.serving.recommender import load_recommender

    path = tiny_task(0).save_pretrained(tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    config["model"]["init_args"]["score_scale"] = 2.0
    (path / "config.json").write_text(json.dumps(config, indent=1))
    for load in (SessionRecommender.from_pretrained, load_recommender):
        with pytest.raises(ValueError) as info:
            load(path)
        message = str(info.value)
        assert message.startswith(f"{path / 'config.json'}: edited after it was saved (its content hash is sha256:")
        assert "\n" not in message, message


def test_a_description_rewritten_with_other_spacing_or_key_order_still_loads(tmp_path):
    path = tiny_task(0).save_pretrained(tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(reversed(list(config.items())))))
    assert torch.equal(weights_of(path), tiny_task(0).model.item_embedding.weight.detach())


def test_a_features_file_the_description_does_not_list_is_refused(tmp_path):
    path = tiny_task(0).save_pretrained(tmp_path / "m")
    (path / "features.npz").write_bytes(b"not listed")
    with pytest.raises(ValueError, match=rf"^{path / 'features.npz'}: is not a part that config.json lists"):
        SessionRecommender.from_pretrained(path)


def test_a_write_removes_the_temporary_files_of_writes_killed_on_this_host(tmp_path):
    """A SIGKILL leaves `atomic_path`'s temporary file behind; the next write of that file removes it when its
    process is gone, and leaves a live writer's and another host's alone."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = socket.gethostname()
        names = [f".model.json.tmp-{host}-{gone.pid}", f".model.json.tmp-{host}-{live.pid}", ".model.json.tmp-another-host-1"]
        for name in names:
            (tmp_path / name).write_text("half")
        write_text(tmp_path / "model.json", "{}")
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*names[1:], "model.json"])
        assert (tmp_path / "model.json").read_text() == "{}"
    finally:
        live.kill()
        live.wait()


def test_a_first_save_removes_the_temporary_folder_of_a_first_save_killed_on_this_host(tmp_path):
    """A first save killed while it writes (SIGKILL: nothing of it runs again) leaves its temporary folder beside
    the directory; the next save removes it, as it does any whose process is gone, and leaves a live writer's and
    another host's alone."""
    root = tmp_path / "model"
    pid = os.fork()
    if pid == 0:  # the killed save: its writer dies halfway through the files

        def die(folder):
            (folder / "part.txt").write_text("half")
            os.kill(os.getpid(), signal.SIGKILL)

        write_directory(root, die)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == -signal.SIGKILL
    host = socket.gethostname()
    (killed,) = [p.name for p in tmp_path.iterdir()]
    assert killed.startswith(f".model.tmp-{host}-{pid}-") and not root.exists()
    live = tmp_path / f".model.tmp-{host}-{os.getpid()}-x1"  # this process: a save in progress
    elsewhere = tmp_path / ".model.tmp-another-host-1-x2"
    for stage in (live, elsewhere):
        stage.mkdir()
    write_directory(root, write_file("whole"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, elsewhere.name, "model"])
    assert read_part(root) == "whole"


@pytest.mark.parametrize("depth", [0, 3])
def test_a_failed_first_save_leaves_nothing_it_created(tmp_path, depth):
    """A writer that raises leaves no temporary folder, no directory and none of the folders above it that the save
    created; the folders that were there stay."""
    (tmp_path / "kept").mkdir()
    root = tmp_path.joinpath("kept", *[f"new{i}" for i in range(depth)], "model")

    def fail(folder):
        (folder / "part.txt").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_directory(root, fail)
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")] == ["kept"]


def test_a_failed_first_save_into_an_empty_folder_leaves_the_folder(tmp_path):
    (tmp_path / "model").mkdir()

    def fail(folder):
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_directory(tmp_path / "model", fail)
    assert [p.name for p in tmp_path.iterdir()] == ["model"] and not any((tmp_path / "model").iterdir())


def test_a_first_save_killed_at_any_point_leaves_nothing_the_next_save_keeps(tmp_path):
    """Killed before any of its filesystem calls, a first save into a new folder leaves no directory or a whole one;
    the next save succeeds, and afterwards the parent holds the directory alone (a dead writer's temporary folder
    removed), with the next save's part."""
    points = 0
    while True:
        points += 1
        parent = tmp_path / f"p{points}"
        root = parent / "model"
        finished = crash_at(points, lambda: write_directory(root, write_file("first")))
        if root.exists():
            assert read_part(root) == "first", points
        write_directory(root, write_file("second"))
        assert [p.name for p in parent.iterdir() if p.name != "model"] == [], points
        assert read_part(root) == "second", points
        if finished:
            break
    assert points > 5


def test_promote_rollback_and_a_canary_of_a_directory_saved_once_are_refused_without_writing_into_it(tmp_path):
    from sessrec.cli import run

    plain = tmp_path / "plain"
    write_directory(plain, write_file("once"))
    before = {p: p.read_bytes() for p in plain.iterdir()}
    for command, nothing in ((["promote", "--version", "v000001"], "nothing to promote"), (["promote"], "nothing to promote"),
                             (["rollback"], "nothing to roll back to"), (["rollback", "--to", "v000001"], "nothing to roll back to")):
        with pytest.raises(ValueError, match=rf"^{plain}: holds one model and no versions \(it was saved once\): {nothing}$"):
            run([command[0], "--model_dir", str(plain), *command[1:]])
    with pytest.raises(ValueError, match=rf"^{plain}: has no versions \(no CURRENT\); a canary is another version"):
        VersionedDirectory(plain).start_canary("v000001", 0.5)
    assert {p: p.read_bytes() for p in plain.iterdir()} == before  # no .lock, no log


@pytest.mark.parametrize("command", [["promote", "--version", "v000001"], ["rollback"]])
def test_a_writer_that_comes_while_promote_or_rollback_decides_is_refused_and_the_move_reports_what_it_replaced(
        tmp_path, capsys, monkeypatch, command):
    """The state a move is decided on (the current version, the canary) and the move are one step under the
    directory's lock: a promotion racing in between is refused, not logged beside a stale decision."""
    from sessrec.cli import run

    store = VersionedDirectory(tmp_path / "m")
    for text in ("one", "two", "three"):
        store.publish(write_file(text))
    store.rollback()  # v000002 current, v000003 kept
    real, racing = versions.canary, []

    def canary_then_another_writer(directory):
        try:
            VersionedDirectory(directory).promote("v000003")
        except RuntimeError as err:
            racing.append(str(err))
        return real(directory)

    monkeypatch.setattr(versions, "canary", canary_then_another_writer)
    assert run([command[0], "--model_dir", str(store.root), *command[1:]]) == "v000001"
    assert len(racing) == 1 and f"another process (pid {os.getpid()}) is writing" in racing[0]
    assert "v000001 is current (was v000002)" in capsys.readouterr().out
    assert store.current_version() == "v000001" and read_part(store.root) == "one"
    assert [(e["event"], e["version"], e["previous"]) for e in store.history()][-1] == (command[0], "v000001", "v000002")


def test_a_directory_named_through_a_missing_folder_and_back_is_the_directory_it_names(tmp_path):
    """``new/../m`` is ``m`` once ``new`` is made: a save there adds a version to the saved ``m``, a save into
    ``new/../mine`` (a folder of other files) is refused in one line, and ``new`` is never made."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("kept")
    with pytest.raises(FileExistsError, match=rf"^{tmp_path}/mine: exists and is not a saved model or pipeline directory"):
        write_directory(f"{tmp_path}/new/../mine", write_file("a"))
    write_directory(tmp_path / "m", write_file("one"))
    assert write_directory(f"{tmp_path}/new/../m", write_file("two")) == tmp_path / "m" / "versions" / "v000002"
    assert read_part(tmp_path / "m") == "two" and VersionedDirectory(tmp_path / "m").line() == ["v000001", "v000002"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "mine"] and os.listdir(tmp_path / "mine") == ["notes.txt"]


def test_sessrec_rollback_to_a_version_says_that_it_dropped_the_running_canary(tmp_path, capsys):
    from sessrec.cli import run

    store = VersionedDirectory(tmp_path / "m")
    for text in ("one", "two", "three"):
        store.publish(write_file(text))
    store.start_canary("v000002", 0.25)
    assert run(["rollback", "--model_dir", str(store.root), "--to", "v000001"]) == "v000001"
    assert capsys.readouterr().out.strip() == (f"sessrec rollback: {store.root}: v000001 is current (was v000003); canary "
                                               "v000002 dropped; a server following it reloads")
    assert versions.canary(store.root) is None and store.current_version() == "v000001"
