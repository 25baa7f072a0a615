"""Tree credit over a shared memory (``algorithms/credit/memory_tree.py``): properties, examples."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bidswarm.algorithms.credit import bucket_brigade_credit
from bidswarm.algorithms.credit.memory_tree import (
    ReadEdge,
    contribution_tree,
    edge_weights,
    memory_tree_credit,
)

credit_values = st.floats(min_value=-50.0, max_value=50.0, allow_nan=False)
shares = st.floats(min_value=0.0, max_value=1.0)
temperatures = st.floats(min_value=0.05, max_value=10.0)
depths = st.integers(min_value=0, max_value=4)


@st.composite
def episodes(draw, max_steps: int = 12):
    """Root credits and, per acting step, up to 3 reads of notes written at earlier steps."""
    credits = draw(st.lists(credit_values, min_size=1, max_size=max_steps))
    reads = []
    for step in range(len(credits)):
        writers = draw(st.lists(st.integers(0, max(step - 1, 0)), max_size=3 if step else 0))
        scores = draw(st.lists(st.floats(0.0, 8.0), min_size=len(writers), max_size=len(writers)))
        reads.append([ReadEdge(w, s) for w, s in zip(writers, scores, strict=True)])
    return credits, reads


@settings(max_examples=100, deadline=None)
@given(episodes(), shares, temperatures, depths)
def test_credit_is_conserved(episode, share, temperature, depth):
    credits, reads = episode
    result = memory_tree_credit(credits, reads, share, temperature, depth)
    assert math.isclose(sum(result.credits), sum(credits), rel_tol=1e-9, abs_tol=1e-7)
    assert len(result.credits) == len(result.received) == len(credits)


@settings(max_examples=100, deadline=None)
@given(st.lists(credit_values, max_size=12), shares, temperatures, depths)
def test_no_reads_is_the_base_rule(credits, share, temperature, depth):
    result = memory_tree_credit(credits, [[] for _ in credits], share, temperature, depth)
    assert result.credits == [float(c) for c in credits]
    assert result.received == [0.0] * len(credits)


@settings(max_examples=100, deadline=None)
@given(episodes(), shares, temperatures)
def test_depth_zero_is_the_base_rule(episode, share, temperature):
    credits, reads = episode
    result = memory_tree_credit(credits, reads, share, temperature, max_depth=0)
    assert result.credits == [float(c) for c in credits]


@settings(max_examples=100, deadline=None)
@given(episodes(), shares, temperatures, depths)
def test_a_note_nobody_read_earns_nothing(episode, share, temperature, depth):
    """A step whose note no later step read receives nothing: it keeps its own root's credit,
    less what it sends down its own reads."""
    credits, reads = episode
    read_writers = {edge.writer for step_reads in reads for edge in step_reads}
    result = memory_tree_credit(credits, reads, share, temperature, depth)
    for step in range(len(credits)):
        if step in read_writers:
            continue
        kept = 1.0 - share if reads[step] and depth > 0 else 1.0
        assert result.received[step] == 0.0
        assert math.isclose(result.credits[step], credits[step] * kept, abs_tol=1e-9)


def test_worked_example_with_bucket_brigade_roots():
    """Bids (0.8, 0.4, 0.6), rewards (0, 0, 10): Eq. 2 gives (0.48, 3.6, 4.0). Step 2 read the
    notes of steps 0 and 1 with equal scores; half of its 4.0 goes down, 1.0 to each writer."""
    roots, _ = bucket_brigade_credit([0.0, 0.0, 10.0], [0.8, 0.4, 0.6])
    reads = [[], [], [ReadEdge(0, 2.0), ReadEdge(1, 2.0)]]
    result = memory_tree_credit(roots, reads, memory_share=0.5, temperature=1.0, max_depth=2)
    assert result.credits == pytest.approx([1.48, 4.6, 2.0])
    assert result.received == pytest.approx([1.0, 1.0, 0.0])
    assert result.entropies == pytest.approx([math.log(2)])


def test_credit_flows_down_chains_of_reads_to_max_depth():
    """Step 2 read step 1's note, which read step 0's: depth 1 stops at step 1, depth 2 reaches
    step 0 (each hop passes half on)."""
    reads = [[], [ReadEdge(0, 1.0)], [ReadEdge(1, 1.0)]]
    one = memory_tree_credit([0.0, 0.0, 8.0], reads, 0.5, 1.0, max_depth=1)
    two = memory_tree_credit([0.0, 0.0, 8.0], reads, 0.5, 1.0, max_depth=2)
    # Depth 1: step 1 keeps what arrives (4) on top of sending half of its own root (0).
    assert one.credits == pytest.approx([0.0, 4.0, 4.0])
    assert two.credits == pytest.approx([2.0, 2.0, 4.0])
    # What writing earned is what the writers keep: step 1 passes on 2 of the 4 it receives,
    # so writers keep 4 of the 8 (0.5), not the 6 (0.75) that passed down read edges.
    assert one.received == pytest.approx([0.0, 4.0, 0.0])
    assert two.received == pytest.approx([2.0, 2.0, 0.0])


@settings(max_examples=100, deadline=None)
@given(episodes(), shares, temperatures, depths)
def test_what_writers_earned_is_what_they_keep_beyond_their_roots(
    episode, share, temperature, depth
):
    """``received`` is the part of the kept credits that came down read edges: each step's
    credit minus what it keeps of its own root."""
    credits, reads = episode
    result = memory_tree_credit(credits, reads, share, temperature, depth)
    for step, root in enumerate(credits):
        kept_of_root = root * (1.0 - share if reads[step] and depth > 0 else 1.0)
        assert math.isclose(
            result.received[step], result.credits[step] - kept_of_root, abs_tol=1e-7
        )


def test_temperature_sharpens_the_edge_weights():
    assert edge_weights([3.0, 1.0], 100.0) == pytest.approx([0.5, 0.5], abs=0.01)
    assert edge_weights([3.0, 1.0], 0.05)[0] == pytest.approx(1.0)
    assert sum(edge_weights([0.0, 2.0, 5.0], 1.0)) == pytest.approx(1.0)


def test_contribution_tree_matches_the_credits():
    """The drawn tree of one root holds that root's share of the summed credits."""
    reads = [[], [ReadEdge(0, 1.0)], [ReadEdge(0, 3.0), ReadEdge(1, 1.0)]]
    nodes = contribution_tree(2, 10.0, reads, 0.5, 1.0, max_depth=2)
    kept = {}
    for node in nodes:
        if node.kind == "action":
            kept[node.step] = kept.get(node.step, 0.0) + node.value
    alone = memory_tree_credit([0.0, 0.0, 10.0], reads, 0.5, 1.0, max_depth=2)
    assert [kept.get(step, 0.0) for step in range(3)] == pytest.approx(alone.credits)
    assert [n.kind for n in nodes[:2]] == ["root", "action"]
    assert {n.kind for n in nodes} == {"root", "action", "read", "write"}


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"memory_share": 1.5}, "credit.memory_share"),
        ({"temperature": 0.0}, "credit.temperature"),
        ({"max_depth": -1}, "credit.max_depth"),
    ],
)
def test_bad_parameters_name_the_key(kwargs, key):
    args = {"memory_share": 0.5, "temperature": 1.0, "max_depth": 2} | kwargs
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        memory_tree_credit([1.0], [[]], **args)


def test_a_read_of_a_later_note_is_refused():
    with pytest.raises(ValueError, match="written before it is read"):
        memory_tree_credit([1.0, 2.0], [[ReadEdge(1, 1.0)], []], 0.5, 1.0, 2)
