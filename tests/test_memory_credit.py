"""``credit=memory_tree`` in the collector's terms: reads from step records, the rule through the
credit registry, per-update diagnostics, the example tree's PNG, and its config."""

from __future__ import annotations

import random

import pytest
from hydra import compose, initialize_config_dir

from bidswarm.algorithms.credit import (
    CREDIT_RULES,
    CreditConfig,
    bucket_brigade_credit,
    make_credit,
)
from bidswarm.algorithms.credit.memory_tree import MemoryTree, MemoryTreeConfig
from bidswarm.config import ConfigError, register_configs, validate
from bidswarm.coordination.base import Decision
from bidswarm.envs.memory import MemoryTrace, Note, Read
from bidswarm.rollout.batches import credited_batches
from bidswarm.rollout.memory_credit import draw_example_tree, episode_reads, memory_tree_metrics
from bidswarm.rollout.records import Episode, Reply, StepRecord
from conftest import CONF

ROLES = ["searcher", "opener", "finder"]
LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]


def step(index, actor, bid, reward=0.0, reads=(), wrote=None, text="act"):
    trace = MemoryTrace(
        tuple(Read(s, ROLES[w], score) for s, w, score in reads),
        Note(index, ROLES[actor], wrote) if wrote else None,
    )
    return StepRecord(
        index,
        Decision(actor, winning_bid=bid),
        action=Reply(actor, [1, 2], [3], text) if actor is not None else None,
        reward=reward,
        memory=trace,
    )


def finder_note_episode() -> Episode:
    """The finder notes a name at decision 1; decision 2 is skipped; the searcher (decision 3)
    and the finder's answer (decision 4) read it; the answer is rewarded."""
    return Episode(
        seed=7,
        steps=[
            step(0, 2, 0.8, text="browser.find(born)"),
            step(1, 2, 0.8, wrote="Thithios", text="note: Thithios"),
            StepRecord(2, Decision(None)),
            step(3, 0, 0.8, reads=[(1, 2, 1.0)], text="browser.search(Thithios)"),
            step(4, 2, 0.6, reward=1.0, reads=[(1, 2, 3.0)], text="answer(Vesna)"),
        ],
    )


def test_reads_become_edges_between_acting_steps():
    # Decision 1 is acting step 1; the skipped decision 2 is no acting step.
    assert [[(e.writer, e.score) for e in r] for r in episode_reads(finder_note_episode())] == [
        [],
        [],
        [(1, 1.0)],
        [(1, 3.0)],
    ]


def test_a_note_from_before_the_episode_has_no_writer_here():
    episode = Episode(seed=0, steps=[step(5, 0, 0.8, reads=[(2, 1, 1.0)])])
    assert episode_reads(episode) == [[]]


def test_the_registry_builds_the_tree_rule_from_the_credit_config():
    rule = make_credit(tree_config(base="bucket_brigade", memory_share=0.25))
    assert rule.config == tree_config(memory_share=0.25)
    assert type(make_credit(CreditConfig("bucket_brigade"))) is CREDIT_RULES["bucket_brigade"]
    with pytest.raises(ValueError, match=r"credit\.base"):
        make_credit(tree_config(base="random"))
    with pytest.raises(ValueError, match="configured by CreditConfig"):  # takes no parameters
        make_credit(MemoryTreeConfig("random", memory_share=0.5))


def tree_config(**parameters) -> MemoryTreeConfig:
    return MemoryTreeConfig("memory_tree", **parameters)


def test_credited_batches_give_the_writer_its_share():
    episode = finder_note_episode()
    rule = MemoryTree(tree_config(memory_share=0.5, temperature=1.0, max_depth=2))
    batches, discarded = credited_batches([episode], rule, random.Random(0), LEVELS)
    plain, plain_discarded = credited_batches(
        [episode], make_credit(CreditConfig("bucket_brigade")), random.Random(0), LEVELS
    )
    roots, lost = bucket_brigade_credit([0.0, 0.0, 0.0, 1.0], [0.8, 0.8, 0.8, 0.6])
    assert discarded == plain_discarded == pytest.approx(lost)
    by_agent = {batch.agent: batch.credit for batch in batches}
    plain_by_agent = {batch.agent: batch.credit for batch in plain}
    # The answer (finder, acting step 3) gives half its root to the note (finder, step 1); the
    # search (searcher, step 2) gives half of its own.
    answer, search, note = roots[3], roots[2], roots[1]
    assert by_agent[2] == pytest.approx([roots[0], note + answer / 2 + search / 2, answer / 2])
    assert by_agent[0] == pytest.approx([search / 2])
    assert sum(map(sum, by_agent.values())) == pytest.approx(sum(map(sum, plain_by_agent.values())))


def test_diagnostics_per_role_and_entropy():
    episode = finder_note_episode()
    rule = MemoryTree(tree_config(memory_share=0.5))
    metrics = memory_tree_metrics([episode], rule, ROLES, LEVELS)
    roots, _ = bucket_brigade_credit([0.0, 0.0, 0.0, 1.0], [0.8, 0.8, 0.8, 0.6])
    assert metrics["memory/writer_share/finder"] == pytest.approx(
        (roots[2] + roots[3]) / 2 / sum(roots)
    )
    assert metrics["memory/writer_share/searcher"] == 0.0
    assert metrics["memory/writer_share"] == metrics["memory/writer_share/finder"]
    assert metrics["memory/edge_entropy"] == 0.0  # each reader read one note
    assert metrics["memory/reads_per_step"] == pytest.approx(2 / 4)


def test_writer_share_counts_what_the_writers_keep_down_a_chain():
    """The searcher's note is read by the opener, whose note the finder's rewarded step reads:
    of the finder's root r2 the opener keeps a quarter and passes a quarter on to the
    searcher, which also keeps half of the opener's root r1. Writers keep (r1 + r2) / 2 of the
    roots, not the (r1 + 1.5 r2) / 2 that passed down read edges."""
    episode = Episode(
        seed=3,
        steps=[
            step(0, 0, 0.8, wrote="need wood", text="note: need wood"),
            step(1, 1, 0.8, reads=[(0, 0, 1.0)], wrote="wood coming", text="note: wood coming"),
            step(2, 2, 0.6, reward=1.0, reads=[(1, 1, 1.0)], text="craft"),
        ],
    )
    rule = MemoryTree(tree_config(memory_share=0.5, max_depth=2))
    metrics = memory_tree_metrics([episode], rule, ROLES, LEVELS)
    (r0, r1, r2), _ = bucket_brigade_credit([0.0, 0.0, 1.0], [0.8, 0.8, 0.6])
    total = r0 + r1 + r2
    assert metrics["memory/writer_share/opener"] == pytest.approx(r2 / 4 / total)
    assert metrics["memory/writer_share/searcher"] == pytest.approx((r2 / 4 + r1 / 2) / total)
    assert metrics["memory/writer_share/finder"] == 0.0
    assert metrics["memory/writer_share"] == pytest.approx((r1 + r2) / 2 / total)


def test_the_example_tree_is_drawn(tmp_path):
    path = draw_example_tree(
        [finder_note_episode()], MemoryTree(), ROLES, LEVELS, tmp_path / "tree.png"
    )
    assert path.read_bytes()[:4] == b"\x89PNG"


# -- config ----------------------------------------------------------------------------------------
register_configs()


def compose_train(overrides):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("train", overrides=overrides, return_hydra_config=False)


def test_memory_experiment_composes_and_validates():
    for credit in ("bucket_brigade", "memory_tree"):
        cfg = compose_train(["experiment=memory", f"credit={credit}"])
        validate(cfg)
        assert cfg.task.memory.size >= 1 and cfg.task.private_inventory
    assert cfg.credit.memory_share == 0.5


@pytest.mark.parametrize(
    "override, key",
    [
        ("credit.memory_share=1.5", "credit.memory_share"),
        ("credit.temperature=0", "credit.temperature"),
        ("credit.max_depth=-1", "credit.max_depth"),
        ("credit.base=random", "credit.base"),
        ("task.memory.top_k=0", "task.memory.top_k"),
        ("task.memory.note_words=0", "task.memory.note_words"),
        ("task.memory.size=0", "task.private_inventory"),
    ],
)
def test_bad_memory_values_fail_naming_the_key(override, key):
    cfg = compose_train(["experiment=memory", "credit=memory_tree", override])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(cfg)
