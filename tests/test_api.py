"""The curated public API: everything in ``__all__`` imports, and nothing private leaks in."""

import sessrec
import sessrec.artifacts
import sessrec.data
import sessrec.models
import sessrec.pipeline
import sessrec.tasks


def test_top_level_api():
    assert set(sessrec.__all__) == {
        "BSARecEncoder", "BertEncoder", "CausalLanguageModeling", "ClickRanker", "ElectraEncoder", "EventLogSource", "GPT2Encoder", "GRU4RecEncoder", "HSTUEncoder",
        "ItemVocab", "MaskedItemModeling", "NextItemTask", "PermutationLanguageModeling", "Pipeline", "ReplacedTokenDetection",
        "SASRecEncoder", "SRGNNSource", "Schema", "SchemaError", "SessionBatch", "SessionDataModule", "SessionModel", "SessionRecommender",
        "SyntheticSource", "TopKMetrics", "UserSequenceSource", "XLNetEncoder",
    }


def test_every_exported_name_exists():
    for module in (sessrec, sessrec.artifacts, sessrec.data, sessrec.models, sessrec.tasks, sessrec.pipeline):
        for name in module.__all__:
            assert not name.startswith("_")
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"


def test_models_do_not_import_lightning():
    import ast
    from pathlib import Path

    for path in Path(sessrec.models.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not any(n.startswith(("pytorch_lightning", "lightning")) for n in names), path.name


def test_nothing_imports_upward():
    """data -> embeddings -> models -> artifacts -> tasks -> pipeline -> deploy -> cli: a package imports only from its left."""
    import ast
    from pathlib import Path

    order = ["data", "embeddings", "models", "artifacts", "tasks", "pipeline", "deploy", "cli"]
    root = Path(sessrec.__file__).parent
    for i, package in enumerate(order[:-1]):
        above = tuple(f"sessrec.{p}" for p in order[i + 1 :])
        for path in (root / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
            assert not any(n.startswith(above) for n in names), f"{path.relative_to(root)} imports from {above}"


RETIRED = ("state", "from_state", "get_config", "get_state", "set_state", "from_state_dict", "to_bytes", "from_bytes")


def library_classes() -> list[type]:
    """Every public class defined in a sessrec module (every module imported)."""
    import importlib
    import inspect
    import pkgutil

    classes = set()
    for info in pkgutil.walk_packages(sessrec.__path__, "sessrec."):
        if info.name.endswith(".__main__"):
            continue  # runs a command when imported
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and value.__module__ == module.__name__ and not name.startswith("_"):
                classes.add(value)
    return sorted(classes, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def test_one_persistence_vocabulary():
    """Directories: ``save_pretrained`` / ``from_pretrained``; in memory: ``state_dict`` / ``load_state_dict``."""
    from sessrec.pipeline import Pipeline

    classes = library_classes()
    assert Pipeline in classes and len(classes) > 100
    defining = [f"{c.__module__}.{c.__qualname__}.{name}" for c in classes for name in RETIRED
                if any(name in k.__dict__ for k in c.__mro__ if k.__module__.startswith("sessrec"))]
    assert defining == []
    assert not hasattr(Pipeline, "save") and not hasattr(Pipeline, "load")
    for name in ("save_pretrained", "from_pretrained"):
        assert callable(getattr(Pipeline, name))
