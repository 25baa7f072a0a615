"""The research task: generated world, BM25 index cache, browser tools, experts, fork contract."""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import subprocess
import sys
from dataclasses import replace

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from bidswarm.envs import TASKS, env_class
from bidswarm.envs.base import EpisodeNotRunning
from bidswarm.envs.conformance import check_fork_contract, check_task_contract, random_reply
from bidswarm.envs.experts import play_expert_episode
from bidswarm.envs.memory import MemoryConfig
from bidswarm.envs.research import ResearchConfig, ResearchEnv
from bidswarm.envs.research.config import WorldSize
from bidswarm.envs.research.corpus import (
    Document,
    document_row,
    question_row,
    read_questions,
    write_jsonl,
)
from bidswarm.envs.research.search import SearchIndex
from bidswarm.envs.research.tools import find_in_text, parse_call, snippet
from bidswarm.envs.research.world import RELATIONS, Relation, generate_world
from conftest import CONF

BID_LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("research_cache"))


@pytest.fixture(scope="module")
def world():
    return generate_world(0, n_train=1000, n_heldout=50)


@pytest.fixture
def env(cache_dir):
    return ResearchEnv(ResearchConfig(cache_dir=cache_dir))


# -- the generated world -------------------------------------------------------------------------
def test_world_is_deterministic_and_sized_as_documented(world):
    documents, questions = world
    again_documents, again_questions = generate_world(0, n_train=1000, n_heldout=50)
    assert documents == again_documents and questions == again_questions
    assert 2000 <= len(documents) <= 5000
    assert len({d.id for d in documents}) == len(documents)
    assert len({d.title for d in documents}) == len(documents)
    assert {len(q.hops) for q in questions} == {2, 3, 4}
    other_documents, _ = generate_world(1, n_train=10, n_heldout=5)
    assert other_documents != documents


def test_world_size_sets_each_kind_of_entity_and_every_question_still_resolves(tmp_path):
    size = WorldSize(regions=2, cities=6, orgs=6, people=12, events=6)
    documents, _ = generate_world(0, n_train=8, n_heldout=4, size=size)
    assert len(documents) == 2 + 6 + 6 + 12 + 6
    assert generate_world(0, n_train=8, n_heldout=4, size=size)[0] == documents
    config = ResearchConfig(
        cache_dir=str(tmp_path), min_hops=1, max_hops=1, n_train_seeds=8, n_heldout_seeds=4
    )
    env = ResearchEnv(replace(config, world_size=size))
    assert len(env.data.documents) == len(documents)
    for seed in [*range(8), *env.heldout_seeds()]:
        assert play_expert_episode(env, seed, BID_LEVELS).metrics["success"] == 1.0, seed


def test_world_facts_agree_across_pages(world):
    documents, _ = world
    by_title = {d.title: d for d in documents}
    regions = [d for d in documents if d.text.startswith("The capital of")]
    assert len(regions) == 24
    for region in regions:
        capital = region.text.split(" is ", 1)[1].split(".")[0]
        assert f"is a city in the region {region.title}." in by_title[capital].text


def test_heldout_questions_are_disjoint_and_do_not_depend_on_training_size(world):
    _, questions = world
    heldout = [q for q in questions if q.split == "heldout"]
    train = [q for q in questions if q.split == "train"]
    assert len(heldout) == 50 and len(train) == 1000
    assert not {q.question for q in heldout} & {q.question for q in train}
    _, fewer = generate_world(0, n_train=10, n_heldout=50)
    assert [q for q in fewer if q.split == "heldout"] == heldout


def test_every_hop_is_found_by_its_pattern_in_its_document(world):
    documents, questions = world
    by_id = {d.id: d for d in documents}
    for question in questions:
        assert question.answer == question.hops[-1].answer
        for hop, following in zip(question.hops, question.hops[1:], strict=False):
            assert following.subject == hop.answer  # the chain is connected
        for hop in question.hops:
            document = by_id[hop.doc_id]
            assert document.title == hop.subject
            matches = find_in_text(document.text, hop.pattern, page_words=25)
            assert matches and hop.answer in matches[0][1], (question.id, hop)


def test_searching_a_subject_lists_its_page(world, cache_dir):
    documents, questions = world
    index = SearchIndex.cached(documents, cache_dir)
    position = {d.id: i for i, d in enumerate(documents)}
    hops = [hop for q in questions[:300] for hop in q.hops]
    ranked = [[p for p, _ in index.search(hop.subject, 3)] for hop in hops]
    first = sum(r[0] == position[hop.doc_id] for r, hop in zip(ranked, hops, strict=True))
    listed = sum(position[hop.doc_id] in r for r, hop in zip(ranked, hops, strict=True))
    # "Siege of X" and "X Observatory" mention the city X more densely than its own page does;
    # the exact-title rule still ranks the page named by the query first.
    assert first == len(hops) and listed == len(hops)


def _misspelt(name: str, rng: random.Random) -> str:
    """``name`` with one letter of its longest word dropped or doubled (a near-miss copy)."""
    words = name.split()
    longest = max(range(len(words)), key=lambda i: len(words[i]))
    word = words[longest]
    at = rng.randrange(1, len(word))
    dropped, doubled = word[:at] + word[at + 1 :], word[:at] + word[at] + word[at:]
    words[longest] = dropped if rng.random() < 0.5 else doubled
    return " ".join(words)


@pytest.mark.parametrize("char_ngrams", [0, 3])
def test_a_misspelt_name_finds_its_page_with_character_ngrams(world, cache_dir, char_ngrams):
    documents, questions = world
    index = SearchIndex.cached(documents, cache_dir, char_ngrams)
    position = {d.id: i for i, d in enumerate(documents)}
    rng = random.Random(0)
    hops = [hop for q in questions[:100] for hop in q.hops]
    found = 0
    for hop in hops:
        query = _misspelt(hop.subject, rng)
        assert query != hop.subject
        hits = index.search(query, 3)
        found += bool(hits) and hits[0][0] == position[hop.doc_id]
    if char_ngrams:
        assert found / len(hops) >= 0.9, found / len(hops)
    else:  # exact words: the misspelt word matches nothing, other words of the name may
        assert found / len(hops) < 0.6, found / len(hops)


def test_a_page_titled_as_the_query_ranks_first(tmp_path):
    documents = [
        Document("a1", "Tarn Observatory", "The Tarn Observatory watches Tarn. Tarn Tarn Tarn."),
        Document("b2", "Tarn", "Tarn is a city in the region Vale with a long history of trade."),
        Document("c3", "Vale", "The capital of Vale is Tarn."),
    ]
    index = SearchIndex.build(documents)
    bm25_first = index.retriever.retrieve([["tarn"]], k=1, show_progress=False)[0][0][0]
    assert bm25_first == 0  # plain BM25 prefers the observatory
    assert [p for p, _ in index.search("Tarn", 3)] == [1, 0, 2]
    assert index.search("tarn observatory", 1)[0][0] == 0


# -- the index cache -----------------------------------------------------------------------------
def test_index_is_cached_by_corpus_hash(tmp_path):
    documents = [
        Document("a1", "Alder Guild", "The Alder Guild is led by Mira Holt."),
        Document("b2", "Mira Holt", "Mira Holt was born in Tarn."),
        Document("c3", "Tarn", "Tarn is a city in the region Vale."),
    ]
    built = SearchIndex.cached(documents, tmp_path)
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert len(folders) == 1 and (tmp_path / folders[0] / "complete.json").exists()
    loaded = SearchIndex.cached(documents, tmp_path)
    assert loaded.search("Mira Holt", 2) == built.search("Mira Holt", 2)
    assert loaded.search("Mira Holt", 2)[0][0] == 1
    assert loaded.search("unrelated words only", 2) == ()
    edited = [*documents[:2], replace(documents[2], text="Tarn is a harbour town.")]
    SearchIndex.cached(edited, tmp_path)
    assert len(list(tmp_path.iterdir())) == 2  # a changed corpus gets its own index


# -- tools and the environment -------------------------------------------------------------------
@pytest.mark.parametrize(
    "reply, expected",
    [
        ("browser.search(Krehou Guild)", ("browser.search", "Krehou Guild")),
        ('I should look. browser.open("d0170")', ("browser.open", "d0170")),
        ("browser.find( led by )\nmore text", ("browser.find", "led by")),
        ("answer(Giomgraend Press)", ("answer", "Giomgraend Press")),
    ],
)
def test_parse_call(reply, expected):
    call = parse_call(reply)
    assert (call.tool, call.argument) == expected


@pytest.mark.parametrize("reply", ["", "search for it", "browser.search(", "answer()", "0.8"])
def test_parse_call_rejects_non_calls_with_a_message(reply):
    assert isinstance(parse_call(reply), str)


def test_experts_solve_every_heldout_question_with_all_three_roles(env):
    actors = set()
    for seed in env.heldout_seeds():
        episode = play_expert_episode(env, seed, BID_LEVELS)
        assert episode.metrics["success"] == 1.0 and episode.metrics["reward"] == 1.0
        assert episode.metrics["hops_found"] == len(env.question.hops)
        assert episode.skipped == 0 and episode.decisions <= env.config.max_decisions
        actors.update(episode.actors)
        opened = {
            d.reply for d in episode.demonstrations if d.role == "opener" and d.kind == "action"
        }
        # The Opener opens the searched subject by rank, so its replies hold nothing to copy.
        assert opened == {"browser.open(1)"}
    assert actors == set(env.roles)


RELATION_OF_PHRASE: dict[str, Relation] = {
    relation.phrase: relation for kind in RELATIONS.values() for relation in kind.values()
}


def _chain_read_from(question: str) -> tuple[str, list[Relation]]:
    """The entity a generated question starts from and its relations, first hop first."""
    rest = question.removeprefix("What is ").removesuffix("?")
    relations = []
    while phrase := next((p for p in RELATION_OF_PHRASE if rest.startswith(p + " ")), None):
        relations.insert(0, RELATION_OF_PHRASE[phrase])
        rest = rest.removeprefix(phrase + " ")
    return rest.removeprefix("the "), relations


def _value_read_from(fact: str, relation: Relation) -> str:
    """What a fact sentence gives for ``relation``: its year, or the last name it holds."""
    if relation.target == "year":
        return re.findall(r"\b\d{4}\b", fact)[-1]
    return re.findall(r"[A-Z]\w*(?: (?:of )?[A-Z]\w*)*", fact)[-1]


def _expert_steps_read_from(
    text: str, open_order: bool, open_hops: bool
) -> dict[str, tuple[float, str]]:
    """Every role's (bid, reply) of the experts, read off an observation of the generated world:
    the chain's next step at 0.8; once a search result's snippet states the value the hop
    reached asks for, with ``open_order`` at the last hop the answer from it, with
    ``open_hops`` at an earlier hop the search for it, at 0.8, and the chain's step at 0.6."""
    start, relations = _chain_read_from(re.search(r"^Q: (.*)$", text, re.M)[1])
    facts = int(re.search(r"Facts: (\d+)\.", text)[1])
    title = re.search(r"Page: (?:none|d\d+ (.*) p\d+/\d+)\.", text)[1]
    last = re.search(r"^Last: (.*)$", text, re.M)[1]
    found = re.match(r'find "[^"]*" in d\d+: \[p\d+\] (.*?)(?: \[p\d+\]|$)', last)
    notes = re.search(r"^Notes: (.*)$", text, re.M)
    fact = found[1] if found else notes[1] if notes else ""
    if facts == len(relations):
        return {"finder": (0.8, f"answer({_value_read_from(fact, relations[-1])})")}
    subject = start if facts == 0 else _value_read_from(fact, relations[facts - 1])
    if title == subject:
        return {"finder": (0.8, f"browser.find({relations[facts].pattern})")}
    if not last.startswith(f'search "{subject}":'):
        return {"searcher": (0.8, f"browser.search({subject})")}
    result = re.search(rf"\[(\d+)\] d\d+ {re.escape(subject)}: ([^;]*)", last)
    steps = {"opener": (0.8, f"browser.open({result[1]})")}
    relation, final = relations[facts], facts == len(relations) - 1
    if (open_order if final else open_hops) and relation.target != "year":
        names = re.findall(r"[A-Z]\w*(?: (?:of )?[A-Z]\w*)*", result[2])
        if relation.pattern in result[2] and names and names[-1] != subject:
            shortcut = ("finder", "answer") if final else ("searcher", "browser.search")
            steps = {
                "opener": (0.6, steps["opener"][1]),
                shortcut[0]: (0.8, f"{shortcut[1]}({names[-1]})"),
            }
    return steps


@pytest.mark.parametrize(
    ("open_order", "open_hops"), [(False, False), (True, False), (False, True), (True, True)]
)
@pytest.mark.parametrize("split", ["train", "heldout"])
def test_the_experts_next_step_can_be_read_off_the_observation(
    split, open_order, open_hops, cache_dir
):
    """Every bid and action of the experts follows from the observation text alone: the
    question names the start and the relations, ``Facts`` the hop reached, the latest fact the
    next subject (or the answer), ``Page`` and ``Last`` whether to search, open or find, and
    with ``task.open_order`` or ``task.open_hops`` a search result's snippet whether the hop's
    value is already shown (a search that follows a snippet notes it, so ``Facts`` still counts
    the hops). No hidden part of the gold chain (progress, page positions) decides a
    demonstration."""
    env = ResearchEnv(
        ResearchConfig(cache_dir=cache_dir, open_order=open_order, open_hops=open_hops)
    )
    seeds = env.train_seeds()[:60] if split == "train" else env.heldout_seeds()
    steps = shortcuts = 0
    for seed in seeds:
        env.reset(seed)
        while not env.done:
            text = env.observation(None)
            expected = _expert_steps_read_from(text, open_order, open_hops)
            for other in env.roles:
                assert env.observation(other) == text
                bid, reply = expected.get(other, (0.0, None))
                assert env.expert_action(other) == reply, text
                assert env.expert_bid(other) == bid, text
            bid, reply = max(expected.values())
            assert env.expert_action(None) == reply
            shortcuts += len(expected) > 1
            env.step(next(role for role in expected if expected[role][0] == bid), reply)
            steps += 1
        assert env.episode_metrics()["success"] == 1.0, seed
        # A hop moved past from a snippet counts once noted; an answer from one leaves it out.
        assert env.episode_metrics()["hops_found"] >= len(env.question.hops) - open_order, seed
    assert steps > 300
    # One question in 10-5 (2-4 hops, 2 hops) shows its answer early, one in 2 a hop's value.
    assert (shortcuts > 0) == (open_order or open_hops)


def test_vocabulary_texts_hold_every_page_name(env):
    texts = env.vocabulary_texts()
    assert len(texts) == len(env.data.documents)
    assert all(text.startswith(d.title) for text, d in zip(texts, env.data.documents, strict=True))


def test_seeds_index_questions_and_heldout_is_disjoint(env):
    train = {env.question_for_seed(seed).id for seed in env.train_seeds()}
    heldout = {env.question_for_seed(seed).id for seed in env.heldout_seeds()}
    assert len(train) == 1000 and len(heldout) == 50 and not train & heldout
    assert env.question_for_seed(3) == env.question_for_seed(1003)  # seeds wrap around


def test_observations_stay_under_80_words(env):
    rng = random.Random(0)
    roles = [*env.roles, None]
    for seed in [*range(20), *env.heldout_seeds()[:20]]:
        env.reset(seed)
        while not env.done:
            for role in roles:
                assert len(env.observation(role).split()) < 80
            actor = rng.choice(roles)
            env.step(actor, random_reply(env, actor, rng))


def test_invalid_turns_are_wasted_with_a_message(env):
    env.reset(0)
    hop = env.question.hops[0]
    cases = [
        ("searcher", "dance wildly", "no tool call"),
        ("opener", f"browser.search({hop.subject})", "searcher owns it"),
        ("finder", "browser.find(born)", "no page is open"),
        ("opener", "browser.open(1)", "no search result"),
        ("opener", "browser.open(http://example.org)", "no page"),
        ("opener", "browser.open(d0001, 9)", "has pages 1 to"),
        ("searcher", "answer(anything)", "finder owns it"),
    ]
    for number, (role, reply, message) in enumerate(cases, start=1):
        before = env.observation(role)
        result = env.step(role, reply)
        assert not result.valid and message in result.message and result.reward == 0.0
        assert env.decisions_made == number and not env.done
        assert f"Msg: {result.message}"[:20] in env.observation(role)
        assert before.split("Last:")[1].split("\n")[0] in env.observation(role)  # screen kept
    assert env.episode_metrics()["invalid_turns"] == len(cases)


def test_tools_show_results_and_open_by_rank(env):
    env.reset(0)
    hop = env.question.hops[0]
    assert env.step("searcher", f"browser.search({hop.subject})").valid
    assert hop.doc_id in env.observation("opener")
    assert env.step("opener", "browser.open(1)").valid
    assert f"Page: {hop.doc_id} {hop.subject} p1/" in env.observation("finder")
    assert "Facts: 0." in env.observation("finder")
    assert env.step("finder", f"browser.find({hop.pattern})").valid
    assert hop.answer in env.observation("searcher")
    assert "Facts: 1." in env.observation("searcher")
    assert env.step("finder", "browser.find(zzzz)").valid
    assert "no match" in env.observation("finder")
    assert hop.answer in env.observation("finder").split("Notes:")[1]  # the fact stays in notes


def test_wrong_answer_ends_with_zero_reward_and_monolithic_owns_every_tool(env):
    env.reset(5)
    assert env.step(None, f"browser.search({env.question.hops[0].subject})").valid
    assert env.step(None, f"browser.open({env.question.hops[0].doc_id})").valid
    result = env.step(None, "answer(Nobody Special)")
    assert result.valid and result.done and result.reward == 0.0
    assert env.episode_metrics()["success"] == 0.0 and env.episode_metrics()["decisions"] == 3
    state = env.snapshot()
    with pytest.raises(EpisodeNotRunning, match="after the episode ended"):
        env.step(None, "answer(again)")
    assert env.snapshot() == state and env.decisions_made == 3


def test_budget_ends_the_episode(cache_dir):
    env = ResearchEnv(ResearchConfig(cache_dir=cache_dir, max_decisions=3))
    env.reset(1)
    assert not env.skip().done and not env.step("finder", "browser.find(x)").done
    assert env.skip().done and env.done and env.episode_metrics()["reward"] == 0.0


OPEN_ORDERS = [{"open_order": True}, {"open_hops": True}, {"open_order": True, "open_hops": True}]
"""The task options that leave the experts' order open (docs/environments.md)."""


@pytest.mark.parametrize("options", [{}, *OPEN_ORDERS], ids=str)
def test_fork_contract(cache_dir, options):
    def make():
        return ResearchEnv(ResearchConfig(cache_dir=cache_dir, **options))

    check_fork_contract(make, list(range(12)))
    check_task_contract(make, [0, 1, 2])
    check_fork_contract(make, [1_000_000, 1_000_007])


@pytest.mark.parametrize(
    ("options", "low", "high"),
    [({"open_order": True}, 3, 25), ({"open_hops": True}, 15, 45), (OPEN_ORDERS[2], 15, 45)],
    ids=str,
)
def test_an_open_order_moves_on_sooner_and_contests_the_steps_it_opens(
    cache_dir, options, low, high
):
    """``task.open_order`` / ``task.open_hops``: the experts answer every held-out question,
    never take more decisions than the paper's experts on it, and fewer on some: exactly the
    questions where a step was contested (a hop's value already on screen, the Opener bidding
    the longer way, 0.6): what forks compare."""
    paper = ResearchEnv(ResearchConfig(cache_dir=cache_dir))
    opened = ResearchEnv(ResearchConfig(cache_dir=cache_dir, **options))
    sooner = contested = 0
    for seed in paper.heldout_seeds():
        before = play_expert_episode(paper, seed, BID_LEVELS)
        after = play_expert_episode(opened, seed, BID_LEVELS)
        assert after.metrics["success"] == 1.0 and after.skipped == 0
        assert after.decisions <= before.decisions
        sooner += after.decisions < before.decisions
        bids = [float(d.reply) for d in after.demonstrations if d.kind == "bid"]
        states = [sorted(bids[i : i + 3]) for i in range(0, len(bids), 3)]
        contested += any(state[-2] > 0.0 for state in states)
        assert all(state[-1] > state[-2] for state in states)  # the experts never tie at the top
    assert sooner == contested and low <= sooner <= high  # of 50 held-out questions


@pytest.mark.parametrize("key", ["open_order", "open_hops"])
def test_an_open_order_with_private_results_is_refused_naming_the_key(cache_dir, key):
    config = ResearchConfig(
        cache_dir=cache_dir, private_results=True, memory=MemoryConfig(size=2), **{key: True}
    )
    with pytest.raises(ValueError, match=rf"task\.{key}=True"):
        ResearchEnv(config)


def test_a_search_for_a_name_a_snippet_shows_notes_that_snippet(cache_dir):
    """``task.open_hops``: a search that follows a snippet on screen notes the snippet's line,
    so ``Facts`` and ``Notes`` show the hop reached; other searches, and every search in the
    paper's task, note nothing."""
    for open_hops in (False, True):
        env = ResearchEnv(ResearchConfig(cache_dir=cache_dir, open_hops=open_hops))
        seed = next(s for s in env.train_seeds() if _first_hop_in_snippet(env, s))
        hop = env.question.hops[0]
        env.step("searcher", f"browser.search({hop.subject})")
        env.step("searcher", "browser.search(zzz unrelated words)")
        assert "Facts: 0." in env.observation(None)  # no result of the first search shows it
        env.reset(seed)
        env.step("searcher", f"browser.search({hop.subject})")
        env.step("searcher", f"browser.search({hop.answer.lower()})")
        screen = env.observation(None)
        assert ("Facts: 1." in screen) == open_hops, screen
        assert (f"Notes: {hop.subject}: " in screen) == open_hops, screen
        assert env.episode_metrics()["hops_found"] == float(open_hops)


def _first_hop_in_snippet(env: ResearchEnv, seed: int) -> bool:
    """Reset ``env`` to ``seed``; whether its first hop's page has the hop's value in its
    snippet."""
    env.reset(seed)
    hop = env.question.hops[0]
    document = env.data.documents[env.data.position[hop.doc_id]]
    return hop.answer in snippet(document.title, document.text)


def test_snapshot_is_plain_data(env):
    env.reset(2)
    env.step(None, env.expert_action(None))
    state = env.snapshot()
    assert json.loads(json.dumps(state)) == state
    assert pickle.loads(pickle.dumps(state)) == state


def test_registered_in_tasks():
    assert TASKS["research"] is ResearchEnv
    assert env_class("research") is ResearchEnv


# -- own corpus files ----------------------------------------------------------------------------
def _write_small_corpus(tmp_path, world, n_heldout=3, n_train=5):
    documents, questions = world
    heldout = [q for q in questions if q.split == "heldout"][:n_heldout]
    train = [q for q in questions if q.split == "train"][:n_train]
    corpus, questions_path = tmp_path / "corpus.jsonl", tmp_path / "questions.jsonl"
    write_jsonl(corpus, (document_row(d) for d in documents))
    write_jsonl(questions_path, (question_row(q) for q in heldout + train))
    return corpus, questions_path


def test_own_jsonl_corpus_and_questions(tmp_path, world):
    corpus, questions_path = _write_small_corpus(tmp_path, world)
    config = ResearchConfig(
        corpus_path=str(corpus),
        questions_path=str(questions_path),
        n_heldout_seeds=3,
        cache_dir=str(tmp_path / "cache"),
    )
    env = ResearchEnv(config)
    assert [q.id for q in env.data.heldout] == [q.id for q in read_questions(questions_path)][:3]
    for seed in env.heldout_seeds():
        assert play_expert_episode(env, seed, BID_LEVELS).metrics["success"] == 1.0
    with pytest.raises(ValueError, match="n_heldout_seeds=50"):
        ResearchEnv(replace(config, n_heldout_seeds=50))


def test_questions_without_hops_still_play(tmp_path, world):
    corpus, _ = _write_small_corpus(tmp_path, world)
    questions_path = tmp_path / "plain.jsonl"
    title = world[0][0].title
    rows = [
        {"id": f"q{i}", "question": f"Who leads {title}?", "answer": "x", "split": split}
        for i, split in enumerate(["heldout", "train"])
    ]
    write_jsonl(questions_path, rows)
    config = ResearchConfig(
        corpus_path=str(corpus),
        questions_path=str(questions_path),
        n_heldout_seeds=1,
        cache_dir=str(tmp_path / "cache"),
    )
    episode = play_expert_episode(ResearchEnv(config), 0, BID_LEVELS)
    assert episode.metrics["success"] == 0.0 and episode.actors[:2] == ["searcher", "opener"]


def test_bad_question_file_names_the_line(tmp_path):
    path = tmp_path / "questions.jsonl"
    write_jsonl(path, [{"id": "q", "question": "?", "answer": "a", "split": "test"}])
    with pytest.raises(ValueError, match=r"questions\.jsonl:1: field 'split'"):
        read_questions(path)


# -- config ----------------------------------------------------------------------------------------
def test_yaml_composes_onto_the_schema():
    # Composed as a primary config here, so its schema is looked up at the root.
    ConfigStore.instance().store(name="research_schema", node=ResearchConfig)
    with initialize_config_dir(str(CONF / "task"), version_base="1.3"):
        cfg = compose("research")
    config = OmegaConf.to_object(cfg)
    assert isinstance(config, ResearchConfig)
    assert config == ResearchConfig()  # the YAML states the schema's defaults, nothing else


@pytest.mark.parametrize(
    "change, key",
    [
        ({"judge": "vibes"}, "task.judge"),
        ({"judge": "llm"}, "task.judge_url"),
        ({"corpus_path": "c.jsonl"}, "task.corpus_path"),
        ({"min_hops": 5}, "task.min_hops"),
        ({"f1_threshold": 0.0}, "task.f1_threshold"),
        ({"world_size": WorldSize(people=0)}, "task.world_size.people"),
        ({"world_size": WorldSize(regions=30, cities=20)}, "task.world_size.cities"),
    ],
)
def test_bad_values_fail_naming_the_key(change, key, cache_dir):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        ResearchEnv(ResearchConfig(cache_dir=cache_dir, **change))


@pytest.mark.parametrize("chosen", [None, "cuda"])
def test_the_search_index_keeps_jax_off_the_gpu_unless_the_user_chose(chosen):
    """bm25s runs JAX at import when JAX is installed; left alone, JAX's GPU backend takes 75%
    of the GPU for its pool. Importing our search module pins JAX to the CPU, and keeps a
    platform the user set."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    if chosen:
        env["JAX_PLATFORMS"] = chosen
    code = "import os, bidswarm.envs.research.search; print(os.environ['JAX_PLATFORMS'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (chosen or "cpu")
