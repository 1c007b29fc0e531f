"""The loop's own Python work per training step, against the hand-written loop's: bytecodes and calls, exact.

bench/instructions.py counts the instructions with valgrind (minutes, and a layout's hashes move a count by ~0.1%);
bench/bytecodes.py counts the Python the loop adds, by function, in seconds and exactly: it depends on the code alone,
never on the machine or its load. This test holds that count, so a change that adds work to every batch fails here
and names the functions that grew, instead of showing up months later as a slower fit.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'bench'))
import bytecodes  # noqa: E402

# #43: 887 bytecodes and 32.4 calls a step at its fourth step's start, 805 and 28.3 after it, 744 and 23.9 after its
# fifth (Preemption quiet until a signal, a scope's cancel caught by an except), 704 and 22.6 here after its sixth
# (bench/bytecodes.py: 688 and 22.1; accuracy on the usual batch without the layout code, a window of one closed in one step)
MOST_BYTECODES, MOST_CALLS = 715, 23.0


def test_a_default_fit_adds_no_more_python_a_step_than_it_did():
    torch.set_num_threads(1)
    (hand_ops, hand_calls), (ops, calls) = (bytecodes.per_step(mode, 20, 120, {}) for mode in ('hand', 'learner'))
    extra_ops = sum(ops.values()) - sum(hand_ops.values())
    extra_calls = sum(calls.values()) - sum(hand_calls.values())
    grown = sorted(ops, key=lambda k: -(ops[k] - hand_ops.get(k, 0)))[:8]
    where = ', '.join(f'{k} {ops[k] - hand_ops.get(k, 0):.0f}' for k in grown)
    assert extra_ops <= MOST_BYTECODES, f'{extra_ops:.1f} bytecodes a step over the hand-written loop: {where}'
    assert extra_calls <= MOST_CALLS, f'{extra_calls:.1f} calls a step over the hand-written loop: {where}'


def test_the_count_is_exact():
    "Two counts of the same loop agree to the bytecode: the bound above is not a measurement with noise."
    torch.set_num_threads(1)
    first, second = (bytecodes.per_step('learner', 10, 30, {}) for _ in range(2))
    assert first == second
