"""Prompt templates of the two things every agent produces: a bid and, when it wins, an action.

Two styles (``ModelConfig.prompt_style``):

- ``chat``: the tokenizer's chat template; the system turn holds the task and role
  descriptions, the user turn what to reply and then the observation. For instruction-tuned
  models (SmolLM2 and bigger). The observation comes last so that an agent's prompts over many
  environments share a long prefix, computed once per batch.
- ``compact``: ``<s>logger bid: <observation> ->`` and ``<s>logger act: <observation> ->``, no
  descriptions: a tiny model trained from scratch only needs to tell the role and the kind of
  reply apart, and short prompts make it fast.

``bids.prompt=apart`` [ours] also marks the reply wanted right before it (:class:`BidPrompt`).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from bidswarm.config import PromptStyle
from bidswarm.coordination.bid_readers import BidPrompt
from bidswarm.envs.base import TextEnv, role_name
from bidswarm.envs.experts import Demonstration, format_bid
from bidswarm.envs.experts import parse_bid as parse_bid  # re-exported: how agents' bids are read


def bid_scale(levels: list[float]) -> str:
    """The anchored meaning of each bid level, lowest (pass) to highest (bottleneck)."""
    meanings = ["you could help a little", "useful", "important"]
    lines = [f"{format_bid(levels[0])} = pass, nothing useful for you to do now"]
    for index, level in enumerate(levels[1:-1]):
        meaning = meanings[min(index * len(meanings) // max(len(levels) - 2, 1), 2)]
        lines.append(f"{format_bid(level)} = {meaning}")
    lines.append(f"{format_bid(levels[-1])} = I am the bottleneck, I must act now")
    return "\n".join(lines)


@dataclass(frozen=True)
class PromptTemplate:
    """Builds bid and action prompts from a task's text (see the module docstring).

    role_descriptions: role -> its description, with ``None`` for the monolithic agent.
    tokenizer: needed by the ``chat`` style (its chat template).
    """

    style: PromptStyle
    task_description: str
    role_descriptions: dict[str | None, str]
    bid_levels: tuple[float, ...]
    tokenizer: PreTrainedTokenizerBase | None = None
    bid_prompt: BidPrompt = BidPrompt.paper
    """How far apart the bid and action prompts are (``bids.prompt``, :class:`BidPrompt`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "style", PromptStyle(self.style))  # a str from a test or a YAML
        object.__setattr__(self, "bid_prompt", BidPrompt(self.bid_prompt))
        if self.style == PromptStyle.chat and (
            self.tokenizer is None or not self.tokenizer.chat_template
        ):
            raise ValueError(
                "prompt_style=chat needs a tokenizer with a chat template; "
                "use prompt_style=compact for models without one (e.g. tiny)"
            )

    @classmethod
    def for_env(
        cls,
        env: TextEnv,
        style: PromptStyle,
        tokenizer: PreTrainedTokenizerBase | None,
        bid_levels: list[float],
        bid_prompt: BidPrompt | str = BidPrompt.paper,
    ) -> PromptTemplate:
        """The template of ``env``'s task, with every role's and the monolithic description."""
        roles: list[str | None] = [*env.roles, None]
        return cls(
            style=style,
            task_description=env.task_description,
            role_descriptions={role: env.role_description(role) for role in roles},
            bid_levels=tuple(bid_levels),
            tokenizer=tokenizer,
            bid_prompt=BidPrompt(bid_prompt),
        )

    def bid(self, role: str, observation: str) -> str:
        """The prompt asking ``role`` how much it should act now."""
        apart = self.bid_prompt == BidPrompt.apart
        if self.style == PromptStyle.compact:
            return f"{self._bos()}{role} bid: {observation} " + ("=> bid:" if apart else "->")
        levels = ", ".join(format_bid(level) for level in self.bid_levels)
        request = (
            f"How urgently must you act now? Reply with one number from {levels}:\n"
            f"{bid_scale(list(self.bid_levels))}\n\nNow: {observation}"
        )
        if apart:
            request += "\n\nYour bid, one number only:"
        return self._chat(role, request)

    def action(self, role: str | None, observation: str) -> str:
        """The prompt asking ``role`` (None: the monolithic agent) for its next instruction."""
        apart = self.bid_prompt == BidPrompt.apart
        if self.style == PromptStyle.compact:
            end = "=> act:" if apart else "->"
            return f"{self._bos()}{role_name(role)} act: {observation} {end}"
        request = f"Reply with your next instruction only.\n\nNow: {observation}"
        if apart:
            request += "\n\nYour instruction:"
        return self._chat(role, request)

    def demonstration_texts(self, demonstrations: list[Demonstration]) -> list[str]:
        """Prompt + reply of each demonstration, as the model sees them (a tokenizer corpus)."""
        texts = []
        for demo in demonstrations:
            build = self.bid if demo.kind == "bid" else self.action
            texts.append(build(demo.role, demo.observation) + self.reply_text(demo.reply))
        return texts

    def reply_text(self, reply: str) -> str:
        """The reply as it continues the prompt (the compact template puts a space before it)."""
        return f" {reply}" if self.style == PromptStyle.compact else reply

    def _bos(self) -> str:
        if self.tokenizer is None or self.tokenizer.bos_token is None:
            return ""
        return self.tokenizer.bos_token

    def _chat(self, role: str | None, request: str) -> str:
        assert self.tokenizer is not None
        system = f"{self.task_description}\n\n{self.role_descriptions[role]}"
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": request},
        ]
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
