"""The shared memory (``envs/memory.py``) and every task's use of it: notes in replies, reads in
observations and on steps, forks, the experts' notes, the private-results research variant."""

from __future__ import annotations

import re

import pytest

from bidswarm.envs import TASKS, env_class
from bidswarm.envs.base import TextEnv
from bidswarm.envs.conformance import check_fork_contract
from bidswarm.envs.experts import play_expert_episode
from bidswarm.envs.memory import MemoryConfig, SharedMemory, overlap_score, split_note
from bidswarm.envs.research import ResearchConfig, ResearchEnv
from test_experts import expert_decisions

BID_LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]
MEMORY = MemoryConfig(size=4, top_k=2, note_words=6)


def make(name: str, memory: MemoryConfig = MEMORY, **fields) -> TextEnv:
    cls = env_class(name)
    return cls(cls.Config(name=name, memory=memory, **fields))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("research_cache"))


@pytest.fixture(scope="module")
def private_env(cache_dir):
    return ResearchEnv(
        ResearchConfig(cache_dir=cache_dir, max_hops=2, memory=MEMORY, private_results=True)
    )


# -- the memory itself ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "reply, expected",
    [
        ("mine stone", ("mine stone", None)),
        ("mine stone note: iron at depth 12", ("mine stone", "iron at depth 12")),
        ("note: Krath Dorn", ("", "Krath Dorn")),
        ("browser.search(X)\nNOTE:  two   words\n", ("browser.search(X)", "two words")),
        ("note:", ("", "")),
    ],
)
def test_split_note(reply, expected):
    assert split_note(reply) == expected


def test_notes_are_cut_counted_and_the_oldest_forgotten():
    memory = SharedMemory(MemoryConfig(size=2, top_k=2, note_words=3))
    assert memory.write(0, "miner", "iron ore at depth 23") == (memory.notes[0], True)
    assert memory.notes[0].text == "iron ore at"
    memory.write(1, "smith", "need planks")
    memory.write(4, "miner", "coal ore")
    assert [note.step for note in memory.notes] == [1, 4]
    assert memory.metrics() == {"memory/notes": 3.0, "memory/notes_cut": 1.0}
    assert memory.write(5, "smith", "   ") == (None, False)  # nothing to keep


def test_reads_are_the_top_k_by_overlap_newest_first_among_equals():
    memory = SharedMemory(MemoryConfig(size=8, top_k=2, note_words=8))
    for step, text in enumerate(["coal ore", "iron ore at depth 23", "trees", "iron ore"]):
        memory.write(step, "miner", text)
    reads = memory.read("near: depth 23, stone, iron layer, 2 iron ore")
    assert [(r.step, r.score) for r in reads] == [(1, 4.0), (3, 2.0)]
    assert memory.show(reads) == "Memo: miner: iron ore | miner: iron ore at depth 23"
    assert overlap_score("Iron ORE", "iron-ore!") == 2.0


def test_bad_memory_values_name_the_key():
    with pytest.raises(ValueError, match=r"task\.memory\.top_k"):
        make("crafting", MemoryConfig(size=2, top_k=0))
    with pytest.raises(ValueError, match=r"task\.memory\.size"):
        make("navigation", MemoryConfig(size=-1))


# -- off by default ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(TASKS))
def test_off_by_default_a_note_is_just_text(name):
    env = make(name, MemoryConfig())
    env.reset(0)
    assert not env.memory.enabled
    assert env.observation(env.roles[0]) == env.screen(env.roles[0])
    result = env.step(env.roles[0], "note: nothing")
    assert result.memory is None and not result.valid
    assert "Memo" not in env.observation(env.roles[0])
    assert not any(key.startswith("memory/") for key in env.episode_metrics())


# -- on: reads and writes on the step, forks carry them -------------------------------------------
@pytest.mark.parametrize("name", sorted(TASKS))
def test_a_note_is_written_read_and_recorded_on_the_step(name):
    env = make(name)
    env.reset(1)
    role = env.roles[0]
    first = env.step(role, "note: look left of the depth 12 kitchen")
    assert first.valid and first.memory.wrote.text == "look left of the depth 12"
    assert first.memory.cut and first.memory.reads == ()
    assert env.decisions_made == 1  # a note-only turn spends a decision
    shown = env.observation(env.roles[1])
    assert shown.endswith(f"Memo: {role}: look left of the depth 12")
    second = env.step(env.roles[1], (env.expert_action(env.roles[1]) or "pass") + " note: x")
    assert [read.step for read in second.memory.reads] == [0]
    assert second.memory.reads[0].writer == role
    assert second.memory.wrote.step == 1
    assert env.episode_metrics()["memory/notes"] == 2.0
    assert env.episode_metrics()["memory/notes_cut"] == 1.0


@pytest.mark.parametrize("name", sorted(TASKS))
def test_fork_contract_with_the_memory_on(name):
    check_fork_contract(lambda: make(name), seeds=[0, 1, 2, 5])


def test_snapshot_holds_the_notes():
    env = make("crafting")
    env.reset(3)
    env.step("miner", "note: iron ore at depth 23")
    state = env.snapshot()
    env.step("smith", "note: later")
    env.restore(state)
    assert [note.text for note in env.memory.notes] == ["iron ore at depth 23"]
    env.reset(3)
    assert env.memory.notes == []


# -- the experts write notes and still decide from the observation -------------------------------
@pytest.mark.parametrize(
    "name, fields, episodes",
    [
        ("crafting", {}, 80),
        ("navigation", {}, 60),
        ("research", {}, 60),
        ("research", {"private_results": True, "max_hops": 2}, 120),
        ("crafting", {"private_inventory": True, "target": "wooden_pickaxe"}, 80),
    ],
    ids=["crafting", "navigation", "research", "research_private", "crafting_private"],
)
def test_the_experts_decide_from_the_observation_with_the_memory_on(name, fields, episodes):
    env = make(name, **fields)
    seen = expert_decisions(env, env.train_seeds()[:episodes])
    conflicts = {key: value for key, value in seen.items() if len(value) > 1}
    assert not conflicts, list(conflicts.items())[:2]


def test_the_crafting_miner_notes_ore_sightings():
    env = make("crafting", MemoryConfig(size=4, top_k=2, note_words=6), target="iron_pickaxe")
    notes = [
        d.reply
        for seed in env.train_seeds()[:6]
        for d in play_expert_episode(env, seed, BID_LEVELS).demonstrations
        if d.kind == "action" and d.role == "miner" and "note:" in d.reply
    ]
    assert notes and all(re.search(r"note: (iron|coal) ore at depth \d+$", n) for n in notes)


def test_the_research_finder_notes_each_fact_for_the_next_hop(cache_dir):
    env = ResearchEnv(ResearchConfig(cache_dir=cache_dir, memory=MEMORY, max_hops=2))
    for seed in env.heldout_seeds()[:10]:
        episode = play_expert_episode(env, seed, BID_LEVELS)
        assert episode.metrics["success"] == 1.0
        assert episode.metrics["memory/notes"] == len(env.question.hops) - 1 == 1


# -- crafting with a private inventory: the Smith asks for wood through the memory ---------------
WOOD = MemoryConfig(size=1, top_k=1, note_words=4)


def test_private_inventory_needs_the_memory():
    with pytest.raises(ValueError, match=r"task\.private_inventory"):
        make("crafting", MemoryConfig(), private_inventory=True)


def test_the_logger_sees_no_inventory_and_only_its_own_events():
    env = make("crafting", WOOD, private_inventory=True, target="wooden_pickaxe")
    env.reset(0)
    env.step("smith", "note: need wood")
    env.step("logger", env.expert_action("logger"))
    env.step("smith", "craft planks")
    logger, smith = env.observation("logger"), env.observation("smith")
    assert "inventory" not in logger and "smith craft planks" not in logger
    assert "inventory" in smith and "smith craft planks" in smith


def test_the_logger_gathers_wood_only_when_the_smith_asks():
    env = make("crafting", WOOD, private_inventory=True, target="wooden_pickaxe")
    for seed in env.heldout_seeds()[:16]:
        episode = play_expert_episode(env, seed, BID_LEVELS)
        assert episode.metrics["success"] == 1.0
        actions = [(d.role, d.reply) for d in episode.demonstrations if d.kind == "action"]
        actions = [action for action in actions if action[0] is not None]
        assert actions[0] == ("smith", "note: need wood")
        for (role, _reply), before in zip(actions[1:], actions, strict=False):
            if role == "logger" and before[0] != "logger":
                assert before == ("smith", "note: need wood")
        chops = [reply for role, reply in actions if reply.startswith("chop a tree")]
        assert chops and all(reply.endswith("note: got wood") for reply in chops)


# -- research with private results: the memory is the only way facts travel ---------------------
def test_private_results_show_a_result_only_to_its_caller(private_env):
    env = private_env
    env.reset(0)
    env.step("searcher", env.expert_action("searcher"))
    assert env.observation("searcher").count("search ") >= 1
    assert "Last: nothing new" in env.observation("opener")
    assert "Team: searcher browser.search(" in env.observation("opener")
    assert "Notes:" not in env.observation("finder")


def test_private_results_need_the_memory(cache_dir):
    with pytest.raises(ValueError, match=r"task\.private_results"):
        ResearchEnv(ResearchConfig(cache_dir=cache_dir, private_results=True))


def test_private_experts_solve_every_heldout_question_through_a_finder_note(private_env):
    env = private_env
    for seed in env.heldout_seeds():
        episode = play_expert_episode(env, seed, BID_LEVELS)
        assert episode.metrics["success"] == 1.0, seed
        assert episode.metrics["memory/notes"] == 1.0
        replies = [(d.role, d.reply) for d in episode.demonstrations if d.kind == "action"]
        replies = [reply for reply in replies if reply[0] is not None]
        note = next(i for i, (role, reply) in enumerate(replies) if reply.startswith("note: "))
        assert replies[note][0] == "finder"
        # The next search is for the noted name, which the Searcher saw only in the memo.
        value = replies[note][1].removeprefix("note: ")
        assert replies[note + 1] == ("searcher", f"browser.search({value})")


def _private_reply_read_from(text: str, role: str) -> str | None:
    """A role's expert reply in the private variant, read off its observation text alone (two
    hops; the question's relations give the find patterns, as in test_research)."""
    from test_research import _chain_read_from

    start, relations = _chain_read_from(re.search(r"^Q: (.*)$", text, re.M)[1])
    facts = int(re.search(r"Facts: (\d+)\.", text)[1])
    title = re.search(r"Page: (?:none|d\d+ (.*) p\d+/\d+)\.", text)[1]
    team = re.search(r"^Team: (.*)$", text, re.M)
    last = re.search(r"^Last: (.*)$", text, re.M)[1]
    memo = re.search(r"^Memo: finder: (.*)$", text, re.M)
    if role == "finder":
        if facts == len(relations):
            found = re.search(r"\[p\d+\] (.*?)(?: \[p\d+\]|$)", last)
            return f"answer({_value(found[1], relations[-1])})" if found else None
        subject = start if facts == 0 else (memo[1] if memo else None)
        if title is not None and title == subject:
            return f"browser.find({relations[facts].pattern})"
        found = re.search(r'^find "[^"]*" in d\d+: \[p\d+\] (.*?)(?: \[p\d+\]|$)', last)
        if facts and found and not memo:
            return f"note: {_value(found[1], relations[facts - 1])}"
        return None
    subject = start if facts == 0 else (memo[1] if memo else None)
    if role == "searcher":
        searched = team is not None and team[1].endswith(f"browser.search({subject})")
        if subject and not searched and title != subject:
            return f"browser.search({subject})"
        return None
    query = re.search(r"browser\.search\((.*)\)$", team[1]) if team else None
    return "browser.open(1)" if query and query[1] != title else None


def _value(fact: str, relation) -> str:
    from test_research import _value_read_from

    return _value_read_from(fact, relation)


def test_private_expert_replies_can_be_read_off_each_roles_observation(private_env):
    env = private_env
    checked = 0
    for seed in env.train_seeds()[:40]:
        env.reset(seed)
        while not env.done:
            for role in env.roles:
                text = env.observation(role)
                assert env.expert_action(role) == _private_reply_read_from(text, role), text
                assert len(text.split()) < 80
                checked += 1
            actor = max(env.roles, key=env.expert_bid)
            env.step(actor, env.expert_action(actor))
        assert env.episode_metrics()["success"] == 1.0
    assert checked > 500
