"""TrialAllocator: how a model's trial budget is shared among its kernels (no TVM needed)."""

from __future__ import annotations

import pytest

from edgetune.kernels.allocate import TrialAllocator


def _drive(alloc: TrialAllocator, latency_after: dict) -> dict[str, int]:
    """Run the allocator against a fake tuner: ``latency_after[name](trials) -> best ns``."""
    for name, target in alloc.first_round().items():
        alloc.report(name, latency_after[name](target))
    while (step := alloc.next_chunk()) is not None:
        name, target = step
        alloc.report(name, latency_after[name](target))
    return alloc.targets()


def test_budget_is_spent_exactly_and_targets_are_cumulative():
    alloc = TrialAllocator({"a": 1, "b": 1, "c": 1}, total=100)
    first = alloc.first_round()
    assert first == {"a": 16, "b": 16, "c": 16}  # half the budget, evenly
    seen = dict(first)
    for name in first:
        alloc.report(name, 1000.0)
    while (step := alloc.next_chunk()) is not None:
        name, target = step
        assert target > seen[name]  # each call asks for more than the last: reruns reuse records
        seen[name] = target
        alloc.report(name, 1000.0)
    assert sum(alloc.targets().values()) == 100
    assert alloc.left == 0


def test_the_kernel_that_costs_the_model_most_gets_the_trials():
    # "big" is slow and keeps improving; "small" is fast already; "hot" is fast but called 8 times
    curves = {
        "big": lambda n: 200_000 / (1 + n / 50),
        "small": lambda n: 5_000.0,
        "hot": lambda n: 20_000 / (1 + n / 50),
    }
    targets = _drive(TrialAllocator({"big": 1, "small": 1, "hot": 8}, total=400), curves)
    assert sum(targets.values()) == 400
    assert targets["small"] == min(targets.values()) == 400 // 2 // 3  # only its first slice
    assert targets["big"] > targets["small"] and targets["hot"] > targets["small"]


def test_a_converged_kernel_stops_soaking_up_trials():
    # "flat" dominates the model but never improves (memory-bound); "slope" is smaller but improves
    curves = {"flat": lambda n: 100_000.0, "slope": lambda n: 30_000 / (1 + n / 20)}
    targets = _drive(TrialAllocator({"flat": 1, "slope": 1}, total=320, chunk=16), curves)
    assert targets["slope"] > 80  # more than its first slice, although "flat" costs more
    assert targets["flat"] < 320 - 80


def test_a_kernel_with_nothing_valid_gets_no_more_than_its_first_slice():
    curves = {"broken": lambda n: None, "ok": lambda n: 10_000 / (1 + n)}
    targets = _drive(TrialAllocator({"broken": 1, "ok": 1}, total=64), curves)
    assert targets == {"broken": 16, "ok": 48}


def test_small_budgets_and_no_kernels():
    alloc = TrialAllocator({"a": 1, "b": 1, "c": 1}, total=2)
    assert alloc.first_round() == {"a": 1, "b": 1}  # one each while trials last
    assert alloc.next_chunk() is None
    assert TrialAllocator({}, total=10).first_round() == {}
    assert TrialAllocator({}, total=10).next_chunk() is None
    assert TrialAllocator({"a": 1}, total=0).first_round() == {}
    with pytest.raises(ValueError):
        TrialAllocator({"a": 1}, total=-1)
    with pytest.raises(ValueError):
        TrialAllocator({"a": 0}, total=8)
