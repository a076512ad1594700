"""The fine-tuning stage's batches (scratchlm/training/sft_batches.py): every conversation once per
epoch, right-padded with the padding and the prompt left out of the targets, two processes
sharing a step as one, an exact resume; and the model's loss on a padded batch equal to the mean
over the learned targets of each row computed alone, without padding."""

from __future__ import annotations

import math

import pytest
import torch

from scratchlm.errors import UserError
from scratchlm.text.chat import ChatRow
from scratchlm.training.distributed import Dist
from scratchlm.training.sft_batches import ConversationBatches, cut_rows

PAD = 0


def _row(n: int, first_learned: int, start: int = 1) -> ChatRow:
    """n ids start, start + 1, ...; learned from position first_learned on."""
    return ChatRow(list(range(start, start + n)), [i >= first_learned for i in range(n)])


ROWS = [_row(5, 2, start=10 * k + 1) for k in range(6)] + [_row(3, 1, start=70)]


def _key(x_row: torch.Tensor) -> int:
    return int(x_row[0])  # each row's first id is its own


def test_an_epoch_holds_every_row_once_padded_with_the_prompt_and_padding_left_out():
    batches = ConversationBatches(ROWS, batch_size=2, block_size=16, seed=3, pad_id=PAD)
    seen = []
    for _ in range(3):  # 7 rows, batches of 2: three steps, the odd row waits for the next shuffle
        x, y = batches.next_batch()
        assert x.shape == y.shape and x.shape[0] == 2
        for xr, yr in zip(x, y):
            row = next(r for r in ROWS if r.ids[0] == _key(xr))
            n = len(row.ids) - 1
            assert xr[:n].tolist() == row.ids[:-1] and set(xr[n:].tolist()) <= {PAD}
            assert yr[:n].tolist() == [i if keep else -100 for i, keep in zip(row.ids[1:], row.loss_mask[1:])]
            assert set(yr[n:].tolist()) <= {-100}
            seen.append(row.ids[0])
    assert len(set(seen)) == 6 and len(seen) == 6
    assert batches.epoch == 0
    batches.next_batch()
    assert batches.epoch == 1


def test_two_processes_keep_the_rows_one_process_with_twice_the_batch_draws():
    one = ConversationBatches(ROWS, batch_size=4, block_size=16, seed=5, pad_id=PAD)
    ranks = [ConversationBatches(ROWS, batch_size=2, block_size=16, seed=5, pad_id=PAD, d=Dist(rank=r, world_size=2))
             for r in range(2)]
    for _ in range(4):
        x, _ = one.next_batch()
        shares = [r.next_batch()[0] for r in ranks]
        assert [_key(row) for row in x[0::2]] == [_key(row) for row in shares[0]]
        assert [_key(row) for row in x[1::2]] == [_key(row) for row in shares[1]]


def test_a_resumed_stream_gives_the_batches_the_first_would_have():
    first = ConversationBatches(ROWS, batch_size=2, block_size=16, seed=7, pad_id=PAD)
    for _ in range(5):
        first.next_batch()
    again = ConversationBatches(ROWS, batch_size=2, block_size=16, seed=7, pad_id=PAD)
    again.load_state_dict(first.state_dict())
    for _ in range(4):
        (xa, ya), (xb, yb) = first.next_batch(), again.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_rows_are_cut_to_the_context_and_one_with_nothing_left_to_learn_is_refused():
    batches = ConversationBatches([_row(10, 2, start=1), _row(10, 3, start=50)], batch_size=2, block_size=4,
                                  seed=0, pad_id=PAD)
    x, y = batches.next_batch()
    assert x.shape == (2, 4)
    with pytest.raises(UserError, match="conversation 2: nothing to learn within the context of 4 tokens"):
        ConversationBatches([_row(10, 2), _row(10, 5)], batch_size=1, block_size=4, seed=0, pad_id=PAD)
    with pytest.raises(UserError, match="7 conversations are fewer than one step's batch of 8"):
        ConversationBatches(ROWS, batch_size=4, block_size=16, seed=0, pad_id=PAD, d=Dist(rank=0, world_size=2))


def test_the_loss_on_a_padded_batch_is_the_mean_over_each_rows_learned_targets_alone():
    from scratchlm.model.config import GPTConfig
    from scratchlm.model.gpt import GPT

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=80, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0)).eval()
    rows = [_row(9, 3, start=1), _row(4, 1, start=40), _row(6, 5, start=60)]
    x, y = ConversationBatches(rows, batch_size=3, block_size=16, seed=1, pad_id=PAD).next_batch()
    with torch.no_grad():
        _, loss = model(x, y)
        nll, count = 0.0, 0
        for row in rows:  # each row alone: no padding anywhere
            logits, _ = model(torch.tensor([row.ids[:-1]]))
            logp = torch.log_softmax(logits[0].double(), dim=-1)
            for t, (target, keep) in enumerate(zip(row.ids[1:], row.loss_mask[1:])):
                if keep:
                    nll, count = nll - float(logp[t, target]), count + 1
    assert count == 6 + 3 + 1
    assert math.isclose(float(loss), nll / count, rel_tol=1e-5)


@pytest.mark.parametrize("batch_size", [1, 2, 5])
def test_the_held_out_loss_is_the_mean_of_minus_log_p_over_every_learned_target(batch_size):
    """evaluate_rows, in batches of any size (padded, the last one short), against every row's
    learned targets scored alone and averaged over all of them (not a mean of batch means)."""
    from types import SimpleNamespace

    from scratchlm.model.config import GPTConfig
    from scratchlm.model.gpt import GPT
    from scratchlm.training.evaluation import evaluate_rows

    torch.manual_seed(1)
    model = GPT(GPTConfig(vocab_size=80, block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=0.0))
    rows = [_row(9, 3, start=1), _row(4, 1, start=40), _row(6, 5, start=60), _row(20, 2, start=10)]  # the last cut to 17
    setup = SimpleNamespace(cfg=SimpleNamespace(batch_size=batch_size, dtype="float32", fused_loss=False),
                            device=torch.device("cpu"), d=Dist(), block_size=16)
    got = evaluate_rows(model, setup, cut_rows(rows, 16), pad_id=PAD)  # the run's rows come cut (sft_data)
    assert model.training  # evaluation put it back
    nll, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            ids, mask = row.ids[:17], row.loss_mask[:17]
            logits, _ = model.eval()(torch.tensor([ids[:-1]]))
            logp = torch.log_softmax(logits[0].double(), dim=-1)
            for t, (target, keep) in enumerate(zip(ids[1:], mask[1:])):
                if keep:
                    nll, count = nll - float(logp[t, target]), count + 1
    assert count == 6 + 3 + 1 + 15
    assert math.isclose(got, nll / count, rel_tol=1e-6)
