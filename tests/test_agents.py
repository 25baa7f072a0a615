"""Tokenizer, model loading, prompts, batched generation (the ``hf`` engine's decode loop),
log-probs and the population."""

from __future__ import annotations

import contextlib

import pytest
import torch

from bidswarm.agents import policy as policy_module
from bidswarm.agents.branching import ReplyTree, branch_logprobs, branch_tokens
from bidswarm.agents.models import load_model_and_tokenizer
from bidswarm.agents.policy import (
    AgentPolicy,
    common_prefix_length,
    micro_batches,
    shared_prefix_length,
)
from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate, parse_bid
from bidswarm.agents.tokenizer import build_tokenizer
from bidswarm.config import ModelConfig, TinyArchConfig
from bidswarm.engines.hf import HFDecoder
from bidswarm.engines.sampling import sample_tokens
from bidswarm.envs import TASKS, env_class
from bidswarm.run.demonstrations import (
    ACTION_LIMIT_WORLDS,
    REPLY_TOKEN_MARGIN,
    action_token_limit,
    expert_demonstrations,
)

LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]
ROLES = ["logger", "miner", "smith"]
OBSERVATIONS = [
    "step 12 of 120. inventory: 3 oak log, 2 stick. near: forest, stone 2 blocks down.",
    "step 3 of 120. inventory: nothing. near: forest.",
    "step 40 of 120. inventory: 1 wooden pickaxe, 4 cobblestone. near: stone. last: miner mine "
    "stone -> got 4 cobblestone.",
]
REPLIES = ["chop a tree", "mine stone", "craft a wooden pickaxe", "0.0", "0.2", "0.6", "0.8"]
REPLIES += [f" {reply}" for reply in REPLIES]


def corpus() -> list[str]:
    prompts = [f"{role} bid: {obs} ->" for role in ROLES for obs in OBSERVATIONS]
    return prompts + REPLIES


def tiny_config(**overrides) -> ModelConfig:
    arch = TinyArchConfig(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
    return ModelConfig(name="tiny", source="tiny", prompt_style="compact", tiny=arch, **overrides)


@pytest.fixture
def agent() -> AgentPolicy:
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(tiny_config(), corpus())
    return AgentPolicy(model, tokenizer, "logger", max_prompt_tokens=768)


def hf_decoder(agent: AgentPolicy) -> HFDecoder:
    """``agent``'s decode loop with the schema's defaults (``model.kv_cache=auto``, no compiled
    decode step, no rollout dtype)."""
    defaults = ModelConfig()
    return HFDecoder(agent, str(defaults.kv_cache), defaults.compile_decode, None)


@pytest.fixture
def decoder(agent: AgentPolicy) -> HFDecoder:
    return hf_decoder(agent)


def generate(decoder: HFDecoder, prompts: list[str], *args, **kwargs):
    """``decoder``'s replies to the prompt texts (encoded as the swarm encodes them)."""
    return decoder.generate(decoder.policy.encode_prompts(prompts), *args, **kwargs)


@pytest.fixture
def template(agent: AgentPolicy) -> PromptTemplate:
    descriptions = {role: f"{role} things" for role in [*ROLES, None]}
    return PromptTemplate("compact", "get a pickaxe", descriptions, tuple(LEVELS), agent.tokenizer)


# -- tokenizer ---------------------------------------------------------------------------------


@contextlib.contextmanager
def forward_input_shapes(agent):
    """The ``input_ids`` shape of every forward pass of the agent's model inside the block."""
    shapes = []
    hook = agent.model.model.register_forward_hook(
        lambda module, args, kwargs, output: shapes.append(kwargs["input_ids"].shape),
        with_kwargs=True,
    )
    try:
        yield shapes
    finally:
        hook.remove()


def test_tokenizer_keeps_task_words_and_numbers_whole_and_round_trips(tmp_path):
    tokenizer = build_tokenizer(corpus(), vocab_size=512)
    # A word after a space (as in every prompt) is one token, its space included.
    for word in [" inventory", " pickaxe", " cobblestone", " 120", " 0.6", " 12", "0.8"]:
        assert len(tokenizer(word, add_special_tokens=False)["input_ids"]) == 1, word
    text = OBSERVATIONS[2] + "\nlast: smith craft sticks"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) < len(text.split()) * 2
    assert tokenizer.decode(ids) == text
    assert {tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token} == {
        "<pad>",
        "<s>",
        "</s>",
    }
    assert tokenizer.padding_side == "left"
    tokenizer.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.get_vocab() == tokenizer.get_vocab()
    assert reloaded(text, add_special_tokens=False)["input_ids"] == ids
    assert (
        reloaded("<s>miner bid:", add_special_tokens=False)["input_ids"][0] == reloaded.bos_token_id
    )


def test_tokenizer_maps_unseen_characters_to_unk_and_rejects_empty_corpus():
    tokenizer = build_tokenizer(corpus(), vocab_size=512)
    assert tokenizer.unk_token_id in tokenizer("é", add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match="corpus"):
        build_tokenizer([], vocab_size=512)


# -- prompts and bids --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.6", (0.6, True)),
        (" 0.8 because I hold the pickaxe", (0.8, True)),
        ("bid: 0.5", (0.4, True)),  # equidistant: the lower level, as the experts snap
        ("0.7", (0.6, True)),
        ("1", (0.8, True)),
        (".2", (0.2, True)),
        ("0", (0.0, True)),
        ("1.5", (0.0, False)),
        ("-0.2", (0.0, False)),
        ("pass", (0.0, False)),
        ("", (0.0, False)),
    ],
)
def test_parse_bid(text, expected):
    value, ok = parse_bid(text, LEVELS)
    assert (pytest.approx(value), ok) == expected


def test_compact_prompts_are_short_and_name_role_and_kind(template, agent):
    bid = template.bid("miner", OBSERVATIONS[0])
    assert bid == f"<s>miner bid: {OBSERVATIONS[0]} ->"
    assert template.action(None, OBSERVATIONS[0]).startswith("<s>monolithic act: ")
    assert template.reply_text("mine stone") == " mine stone"
    ids = agent.encode_prompts([bid])[0]
    assert ids[0] == agent.tokenizer.bos_token_id
    assert len(ids) <= len(bid.split()) + 12


def test_chat_style_needs_a_chat_template(agent):
    with pytest.raises(ValueError, match="chat template"):
        PromptTemplate("chat", "task", {None: "all"}, tuple(LEVELS), agent.tokenizer)
    with pytest.raises(ValueError, match="PromptStyle"):  # the config refuses it first
        PromptTemplate("verbose", "task", {None: "all"}, tuple(LEVELS), agent.tokenizer)


# -- models ------------------------------------------------------------------------------------
def test_model_sources_fail_clearly():
    with pytest.raises(ValueError, match="corpus"):
        load_model_and_tokenizer(tiny_config(), None)
    with pytest.raises(ValueError, match="ModelSource"):  # the config refuses it first
        load_model_and_tokenizer(ModelConfig(name="x", source="magic"), None)
    missing = ModelConfig(name="x", source="hub", path="/nonexistent/model-folder")
    with pytest.raises(FileNotFoundError, match="/nonexistent/model-folder"):
        load_model_and_tokenizer(missing, None)
    absent = ModelConfig(name="x", source="gguf", gguf_package="no_such_pkg", gguf_file="m.gguf")
    with pytest.raises(FileNotFoundError, match="no_such_pkg"):
        load_model_and_tokenizer(absent, None)


def test_tiny_model_matches_config_and_tokenizer():
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(tiny_config(), corpus())
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2
    assert next(model.parameters()).dtype == torch.float32
    assert model.config.eos_token_id == tokenizer.eos_token_id


# -- generation and log-probs ------------------------------------------------------------------
def prompts_of_different_lengths(template: PromptTemplate) -> list[str]:
    return [
        template.bid("logger", OBSERVATIONS[0]),
        template.action("miner", OBSERVATIONS[1]),
        template.bid("smith", OBSERVATIONS[2]),
        template.action(None, "step 1 of 120."),
    ]


def test_batched_greedy_generation_equals_one_at_a_time(agent, template, decoder):
    prompts = prompts_of_different_lengths(template)
    batched = generate(decoder, prompts, max_new_tokens=6, temperature=0.0)
    singles = [generate(decoder, [p], max_new_tokens=6, temperature=0.0)[0] for p in prompts]
    assert batched == singles
    assert all(len(g.reply_ids) == 6 for g in batched)  # an untrained model rarely stops
    assert [g.prompt_ids for g in batched] == agent.encode_prompts(prompts)


def test_cached_greedy_generation_equals_decoding_without_a_cache(agent, template, decoder):
    # The decode loop hands the KV cache from one forward to the next through the stable
    # `past_key_values` API (the `make test-oldest` target runs this against the oldest
    # supported transformers); recomputing the whole sequence each token must agree.
    prompts = prompts_of_different_lengths(template)
    cached = generate(decoder, prompts, max_new_tokens=5, temperature=0.0)
    for prompt, generation in zip(prompts, cached, strict=True):
        ids = agent.encode_prompts([prompt])[0]
        for _ in range(5):
            with torch.no_grad():
                logits = agent.model(input_ids=torch.tensor([ids]), use_cache=False).logits
            ids = [*ids, int(logits[0, -1].argmax())]
        assert generation.reply_ids == ids[-5:]


def test_sampling_is_reproducible_with_a_generator(agent, template, decoder):
    prompts = prompts_of_different_lengths(template) * 4

    def sample(seed: int):
        return generate(decoder, prompts, 8, 1.0, torch.Generator().manual_seed(seed))

    first, again, other = sample(1), sample(1), sample(2)
    assert first == again
    assert first != other
    assert len({tuple(g.reply_ids) for g in first}) > 4  # rows sample independently


def test_generation_stops_at_eos_per_row_and_keeps_it(agent, template, decoder):
    prompts = prompts_of_different_lengths(template)
    free = generate(decoder, prompts, max_new_tokens=5, temperature=0.0)
    # Declare the first greedy token of row 0 the end of sequence: row 0 must stop right
    # after it, the rows whose greedy path never meets it must still run to the limit.
    stop = free[0].reply_ids[0]
    agent.stop_ids = [stop]
    stopped = generate(decoder, prompts, max_new_tokens=5, temperature=0.0)
    assert stopped[0].reply_ids == [stop]
    for before, after in zip(free, stopped, strict=True):
        cut = before.reply_ids.index(stop) + 1 if stop in before.reply_ids else 5
        assert after.reply_ids == before.reply_ids[:cut]


def test_checking_for_stopped_rows_every_few_tokens_changes_no_reply(agent, template, decoder):
    prompts = prompts_of_different_lengths(template)
    free = generate(decoder, prompts, max_new_tokens=5, temperature=0.0)
    agent.stop_ids = [free[0].reply_ids[0], free[1].reply_ids[1]]  # rows stop early
    every_token = generate(decoder, prompts, max_new_tokens=12, temperature=0.0)
    decoder.stop_check_every = 8  # as on an accelerator: decode on past the last stop
    assert generate(decoder, prompts, max_new_tokens=12, temperature=0.0) == every_token
    assert len(every_token[0].reply_ids) == 1


def varied_agent(agent: AgentPolicy) -> AgentPolicy:
    """``agent`` with large random weights: its greedy replies vary from token to token and
    from prompt to prompt (a freshly initialised tiny model repeats one token)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in agent.model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.3)
    return agent


def shared_header_prompts() -> list[str]:
    header = "<s>logger bid: " + " ".join(["inventory: 3 oak log, 2 stick."] * 4)
    return [f"{header} {obs} ->" for obs in OBSERVATIONS] + [f"{header} ->"]


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_static_kv_cache_generates_what_the_dynamic_one_does(
    agent, template, shared_prefix, decoder
):
    agent = varied_agent(agent)
    if shared_prefix:
        prompts, decoder.min_shared_prefix = shared_header_prompts(), 8
    else:
        prompts = prompts_of_different_lengths(template)
    assert not decoder.uses_static_cache()  # kv_cache=auto: dynamic on CPU
    with forward_input_shapes(agent) as first:
        free = generate(decoder, prompts, max_new_tokens=9, temperature=0.0)
    agent.stop_ids = [free[0].reply_ids[2], free[1].reply_ids[5]]  # rows stop at other steps

    def decode(kv_cache: str):
        decoder.kv_cache = kv_cache
        with forward_input_shapes(agent) as calls:
            greedy = generate(decoder, prompts, max_new_tokens=9, temperature=0.0)
        sampled = generate(decoder, prompts * 3, 8, 1.0, torch.Generator().manual_seed(1))
        return greedy, sampled, calls[0]

    dynamic, static = decode("dynamic"), decode("static")
    assert decoder.uses_static_cache()
    assert static == dynamic
    greedy = static[0]
    assert len({len(g.reply_ids) for g in greedy}) > 1  # rows stopped at different steps
    assert len({tuple(g.reply_ids) for g in greedy}) == len(greedy)
    # The prefix ran once, for one row; both caches took it from the kept prompt head.
    assert (first[0][0] == 1) == shared_prefix
    assert dynamic[2][0] == static[2][0] == len(prompts)


def test_compiling_the_decode_step_changes_nothing_on_cpu(agent, template, decoder):
    # CUDA graphs need a CUDA device: on CPU `compile_decode` leaves the eager forward.
    agent = varied_agent(agent)
    decoder.kv_cache = "static"
    prompts = prompts_of_different_lengths(template)
    eager = generate(decoder, prompts, max_new_tokens=6, temperature=0.0)
    decoder.compile_decode = True
    assert generate(decoder, prompts, max_new_tokens=6, temperature=0.0) == eager
    assert decoder._compiled_decode is None


def test_prompts_are_truncated_from_the_left(agent, template, decoder):
    prompt = template.bid("logger", OBSERVATIONS[2])
    full = agent.encode_prompts([prompt])[0]
    agent.max_prompt_tokens = 7
    generation = generate(decoder, [prompt], max_new_tokens=2, temperature=0.0)[0]
    assert generation.prompt_ids == full[-7:]


def test_batched_logprobs_equal_one_at_a_time_and_carry_gradient(agent, template):
    prompts = prompts_of_different_lengths(template)
    prompt_ids = agent.encode_prompts(prompts)
    reply_ids = [agent.encode_reply(text) for text in [" 0.6", " mine stone", "", " chop a tree"]]
    logprobs, mask = agent.reply_token_logprobs(prompt_ids, reply_ids)
    assert logprobs.shape == mask.shape == (4, max(len(r) for r in reply_ids))
    assert mask.sum(1).tolist() == [len(r) for r in reply_ids]
    for row, (prompt, reply) in enumerate(zip(prompt_ids, reply_ids, strict=True)):
        single, _ = agent.reply_token_logprobs([prompt], [reply])
        torch.testing.assert_close(logprobs[row, : len(reply)], single[0], atol=1e-5, rtol=0)
        assert bool((logprobs[row, len(reply) :] == 0).all())
        # Reference: the plain unpadded forward of this one sequence.
        sequence = torch.tensor([prompt + reply])
        if reply:
            reference = torch.log_softmax(agent.model(sequence).logits[0, :-1], -1)
            expected = reference[len(prompt) - 1 :].gather(-1, sequence[0, len(prompt) :, None])
            torch.testing.assert_close(single[0], expected[:, 0], atol=1e-5, rtol=0)
    (logprobs * mask).sum().backward()
    grads = [p.grad for p in agent.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def gradients(agent: AgentPolicy, prompt_ids, reply_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """The masked reply log-probs of one forward over the rows, and the gradient of their sum."""
    agent.model.zero_grad()
    logprobs, mask = agent.reply_token_logprobs(prompt_ids, reply_ids)
    (logprobs * mask).sum().backward()
    grad = torch.cat([p.grad.flatten() for p in agent.parameters() if p.grad is not None])
    return (logprobs * mask).detach(), grad


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_a_shared_prompt_head_is_trained_once_with_the_same_logprobs_and_gradients(
    adapter, monkeypatch
):
    torch.manual_seed(0)
    agent = Population.build(tiny_config(adapter=adapter), ROLES, 1, corpus())[1]
    with torch.no_grad():  # replies that vary from token to token (LoRA: its B is non-zero)
        for parameter in agent.model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.3)
    prompt_ids = agent.encode_prompts(shared_header_prompts())
    reply_ids = [agent.encode_reply(text) for text in [" 0.6", " mine stone", "", " chop a tree"]]
    reply_ids = (reply_ids * 2)[: len(prompt_ids)]
    head = agent.prompt_head_length(prompt_ids)
    assert head >= policy_module.MIN_TRAINED_PROMPT_HEAD
    assert agent.forward_row_tokens(prompt_ids, reply_ids) == [
        len(p) + len(r) - head for p, r in zip(prompt_ids, reply_ids, strict=True)
    ]
    longest = max(len(p) + len(r) for p, r in zip(prompt_ids, reply_ids, strict=True))
    with forward_input_shapes(agent) as shapes:
        once, grad_once = gradients(agent, prompt_ids, reply_ids)
    assert [tuple(shape) for shape in shapes] == [(1, head), (len(prompt_ids), longest - head)]
    monkeypatch.setattr(policy_module, "MIN_TRAINED_PROMPT_HEAD", 10**6)
    assert agent.prompt_head_length(prompt_ids) == 0
    full, grad_full = gradients(agent, prompt_ids, reply_ids)
    torch.testing.assert_close(once, full, atol=1e-5, rtol=0)
    assert float((grad_once - grad_full).norm() / grad_full.norm()) < 1e-5  # float rounding


@pytest.mark.parametrize("checkpointing", [False, True])
def test_branch_scores_compute_the_shared_prompt_head_once(agent, checkpointing):
    """Every reply after every prompt, as teacher forcing each (prompt, reply) row gives it: the
    prompts' shared head in one forward of one row, their rests in one, the replies' later
    tokens in one (a common start once); without gradients also under activation
    checkpointing; the ledger counts the head once."""
    agent = varied_agent(agent)
    prompt_ids = agent.encode_prompts(shared_header_prompts())
    replies = [agent.encode_reply(text) for text in [" 0.6", " mine stone", " mine log", ""]]
    assert sorted(map(len, replies))[:2] == [1, 2]  # "" is the end of sequence alone
    later = sum(len(reply) - 1 for reply in replies)
    tree = ReplyTree.of(replies)
    assert len(tree) < later  # the two mines feed their common start once
    agent.model.train(checkpointing)  # training mode: the checkpointed layers drop a cache
    if checkpointing:
        agent.model.gradient_checkpointing_enable()
    head = agent.prompt_head_length(prompt_ids, with_gradient=False)
    assert head >= policy_module.MIN_TRAINED_PROMPT_HEAD
    rows, rests = len(prompt_ids), [len(ids) - head for ids in prompt_ids]
    with forward_input_shapes(agent) as shapes:
        found = branch_logprobs(agent, prompt_ids, replies)
    assert [tuple(shape) for shape in shapes] == [(1, head), (rows, max(rests)), (rows, len(tree))]
    assert agent.model.training == checkpointing  # the mode it was in
    assert branch_tokens(agent, prompt_ids, replies) == head + sum(rests) + rows * len(tree)
    with torch.no_grad():
        for j, reply in enumerate(replies):
            logp, mask = agent.reply_token_logprobs(prompt_ids, [reply] * rows)
            torch.testing.assert_close(found[:, j], (logp * mask).sum(1), atol=1e-4, rtol=0)
    # Micro-batches of one prompt's rest each: the head is still computed once.
    with forward_input_shapes(agent) as shapes:
        one_by_one = branch_logprobs(agent, prompt_ids, replies, token_budget=max(rests))
    assert [tuple(shape) for shape in shapes if shape[1] == head] == [(1, head)]
    assert [tuple(shape) for shape in shapes if shape[0] == rows] == []
    torch.testing.assert_close(one_by_one, found, atol=1e-4, rtol=0)


def test_the_reply_tree_feeds_each_start_once_and_scores_every_later_token():
    replies = [[5, 7, 9, 2], [5, 7, 8, 2], [5, 2], [6, 2], [3]]
    tree = ReplyTree.of(replies)
    # Starts (5), (5, 7), (5, 7, 9), (5, 7, 8), (6): the one-token reply feeds nothing.
    assert tree.tokens == [5, 7, 9, 8, 6] and tree.depth == [0, 1, 2, 2, 0]
    assert [[int(b) for b in row] for row in tree.sees] == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [0, 0, 0, 0, 1],
    ]
    assert tree.scored == [
        (0, 0, 7), (0, 1, 9), (0, 2, 2), (1, 0, 7), (1, 1, 8), (1, 3, 2), (2, 0, 2), (3, 4, 2)
    ]  # fmt: skip


def test_no_prompt_head_under_activation_checkpointing(agent):
    prompt_ids = agent.encode_prompts(shared_header_prompts())
    assert agent.prompt_head_length(prompt_ids) > 0
    agent.model.gradient_checkpointing_enable()
    assert agent.prompt_head_length(prompt_ids) == 0  # the layers would drop the head's cache


def test_logprobs_of_sampled_replies_match_the_sampling_distribution(agent, template, decoder):
    """Greedy replies take each row's most likely token: its log-prob is the row maximum."""
    prompts = prompts_of_different_lengths(template)
    generations = generate(decoder, prompts, max_new_tokens=3, temperature=0.0)
    with torch.no_grad():
        logprobs, _ = agent.reply_token_logprobs(
            [g.prompt_ids for g in generations], [g.reply_ids for g in generations]
        )
        for row, generation in enumerate(generations):
            ids = torch.tensor([generation.prompt_ids + generation.reply_ids[:-1]])
            step_logprobs = torch.log_softmax(
                agent.model(ids).logits[0, -len(generation.reply_ids) :], -1
            )
            torch.testing.assert_close(
                logprobs[row], step_logprobs.max(-1).values, atol=1e-5, rtol=0
            )


def test_agent_save_and_load_round_trip(agent, template, tmp_path, decoder):
    prompts = prompts_of_different_lengths(template)
    agent.save_pretrained(tmp_path / "agent")
    loaded = AgentPolicy.from_pretrained(tmp_path / "agent")
    assert loaded.role == "logger"
    assert generate(hf_decoder(loaded), prompts, 5, 0.0) == generate(decoder, prompts, 5, 0.0)
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "agent", dtype=torch.float32)
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in agent.parameters())


# -- population --------------------------------------------------------------------------------
def test_population_roles_replicas_and_independent_copies(tmp_path):
    torch.manual_seed(0)
    population = Population.build(tiny_config(), [*ROLES, None], replicas=2, corpus=corpus())
    assert population.roles == ["logger", "logger", "miner", "miner", "smith", "smith", None, None]
    assert population.agents_of("miner") == [2, 3]
    logger_a, logger_b, miner_a = population[0], population[1], population[2]
    weights = [p for p in logger_a.parameters()]
    for a, b in zip(weights, logger_b.parameters(), strict=True):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    assert not all(torch.equal(a, b) for a, b in zip(weights, miner_a.parameters(), strict=True)), (
        "different roles start from different random weights"
    )
    assert len({id(agent.tokenizer) for agent in population}) == 1
    with torch.no_grad():
        weights[0].add_(1.0)
    assert not torch.equal(weights[0], next(logger_b.parameters()))

    population.save_pretrained(tmp_path)
    folders = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert "agent0_logger" in folders and "agent7_monolithic" in folders
    loaded = Population.from_pretrained(tmp_path)
    assert loaded.roles == population.roles
    for a, b in zip(population.parameters(), loaded.parameters(), strict=True):
        assert torch.equal(a, b)
    assert loaded[3].tokenizer.get_vocab() == population[3].tokenizer.get_vocab()


def test_population_rejects_bad_shapes():
    with pytest.raises(ValueError, match="replicas"):
        Population.build(tiny_config(), ROLES, replicas=0, corpus=corpus())
    with pytest.raises(ValueError, match="distinct"):
        Population.build(tiny_config(), ["miner", "miner"], replicas=1, corpus=corpus())


def test_shared_prompt_prefix_is_computed_once_with_the_same_result(agent, template, decoder):
    header = "<s>logger bid: " + " ".join(["inventory: 3 oak log, 2 stick."] * 4)
    prompts = [f"{header} {obs} ->" for obs in OBSERVATIONS] + [f"{header} ->"]
    decoder.min_shared_prefix = 10**6  # never share
    plain = generate(decoder, prompts, max_new_tokens=5, temperature=0.0)
    decoder.min_shared_prefix = 8
    with forward_input_shapes(agent) as calls:
        shared = generate(decoder, prompts, max_new_tokens=5, temperature=0.0)
    assert shared == plain
    assert calls[0][0] == 1 and calls[0][1] >= 30  # the shared prefix, one row
    assert calls[1][0] == len(prompts) and calls[1][1] < calls[0][1]  # only the suffixes
    gen = torch.Generator().manual_seed(3)
    sampled = generate(decoder, prompts, 6, 1.0, gen)
    logprobs, mask = agent.reply_token_logprobs(
        [g.prompt_ids for g in sampled], [g.reply_ids for g in sampled]
    )
    assert torch.isfinite(logprobs).all() and mask.sum() == sum(len(g.reply_ids) for g in sampled)


def head_lengths(decoder: HFDecoder, prompts: list[str]) -> tuple[list, list[int]]:
    """Greedy replies to ``prompts`` and the lengths of the one-row forwards (prompt heads)."""
    with forward_input_shapes(decoder.policy) as calls:
        replies = generate(decoder, prompts, max_new_tokens=6, temperature=0.0)
    return replies, [shape[1] for shape in calls if shape[0] == 1]


def test_kept_prompt_heads_compute_only_what_they_lack_with_the_same_replies(agent, decoder):
    """A batch whose shared prefix starts like a kept head forwards only the rest of it; one
    whose prefix a kept head holds forwards none. Greedy replies equal those computed from
    scratch (a token's keys and values depend on the tokens before it only)."""
    agent = varied_agent(agent)
    decoder.min_shared_prefix = 8
    header = "<s>logger bid: " + " ".join(["inventory: 3 oak log, 2 stick."] * 4)
    first = [f"{header} {obs} ->" for obs in OBSERVATIONS]
    longer = [f"{header} near: forest. {obs} ->" for obs in OBSERVATIONS]
    batches = [first, longer, first, longer]
    prefixes = [shared_prefix_length(agent.encode_prompts(batch)) for batch in batches[:2]]
    heads = [agent.encode_prompts(b)[0][:n] for b, n in zip(batches[:2], prefixes, strict=True)]
    common = common_prefix_length(*heads)
    assert 8 <= common < min(prefixes)
    decoder.kept_prompt_heads = 0
    plain = [head_lengths(decoder, batch) for batch in batches]
    assert [lengths for _, lengths in plain] == [[n] for n in prefixes * 2]
    decoder.kept_prompt_heads = 4
    kept = [head_lengths(decoder, batch) for batch in batches]
    assert [replies for replies, _ in kept] == [replies for replies, _ in plain]
    assert [lengths for _, lengths in kept] == [[prefixes[0]], [prefixes[1] - common], [], []]


def test_kept_prompt_heads_are_dropped_when_the_weights_change(agent, decoder):
    agent = varied_agent(agent)
    decoder.min_shared_prefix = 8
    prompts = shared_header_prompts()
    head = head_lengths(decoder, prompts)[1]
    assert head_lengths(decoder, prompts)[1] == []  # kept
    optimizer = torch.optim.SGD(agent.parameters(), lr=0.1)
    logprobs, mask = agent.reply_token_logprobs(
        agent.encode_prompts(prompts), [agent.encode_reply(" chop a tree")] * len(prompts)
    )
    (logprobs * mask).sum().backward()
    optimizer.step()
    changed, lengths = head_lengths(decoder, prompts)
    assert lengths == head  # computed anew, with the new weights
    decoder.kept_prompt_heads = 0
    assert head_lengths(decoder, prompts)[0] == changed


def test_a_rollout_dtype_generates_on_a_copy_refreshed_after_each_update(agent, template, decoder):
    agent = varied_agent(agent)
    parameters = len(list(agent.parameters()))
    keys = set(agent.state_dict())
    assert decoder.rollout_model() is agent.model  # rollout_dtype None: the weights themselves
    decoder.rollout_dtype = torch.bfloat16
    copy = decoder.rollout_model()
    assert copy is not agent.model and copy.dtype == torch.bfloat16
    assert agent.model.dtype == torch.float32
    # The copy is no part of the agent: not trained, not saved.
    assert len(list(agent.parameters())) == parameters and set(agent.state_dict()) == keys
    inv_freq = [b for name, b in copy.named_buffers() if name.endswith("inv_freq")]
    assert inv_freq and all(b.dtype == torch.float32 for b in inv_freq)  # buffers as they were
    prompts = prompts_of_different_lengths(template)
    replies = generate(decoder, prompts, 4, 1.0, torch.Generator().manual_seed(0))
    prompt_ids, reply_ids = [g.prompt_ids for g in replies], [g.reply_ids for g in replies]
    logprobs, _ = agent.reply_token_logprobs(prompt_ids, reply_ids)
    assert logprobs.dtype == torch.float32 and logprobs.requires_grad  # training: float32
    with torch.no_grad():
        for parameter in agent.model.parameters():
            parameter.add_(0.5)  # an update in place
    assert decoder.rollout_model() is copy  # refreshed in place
    for target, source in zip(copy.parameters(), agent.model.parameters(), strict=True):
        assert torch.equal(target, source.to(torch.bfloat16))
    sums, _ = agent.sequence_logprobs(prompt_ids, reply_ids, model=decoder.rollout_model())
    with torch.no_grad():
        full, mask = agent.reply_token_logprobs(prompt_ids, reply_ids)
    torch.testing.assert_close(sums, (full * mask).sum(dim=1), atol=0.1, rtol=0.05)
    decoder.rollout_dtype = None
    assert decoder.rollout_model() is agent.model


def test_inverse_cdf_sampling_draws_from_the_softmax():
    logits = torch.tensor([[0.0, 1.0, 2.0, -float("inf"), 0.5]] * 4000)
    generator = torch.Generator().manual_seed(0)
    tokens = sample_tokens(logits, 1.0, generator, inverse_cdf=True)
    counts = torch.bincount(tokens, minlength=5) / len(tokens)
    expected = torch.softmax(logits[0], dim=-1)
    assert counts[3] == 0  # probability 0: never drawn
    torch.testing.assert_close(counts, expected, atol=0.02, rtol=0)
    again = sample_tokens(logits, 1.0, torch.Generator().manual_seed(0), inverse_cdf=True)
    assert torch.equal(tokens, again)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_derived_action_token_limit_fits_every_expert_reply(task):
    env_type = env_class(task)
    env = env_type(env_type.Config())
    template = PromptTemplate.for_env(env, "compact", None, LEVELS)
    seeds = env.train_seeds()[:ACTION_LIMIT_WORLDS]
    demos = [demo for demo in expert_demonstrations(env, seeds, LEVELS) if demo.kind == "action"]
    tokenizer = build_tokenizer(template.demonstration_texts(demos), 512)
    budget = action_token_limit(None, demos, template, tokenizer)
    lengths = [len(tokenizer(template.reply_text(demo.reply))["input_ids"]) for demo in demos]
    assert budget == max(lengths) + REPLY_TOKEN_MARGIN
    assert action_token_limit(5, demos, template, tokenizer) == 5  # an explicit cap is kept


def test_micro_batches_bound_the_padded_tokens_of_a_forward():
    lengths = [5, 3, 8, 2, 2, 9, 1, 20]
    parts = micro_batches(lengths, 16)
    assert [list(part) for part in parts] == [[0, 1], [2, 3], [4], [5], [6], [7]]
    assert all(len(p) * max(lengths[i] for i in p) <= 16 for p in parts[:-1])
    assert parts[-1] == range(7, 8)  # longer than the budget: it cannot be split, it goes alone
    assert micro_batches(lengths, None) == [range(8)] and micro_batches([], 4) == []


def test_sequence_logprobs_in_micro_batches_equal_one_forward(agent, template):
    prompts = agent.encode_prompts([template.action("logger", o) for o in OBSERVATIONS])
    replies = [agent.encode_reply(" chop a tree"), agent.encode_reply(" mine stone"), []]
    replies = (replies * len(prompts))[: len(prompts)]
    whole, lengths = agent.sequence_logprobs(prompts, replies, temperature=0.7)
    widest = max(len(p) + len(r) for p, r in zip(prompts, replies, strict=True))
    split, split_lengths = agent.sequence_logprobs(prompts, replies, 0.7, token_budget=widest)
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-5)
    assert lengths.tolist() == split_lengths.tolist() == [float(len(r)) for r in replies]


def test_expert_episodes_are_played_once_at_start_up(monkeypatch):
    from omegaconf import OmegaConf

    import bidswarm.run.demonstrations as run

    played = []
    real = run.play_expert_episode
    monkeypatch.setattr(
        run,
        "play_expert_episode",
        lambda env, seed, levels, **kw: played.append(seed) or real(env, seed, levels, **kw),
    )
    env_type = env_class("crafting")
    env = env_type(env_type.Config(max_decisions=8))
    cfg = OmegaConf.create(
        {
            "seed": 0,
            "sft": {"demo_episodes": 20, "action_roles": "same_reply"},
            "coordination": {"bid_levels": LEVELS},
        }
    )
    sft, budget = run.start_demonstrations(env, cfg)
    worlds = run.demonstration_worlds(env, cfg) + run.action_limit_worlds(env)
    assert sorted(played) == sorted(set(worlds)) and len(played) == len(set(played))
    assert sft == run.expert_demonstrations(env, run.demonstration_worlds(env, cfg), LEVELS)
    assert budget == run.expert_demonstrations(env, run.action_limit_worlds(env), LEVELS)
