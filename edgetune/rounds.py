"""The one interleaved-round loop (DESIGN.md §4.4): tune's race, the kernels' and the judge's final
rounds all run through ``interleaved``; tune's confirmation walks the rounds its replay decides
(``select.replay``), each in the order of the same rotation (``measure.rotation``).

The loop's rules, written once:

- rounds are numbered from ``first`` (tune's race: 1..R; stored confirmation rounds have numbers of
  their own, ``select.stored_round``);
- each round runs every participant once, in the rotating order A B C, B C A, ... so drift and
  position within a round fall on every participant alike;
- ``before_round(rnd)`` is called before a round's first job and its value handed to every job of the
  round (the round's inputs, its per-job budget);
- a participant that fails a round is out: it runs no more rounds, and its first reason is kept. A
  failed run can never be selected or be the baseline (``select.race_field``, ``strongest_baseline``),
  so its later rounds would only spend the budget.

The statistics over the rounds (median of per-round medians, ratios, intervals) live in
``measure.py`` only.
"""

from __future__ import annotations

from typing import Callable, Hashable, MutableMapping, Sequence, TypeVar

from edgetune.measure import rotation

P = TypeVar("P")
C = TypeVar("C")


def interleaved(participants: Sequence[P], rounds: int, run: Callable[[P, int, C], str | None], *,
                first: int = 1, before_round: Callable[[int], C] | None = None,
                out: MutableMapping[Hashable, str] | None = None,
                key: Callable[[P], Hashable] = lambda p: p,
                go_on: Callable[[int], bool] | None = None) -> dict[Hashable, str]:
    """Run ``rounds`` interleaved rounds of ``participants`` (numbered ``first``, ``first + 1``, ...).
    ``run(who, rnd, ctx)`` runs one job and returns None when it passed, else the reason it failed.
    ``out`` (keyed by ``key(who)``) may hold participants already out (a resumed run's stored
    failures); the participants out at the end, with their first reason, are returned.
    ``go_on(rnd)``, asked before every round after the first, False: the rounds end there (whole
    rounds only, so every participant has the same ones)."""
    gone: dict[Hashable, str] = dict(out or {})
    for rnd in range(first, first + rounds):
        if go_on is not None and rnd > first and not go_on(rnd):
            break
        ctx = before_round(rnd) if before_round is not None else None
        for who in rotation(participants, rnd):
            k = key(who)
            if k in gone:
                continue
            reason = run(who, rnd, ctx)  # type: ignore[arg-type]
            if reason is not None:
                gone[k] = reason or "failed"
    if out is not None:
        out.update(gone)
    return gone
