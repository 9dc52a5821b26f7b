"""The text-quality measures that pick the shipped target's weights and fill the model card."""

from specdec_lab.train.quality import first_statement_parses, is_degenerate, longest_loop


def test_longest_loop_finds_single_token_runs_and_short_cycles():
    assert longest_loop([]) == 0
    assert longest_loop([5]) == 1
    assert longest_loop([1, 2, 3, 4, 5]) == 1
    assert longest_loop([7, 7, 7]) == 3
    assert longest_loop([1, 2, 1, 2, 1]) == 5
    assert longest_loop([9, 1, 2, 3, 1, 2, 3, 1, 2, 3, 8]) == 9
    # A cycle longer than the longest period counted is not a loop.
    assert longest_loop([1, 2, 3, 4, 5] * 3, max_period=4) < 6


def test_degenerate_needs_a_long_enough_loop():
    looping = [3, 4] + [10, 11] * 6  # 12 tokens of one 2-token cycle
    assert is_degenerate(looping)
    assert not is_degenerate([3, 4] + [10, 11] * 5 + [12])
    assert not is_degenerate(list(range(64)))


def test_first_statement_parses_adds_whole_lines():
    prompt = 'def f(x):\n    """Double."""'
    assert first_statement_parses(prompt, "\n    return 2 * x\n")
    assert not first_statement_parses(prompt, "\n    return (2 *\n")
    assert not first_statement_parses(prompt, "\n    return 2 * x")  # a cut-off last line is not counted


def test_loop_positions_mark_the_tokens_that_carry_a_loop_past_its_length():
    import torch

    from specdec_lab.train.quality import loop_positions

    rows = torch.tensor([[5, 1, 2, 1, 2, 1, 2, 9, 9],   # a 2-cycle reaching 6 tokens at index 6
                         [3, 3, 3, 3, 4, 5, 6, 7, 8]])  # one token repeated, 4 long at index 3
    marked = loop_positions(rows, min_tokens=4)
    assert marked[0].tolist() == [False] * 4 + [True, True, True, False, False]
    assert marked[1].tolist() == [False] * 3 + [True] + [False] * 5
    assert not loop_positions(torch.arange(20)[None], min_tokens=2).any()


def test_loop_positions_agree_with_the_degeneracy_measure():
    import torch

    from specdec_lab.train.quality import LOOP_MIN_TOKENS, loop_positions

    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        period = 1 + trial % 4
        row = torch.randint(0, 6, (40,), generator=gen)
        start, repeats = int(torch.randint(0, 20, (1,), generator=gen)), int(torch.randint(1, 6, (1,), generator=gen))
        cycle = row[start : start + period].repeat(repeats)
        row[start : start + len(cycle)] = cycle[: 40 - start]
        tokens = row.tolist()
        assert loop_positions(row[None], LOOP_MIN_TOKENS)[0].any().item() == is_degenerate(tokens)


def test_a_statement_written_three_times_in_a_row_repeats_itself():
    import torch

    from specdec_lab.train.quality import loop_positions, repeats_itself

    line = [11, 12, 13, 14, 15, 16, 17]  # e.g. "self.items.append(item)\n": a cycle longer than 4 tokens
    assert not is_degenerate([1, 2] + line * 3) and repeats_itself([1, 2] + line * 3)
    assert not repeats_itself([1, 2] + line * 2 + [3])  # twice is not yet a loop
    marked = loop_positions(torch.tensor([line * 3]), 8, max_period=32, copies=2)[0]
    assert marked.tolist() == [False] * 14 + [True] * 7  # the third copy, from its first token
    assert not repeats_itself([]) and not repeats_itself(list(range(40)))
