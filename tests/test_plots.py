"""benchmarks/plots.py draws the figures the docs link, from the committed JSON, and the docs agree
with that JSON.

- the script runs on `docs/figures/data/*.json` and writes every figure as a PNG of the fixed size;
- every `figures/*.png` linked from docs/results.md and docs/benchmarks.md is one the script writes
  (and is committed), and every figure it writes is linked;
- every number a figure draws is a number of the doc that shows it (the tables and the plots come
  from the same figures);
- the two docs stay short references: under 250 lines each, no narration of runs or sessions.

matplotlib is in the `dev` extra: without it these tests fail, they do not skip.
"""

import importlib.util
import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "plots.py"
DATA = ROOT / "docs" / "figures" / "data"
DOCS = {"results": ROOT / "docs" / "results.md", "benchmarks": ROOT / "docs" / "benchmarks.md"}
# which doc shows (and tabulates) each figure
SHOWN_IN = {
    "accuracy_vs_time.png": "results",
    "pipeline_stages.png": "results",
    "pipeline_ablations.png": "results",
    "throughput_ratios.png": "benchmarks",
}
NARRATION = [
    r"\bissues?\b",
    r"\bsession of \d",
    r"\brun [A-Z]\b",
    r"\b\d{1,2}:\d{2}(?:-\d{1,2}:\d{2})? UTC\b",
    r"\bearlier rounds?\b",
    r"\bfor the record\b",
    r"\bwe (?:learned|tried|found)\b",
    r"\bthis session\b",
    r"\bdevelopment machine\b",
    r"\bother engineers?\b",
    r"\bcommit `?[0-9a-f]{7,40}\b",
    r"\b(?:before|after|since|at) `[0-9a-f]{7,40}`",
]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def plots():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.fail("matplotlib is missing: it is in the dev extra (pip install -e '.[dev]')")
    spec = importlib.util.spec_from_file_location("sessrec_benchmark_plots", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def written(tmp_path_factory, plots):
    """The script run as the docs say, on the committed JSON, into a scratch folder."""
    out = tmp_path_factory.mktemp("figures")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--data", str(DATA), "--out", str(out)],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return out


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert head[12:16] == b"IHDR", f"{path}: no IHDR chunk first"
    return struct.unpack(">II", head[16:24])


def expected_size(plots, name: str) -> tuple[int, int]:
    width, height = plots.SIZES[name]
    return round(width * plots.DPI), round(height * plots.DPI)


def doc_numbers(text: str) -> set[float]:
    """Every number of a doc, as floats ("1,773" is 1773, "−0.0309" and "+0.0000" are signed)."""
    text = text.replace("\u2212", "-")
    out = set()
    for match in re.finditer(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?", text):
        token = match.group().replace(",", "")
        try:
            value = float(token)
        except ValueError:
            continue
        out.update({round(value, 6), round(abs(value), 6)})
    return out


def linked_figures(text: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(figures/([^)\s]+\.png)\)", text)


@pytest.mark.slow
def test_the_script_writes_every_figure_as_a_png_of_its_size(plots, written):
    assert sorted(p.name for p in written.glob("*.png")) == sorted(plots.SIZES)
    for name in plots.SIZES:
        assert png_size(written / name) == expected_size(plots, name), name


def test_the_docs_link_exactly_the_figures_the_script_writes(plots):
    linked = {name for path in DOCS.values() for name in linked_figures(path.read_text())}
    assert linked == set(plots.SIZES), f"linked {sorted(linked)}, written {sorted(plots.SIZES)}"
    for name in linked:  # committed next to the docs, as the script writes them
        committed = ROOT / "docs" / "figures" / name
        assert committed.exists(), f"{committed} is linked but not there: run python benchmarks/plots.py"
        assert png_size(committed) == expected_size(plots, name), name
    for doc, path in DOCS.items():
        text = path.read_text()
        assert "python benchmarks/plots.py" in text, f"docs/{path.name} does not say how its figures are made"
        for name in linked_figures(text):
            assert SHOWN_IN[name] == doc, f"{name} is linked from docs/{path.name}"


def test_every_plotted_number_is_in_the_doc_that_shows_it(plots):
    values = plots.plotted_values(plots.load(DATA))
    numbers = {doc: doc_numbers(path.read_text()) for doc, path in DOCS.items()}
    for name, points in values.items():
        assert points, f"{name} draws nothing"
        missing = [(label, v) for label, v in points if round(v, 6) not in numbers[SHOWN_IN[name]]]
        assert not missing, f"{name}: plotted but not in docs/{SHOWN_IN[name]}.md: {missing}"


def test_spot_checks_against_the_tables(plots):
    data = plots.load(DATA)
    results = DOCS["results"].read_text()
    benchmarks = DOCS["benchmarks"].read_text()
    accuracy = plots.accuracy_series(data)
    xlnet = {m: v for m, _, v, *_ in accuracy["diginetica"]["points"]}["XLNet MLM"]
    assert re.search(rf"\| XLNet, MLM \| [^|]* \| \*\*{xlnet:.4f}\*\* \|", results)
    # a point trained on a GPU carries its device (drawn hollow) and is marked so in the table
    toys = {(m, device): v for m, _, v, _, device in accuracy["s3rec_toys"]["points"]}
    assert {m for m, device in toys if device == "H100"} == {"HSTU"}
    assert re.search(rf"\| HSTU \| .* \| {toys['HSTU', 'H100']:.4f} / \*\*[0-9.]+\*\* \| [^|]*\*H100\* \|", results)
    stages = {ds: plots.stage_series(data)[ds]["recall@20"][plots.STAGES[1]] for ds in ("diginetica", "rsc15_100k")}
    assert (
        f"| candidate recall: the target among the 200 | {stages['diginetica']:.4f} | {stages['rsc15_100k']:.4f} |"
        in results
    )
    ablations = plots.ablation_series(data)["recall@20"]["retriever-xlnet"]
    assert f"| retriever XLNet-MLM | not run | {ablations['rsc15_100k']:+.4f} /" in results
    ratios = dict(plots.ratio_series(data)[0][2])
    assert f"| 512 (the recipes' batch) | 25.7 M | 1.01 M | **{ratios['batch 512']}x** |" in benchmarks


def test_a_run_over_seeds_is_drawn_from_its_means(plots):
    """``pipeline_eval.py --seeds N`` prints each seed's lines, then their means (``seeds``): the stages
    are drawn from the means, an ablation against the full pipeline of its own seeds."""
    def line(system, r20, **extra):
        return {"system": system, "dataset": "tmall", "recall@20": r20, "mrr@20": r20 / 2, **extra}

    retriever = {"retrieval_recall@50": 0.5}
    per_seed = [
        line("gpt2", 0.30, stage1_seed=0, **retriever), line("gpt2", 0.32, stage1_seed=1, **retriever),
        line("pipeline-gbdt", 0.40, stage1_seed=0, ranker_seed=0), line("pipeline-dlrm", 0.38, stage1_seed=0, ranker_seed=0),
        line("pipeline-without-retriever-gpt2", 0.35, stage1_seed=0, ranker_seed=0),
        line("pipeline", 0.38, stage1_seed=0, ranker_seed=0, candidate_recall=0.6),
        line("pipeline-gbdt", 0.44, stage1_seed=1, ranker_seed=1), line("pipeline-dlrm", 0.42, stage1_seed=1, ranker_seed=1),
        line("pipeline", 0.42, stage1_seed=1, ranker_seed=1, candidate_recall=0.62),
    ]
    means = [
        line("gpt2", 0.31, seeds=2, **retriever), line("pipeline-gbdt", 0.42, seeds=2),
        line("pipeline-dlrm", 0.40, seeds=2), line("pipeline", 0.40, seeds=2, candidate_recall=0.61),
    ]
    data = {"pipeline_eval": {"runs": [{"command": "pipeline_eval.py --dataset tmall --seeds 2", "lines": per_seed + means}]}}
    assert [r["system"] for r in plots.lines(data, "pipeline_eval")] == [
        "pipeline-without-retriever-gpt2", "gpt2", "pipeline-gbdt", "pipeline-dlrm", "pipeline"]
    assert len(plots.lines(data, "pipeline_eval", per_seed=True)) == len(per_seed) + len(means)
    stages = plots.stage_series(data)["tmall"]["recall@20"]
    assert list(stages.values()) == [0.31, 0.61, 0.40, 0.42, 0.40]
    assert plots.ablation_series(data)["recall@20"]["retriever-gpt2"] == {"tmall": -0.05}  # 0.35 - 0.40 (seed 0)


def test_the_data_names_its_commands_and_machine():
    for path in sorted(DATA.glob("*.json")):
        data = json.loads(path.read_text())
        assert "2-core" in data["machine"], path.name
        for run in data["runs"]:
            command = run["command"]
            assert re.match(
                r"(OMP_NUM_THREADS=1 )?(sessrec fit|sessrec test|python benchmarks/\w+\.py)", command
            ), command
            for script in re.findall(r"benchmarks/\w+\.py", command):
                assert (ROOT / script).exists(), command
            assert run["lines"], path.name


def test_the_output_is_deterministic(plots, tmp_path):
    data = plots.load(DATA)
    for attempt in ("a", "b"):
        (tmp_path / attempt).mkdir()
        plots.draw_ablations(data, tmp_path / attempt / "pipeline_ablations.png")
    first, second = ((tmp_path / a / "pipeline_ablations.png").read_bytes() for a in ("a", "b"))
    assert first == second
    assert b"tIME" not in first and b"Software" not in first


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_the_docs_are_short_references(doc):
    text = DOCS[doc].read_text()
    assert len(text.splitlines()) < 250, f"docs/{doc}.md has {len(text.splitlines())} lines"
    for pattern in NARRATION:
        found = re.search(pattern, text, flags=re.IGNORECASE)
        assert not found, f"docs/{doc}.md narrates: {found.group()!r} ({pattern})"
