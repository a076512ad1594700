"""Token shards and batches (scratchlm/data/shards.py): the shard format by hand, bad headers,
batch streams (targets, seeds, ranks, epochs, resuming), padding, the padded vocabulary."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scratchlm.data import BatchStream, pad_batch, padded_vocab_size, read_shard, write_shard
from scratchlm.errors import UserError


# ------------------------------------------------------------------------------------- shards


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.integers(0, 2**32 - 1), max_size=300), wide=st.booleans())
def test_shard_round_trip_and_header_by_hand(tmp_path_factory, values, wide):
    path = tmp_path_factory.mktemp("shard") / "x.bin"
    values = values if wide else [v % 65536 for v in values]
    itemsize = 4 if wide else 2
    write_shard(path, np.array(values, dtype=np.uint64), dtype="uint32" if wide else "uint16")
    raw = path.read_bytes()
    assert raw[:8] == b"SLMTOKEN"
    assert int.from_bytes(raw[8:12], "little") == 1
    assert int.from_bytes(raw[12:16], "little") == itemsize
    assert int.from_bytes(raw[16:24], "little") == len(values)
    assert len(raw) == 24 + itemsize * len(values)
    assert [int.from_bytes(raw[24 + i * itemsize : 24 + (i + 1) * itemsize], "little") for i in range(len(values))] == values
    back = read_shard(path)
    assert back.dtype.itemsize == itemsize and back.tolist() == values


def _corrupt(raw: bytes, how: str) -> bytes:
    if how == "magic":
        return b"NOTASHRD" + raw[8:]
    if how == "version":
        return raw[:8] + (7).to_bytes(4, "little") + raw[12:]
    if how == "dtype":
        return raw[:12] + (3).to_bytes(4, "little") + raw[16:]
    if how == "truncated":
        return raw[:-1]
    if how == "trailing":
        return raw + b"\0\0"
    if how == "short_header":
        return raw[:10]
    raise AssertionError(how)


@pytest.mark.parametrize("how, message", [
    ("magic", "magic"), ("version", "version 7"), ("dtype", "3 bytes per id"), ("truncated", "truncated"),
    ("trailing", "trailing bytes"), ("short_header", "truncated"),
])
def test_bad_shard_header_is_a_clear_error(tmp_path, how, message):
    path = tmp_path / "train.bin"
    write_shard(path, np.arange(10), dtype="uint16")
    path.write_bytes(_corrupt(path.read_bytes(), how))
    with pytest.raises(UserError, match=message) as info:
        read_shard(path)
    assert str(path) in str(info.value)


def test_missing_shard_and_empty_shard(tmp_path):
    with pytest.raises(UserError, match="no such token shard"):
        read_shard(tmp_path / "nope.bin")
    write_shard(tmp_path / "empty.bin", [], dtype="uint16")
    assert len(read_shard(tmp_path / "empty.bin")) == 0


# ------------------------------------------------------------------------------------- batches


def test_targets_are_inputs_shifted_by_one():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50, size=500).astype(np.uint16)
    for mode in ("random", "sequential"):
        stream = BatchStream(tokens, 4, 8, seed=1, mode=mode)
        for _ in range(5):
            x, y = stream.next_batch()
            assert x.shape == y.shape == (4, 8) and x.dtype == y.dtype == torch.int64
            assert torch.equal(x[:, 1:], y[:, :-1])
    # with tokens equal to their positions, each row is a contiguous window and y = x + 1
    positions = np.arange(1000, dtype=np.uint32)
    for mode in ("random", "sequential"):
        x, y = BatchStream(positions, 3, 16, seed=0, mode=mode).next_batch()
        assert torch.equal(y, x + 1) and torch.equal(x[:, 1:] - x[:, :-1], torch.ones(3, 15, dtype=torch.int64))


def test_same_seed_same_batches_different_seed_different():
    tokens = np.arange(10_000, dtype=np.uint16)
    a, b, c = (BatchStream(tokens, 4, 32, seed=s) for s in (7, 7, 8))
    for _ in range(5):
        xa, ya = a.next_batch()
        xb, yb = b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(BatchStream(tokens, 4, 32, seed=7).next_batch()[0], c.next_batch()[0])


@pytest.mark.parametrize("mode", ["random", "sequential"])
def test_ranks_see_disjoint_windows(mode):
    tokens = np.arange(3000, dtype=np.uint16)  # a token's value is its position
    W, B, T = 3, 4, 16
    seen = []
    for rank in range(W):
        stream = BatchStream(tokens, B, T, seed=3, rank=rank, world_size=W, mode=mode)
        positions: set[int] = set()
        for _ in range(15):
            x, _ = stream.next_batch()
            positions.update(x.flatten().tolist())
        seen.append(positions)
    for i in range(W):
        for j in range(i + 1, W):
            assert not seen[i] & seen[j], (i, j)


def test_sequential_epoch_predicts_every_token_once():
    n, B, T = 1 + 16 * 10, 2, 16  # exactly 10 rows of T+1 sharing their edge tokens
    stream = BatchStream(np.arange(n, dtype=np.uint16), B, T, seed=0, mode="sequential")
    targets = [t for _ in range(5) for t in stream.next_batch()[1].flatten().tolist()]
    assert sorted(targets) == list(range(1, n))


@settings(max_examples=25, deadline=None)
@given(k=st.integers(0, 30), mode=st.sampled_from(["random", "sequential"]), rank=st.integers(0, 1))
def test_resume_continues_identically(k, mode, rank):
    tokens = np.arange(5000, dtype=np.uint16)
    a = BatchStream(tokens, 3, 20, seed=11, rank=rank, world_size=2, mode=mode)
    for _ in range(k):
        a.next_batch()
    state = json.loads(json.dumps(a.state_dict()))  # survives a JSON round trip, as in a checkpoint
    b = BatchStream(tokens, 3, 20, seed=11, rank=rank, world_size=2, mode=mode)
    b.load_state_dict(state)
    for _ in range(3):
        xa, ya = a.next_batch()
        xb, yb = b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_stream_errors():
    tokens = np.arange(40, dtype=np.uint16)
    with pytest.raises(UserError, match="fewer than one window"):
        BatchStream(tokens, 2, 40, seed=0)
    with pytest.raises(UserError, match="per rank"):
        BatchStream(tokens, 2, 16, seed=0, rank=0, world_size=3)
    with pytest.raises(UserError, match="fewer than one window"):
        BatchStream(tokens, 2, 40, seed=0, mode="sequential")
    stream = BatchStream(tokens, 2, 8, seed=0)
    with pytest.raises(UserError, match="batch_size"):
        BatchStream(tokens, 3, 8, seed=0).load_state_dict(stream.state_dict())


def test_stream_over_a_memmapped_shard(tmp_path):
    write_shard(tmp_path / "s.bin", np.arange(300), dtype="uint16")
    x, y = BatchStream(read_shard(tmp_path / "s.bin"), 2, 10, seed=0).next_batch()
    assert torch.equal(y, x + 1)


def test_pad_batch_by_hand():
    x, y, mask = pad_batch([[5, 6, 7, 8], [9, 10]], pad_id=0)
    assert x.tolist() == [[5, 6, 7], [9, 0, 0]]
    assert y.tolist() == [[6, 7, 8], [10, -100, -100]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    with pytest.raises(UserError):
        pad_batch([[1]], pad_id=0)


def test_padded_batch_loss_equals_separate_sequences():
    from scratchlm.model.config import GPTConfig
    from scratchlm.model.gpt import GPT

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=16, n_layer=2, n_head=2, n_embd=16)).eval()
    seqs = [[1, 4, 5, 6, 7, 8, 9], [1, 2, 3], [1, 11, 12, 13, 14]]
    x, y, mask = pad_batch(seqs, pad_id=0)
    with torch.no_grad():
        logits, loss = model(x, y, attention_mask=mask)
        total, count = 0.0, 0
        for b, s in enumerate(seqs):
            alone_logits, alone_loss = model(torch.tensor([s[:-1]]), torch.tensor([s[1:]]))
            n = len(s) - 1
            assert torch.allclose(logits[b, :n], alone_logits[0], atol=1e-5)
            total, count = total + alone_loss.item() * n, count + n
    assert loss.item() == pytest.approx(total / count, abs=1e-5)


def test_padded_vocab_size():
    assert padded_vocab_size(50257) == 50304
    assert (padded_vocab_size(64), padded_vocab_size(65), padded_vocab_size(67, 8)) == (64, 128, 72)


def test_line_starts_by_hand_and_windows_that_begin_only_there():
    """--windows lines: 0 is BOS, 1 a newline; a row starts only after one of them (or at 0),
    with a whole window inside the rank's part, and all such places get drawn."""
    from scratchlm.data.shards import line_starts

    tokens = np.array([0, 5, 6, 1, 7, 8, 9, 1, 1, 5, 0, 6, 7, 8, 9, 5, 6], dtype=np.uint16)
    # after index 0 (BOS), 3 (\n), 7 (\n), 8 (\n), 10 (BOS); and 0 itself
    assert line_starts(tokens, 1, 0).tolist() == [0, 1, 4, 8, 9, 11]
    assert line_starts(tokens, 1, 0, chunk=4).tolist() == [0, 1, 4, 8, 9, 11]  # marks at chunk edges
    assert line_starts(tokens, 1, None).tolist() == [0, 4, 8, 9]
    stream = BatchStream(tokens, 64, 4, seed=3, starts=line_starts(tokens, 1, 0))
    x, y = stream.next_batch()
    firsts = {tuple(row) for row in x.tolist()}
    # starts with 4 + 1 tokens after them: 0, 1, 4, 8, 9, 11 (11 + 4 < 17): each one's window
    assert firsts == {tuple(tokens[s:s + 4].tolist()) for s in (0, 1, 4, 8, 9, 11)}
    assert torch.equal(y[:, :-1], x[:, 1:])
    resumed = BatchStream(tokens, 64, 4, seed=3, starts=line_starts(tokens, 1, 0))
    resumed.load_state_dict(stream.state_dict())
    assert torch.equal(resumed.next_batch()[0], stream.next_batch()[0])
    anywhere = BatchStream(tokens, 64, 4, seed=3)
    with pytest.raises(UserError, match="line_starts"):  # a state saved with line windows is not an anywhere one's
        anywhere.load_state_dict(resumed.state_dict())
    with pytest.raises(UserError, match="no line starts"):
        BatchStream(tokens, 2, 4, seed=3, starts=np.array([15]))
