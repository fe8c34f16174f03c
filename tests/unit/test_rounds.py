"""The one interleaved-round loop (edgetune/rounds.py): order, failures, resumption, round context."""

from edgetune.rounds import interleaved


def test_every_round_runs_everyone_in_the_rotating_order_with_the_round_context():
    ran = []
    ctxs = []

    def start(rnd):
        ctxs.append(rnd)
        return f"inputs-{rnd}"

    out = interleaved(["a", "b", "c"], 3, lambda who, rnd, ctx: ran.append((rnd, who, ctx)), before_round=start)
    assert out == {}
    assert ctxs == [1, 2, 3]
    assert [(r, w) for r, w, _ in ran] == [(1, "a"), (1, "b"), (1, "c"), (2, "b"), (2, "c"), (2, "a"),
                                           (3, "c"), (3, "a"), (3, "b")]
    assert all(ctx == f"inputs-{r}" for r, _, ctx in ran)


def test_a_participant_that_fails_a_round_runs_no_more_rounds_and_keeps_its_first_reason():
    ran = []

    def run(who, rnd, _ctx):
        ran.append((rnd, who))
        if who == "b" and rnd == 2:
            return "wrong output"
        return "" if who == "c" and rnd == 3 else None  # an empty reason still fails

    out = interleaved(["a", "b", "c"], 4, run)
    assert out == {"b": "wrong output", "c": "failed"}
    assert [r for r, w in ran if w == "b"] == [1, 2]
    assert [r for r, w in ran if w == "c"] == [1, 2, 3]
    assert [r for r, w in ran if w == "a"] == [1, 2, 3, 4]


def test_a_resumed_loop_skips_the_participants_already_out_and_numbers_rounds_from_first():
    ran = []
    out = {"b": "stored failure"}
    got = interleaved([{"k": "a"}, {"k": "b"}], 2, lambda who, rnd, _c: ran.append((rnd, who["k"])),
                      first=5, out=out, key=lambda p: p["k"])
    assert ran == [(5, "a"), (6, "a")]
    assert got == out == {"b": "stored failure"}
