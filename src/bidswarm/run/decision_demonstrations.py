"""[ours] The demonstrations of the decisions a coordination rule learns in place of the bids.

Read from the same expert play as the bid demonstrations (the same worlds, the same states:
``play_expert_episode``'s ``on_state``), one label source, the experts' bids: the owner (the
role the experts' auction lets act, ``expert_owners``), or for ``own_score`` each role's own
bid; states where the experts skip have no owner and give none. Per state with an owner:

- ``route`` (``coordination=agentnet coordination.router=trained``): every role, as if it held
  the task, names the owner from its own observation: it keeps the task when it owns the step
  and forwards it to the owner when the owner changes (N demonstrations per state, as many as
  the bids: every role bids at every state).
- ``pick`` (``coordination=router``): the decider names the owner from the whole world's
  observation (one per state).
- ``own_score`` (``coordination=proposal_auction``): every role rates its own reply at its
  expert's bid there (``levels``), the reply being its latest expert reply as for ``score``
  (up to N per state, as many as the bids).
- ``score`` (``coordination=graph_of_agents coordination.scoring=trained``): every role scores
  every other role's reply in that state: the owner's expert action at the top bid level, each
  other role's at the lowest, where a role the plan does not need now (``expert_action`` None)
  says what it said last in the episode (its latest expert reply; none before its first), as an
  agent repeating its last useful instruction would (up to N (N - 1) per state).

So each learned decision is a classifier of the expert's owner, as the bids after SFT are.
The agents still learn their bids, unused by such a rule, so that their actions are trained on
exactly the auction's stream (the decision demonstrations come on top; the decider's are its
own): the arms differ in who acts, not in how the actions were learned.
"""

from __future__ import annotations

from bidswarm.coordination.base import (
    DECIDER_NAME,
    OWN_SCORE,
    PICK,
    ROUTE,
    SCORE,
    CoordinationRule,
)
from bidswarm.envs.base import MONOLITHIC, TextEnv
from bidswarm.envs.experts import Demonstration, expert_owners, format_bid, play_expert_episode


def state_demonstrations(
    env: TextEnv,
    levels: dict[str, float],
    bid_levels: list[float],
    learned: frozenset[str],
    latest: dict[str, str],
) -> list[Demonstration]:
    """The ``learned`` decisions' demonstrations in ``env``'s state (``levels``: every role's
    expert bid there; ``latest``: each role's latest expert reply in the episode, updated
    here); none where the experts skip."""
    replies = {role: env.expert_action(role) for role in env.roles}
    latest.update({role: reply for role, reply in replies.items() if reply})
    owners = expert_owners(levels)
    if len(owners) != 1:
        return []
    (owner,) = owners
    observations = {role: env.observation(role) for role in env.roles}
    demos = []
    if ROUTE in learned:
        demos += [Demonstration(ROUTE, role, observations[role], owner) for role in env.roles]
    if PICK in learned:
        demos.append(Demonstration(ROUTE, DECIDER_NAME, env.observation(MONOLITHIC), owner))
    if OWN_SCORE in learned:
        for role, reply in latest.items():
            label = format_bid(levels[role])
            demos.append(Demonstration(OWN_SCORE, role, observations[role], label, proposal=reply))
    if SCORE in learned:
        useful, useless = format_bid(max(bid_levels)), format_bid(min(bid_levels))
        for scorer in env.roles:
            for proposer, reply in latest.items():
                if proposer != scorer:
                    label = useful if proposer == owner else useless
                    demos.append(
                        Demonstration(SCORE, scorer, observations[scorer], label, proposal=reply)
                    )
    return demos


def decision_demonstrations(
    env: TextEnv, worlds: list[int], bid_levels: list[float], learned: frozenset[str]
) -> list[Demonstration]:
    """The ``learned`` decisions' demonstrations over the experts' play of each of ``worlds``
    (each world once, in order)."""
    demos: list[Demonstration] = []
    for world in dict.fromkeys(worlds):
        latest: dict[str, str] = {}

        def collect(state: TextEnv, levels: dict[str, float], seen=latest) -> None:
            demos.extend(state_demonstrations(state, levels, bid_levels, learned, seen))

        play_expert_episode(env, world, bid_levels, on_state=collect)
    return demos


def with_learned_decisions(
    demonstrations: list[Demonstration],
    env: TextEnv,
    worlds: list[int],
    bid_levels: list[float],
    rule: CoordinationRule,
) -> list[Demonstration]:
    """The SFT demonstrations of a run under ``rule``: those given, then the demonstrations of
    the decisions the rule learns (:attr:`CoordinationRule.decisions_learned`) on the same
    ``worlds`` (learned at the bids' passes and ``sft.bid_fraction``). A rule that learns
    nothing: ``demonstrations`` unchanged."""
    if not rule.decisions_learned:
        return demonstrations
    return demonstrations + decision_demonstrations(env, worlds, bid_levels, rule.decisions_learned)
