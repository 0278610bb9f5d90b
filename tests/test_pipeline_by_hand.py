"""A pipeline of five items whose lists are worked out by hand, and the settings that would lose a stage.

Co-visitation with its defaults (pairs up to 5 apart in both orders, weight 1 / distance, rows normalised; a
session's query: its last distinct items weighted 0.5 ** r, r = 0 the latest) and a filter of the session's
items, no ranker: the lists are the co-visitation scores of the unseen items, best first.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from test_pipeline_sessions import MAX_LENGTH, HandSessions

from sessrec.baselines import VSKNN, Popularity
from sessrec.data import ItemVocab
from sessrec.pipeline.filters import SeenItemsFilter
from sessrec.pipeline.ordering import DiversityCap, Ordering
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.retrieval.baseline_retriever import BaselineRetriever
from sessrec.pipeline.retrieval.covisitation import CoVisitation
from sessrec.pipeline_training.recipe import BaselineRetrieval, ModelRetrieval, PipelineRecipe
from sessrec.tasks import SessionDataModule

torch.set_num_threads(1)

# raw ids 100..500 are model ids 2..6 (by count); training sessions, right-aligned
VOCAB = ItemVocab(pa.array([100, 200, 300, 400, 500]), np.array([5, 4, 3, 2, 1]))
TRAIN = torch.tensor([[2, 3, 4], [0, 3, 4], [0, 2, 5], [0, 4, 6]])


def hand_pipeline(**options) -> Pipeline:
    retrievers = options.pop("retrievers", {"cv": (CoVisitation().fit(TRAIN, len(VOCAB)), 10)})
    return Pipeline(VOCAB, retrievers, max_length=5, max_candidates=10, filters=[SeenItemsFilter()], **options)


def test_lists_are_the_co_visitation_scores_of_the_unseen_items() -> None:
    # W before normalising: 2->{3: 1, 4: 1/2, 5: 1}, 3->{2: 1, 4: 2}, 4->{2: 1/2, 3: 2, 6: 1}, 5->{2: 1}, 6->{4: 1}
    w = {2: {3: 0.4, 4: 0.2, 5: 0.4}, 3: {2: 1 / 3, 4: 2 / 3}, 4: {2: 1 / 7, 3: 4 / 7, 6: 2 / 7}, 5: {2: 1.0}, 6: {4: 1.0}}
    pipe = hand_pipeline()
    # [100, 300] = [2, 4]: 4 weighs 1, 2 weighs 0.5; 2 and 4 are seen
    expected = {3: w[4][3] + 0.5 * w[2][3], 6: w[4][6], 5: 0.5 * w[2][5]}  # 0.7714, 0.2857, 0.2
    got = pipe.recommend([[100, 300]], k=5)[0]
    assert got["item_ids"] == [200, 500, 400]
    assert got["scores"] == pytest.approx([expected[3], expected[6], expected[5]], abs=1e-6)
    # a repeat counts once, at its latest event: [100, 300, 100] queries 2 with 1 and 4 with 0.5
    got = pipe.recommend([[100, 300, 100]], k=5)[0]
    assert got["item_ids"] == [200, 400, 500]
    assert got["scores"] == pytest.approx([w[2][3] + 0.5 * w[4][3], w[2][5], 0.5 * w[4][6]], abs=1e-6)
    # k past the candidates returns what there is; a batch gives each session its own list
    batch = pipe.recommend([[100, 300], [200], [500]], k=50)
    assert [r["item_ids"] for r in batch] == [[200, 500, 400], [300, 100], [300]]
    assert batch[1]["scores"] == pytest.approx([2 / 3, 1 / 3], abs=1e-6)
    assert pipe.recommend([[100, 300]], k=2)[0]["item_ids"] == [200, 500]
    # a session of unknown ids co-visits with nothing
    assert pipe.recommend([[999, 998]], k=5) == [{"item_ids": [], "scores": []}]


@pytest.mark.parametrize("name", ["a/b", "../up", "a\\b", ""])
def test_a_retriever_name_that_is_no_file_name_is_refused(name: str) -> None:
    """A retriever is saved as retriever-<name>.safetensors: a name with a folder in it is refused when the pipeline
    is built, not when it is saved after its fit."""
    cv = CoVisitation().fit(TRAIN, len(VOCAB))
    with pytest.raises(ValueError, match="^" + re.escape(f"retriever name {name!r}: a retriever is saved as retriever-<name>")):
        hand_pipeline(retrievers={name: (cv, 10)})


@pytest.mark.parametrize("k", [0, 2.5, True])
def test_a_retriever_k_that_is_no_count_is_refused(k) -> None:
    cv = CoVisitation().fit(TRAIN, len(VOCAB))
    with pytest.raises(ValueError, match=rf"^retriever 'cv': K must be an integer >= 1, got {k!r}$"):
        hand_pipeline(retrievers={"cv": (cv, k)})


def test_retrievers_of_one_name_are_refused(tmp_path) -> None:
    """A pipeline keeps its retrievers by name: a baseline named as a model or as the co-visitation retriever would
    silently replace it."""
    dm = SessionDataModule(source=HandSessions(), max_length=MAX_LENGTH)
    pop = {"covisitation": BaselineRetrieval(Popularity(), k=8)}
    with pytest.raises(ValueError, match=r"^baselines.covisitation: 'covisitation' names the recipe's co-visitation "
                                         r"retriever \(covisitation:\).* rename baselines.covisitation$"):
        PipelineRecipe(data=dm, baselines=pop, covisitation=CoVisitation(), output=str(tmp_path / "p"))
    with pytest.raises(ValueError, match=r"^baselines.pop: 'pop' also names models.pop, .* rename one of them$"):
        PipelineRecipe(data=dm, models={"pop": ModelRetrieval("runs/x/model")},
                       baselines={"pop": BaselineRetrieval(Popularity(), k=8)}, output=str(tmp_path / "p"))
    # apart, both are kept
    recipe = PipelineRecipe(data=dm, baselines={"pop": BaselineRetrieval(Popularity(), k=8)}, covisitation=CoVisitation(),
                            max_candidates=8, output=str(tmp_path / "p"))
    assert list(recipe.build().retrievers) == ["pop", "covisitation"]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: hand_pipeline(history_length=7.5), "history_length must be an integer >= 1, got 7.5"),
        (lambda: hand_pipeline(history_length=True), "history_length must be an integer >= 1, got True"),
        (lambda: SeenItemsFilter(window=1.5), "SeenItemsFilter window must be an integer >= 1 or None (whole session), got 1.5"),
        (lambda: SeenItemsFilter(window=True), "SeenItemsFilter window must be an integer >= 1 or None (whole session), got True"),
        (lambda: DiversityCap("categories.parquet", 1.5), "DiversityCap max_per_category must be an integer >= 1, got 1.5"),
        (lambda: DiversityCap("categories.parquet", True), "DiversityCap max_per_category must be an integer >= 1, got True"),
    ],
)
def test_a_count_that_is_no_integer_is_refused(build, message: str) -> None:
    """A cap of 1.5 kept two items of a category and True one, a history_length or a window of 1.5 failed inside
    the first request (a slice index), True kept one event: each is refused when built."""
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        build()


def test_a_cap_keeps_its_count_of_a_category(tmp_path) -> None:
    path = tmp_path / "categories.parquet"
    pq.write_table(pa.table({"item_id": [200, 400, 500], "category": [1, 1, 1]}), path)
    capped = hand_pipeline(ordering=Ordering(diversity=DiversityCap(str(path), 2)))
    assert capped.recommend([[100, 300]], k=5)[0]["item_ids"] == [200, 500]  # 400, the third of category 1, goes


@pytest.mark.parametrize("batch_size", [0, -1, 2.5])
def test_a_recipe_batch_size_that_is_no_count_is_refused(tmp_path, batch_size) -> None:
    """0 failed in the ranker's fit on range()'s message and -1 with an IndexError traceback: refused when read."""
    dm = SessionDataModule(source=HandSessions(), max_length=MAX_LENGTH)
    with pytest.raises(ValueError, match="^" + re.escape(f"batch_size must be an integer >= 1, got {batch_size!r}") + "$"):
        PipelineRecipe(data=dm, covisitation=CoVisitation(), batch_size=batch_size, output=str(tmp_path / "p"))


def test_the_retrievers_spend_their_k_on_products_only() -> None:
    """Virtual items (input-only: page views, searches) co-visit like products but are never recommended: a
    retriever's K holds products only, else the pipeline's filter leaves fewer candidates than K."""
    vocab = ItemVocab(pa.array([100, 200, 300, 900]), np.array([4, 1, 1, 2]), num_virtual=1)  # 900 is model id 5
    train = torch.tensor([[0, 2, 5], [0, 2, 5], [0, 2, 3], [0, 2, 4]])
    # W[2] = {5: 2, 3: 1, 4: 1} / 4: the virtual item co-visits most
    retrievers = {"cv": (CoVisitation().fit(train, len(vocab)), 2), "knn": (BaselineRetriever(VSKNN()).fit(train, len(vocab)), 2)}
    pipe = Pipeline(vocab, retrievers, max_length=5, max_candidates=4)
    found = pipe.retrieve(pipe.wrap(torch.tensor([[2]])))
    assert found["cv"].items.tolist() == [[3, 4]] and found["cv"].scores.tolist() == [[0.25, 0.25]]
    assert found["knn"].items.tolist() == [[2, 3]]  # every neighbour holds 2, two of them the virtual 5
    assert pipe.recommend([[100]], k=5)[0]["item_ids"] == [200, 300, 100]  # by co-visitation: 0.25, 0.25, 0
    assert pipe.recommend([[900]], k=5)[0]["item_ids"] == []  # a request's ids are products: 900 is OOV there


def test_a_batch_of_no_sessions_gets_no_lists() -> None:
    """recommend_batch of 0 sessions (a caller's empty chunk) failed in the merge on a reshape; it returns (0, k)."""
    pipe = hand_pipeline()
    recs = pipe.recommend_batch(pipe.wrap(torch.zeros(0, 3, dtype=torch.long)), k=3)
    assert recs.items.shape == (0, 3) and recs.scores.shape == (0, 3) and pipe.decode(recs) == []
