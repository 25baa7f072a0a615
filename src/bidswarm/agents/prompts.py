"""Prompt templates of the two things every agent produces: a bid and, when it wins, an action;
and of the decisions a coordination rule may learn instead of bids: a peer's usefulness score
of another agent's proposal (:meth:`PromptTemplate.score`) and who acts next
(:meth:`PromptTemplate.route`, asked of an agent or of the population's decider).

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
from bidswarm.coordination.base import DECIDER_NAME, OWN_SCORE, SCORE
from bidswarm.coordination.bid_readers import BidPrompt
from bidswarm.envs.base import TextEnv, role_name
from bidswarm.envs.experts import Demonstration, format_bid
from bidswarm.envs.experts import parse_bid as parse_bid  # re-exported: how agents' bids are read

DECIDER_DESCRIPTION = (
    "You are the team's router: you read what every role sees and name the role that acts "
    "next. You never act yourself."
)
"""The system turn's role description of the population's decider (chat prompts)."""


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

    def score(self, role: str, observation: str, proposal: str, own: bool = False) -> str:
        """The prompt asking ``role`` how useful another agent's ``proposal`` (``own``: its own)
        is now; the reply is a level of :attr:`bid_levels` (lowest: useless now, highest: what
        the team needs). The compact style marks an own proposal ``mine:``."""
        apart = self.bid_prompt == BidPrompt.apart
        if self.style == PromptStyle.compact:
            end = "=> score:" if apart else "->"
            whose = "mine" if own else "proposal"
            return f"{self._bos()}{role} score: {observation} {whose}: {proposal} {end}"
        levels = ", ".join(format_bid(level) for level in self.bid_levels)
        whose = "your own proposal" if own else "this proposal of another agent"
        request = (
            f"How useful is {whose} for the team now? Reply with one "
            f"number from {levels} ({format_bid(self.bid_levels[0])} = useless now, "
            f"{format_bid(self.bid_levels[-1])} = what the team needs now).\n\n"
            f"Now: {observation}\n\nProposal: {proposal}"
        )
        if apart:
            request += "\n\nYour score, one number only:"
        return self._chat(role, request)

    @property
    def route_replies(self) -> list[str]:
        """What a route prompt may be answered with: the task's roles (a role names itself to
        keep acting)."""
        return [role for role in self.role_descriptions if role is not None]

    def route(self, name: str, observation: str) -> str:
        """The prompt asking ``name`` (a role, or :data:`DECIDER_NAME` for the population's
        decider, who reads the whole world's observation) which role should act now; the reply
        is one of :attr:`route_replies`."""
        apart = self.bid_prompt == BidPrompt.apart
        if self.style == PromptStyle.compact:
            end = "=> route:" if apart else "->"
            return f"{self._bos()}{name} route: {observation} {end}"
        roles = ", ".join(self.route_replies)
        request = f"Which role should act now? Reply with one of: {roles}.\n\nNow: {observation}"
        if apart:
            request += "\n\nThe role, one word only:"
        return self._chat(name, request)

    def prompt_of(self, demo: Demonstration) -> str:
        """The prompt of a demonstration of any kind (``bid``, ``action``, ``score``,
        ``own_score``, ``route``)."""
        if demo.kind == "bid":
            return self.bid(demo.role, demo.observation)
        if demo.kind in (SCORE, OWN_SCORE):
            return self.score(demo.role, demo.observation, demo.proposal, demo.kind == OWN_SCORE)
        if demo.kind == "route":
            return self.route(demo.role, demo.observation)
        return self.action(demo.role, demo.observation)

    def demonstration_texts(self, demonstrations: list[Demonstration]) -> list[str]:
        """Prompt + reply of each demonstration, as the model sees them (a tokenizer corpus)."""
        return [self.prompt_of(demo) + self.reply_text(demo.reply) for demo in demonstrations]

    def reply_text(self, reply: str) -> str:
        """The reply as it continues the prompt (the compact template puts a space before it)."""
        return f" {reply}" if self.style == PromptStyle.compact else reply

    def _bos(self) -> str:
        if self.tokenizer is None or self.tokenizer.bos_token is None:
            return ""
        return self.tokenizer.bos_token

    def _chat(self, role: str | None, request: str) -> str:
        assert self.tokenizer is not None
        description = DECIDER_DESCRIPTION if role == DECIDER_NAME else self.role_descriptions[role]
        system = f"{self.task_description}\n\n{description}"
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": request},
        ]
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
