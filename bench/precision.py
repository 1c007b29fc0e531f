"""bf16 against fp32 on this machine's CPU: time per step and peak memory, each in a fresh process.

A 784-2048-2048-10 MLP, batch 512, AdamW, one thread, 40 steps after 5 warm-up steps. Peak memory is the
process's peak resident set (ru_maxrss), which includes torch itself: compare the two rows, not the absolute
numbers. On a GPU with tensor cores bf16 is typically much faster; on a CPU it depends on whether the CPU has
native bf16 instructions (AVX512-BF16 / AMX), so this figure is about this machine only.

    python bench/precision.py
"""

import json, platform, resource, subprocess, sys, time


def child(precision):
    import torch, torch.nn as nn
    from nbtrainer import Learner

    torch.set_num_threads(1)
    torch.manual_seed(0)
    batches = [(torch.randn(512, 784), torch.randint(0, 10, (512,))) for _ in range(45)]
    model = nn.Sequential(nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
    learn = Learner(model, batches[:5], precision=precision, metrics=(), progress=False)
    learn.fit(1)  # warm-up
    learn.train_dl = batches[5:]
    start = time.perf_counter()
    learn.fit(1)
    per_step = (time.perf_counter() - start) / 40
    print(
        json.dumps(
            {
                'precision': precision,
                'ms_per_step': per_step * 1e3,
                'peak_rss_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                'final_loss': learn.recorder.train_losses[-1],
            }
        )
    )


def main():
    rows = []
    for precision in ('fp32', 'bf16', 'fp32', 'bf16'):  # twice each, interleaved: noise shows as spread
        out = subprocess.check_output([sys.executable, __file__, '--child', precision], text=True)
        rows.append(json.loads(out))
    cpu = next(
        (line.split(':', 1)[1].strip() for line in open('/proc/cpuinfo') if line.startswith('model name')),
        platform.processor(),
    )
    print(f'CPU: {cpu}; torch one thread')
    for r in rows:
        print(
            f"  {r['precision']}: {r['ms_per_step']:7.1f} ms/step   peak RSS {r['peak_rss_mb']:7.0f} MB   last loss {r['final_loss']:.4f}"
        )


if __name__ == '__main__':
    if '--child' in sys.argv:
        child(sys.argv[sys.argv.index('--child') + 1])
    else:
        main()
