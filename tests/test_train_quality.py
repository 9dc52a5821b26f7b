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
