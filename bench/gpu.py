"""The first GPU run: steps per second and peak memory of a hand-written loop, nbtrainer and (when installed) Hugging
Face's Trainer, as ratios to the hand-written loop measured in the same run.

    python bench/gpu.py [--steps 200] [--models mlp resnet18 encoder] [--precisions fp32 bf16 fp16] [--compile off on]

Models: a small MLP at batch 64 (launch-bound: the Python and kernel-launch overhead per step is what shows), a
resnet18-like CNN at batch 256 (32x32 inputs; built here, no torchvision needed) and a small transformer encoder
(6 layers, d_model 512, 128 tokens, batch 64). Each configuration trains `--steps` steps after 20 warm-up steps
(compile's warm-up excluded), synchronising only at the end; the order of the loops rotates per configuration.
Every loop uses the same recipe: AdamW (fused on CUDA), autocast in the precision, GradScaler for fp16.

On a machine without CUDA it says so and exits 0: CI and the development machines have no GPU.
"""

import argparse, itertools, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F


def block(cin, cout, stride):
    "A resnet basic block."

    class Basic(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
            self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.skip = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else nn.Identity()
            )

        def forward(self, x):
            return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.skip(x))

    return Basic()


def resnet18(classes=10):
    layers, cin = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()], 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [block(cin, cout, stride), block(cout, cout, 1)]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))


class Encoder(nn.Module):
    def __init__(self, vocab=1000, d=512, layers=6, classes=10):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.body = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 8, 4 * d, batch_first=True), layers)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        return self.head(self.body(self.embed(x)).mean(1))


MODELS = {  # name: (model, batch size, input maker)
    'mlp': (
        lambda: nn.Sequential(nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)),
        64,
        lambda n, g: torch.randn(n, 784, generator=g),
    ),
    'resnet18': (resnet18, 256, lambda n, g: torch.randn(n, 3, 32, 32, generator=g)),
    'encoder': (Encoder, 64, lambda n, g: torch.randint(0, 1000, (n, 128), generator=g)),
}
DTYPES = {'fp32': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}


def batches(name, steps):
    "Batches made on the host and pinned, as a DataLoader with pin_memory gives them; moved with non_blocking."
    _, bs, make = MODELS[name]
    g = torch.Generator().manual_seed(0)
    return [
        (make(bs, g).pin_memory(), torch.randint(0, 10, (bs,), generator=g).pin_memory()) for _ in range(min(steps, 50))
    ]


def make_model(name, compiled):
    torch.manual_seed(0)
    model = MODELS[name][0]().cuda()
    return torch.compile(model) if compiled else model


def hand(name, precision, compiled, data, steps):
    model = make_model(name, compiled)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    scaler = torch.amp.GradScaler('cuda') if precision == 'fp16' else None
    dtype = DTYPES[precision]

    def run(n):
        for x, y in itertools.islice(itertools.cycle(data), n):
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            with torch.autocast('cuda', dtype=dtype, enabled=dtype is not None):
                loss = F.cross_entropy(model(x), y)
            if scaler:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            opt.zero_grad(set_to_none=True)

    return run


def nbtrainer_loop(name, precision, compiled, data, steps):
    from nbtrainer import Learner

    learn = Learner(
        make_model(name, False),
        data,
        lr=1e-4,
        metrics=(),
        precision=precision,
        progress=False,
        compile=compiled,
        device='cuda',
    )

    def run(n):
        learn.fit(steps=n)

    return run


def hf_trainer(name, precision, compiled, data, steps):
    try:
        from transformers import Trainer, TrainingArguments
    except ImportError:
        return None
    model = make_model(name, False)

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x, labels):
            return {'loss': F.cross_entropy(self.model(x), labels)}

    examples = [{'x': x[i], 'labels': y[i]} for x, y in data for i in range(len(y))]

    def run(n):
        args = TrainingArguments(
            '/tmp/nbtrainer-gpu-bench',
            max_steps=n,
            per_device_train_batch_size=MODELS[name][1],
            learning_rate=1e-4,
            bf16=precision == 'bf16',
            fp16=precision == 'fp16',
            torch_compile=compiled,
            report_to=[],
            save_strategy='no',
            logging_strategy='no',
            dataloader_pin_memory=True,
            optim='adamw_torch_fused',
        )
        Trainer(Wrapped(), args, train_dataset=examples).train()

    return run


def measure(make, name, precision, compiled, steps):
    run = make(name, precision, compiled, batches(name, steps), steps)
    if run is None:
        return None
    run(20)  # warm-up: allocator, cuDNN autotuning, compilation
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    run(steps)
    torch.cuda.synchronize()
    return steps / (time.perf_counter() - start), torch.cuda.max_memory_allocated() / 2**20


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--steps', type=int, default=200)
    ap.add_argument('--models', nargs='+', default=list(MODELS), choices=list(MODELS))
    ap.add_argument('--precisions', nargs='+', default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument('--compile', nargs='+', default=['off', 'on'], choices=['off', 'on'])
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            'bench/gpu.py needs CUDA: this machine has no GPU (torch.cuda.is_available() is False). Nothing measured.'
        )
        return 0
    print(f'{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.steps} steps per configuration')
    print(f'{"model":10} {"precision":9} {"compile":7} {"loop":10} {"steps/s":>9} {"ratio":>7} {"peak MiB":>9}')
    loops = [('hand', hand), ('nbtrainer', nbtrainer_loop), ('hf Trainer', hf_trainer)]
    for i, (name, precision, compiled) in enumerate(itertools.product(args.models, args.precisions, args.compile)):
        order = loops[i % 3 :] + loops[: i % 3]  # rotate, so no loop always runs first
        results = {label: measure(make, name, precision, compiled == 'on', args.steps) for label, make in order}
        base = results['hand'][0]
        for label, _ in loops:
            if results[label] is None:
                continue
            rate, peak = results[label]
            print(f'{name:10} {precision:9} {compiled:7} {label:10} {rate:9.1f} {rate / base:7.3f} {peak:9.0f}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
