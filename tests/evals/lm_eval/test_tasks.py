"""The passkey task YAMLs in evals/lm_eval/tasks, loaded through lm-eval's TaskManager (offline)."""

from __future__ import annotations

import pytest

from ropescale.evals.lm_eval import TASKS_DIR
from tests.evals.lm_eval.conftest import task_utils, word_tokenizer


def test_passkey_docs_are_seeded_spread_and_scored():
    u = task_utils()
    docs = u.make_docs(4096, samples=4)  # no tokenizer: estimated lengths
    assert docs == u.make_docs(4096, samples=4)
    assert [d["depth"] for d in docs] == [0.5, 0.25, 0.75, 0.125]
    assert all(d["sizing"] == "estimate" and len(d["key"]) == 5 and d["key"] in d["input"] for d in docs)
    assert docs[0]["input"].startswith(u.TASK) and docs[0]["input"].endswith(u.QUESTION)
    assert len({d["key"] for d in docs}) == 4 and u.make_docs(4096, samples=4, seed=1)[0]["key"] != docs[0]["key"]
    key = docs[0]["key"]
    assert u.process_results(docs[0], [f" {key}. Remember it."]) == {"acc": 1.0}
    assert u.process_results(docs[0], [f" 1{key}"]) == {"acc": 0.0}
    assert u.process_results(docs[0], [" the pass key"]) == {"acc": 0.0}
    with pytest.raises(ValueError, match="passkey_samples must be a positive integer"):
        u.make_docs(4096, samples=0)


def test_passkey_task_loads_through_include_path_sized_by_the_tokenizer(tiny_dir):
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata={"tokenizer": str(tiny_dir)})
    assert {"ropescale_passkey", "passkey_2k", "passkey_32k", "passkey_128k"} <= set(manager.all_tasks)
    task = manager.load(["passkey_2k"])["tasks"]["passkey_2k"]
    docs = list(task.test_docs())
    tok = word_tokenizer()
    u = task_utils()
    assert len(docs) == u.DEFAULT_SAMPLES
    for d in docs:
        n = len(tok(d["input"])["input_ids"])  # BOS included
        assert d["sizing"] == "tokenizer" and n == d["n_tokens"] <= 2048 - 16
        longer = u.build_text(d["n_filler_sentences"] + 1, d["depth"], int(d["key"]))
        assert len(tok(longer)["input_ids"]) > 2048 - 16  # the most filler that fits
    assert task.config.generation_kwargs["do_sample"] is False
    assert task.doc_to_target(docs[0]) == docs[0]["key"]


def test_passkey_group_holds_2k_to_32k(tiny_dir):
    from lm_eval.tasks import TaskManager

    manager = TaskManager(
        include_path=str(TASKS_DIR),
        include_defaults=False,
        metadata={"tokenizer": str(tiny_dir), "passkey_samples": 1},
    )
    loaded = manager.load(["ropescale_passkey"])
    assert sorted(loaded["tasks"], key=lambda n: int(n[8:-1])) == [f"passkey_{k}k" for k in (2, 4, 8, 16, 32)]
    assert [len(list(t.test_docs())) for t in loaded["tasks"].values()] == [1] * 5
