"""Hugging Face sequence models (tiny configs, test-only dependency): a causal LM and a token classifier train,
accumulate by tokens, resume, and report perplexity and token accuracy, each against a hand-written reference."""

import copy, math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from nbtrainer import Checkpointer, Learner
from nbtrainer.callback import CancelFitException

VOCAB, WIDTH = 50, 12


def hf():
    "Hugging Face transformers (a dev dependency: pip install -e \".[dev]\"), imported by the first test that builds a model, not at collection."
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def causal_lm(seed=0):
    transformers = hf()
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=WIDTH,
        n_embd=16,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config)


def token_classifier(seed=0, labels=5):
    transformers = hf()
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=WIDTH,
        num_labels=labels,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertForTokenClassification(config)


class Sequences(Dataset):
    "Right-padded arithmetic sequences of lengths 2..WIDTH: padding has attention 0 and label -100, so each batch has its own token count."

    def __init__(self, n, seed, tags=None):
        g = torch.Generator().manual_seed(seed)
        start, step = torch.randint(1, VOCAB, (n, 1), generator=g), torch.randint(1, 4, (n, 1), generator=g)
        self.ids = (start + step * torch.arange(WIDTH)) % (VOCAB - 1) + 1  # learnable: a stride per sequence
        self.lengths = torch.randint(2, WIDTH + 1, (n,), generator=g)
        self.tags = None if tags is None else self.ids % tags  # learnable from the token itself

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        mask = (torch.arange(WIDTH) < self.lengths[i]).long()
        labels = self.ids[i] if self.tags is None else self.tags[i]
        return {'input_ids': self.ids[i], 'attention_mask': mask, 'labels': labels.masked_fill(mask == 0, -100)}


def batches_of(ds, bs):
    return DataLoader(ds, batch_size=bs)


def union(ds):
    "The whole dataset as one batch."
    return next(iter(DataLoader(ds, batch_size=len(ds))))


def sgd_step_on(model, batches, weights):
    "One SGD step (lr 0.5) on the sum of weights[i] * loss of batch i: the hand-written reference."
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for batch, w in zip(batches, weights):
        (model(**batch).loss * w).backward()
    opt.step()
    return model


def max_diff(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def tokens_of(batch, shift):
    labels = batch['labels'][:, 1:] if shift else batch['labels']
    return (labels != -100).sum().item()


@pytest.mark.parametrize('build,shift', [(causal_lm, True), (token_classifier, False)])
def test_accumulation_counts_tokens(build, shift):
    "4 micro-batches of varying token counts step to the weights of one batch of their union, as the model's own loss says."
    ds = Sequences(8, seed=1, tags=None if shift else 5)
    learn = Learner(
        build(), batches_of(ds, 2), opt_func=torch.optim.SGD, lr=0.5, accumulate=4, progress=False, metrics=()
    )
    learn.fit(steps=1)
    big = sgd_step_on(build(), [union(ds)], [1.0])
    assert max_diff(learn.model, big) < 1e-6
    # the example-weighted rule (the Trainer bug of October 2024) gives other weights: this test can tell them apart
    micro = list(batches_of(ds, 2))
    assert len({tokens_of(b, shift) for b in micro}) > 1  # the micro-batches really differ in tokens
    by_examples = sgd_step_on(build(), micro, [0.25] * 4)
    assert max_diff(by_examples, big) > 1e-4


def test_causal_lm_trains_and_reports_perplexity_and_token_accuracy():
    train, valid = Sequences(64, seed=2), Sequences(24, seed=3)
    learn = Learner(
        causal_lm(),
        batches_of(train, 8),
        batches_of(valid, 5),
        lr=3e-3,
        progress=False,
        metrics=['perplexity', 'accuracy'],
    )
    learn.fit(3)
    rows = learn.recorder.history
    assert rows[-1]['valid_loss'] < rows[0]['valid_loss']  # it learns
    model = learn.model.eval()
    total, count, hits = 0.0, 0, 0
    with torch.no_grad():
        for batch in batches_of(valid, 5):  # the reference: sums over the next-token labels that count
            logits, labels = (
                model(**{k: v for k, v in batch.items() if k != 'labels'}).logits[:, :-1],
                batch['labels'][:, 1:],
            )
            kept = labels != -100
            total += F.cross_entropy(logits[kept].double(), labels[kept], reduction='sum').item()
            hits += (logits[kept].argmax(-1) == labels[kept]).sum().item()
            count += kept.sum().item()
    values = learn.validate()
    assert math.isclose(values['valid_loss'], total / count, rel_tol=1e-5)
    assert math.isclose(values['perplexity'], math.exp(total / count), rel_tol=1e-5)
    assert values['accuracy'] == hits / count


def test_token_classifier_accuracy_matches_sklearn():
    from sklearn.metrics import accuracy_score

    train, valid = Sequences(64, seed=4, tags=5), Sequences(21, seed=5, tags=5)
    learn = Learner(
        token_classifier(),
        batches_of(train, 8),
        batches_of(valid, 4),
        lr=3e-3,
        progress=False,
        metrics=['accuracy', 'f1'],
    )
    learn.fit(2)
    preds, targets = learn.get_preds()  # (N, T, labels) and (N, T), padding labelled -100
    kept = targets != -100
    row = learn.recorder.history[-1]
    assert row['accuracy'] == accuracy_score(targets[kept], preds[kept].argmax(-1))


def test_causal_lm_resumes_to_the_uninterrupted_weights(tmp_path):
    "Killed (stopped) after 3 of 6 steps, then resumed from the checkpoint: the weights of a fit never stopped."
    train = Sequences(48, seed=6)

    def learner(folder=None):
        cbs = [Checkpointer(folder, every_steps=1, every_epoch=False)] if folder else []
        return Learner(causal_lm(), batches_of(train, 4), lr=3e-3, accumulate=2, progress=False, metrics=(), cbs=cbs)

    straight = learner()
    straight.fit(steps=6)

    def stop_at_3(learn, event):
        if event == 'after_step' and learn.step == 3:
            raise CancelFitException()

    first = learner(tmp_path)
    first.fit(steps=6, cbs=[stop_at_3])
    assert first.step == 3
    resumed = learner(tmp_path)
    resumed.fit(steps=6, resume=True)
    assert resumed.step == 6 and max_diff(resumed.model, straight.model) == 0


def test_label_check_reads_the_vocabulary_dimension():
    "Labels beyond the vocabulary are caught on the first batch, before any step, naming the vocabulary size."

    class Bad(Sequences):
        def __getitem__(self, i):
            item = super().__getitem__(i)
            item['input_ids'] = item['input_ids'].clamp(max=VOCAB - 1)  # labels alone out of range
            return item

    bad = Bad(8, seed=7)
    bad.ids[:, 5] = VOCAB + 3
    learn = Learner(causal_lm(), batches_of(bad, 4), progress=False, metrics=())
    before = copy.deepcopy(learn.model.state_dict())
    with pytest.raises(ValueError, match=f'model outputs {VOCAB} classes'):
        learn.fit(1)
    assert all(torch.equal(v, learn.model.state_dict()[k]) for k, v in before.items())


def checkpointing(model):
    "Whether any layer of a Hugging Face model recomputes its activations in backward."
    return any(getattr(m, 'gradient_checkpointing', False) for m in model.modules())


@pytest.mark.parametrize('build', [causal_lm, token_classifier])
def test_gradient_checkpointing_is_the_models_own_switch_and_changes_no_weight(build):
    "model.gradient_checkpointing_enable() (activation_checkpointing_enable() from transformers 5) recomputes"
    "activations in backward: the same fit, the same weights, bit for bit."
    train = Sequences(32, seed=2, tags=None if build is causal_lm else 5)
    fitted = []
    for recompute in (False, True):
        model = build()
        if recompute:
            (getattr(model, 'activation_checkpointing_enable', None) or model.gradient_checkpointing_enable)()
        learn = Learner(model, batches_of(train, 8), lr=3e-3, accumulate=2, progress=False, metrics=())
        learn.fit(2)
        fitted.append(learn)
    plain, checkpointed = fitted
    assert checkpointing(checkpointed.model) and not checkpointing(plain.model)
    assert all(torch.equal(p, q) for p, q in zip(plain.model.parameters(), checkpointed.model.parameters()))
    assert plain.recorder.train_losses == checkpointed.recorder.train_losses
