"""Where the loop's Python work per step goes: bytecodes and calls by function, `learn.fit` minus the hand-written loop.

bench/instructions.py counts every instruction (C included) but says nothing of where they go; this counts Python's
own work by function, exactly, in seconds (no valgrind): `sys.settrace` with opcode events. Each loop runs twice, a
short and a long epoch (validation set a fifth of it, as in bench/overhead.py); the difference over the extra steps is
the work per step, start-up and per-fit work removed. What the hand-written loop also runs (nn.Module's `__call__`,
the optimizer's Python) cancels out in the difference. The counts depend on the code only, never on the machine.

    python bench/bytecodes.py [--short 20] [--long 120] [--top 30] [--learner preemption=False metrics=()]

tests/test_overhead.py holds the totals under a bound, with `per_step`.

`--learner KEY=VALUE ...` passes keywords to the Learner (Python literals): what a default costs, by ablation.
"""

import argparse, ast, collections, os, sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import overhead as ov  # noqa: E402


def traced(run):
    "Run `run()` under a tracer: ({function: bytecodes}, {function: calls})."
    opcodes, calls = collections.Counter(), collections.Counter()

    def tracer(frame, event, arg):
        code = frame.f_code
        key = f'{os.path.basename(code.co_filename)}:{code.co_qualname}'
        if event == 'opcode':
            opcodes[key] += 1
        elif event == 'call':
            calls[key] += 1
            frame.f_trace_opcodes = True
        return tracer

    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    return opcodes, calls


def loop(mode, steps, learner_kwargs):
    "A function running `mode` ('hand' or 'learner') for one epoch of `steps` batches, its setup done."
    train, valid = ov.make_batches(steps), ov.make_batches(max(1, steps // 5), seed=1)
    model = ov.make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if mode == 'hand':
        return lambda: ov.hand_written_epoch(model, opt, train, valid)
    from nbtrainer import Learner

    kwargs = dict(opt_func=torch.optim.Adam, lr=1e-3, metrics=('accuracy',), progress=False) | learner_kwargs
    learn = Learner(model, train, valid, **kwargs)
    return lambda: learn.fit(1)


def keyword(text):
    "KEY=VALUE with VALUE a Python literal."
    key, _, value = text.partition('=')
    if not key.isidentifier() or not value:
        raise argparse.ArgumentTypeError(f'{text!r} is not KEY=VALUE')
    return key, ast.literal_eval(value)


def per_step(mode, short, long, learner_kwargs):
    "({function: bytecodes}, {function: calls}) a step of `mode`: the difference of a `long` and a `short` epoch."
    few, many = (traced(loop(mode, n, learner_kwargs)) for n in (short, long))
    return tuple(
        {k: (b[k] - a.get(k, 0)) / (long - short) for k in b.keys() | a.keys() if b.get(k, 0) != a.get(k, 0)}
        for a, b in zip(few, many)
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--short', type=int, default=20)
    parser.add_argument('--long', type=int, default=120)
    parser.add_argument('--top', type=int, default=30, help='functions listed, by bytecodes per step')
    parser.add_argument('--learner', nargs='*', type=keyword, default=[], metavar='KEY=VALUE')
    args = parser.parse_args()
    torch.set_num_threads(1)
    learner_kwargs = dict(args.learner)
    (hand_ops, hand_calls), (ops, calls) = (
        per_step(mode, args.short, args.long, learner_kwargs) for mode in ('hand', 'learner')
    )
    extra_ops = {k: v - hand_ops.get(k, 0) for k, v in ops.items()}
    extra_calls = {k: calls.get(k, 0) - hand_calls.get(k, 0) for k in calls.keys() | hand_calls.keys()}
    print(f'per step, learn.fit({learner_kwargs or "defaults"}) minus the hand-written loop:')
    print(
        f'  bytecodes {sum(ops.values()) - sum(hand_ops.values()):8.1f}   (hand-written loop: {sum(hand_ops.values()):.1f})'
    )
    print(f'  calls     {sum(extra_calls.values()):8.1f}   (of Python functions)')
    print(f'\n  {"bytecodes":>9} {"calls":>6}  function')
    for key in sorted(extra_ops, key=lambda k: -abs(extra_ops[k]))[: args.top]:
        print(f'  {extra_ops[key]:9.1f} {extra_calls.get(key, 0):6.2f}  {key}')


if __name__ == '__main__':
    main()
