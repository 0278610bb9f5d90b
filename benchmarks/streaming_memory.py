"""Peak memory of a training epoch: `StreamingLoader` over a prepared dataset against the in-memory loader.

A synthetic prepared dataset is written part by part into a temporary folder (never committed):
sessions of 2-12 events, item ids drawn from a Zipf law over ``--items`` items, timestamps; parts of
``--part-sessions`` sessions in row groups of ``--group-rows``, and the vocabulary of its items.
Each size of ``--sessions`` is a prepared dataset of the first parts (links to the same files).

For each size, each loader runs one training epoch (batches of ``--batch``, ``max_length`` 20, every
batch touched) in its own process, so that each peak resident memory (``ru_maxrss``) is its own:

- ``memory``: `SessionDataModule` as it trains without streaming: the training split read, encoded
  and padded into one tensor, then `SessionLoader`'s epoch;
- ``streaming``: `SessionDataModule(streaming=True, shuffle_buffer=--buffer)`: `StreamingLoader`'s epoch
  (the parts' sha256 checked first, as the data module does), the next row group read ahead;
- ``streaming-serial``: the same without reading ahead (``prefetch=False``).

``--step-ms`` waits that long after each batch, as a training step on an accelerator leaves the host
waiting: what reading ahead hides.

Prints one JSON line per (size, loader): ``peak_rss_mb``, ``base_rss_mb`` (the same process before it
reads any session: interpreter, torch, the vocabulary), ``data_mb`` (their difference), ``seconds``
(the epoch, reading included), ``sessions_per_s``, ``batches``; then one line per size with the
ratios. The two loaders cannot share a process (a peak is per process), so they run one after the other.

Example (from the repository root):
    python benchmarks/streaming_memory.py                      # 1M and 5M sessions, 1M items
    python benchmarks/streaming_memory.py --quick              # seconds: 20,000 and 100,000 sessions, 10,000 items
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sessrec.data import ItemVocab, PreparedSource
from sessrec.data.prepared.dataset import VERSION
from sessrec.saved.atomic import digest
from sessrec.saved.directory import HASH, content_hash

MAX_LENGTH = 20


def peak_mb() -> float:
    """This process's peak resident memory in MB (Linux reports ru_maxrss in KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_parts(root: Path, n_parts: int, args: argparse.Namespace) -> tuple[list[str], np.ndarray]:
    """Write the training parts (and one part each of validation and test); the train item counts."""
    rng = np.random.default_rng(0)
    counts = np.zeros(args.items, dtype=np.int64)
    names = []
    (root / "parts").mkdir()
    for i in range(n_parts + 2):
        n = args.part_sessions if i < n_parts else max(args.part_sessions // 10, 10)
        lengths = rng.integers(2, 13, n)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        items = (rng.zipf(1.2, offsets[-1]) - 1) % args.items
        times = 1.6e9 + np.arange(offsets[-1], dtype=np.float64)
        table = pa.table({
            "session_id": pa.array(np.arange(n) + i * args.part_sessions),
            "item_id": pa.ListArray.from_arrays(pa.array(offsets), pa.array(items)),
            "timestamp": pa.ListArray.from_arrays(pa.array(offsets), pa.array(times)),
        })
        name = f"train-{i:05d}.parquet" if i < n_parts else ("valid.parquet" if i == n_parts else "test.parquet")
        pq.write_table(table, root / "parts" / name, row_group_size=args.group_rows)
        names.append(name)
        if i < n_parts:
            counts += np.bincount(items, minlength=args.items)
    return names, counts


def prepared(root: Path, names: list[str], n_parts: int, counts: np.ndarray, sha: dict[str, str]) -> Path:
    """A prepared dataset of the first `n_parts` training parts: links to the files, a manifest, the vocabulary."""
    directory = root / f"prepared-{n_parts}"
    layout = {"train": names[:n_parts], "valid": [names[-2]], "test": [names[-1]]}
    listing, hashes = {}, {}
    for split, files in layout.items():
        (directory / split).mkdir(parents=True)
        entries = []
        for j, name in enumerate(files):
            entry = f"{split}/part-{j:05d}.parquet"
            (directory / entry).symlink_to(root / "parts" / name)
            entries.append(entry)
            hashes[entry] = sha[name]
        rows = sum(pq.read_metadata(root / "parts" / f).num_rows for f in files)
        listing[split] = {"files": entries, "sessions": rows, "events": -1}
    seen = np.flatnonzero(counts)
    order = seen[np.argsort(-counts[seen], kind="stable")]  # by decreasing count, as ItemVocab.fit orders them
    ItemVocab(pa.array(order), counts[order]).save(directory / "vocab.parquet")
    hashes["vocab.parquet"] = digest(directory / "vocab.parquet").removeprefix("sha256:")  # checked when it is read
    manifest = {"format": "sessrec-prepared", "version": VERSION, "source": {"synthetic": True},
                "settings": {"min_item_count": 1, "max_vocab_size": None},
                "splits": listing, "sha256": hashes}
    manifest[HASH] = content_hash(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def epoch(directory: Path, kind: str, args: argparse.Namespace) -> dict:
    """One training epoch of the loader `kind` over the prepared dataset in `directory` (the child process's work)."""
    import torch  # only the children train: the parent, which writes the parts, does without torch and Lightning

    from sessrec.tasks import SessionDataModule

    torch.set_num_threads(1)
    options = {"streaming": True, "shuffle_buffer": args.buffer} if kind.startswith("streaming") else {
        "vocab_path": str(directory / "vocab.parquet")}
    source = PreparedSource(str(directory))  # every part read whole by the in-memory loader
    dm = SessionDataModule(source=source, max_length=MAX_LENGTH, batch_size=args.batch, **options)
    dm.vocab  # noqa: B018 - the vocabulary is part of the base, not of the data
    base = peak_mb()
    start = time.perf_counter()
    batches, sessions, touched = 0, 0, 0
    loader = dm.train_dataloader()
    if kind.startswith("streaming"):
        loader.prefetch = kind == "streaming"
    for batch in loader:
        if args.step_ms:
            time.sleep(args.step_ms / 1000)
        batches += 1
        sessions += len(batch)
        touched += int(batch.items.sum())
    seconds = time.perf_counter() - start
    return {"loader": kind, "sessions": int(json.loads((directory / "manifest.json").read_text())["splits"]["train"]["sessions"]),
            "batches": batches, "rows_seen": sessions, "peak_rss_mb": round(peak_mb()), "base_rss_mb": round(base),
            "data_mb": round(peak_mb() - base), "seconds": round(seconds, 2), "sessions_per_s": round(sessions / seconds),
            "batch_size": args.batch, "shuffle_buffer": args.buffer if kind.startswith("streaming") else None,
            "step_ms": args.step_ms,
            "group_rows": args.group_rows, "items": args.items, "max_length": MAX_LENGTH}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1_000_000, 5_000_000],
                        help="training sessions of each prepared dataset (multiples of --part-sessions)")
    parser.add_argument("--items", type=int, default=1_000_000, help="catalogue size")
    parser.add_argument("--part-sessions", type=int, default=250_000, help="sessions per parquet part")
    parser.add_argument("--group-rows", type=int, default=65_536, help="sessions per row group")
    parser.add_argument("--buffer", type=int, default=65_536, help="the streaming loader's shuffle buffer (rows)")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--loaders", nargs="+", choices=["memory", "streaming", "streaming-serial"],
                        default=["memory", "streaming"])
    parser.add_argument("--step-ms", type=float, default=0.0, help="wait this long after each batch (a device step)")
    parser.add_argument("--quick", action="store_true",
                        help="seconds, for CI: 20,000 and 100,000 sessions, 10,000 items, parts of 20,000 sessions, "
                             "row groups of 4,096, a buffer of 8,192")
    parser.add_argument("--child", nargs=2, metavar=("DIR", "LOADER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.items, args.part_sessions, args.group_rows, args.buffer = [20_000, 100_000], 10_000, 20_000, 4096, 8192
    if args.child:
        print(json.dumps(epoch(Path(args.child[0]), args.child[1], args)))
        return
    if any(n % args.part_sessions for n in args.sessions):
        parser.error(f"--sessions must be multiples of --part-sessions ({args.part_sessions})")
    with tempfile.TemporaryDirectory(prefix="streaming_memory-") as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        names, counts = write_parts(root, max(args.sessions) // args.part_sessions, args)
        sha = {name: digest(root / "parts" / name).removeprefix("sha256:") for name in names}
        print(f"wrote {max(args.sessions):,} sessions in {time.perf_counter() - start:.0f} s", file=sys.stderr)
        flags = ["--items", str(args.items), "--group-rows", str(args.group_rows), "--buffer", str(args.buffer),
                 "--batch", str(args.batch), "--step-ms", str(args.step_ms)]
        for n in sorted(args.sessions):
            directory = prepared(root, names, n // args.part_sessions, counts, sha)
            records = {}
            for loader in args.loaders:
                done = subprocess.run([sys.executable, __file__, "--child", str(directory), loader, *flags],
                                      capture_output=True, text=True, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
                if done.returncode != 0:
                    raise SystemExit(f"{loader} at {n} sessions failed:\n{done.stderr[-3000:]}")
                records[loader] = json.loads(done.stdout.splitlines()[-1])
                print(json.dumps(records[loader]), flush=True)
            if "memory" in records and "streaming" in records:
                mem, stream = records["memory"], records["streaming"]
                print(json.dumps({"sessions": n, "peak_rss_ratio_memory_to_streaming": round(mem["peak_rss_mb"] / stream["peak_rss_mb"], 2),
                                  "data_mb_memory": mem["data_mb"], "data_mb_streaming": stream["data_mb"],
                                  "speed_ratio_streaming_to_memory": round(stream["sessions_per_s"] / mem["sessions_per_s"], 2)}),
                      flush=True)


if __name__ == "__main__":
    main()
