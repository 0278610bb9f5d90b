"""Write the built-in synthetic session log to files, e.g. to try ``sessrec predict``.

    python data/make_synthetic.py --out data/generated --sessions 2000

Writes ``events.csv`` (one row per event, page views included: non-product rows have an empty
``item_id``) and ``sessions.parquet`` (one row per session, product views only, list column
``item_id``), both with the raw item ids that the quickstart model is trained on.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from sessrec.data import Schema, generate_sessions
from sessrec.data import frame
from sessrec.saved.atomic import atomic_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/generated"))
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    events = generate_sessions(num_sessions=args.sessions, num_items=args.items, seed=args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    products = events.filter(pc.equal(events.column("event_type"), "product"))
    schema = Schema()
    sessions = frame.group_sessions(frame.sort_events(schema.validate(products, "synthetic"), schema), schema)
    for name, write, table in (
        ("events.csv", pacsv.write_csv, events),
        ("sessions.parquet", pq.write_table, sessions.select(["session_id", "item_id"])),
    ):
        with atomic_path(args.out / name) as tmp:
            write(table, tmp)
        print(f"wrote {args.out / name} ({table.num_rows} rows)")


if __name__ == "__main__":
    main()
