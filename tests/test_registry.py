"""Saved configs build only registered classes, and nothing they name is imported or run.

Hostile ``config.json`` files (model directories) and ``pipeline.json`` files name a function, a
module, an unregistered class, a registered class of the wrong base, or nest 10,000 levels deep:
each is refused with one line naming the file and the key path, and a sentinel
module (whose import writes a marker file) proves nothing named was imported. Then the resolver
itself: aliases, the expected base taken from constructor annotations, a user's class.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from sessrec.artifacts import SessionRecommender
from sessrec.baselines import VSKNN, Popularity
from sessrec.data import ItemVocab
from sessrec.models import CausalLanguageModeling, GRU4RecEncoder, MaskedItemModeling
from sessrec.saved import registry
from sessrec.saved.directory import write_description
from sessrec.saved.registry import ConfigError, Configurable, instantiate, register, resolve
from sessrec.tasks import NextItemTask
from sessrec.tasks.losses import CatalogueLoss, FullSoftmax, SampledSoftmax

torch.set_num_threads(1)
SENTINEL = "sentinel_xyz"
DEEP = 10_000


# --------------------------------------------------------------------------- fixtures
@pytest.fixture
def sentinel(tmp_path, monkeypatch):
    """A module on sys.path whose import writes a marker file; after the test: never imported."""
    marker = tmp_path / "sentinel-was-imported"
    module_dir = tmp_path / "modules"
    module_dir.mkdir()
    (module_dir / f"{SENTINEL}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n\n\nclass Thing:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(module_dir))
    monkeypatch.delitem(sys.modules, SENTINEL, raising=False)
    yield marker
    assert not marker.exists(), "the sentinel module was imported"
    assert SENTINEL not in sys.modules


@pytest.fixture(scope="module")
def vocab() -> ItemVocab:
    return ItemVocab.fit(pa.array(np.arange(1, 12)))


@pytest.fixture(scope="module")
def task(vocab) -> NextItemTask:
    torch.manual_seed(0)
    task = NextItemTask(num_items=len(vocab), max_length=5, encoder=GRU4RecEncoder(d_model=8),
                        objective=CausalLanguageModeling(), loss=SampledSoftmax(num_samples=4))
    task.vocab = vocab
    return task


@pytest.fixture(scope="module")
def saved_model(task, tmp_path_factory) -> Path:
    return task.recommender().save_pretrained(tmp_path_factory.mktemp("saved") / "model")


@pytest.fixture(scope="module")
def pipeline(task, vocab):
    from sessrec.pipeline import BaselineRetriever, Pipeline, SeenItemsFilter, SessionModelRetriever

    sessions = torch.tensor([[0, 2, 3, 4, 5], [0, 6, 7, 8, 9], [2, 4, 6, 8, 10]])
    retrievers = {"model": (SessionModelRetriever(task.model, task.objective), 5),
                  "pop": (BaselineRetriever(Popularity()).fit(sessions, len(vocab)), 5)}
    return Pipeline(vocab, retrievers, max_length=5, history_length=5, filters=[SeenItemsFilter()])


@pytest.fixture(scope="module")
def saved_pipeline(pipeline, tmp_path_factory) -> Path:
    return pipeline.save_pretrained(tmp_path_factory.mktemp("saved") / "pipeline")


def with_config(source: Path, target: Path, name: str, edit: Any) -> Path:
    """A copy of the directory `source` whose JSON file `name` is `edit(config)` (or what `edit` wrote in it)."""
    directory = shutil.copytree(source, target)
    config = json.loads((directory / name).read_text())
    changed = edit(config)
    if isinstance(changed, str):
        (directory / name).write_text(changed)
    else:  # its content hash recomputed, as a hostile writer would: what the registry refuses is under test
        write_description(directory, name, config)
    return directory


def refused(load: Any, *args: Any) -> str:
    with pytest.raises(ValueError) as info:
        load(*args)
    message = str(info.value)
    assert "\n" not in message
    return message


def deep(levels: int) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


# --------------------------------------------------------------------------- model directories
def test_a_saved_model_round_trips_through_the_registry(saved_model, task):
    loaded = SessionRecommender.from_pretrained(saved_model)
    assert isinstance(loaded.model.encoder, GRU4RecEncoder) and isinstance(loaded.objective, CausalLanguageModeling)
    items = torch.tensor([[0, 2, 3, 4, 5]])
    assert torch.equal(loaded.scores(items), task.eval().model(items, task.objective))


FN = {"class_path": "os.system", "init_args": {"command": "touch pwned"}}
IMPORT = {"class_path": "sessrec.import_module", "init_args": {"name": SENTINEL}}
THING = {"class_path": f"{SENTINEL}.Thing", "init_args": {}}
CLM = "sessrec.models.CausalLanguageModeling"

# (case id, section: "objective", or the model's "encoder" or "side_info", value there, key path in the message,
# message after it)
HOSTILE = [
    ("function", "objective", FN, "objective", r"'os.system' is not registered; import the module that defines it"),
    ("import_module", "encoder", IMPORT, "model.init_args.encoder",
     r"'sessrec.import_module' is not a registered class; a saved config builds only registered classes \("),
    ("module", "encoder", {"class_path": "sessrec.tasks"}, "model.init_args.encoder", "'sessrec.tasks' is not a registered class"),
    ("sentinel-module", "objective", {"class_path": SENTINEL}, "objective", f"'{SENTINEL}' is not a registered class"),
    ("sentinel-class", "encoder", THING, "model.init_args.encoder", f"'{SENTINEL}.Thing' is not registered; import the module"),
    ("unregistered-library-class", "encoder", {"class_path": "sessrec.models.dlrm.DenseArch"},
     "model.init_args.encoder", "'sessrec.models.dlrm.DenseArch' is not a registered class"),
    ("loss-as-encoder", "encoder", {"class_path": "sessrec.tasks.losses.FullSoftmax"}, "model.init_args.encoder",
     "'sessrec.tasks.losses.FullSoftmax' is a registered class, but not a Module, which this key takes"),
    ("class-as-an-int", "encoder", {"class_path": "sessrec.models.GRU4RecEncoder", "init_args": {"d_model": THING}},
     "model.init_args.encoder.init_args.d_model", f"'{SENTINEL}.Thing' is not registered"),
    ("init-args-a-list", "objective", {"class_path": CLM, "init_args": [IMPORT]},
     "objective.init_args", "the arguments of CausalLanguageModeling must be a mapping, got list"),
    ("class-path-not-a-string", "objective", {"class_path": ["os", "system"]}, "objective", "class_path must be a string, got list"),
    ("unknown-argument", "objective", {"class_path": CLM, "init_args": {"cmd": IMPORT}},
     "objective.init_args.cmd", "CausalLanguageModeling takes no argument 'cmd'"),
    ("arguments-to-a-base-without-any", "objective",
     {"class_path": "sessrec.models.objective.Objective", "init_args": {"x": IMPORT}},
     "objective.init_args.x", "Objective takes no argument 'x'"),
    ("extra-key", "objective", {**FN, "class_path": CLM, "dict_kwargs": IMPORT},
     "objective", r"a class config holds only class_path and init_args, not \['dict_kwargs'\]"),
    ("too-deep", "side_info", {"class_path": "sessrec.models.side_info.SideInfoEmbedding", "init_args": {"spec": {
        "class_path": "sessrec.data.side.SideInfoSpec", "init_args": {"categorical": json.loads(deep(40))}}}},
     "model.init_args.side_info.init_args.spec.init_args.categorical.a", "nested deeper than 32 levels$"),
]


@pytest.mark.parametrize("section, value, where, message", [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_a_hostile_model_config_is_refused_before_anything_is_imported(
    sentinel, saved_model, tmp_path, section, value, where, message
):
    def edit(config: dict) -> None:
        if section in ("encoder", "side_info"):
            config["model"]["init_args"][section] = value
        else:
            config[section] = value

    model = with_config(saved_model, tmp_path / "model", "config.json", edit)
    got = refused(SessionRecommender.from_pretrained, model)
    assert got.startswith(f"{model / 'config.json'}: {where}") and re.search(message, got), got


@pytest.mark.parametrize("model_config, message", [
    ({"class_path": "sessrec.models.GRU4RecEncoder", "init_args": {"d_model": 8}},
     "model: 'sessrec.models.GRU4RecEncoder' is a registered class, but not a SessionModel"),
    ({"class_path": "sessrec.tasks.NextItemTask"}, "model: 'sessrec.tasks.NextItemTask' is a registered class, but not a SessionModel"),
    ([THING], "model: expected a {class_path, init_args} mapping, got list"),
    (THING, f"model: '{SENTINEL}.Thing' is not registered"),
], ids=["encoder-as-model", "a-task", "a-list", "sentinel"])
def test_the_network_itself_must_be_the_class_asked_for(sentinel, saved_model, tmp_path, model_config, message):
    model = with_config(saved_model, tmp_path / "model", "config.json", lambda c: c.update(model=model_config))
    got = refused(SessionRecommender.from_pretrained, model)
    assert got.startswith(f"{model / 'config.json'}: {message}"), got


def test_a_config_nested_10000_levels_is_one_line(sentinel, saved_model, tmp_path):
    model = with_config(saved_model, tmp_path / "model", "config.json",
                        lambda config: json.dumps(config)[:-1] + f', "x": {deep(DEEP)}}}')
    assert refused(SessionRecommender.from_pretrained, model) == f"{model / 'config.json'}: nested too deeply to be a saved description"


# --------------------------------------------------------------------------- pipeline directories
def test_a_saved_pipeline_round_trips_through_the_registry(pipeline, saved_pipeline):
    from sessrec.pipeline import BaselineRetriever, Pipeline, SeenItemsFilter, SessionModelRetriever

    loaded = Pipeline.from_pretrained(saved_pipeline)
    model, pop = loaded.retrievers["model"][0], loaded.retrievers["pop"][0]
    assert isinstance(model, SessionModelRetriever) and isinstance(model.model.encoder, GRU4RecEncoder)
    assert isinstance(model.objective, CausalLanguageModeling)
    assert isinstance(pop, BaselineRetriever) and isinstance(pop.baseline, Popularity)
    assert isinstance(loaded.filters[1], SeenItemsFilter)
    sessions = [[3, 4], [5, 6, 7], [2]]
    assert loaded.recommend(sessions, k=4) == pipeline.recommend(sessions, k=4)


def _set(path: str, value: Any):
    """An edit of pipeline.json that puts `value` at the dotted `path` (list indices as numbers)."""
    def edit(spec: dict) -> None:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node = spec
        for p in parents:
            node = node[p]
        node[last] = value
    return edit


PIPELINE_HOSTILE = [
    ("network-encoder", "retrievers.0.config.init_args.model.init_args.encoder", THING,
     "retrievers[0].config.init_args.model.init_args.encoder", f"'{SENTINEL}.Thing' is not registered"),
    ("network", "retrievers.0.config.init_args.model", IMPORT, "retrievers[0].config.init_args.model",
     "'sessrec.import_module' is not a registered class"),
    ("network-a-task", "retrievers.0.config.init_args.model", {"class_path": "sessrec.tasks.NextItemTask"},
     "retrievers[0].config.init_args.model", "'sessrec.tasks.NextItemTask' is a registered class, but not a SessionModel"),
    ("network-encoder-a-loss", "retrievers.0.config.init_args.model.init_args.encoder",
     {"class_path": "sessrec.tasks.losses.FullSoftmax"}, "retrievers[0].config.init_args.model.init_args.encoder",
     "is a registered class, but not a Module"),
    ("objective", "retrievers.0.config.init_args.objective", THING, "retrievers[0].config.init_args.objective",
     f"'{SENTINEL}.Thing' is not registered"),
    ("objective-for-another-encoder", "retrievers.0.config.init_args.objective",
     {"class_path": "sessrec.models.MaskedItemModeling"}, "retrievers[0].config",
     "MaskedItemModeling predicts hidden items from the context on both sides"),
    ("retriever-class", "retrievers.0.config.class_path", f"{SENTINEL}.Thing", "retrievers[0].config",
     f"'{SENTINEL}.Thing' is not registered"),
    ("retriever-class-an-index", "retrievers.0.config.class_path", "ExactIndex", "retrievers[0].config",
     "'ExactIndex' is a registered class, but not a Retriever"),
    ("index-class", "retrievers.0.config.init_args.index.class_path", "os.system", "retrievers[0].config.init_args.index",
     "'os.system' is not registered"),
    ("baseline", "retrievers.1.config.init_args.baseline", {"class_path": "sessrec.tasks.NextItemTask"},
     "retrievers[1].config.init_args.baseline", "'sessrec.tasks.NextItemTask' is a registered class, but not a SessionBaseline"),
    ("baseline-sentinel", "retrievers.1.config.init_args.baseline", THING, "retrievers[1].config.init_args.baseline",
     f"'{SENTINEL}.Thing' is not registered"),
    ("filter-class", "filters.0.config.class_path", "sessrec.tasks", "filters[0].config",
     "'sessrec.tasks' is not a registered class"),
    ("filter-class-a-retriever", "filters.0.config.class_path", "CoVisitation", "filters[0].config",
     "'CoVisitation' is a registered class, but not a SeenItemsFilter or NonProductFilter or ItemTableFilter"),
    ("feature-ops-in-the-state", "features.state.ops",
     {"config": {"class_path": "sessrec.features.FeaturePipeline", "init_args": {"ops": {"x": THING}}}, "ops": {}},
     "features.state.ops.config.init_args.ops.x", f"'{SENTINEL}.Thing' is not registered"),
]


@pytest.mark.parametrize("path, value, where, message", [c[1:] for c in PIPELINE_HOSTILE], ids=[c[0] for c in PIPELINE_HOSTILE])
def test_a_hostile_pipeline_config_is_refused_before_anything_is_imported(
    sentinel, saved_pipeline, tmp_path, path, value, where, message
):
    from sessrec.pipeline import Pipeline

    directory = with_config(saved_pipeline, tmp_path / "pipeline", "pipeline.json", _set(path, value))
    got = refused(Pipeline.from_pretrained, directory)
    assert got.startswith(f"{directory / 'pipeline.json'}: {where}: ") and message in got, got


# --------------------------------------------------------------------------- pipelines of another format version
@pytest.mark.parametrize("version", [1, 2, 3, 5])
def test_a_pipeline_of_another_format_version_is_refused_in_one_line(saved_pipeline, tmp_path, version):
    from sessrec.pipeline import Pipeline

    directory = with_config(saved_pipeline, tmp_path / "pipeline", "pipeline.json", lambda c: c.update(version=version))
    assert refused(Pipeline.from_pretrained, directory) == (
        f"{directory / 'pipeline.json'}: a pipeline of format version {version}, which this sessrec does not read (it "
        "reads version 4): fit the pipeline again with sessrec fit --config <pipeline recipe>")


def test_a_pipeline_json_nested_10000_levels_is_one_line(sentinel, saved_pipeline, tmp_path):
    from sessrec.pipeline import Pipeline

    directory = with_config(saved_pipeline, tmp_path / "pipeline", "pipeline.json",
                            lambda spec: json.dumps(spec)[:-1] + f', "x": {deep(DEEP)}}}')
    assert refused(Pipeline.from_pretrained, directory) == f"{directory / 'pipeline.json'}: nested too deeply to be a saved description"


# --------------------------------------------------------------------------- the resolver
@pytest.fixture
def isolated(monkeypatch):
    """The registry as it is, restored after the test (classes the test registers do not stay)."""
    monkeypatch.setattr(registry, "_CLASSES", dict(registry._CLASSES))


def test_public_aliases_resolve_to_the_registered_class():
    import sessrec
    import sessrec.baselines
    import sessrec.models
    import sessrec.pipeline
    import sessrec.tasks

    assert resolve("sessrec.tasks.NextItemTask", object, "x") is NextItemTask
    assert resolve("sessrec.models.MaskedItemModeling", object, "x") is MaskedItemModeling
    assert resolve("sessrec.MaskedItemModeling", object, "x") is MaskedItemModeling  # what jsonargparse writes
    assert resolve("sessrec.baselines.VSKNN", object, "x") is VSKNN
    assert resolve("SeenItemsFilter", object, "x").__module__ == "sessrec.pipeline.filters"  # a pipeline's kind
    paths = registry.registered()
    assert all(path == f"{c.__module__}.{c.__qualname__}" for path, c in paths.items())
    names = [c.__qualname__ for path, c in paths.items() if path.startswith("sessrec.")]
    assert len(names) == len(set(names))  # so every alias sessrec.<package>.<Name> names one class
    checked = 0
    for package in (sessrec, sessrec.models, sessrec.tasks, sessrec.baselines, sessrec.pipeline):
        for name in package.__all__:
            value = getattr(package, name)
            if isinstance(value, type) and value in registry.registered().values():
                assert resolve(f"{package.__name__}.{name}", object, "x") is value
                checked += 1
    assert checked >= 30


def test_an_ambiguous_alias_is_refused(isolated):
    for module in ("fakepkg.a", "fakepkg.b"):
        register(type("Twin", (), {"__module__": module}))
    with pytest.raises(ConfigError, match=r"^f.json: k: 'fakepkg.Twin' names 2 registered classes "
                                          r"\['fakepkg.a.Twin', 'fakepkg.b.Twin'\]; give the full class path$"):
        resolve("fakepkg.Twin", object, "f.json", "k")
    assert resolve("fakepkg.a.Twin", object, "f.json").__module__ == "fakepkg.a"


class Holder(Configurable):
    """A user's class: its annotations say what each argument may be."""

    def __init__(
        self,
        loss: CatalogueLoss,
        losses: list[CatalogueLoss] | None = None,
        either: FullSoftmax | SampledSoftmax | None = None,
        table: dict | None = None,
        anything: Any = None,
    ) -> None:
        self.loss, self.losses, self.either, self.table, self.anything = loss, losses, either, table, anything


FULL = {"class_path": "sessrec.tasks.losses.FullSoftmax", "init_args": {"temperature": 2.0}}
HOLDER = f"{__name__}.Holder"


def test_a_registered_user_class_builds_with_its_annotations_checked():
    built = instantiate({"class_path": HOLDER, "init_args": {
        "loss": FULL, "losses": [FULL, {"class_path": "sessrec.tasks.losses.SampledSoftmax"}], "either": FULL,
        "table": {"a": [1, 2]}, "anything": {"class_path": "sessrec.models.GRU4RecEncoder", "init_args": {"d_model": 4}},
    }}, expected=Configurable, source="h.json")
    assert isinstance(built, Holder) and built.loss == FullSoftmax(temperature=2.0)
    assert [type(x) for x in built.losses] == [FullSoftmax, SampledSoftmax] and built.either == FullSoftmax(temperature=2.0)
    assert built.table == {"a": [1, 2]} and isinstance(built.anything, GRU4RecEncoder) and built.anything.d_model == 4


@pytest.mark.parametrize("init_args, message", [
    ({"loss": {"class_path": "sessrec.models.GRU4RecEncoder"}},
     "config.init_args.loss: 'sessrec.models.GRU4RecEncoder' is a registered class, but not a CatalogueLoss"),
    ({"loss": FULL, "losses": [FULL, {"class_path": "sessrec.models.MaskedItemModeling"}]},
     "config.init_args.losses[1]: 'sessrec.models.MaskedItemModeling' is a registered class, but not a CatalogueLoss"),
    ({"loss": FULL, "either": {"class_path": "sessrec.tasks.losses.CatalogueLoss"}},
     ("config.init_args.either: 'sessrec.tasks.losses.CatalogueLoss' is a registered class, but not a FullSoftmax or "
      "SampledSoftmax")),
    ({"loss": FULL, "table": {"x y": FULL}},
     "config.init_args.table['x y']: 'sessrec.tasks.losses.FullSoftmax': this key holds plain values, not a class"),
    ({"loss": FULL, "either": "FullSoftmax", "nope": 1}, "config.init_args.nope: Holder takes no argument 'nope'"),
], ids=["wrong-base", "wrong-base-in-a-list", "outside-a-union", "class-in-a-plain-dict", "unknown-argument"])
def test_the_expected_base_comes_from_the_constructor_annotation(init_args, message):
    with pytest.raises(ConfigError) as info:
        instantiate({"class_path": HOLDER, "init_args": init_args}, expected=Holder, source="h.json")
    assert str(info.value).startswith(f"h.json: {message}"), str(info.value)


def test_the_caller_gives_the_top_level_base():
    with pytest.raises(ConfigError, match=r"^s: config: 'sessrec.tasks.losses.FullSoftmax' is a registered class, but "
                                          r"not a Holder or Popularity, which this key takes$"):
        instantiate(FULL, expected=(Holder, Popularity), source="s")
    assert instantiate(FULL, expected=(Holder, CatalogueLoss), source="s") == FullSoftmax(temperature=2.0)


def test_register_lets_a_plain_class_build_and_the_message_says_how(isolated):
    class Plain:
        def __init__(self, size: int = 1) -> None:
            self.size = size

    path = f"{Plain.__module__}.{Plain.__qualname__}"
    with pytest.raises(ConfigError, match=rf"^s: config: '{path}' is not registered; import the module that defines it "
                                          r"\(subclasses of Configurable register themselves; the sessrec command: "
                                          r"--import MODULE\) or call "
                                          r"sessrec.saved.registry.register\(Plain\) before loading$"):
        instantiate({"class_path": path, "init_args": {"size": 3}}, expected=object, source="s")
    register(Plain)
    assert instantiate({"class_path": path, "init_args": {"size": 3}}, expected=object, source="s").size == 3


def test_only_classes_can_be_registered():
    with pytest.raises(TypeError, match="register takes a class, got function"):
        register(lambda: None)


@pytest.mark.parametrize("signature, named", [("self, *widths: int", "*widths"), ("self, d_model: int, /", "d_model")])
def test_a_configurable_whose_arguments_no_config_can_name_is_refused_where_it_is_defined(isolated, signature, named):
    """Its config recorded them by name, which no saved model directory could build again: refused at the class, not
    at the first load of a model saved with it."""
    with pytest.raises(TypeError, match=rf"^Stack.__init__ takes {re.escape(named)}, which a config cannot name: a "
                                        r"Configurable is rebuilt from its arguments by name; make each a keyword argument$"):
        exec(f"class Stack(Configurable):\n    def __init__({signature}) -> None:\n        pass", {"Configurable": Configurable})
    assert not [path for path in registry.registered() if path.endswith("Stack")]


BUILT: list[str] = []


class Recorder(Configurable):
    """A user's class that notes each construction."""

    def __init__(self, name: str = "") -> None:
        BUILT.append(name)


def test_nothing_is_built_before_the_whole_config_resolves():
    BUILT.clear()
    recorder = {"class_path": f"{__name__}.Recorder", "init_args": {"name": "first"}}
    config = {"class_path": HOLDER, "init_args": {"anything": recorder, "loss": FULL, "either": FN}}
    with pytest.raises(ConfigError, match="^s: config.init_args.either: 'os.system' is not registered"):
        instantiate(config, expected=Holder, source="s")
    assert BUILT == []  # the valid parts before the refused one were not constructed
    config["init_args"]["either"] = FULL
    assert instantiate(config, expected=Holder, source="s").anything is not None and BUILT == ["first"]


def test_depth_and_size_are_bounded():
    config: dict = {"class_path": HOLDER, "init_args": {"loss": FULL, "anything": {}}}
    node = config["init_args"]["anything"]
    for _ in range(DEEP):  # built as Python objects: the walk stops at its own limit, not at the interpreter's
        node["a"] = {}
        node = node["a"]
    with pytest.raises(ConfigError, match=r"^s: config.init_args.anything(\.a){31}: nested deeper than 32 levels$"):
        instantiate(config, expected=Holder, source="s")
    many = {"class_path": HOLDER, "init_args": {"loss": FULL, "anything": list(range(registry.MAX_VALUES))}}
    with pytest.raises(ConfigError, match=rf"holds more than {registry.MAX_VALUES} values$"):
        instantiate(many, expected=Holder, source="s")


def test_a_constructor_that_refuses_its_arguments_is_one_line_at_its_key():
    config = {"class_path": HOLDER, "init_args": {"loss": {"class_path": "sessrec.tasks.losses.FullSoftmax",
                                                           "init_args": {"temperature": 0.0}}}}
    with pytest.raises(ConfigError, match=r"^s: config.init_args.loss: the saved arguments do not build a FullSoftmax "
                                          r"\(temperature must be a finite positive number, got 0.0\)$"):
        instantiate(config, expected=Holder, source="s")


def test_a_users_own_class_loads_where_the_user_names_its_module(tmp_path: Path) -> None:
    """A saved config naming a user's class builds it only once the user's module is imported: SESSREC_IMPORT (or
    ``sessrec --import``) names it, inherited by the processes a command starts; without it, one line says how."""
    import os
    import subprocess

    (tmp_path / "mylib_parts.py").write_text(
        "from sessrec.saved.registry import Configurable\n\n\n"
        "class Halver(Configurable):\n"
        "    def __init__(self, factor: float = 0.5) -> None:\n"
        "        self.factor = factor\n"
    )
    config = {"class_path": "mylib_parts.Halver", "init_args": {"factor": 0.25}}
    script = ("from sessrec.saved.registry import instantiate\n"
              f"print(instantiate({config!r}, expected=object, source='c.json').factor)")
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo)])}
    env.pop("SESSREC_IMPORT", None)
    run = lambda **extra: subprocess.run([sys.executable, "-c", script], env={**env, **extra}, capture_output=True,  # noqa: E731
                                         text=True, cwd=tmp_path)
    without = run()
    assert without.returncode == 1 and "c.json: config: 'mylib_parts.Halver' is not registered" in without.stderr
    assert "the sessrec command: --import MODULE" in without.stderr
    assert run(SESSREC_IMPORT="mylib_parts").stdout.strip() == "0.25"
    missing = run(SESSREC_IMPORT="mylib_parts, no_such_module_xyz")
    assert "ValueError: SESSREC_IMPORT: module 'no_such_module_xyz' cannot be imported (No module named" in missing.stderr


def test_the_import_flag_is_taken_out_of_any_command_and_named_modules_imported(monkeypatch) -> None:
    import os

    from sessrec.cli import user_modules

    monkeypatch.setenv("SESSREC_IMPORT", "")  # restored when the test ends, whatever user_modules writes
    assert user_modules(["--import", "json", "serve", "--model_dir", "m", "--import=csv"]) == ["serve", "--model_dir", "m"]
    assert os.environ["SESSREC_IMPORT"] == "json,csv"
    with pytest.raises(ValueError, match=r"^--import needs a module name \(--import mylib.encoders\)$"):
        user_modules(["serve", "--import", "--model_dir", "m"])
    with pytest.raises(ValueError, match=r"^SESSREC_IMPORT: module 'no_such_module_xyz' cannot be imported"):
        user_modules(["--import", "no_such_module_xyz", "serve"])


def test_a_class_of_the_script_being_run_is_refused_at_save_with_nothing_written(tmp_path):
    """A saved config names a class by its module, and ``__main__`` is another module in every other process:
    a model or pipeline holding a class the running script defines is refused when saved, in one line."""
    import subprocess

    script = f"""
import torch
import numpy as np, pyarrow as pa
from sessrec.data import ItemVocab
from sessrec.models import CausalLanguageModeling, GRU4RecEncoder
from sessrec.pipeline import Pipeline, SessionModelRetriever
from sessrec.tasks import NextItemTask

class MyGRU(GRU4RecEncoder):
    pass

vocab = ItemVocab.fit(pa.array(np.arange(1, 12)))
task = NextItemTask(num_items=len(vocab), max_length=5, encoder=MyGRU(d_model=8), objective=CausalLanguageModeling())
task.vocab = vocab
for save in (lambda: task.recommender().save_pretrained({str(tmp_path / 'model')!r}),
             lambda: Pipeline(vocab, {{"model": (SessionModelRetriever(task.model, task.objective), 5)}},
                              max_length=5).save_pretrained({str(tmp_path / 'pipeline')!r})):
    try:
        save()
    except ValueError as err:
        print(err)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    tail = (": MyGRU is defined in the script being run (__main__), which no other process can import to read the "
            "saved model; define it in a module and import it from there (the sessrec command: --import MODULE)")
    assert out.stdout.splitlines() == [f"{tmp_path / 'model' / 'config.json'}: model.init_args.encoder{tail}",
                                       f"{tmp_path / 'pipeline' / 'pipeline.json'}: retrievers[0].config.init_args.model"
                                       f".init_args.encoder{tail}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []
