"""scratchlm.kernels.train_ops: the compiled attention core and GELU for float32 training on a CPU,
checked against float64 computations done here (RoPE as the model applies it, softmax attention
written out, GELU from erf), in every kernel variant this CPU runs; and the model's choice between
them and PyTorch's operations."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from scratchlm import kernels
from scratchlm.kernels import train_ops
from scratchlm.kernels.training_copy import attach_training_kernels
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT, KVCache, rope_tables

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see tests/conftest.py

KERNEL = kernels.cpu_kernels()
needs_kernel = pytest.mark.skipif(KERNEL is None, reason=f"compiled kernels: {kernels.kernel_status()}")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE written out here: pair (d, d + hs/2) of x (..., T, hs) turned by the angle in cos/sin (T, hs/2)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def _attention_float64(qkv: torch.Tensor, n_head: int, rope: bool) -> torch.Tensor:
    """Causal softmax attention of qkv (B, T, 3C), float64 throughout, heads side by side again."""
    B, T, three_c = qkv.shape
    C = three_c // 3
    hs = C // n_head
    q, k, v = (t.reshape(B, T, n_head, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
    if rope:
        cos, sin = rope_tables(T, hs, 10000.0)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    return (weights @ v).transpose(1, 2).reshape(B, T, C)


SHAPES = [  # (B, T, H, hs, rope)
    (3, 17, 2, 32, True),  # T not a multiple of 16: padded rows
    (2, 64, 4, 32, True),  # the baby model's layer
    (1, 5, 3, 16, False),
    (2, 100, 2, 64, True),
    (1, 1, 1, 48, True),  # one position
    (1, 256, 1, 16, True),  # the longest context it takes
    (2, 33, 1, 256, False),  # the widest head
]


@pytest.mark.parametrize("B, T, H, hs, rope", SHAPES)
def test_attention_matches_float64_softmax_attention(kernel_variant, B, T, H, hs, rope):
    g = torch.Generator().manual_seed(T * 1000 + hs)
    qkv64 = torch.randn(B, T, 3 * H * hs, generator=g, dtype=torch.float64, requires_grad=True)
    want = _attention_float64(qkv64, H, rope)
    upstream = torch.randn(want.shape, generator=g, dtype=torch.float64)
    want.backward(upstream)

    qkv = qkv64.detach().float().requires_grad_()
    tables = tuple(t.float() for t in rope_tables(T, hs, 10000.0)) if rope else None
    got = train_ops.attention(qkv, tables, H, kernel_variant)
    assert got is not None and got.shape == (B, T, H * hs) and got.dtype == torch.float32
    got.backward(upstream.float())
    # float32 sums over up to T keys and hs dimensions of values of size ~1 (measured: at most
    # 3.5% of these bounds for y and 1% for the gradient)
    tol = 4e-8 * math.sqrt(T * hs)
    torch.testing.assert_close(got.double(), want.detach(), atol=tol, rtol=1e-6)
    torch.testing.assert_close(qkv.grad.double(), qkv64.grad, atol=4 * tol, rtol=1e-5)


@needs_kernel
def test_attention_is_the_same_on_one_thread_and_two():
    """Each (sequence, head) pair is one thread's from start to end: the thread count cannot change a bit."""
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(4, 40, 3 * 64, generator=g, requires_grad=True)
    upstream = torch.randn(4, 40, 64, generator=g)
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        qkv.grad = None
        y = train_ops.attention(qkv, None, 2)
        y.backward(upstream)
        results.append((y.detach(), qkv.grad.clone()))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@needs_kernel
def test_the_limits_known_in_python_are_the_librarys():
    assert (train_ops.ATTENTION_MAX_T, train_ops.ATTENTION_MAX_HS, train_ops.ATTENTION_HS_MULTIPLE) == (
        KERNEL.attention_max_t, KERNEL.attention_max_hs, KERNEL.attention_hs_multiple)


@needs_kernel
def test_attention_takes_views_and_a_float64_default_dtype():
    """Non-contiguous qkv and dy (the kernel reads contiguous copies) and tables at an offset;
    outputs float32 whatever torch's default dtype (a float16 default once meant 2-byte buffers)."""
    g = torch.Generator().manual_seed(9)
    wide = torch.randn(2, 20, 3 * 64 * 2, generator=g, dtype=torch.float64)
    qkv64 = wide[:, :, ::2].clone().requires_grad_()  # (2, 20, 192): heads of 32
    want = _attention_float64(qkv64, 2, rope=False)
    upstream = torch.randn(2, 20, 64, generator=g, dtype=torch.float64)
    want.backward(upstream)
    qkv = wide.float()[:, :, ::2].detach().requires_grad_()
    assert not qkv.is_contiguous()
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        got = train_ops.attention(qkv, None, 2)
        got.backward(upstream.float().transpose(0, 1).contiguous().transpose(0, 1))  # a non-contiguous dy
    finally:
        torch.set_default_dtype(before)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want.detach(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(qkv.grad.double(), qkv64.grad, atol=4e-6, rtol=1e-5)
    cos, sin = (t.float() for t in rope_tables(30, 32, 10000.0))
    x = torch.randn(1, 10, 3 * 32)
    offset = train_ops.attention(x, (cos[20:], sin[20:]), 1)  # positions 20..29, as after a cache
    x64 = x.double()
    q, k, v = x64.split(32, dim=2)
    q, k = _rotate(q, cos[20:].double(), sin[20:].double()), _rotate(k, cos[20:].double(), sin[20:].double())
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(32)
    weights = torch.softmax(scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf")), -1)
    torch.testing.assert_close(offset.double(), weights @ v, atol=1e-6, rtol=1e-6)


@needs_kernel
def test_attention_declines_what_it_does_not_cover(monkeypatch):
    qkv = torch.randn(2, 8, 3 * 64)
    tables = tuple(t.float() for t in rope_tables(8, 32, 10000.0))
    assert train_ops.attention_unsupported(qkv, tables, 2, KERNEL) is None
    cases = {
        "float64": (qkv.double(), tables, 2),
        "bfloat16": (qkv.bfloat16(), tables, 2),
        "a head of 8": (qkv, None, 8),  # hs 8: not a multiple of 16
        "a head of 24": (torch.randn(2, 8, 3 * 48), None, 2),
        "a head of 512": (torch.randn(1, 4, 3 * 512), None, 1),
        "past the longest context": (torch.randn(1, KERNEL.attention_max_t + 1, 3 * 32), None, 1),
        "float64 tables": (qkv, tuple(t.double() for t in tables), 2),
        "tables for another length": (qkv, tuple(t.float() for t in rope_tables(9, 32, 10000.0)), 2),
        "tables that need a gradient": (qkv, tuple(t.clone().requires_grad_() for t in tables), 2),
        "a meta tensor": (qkv.to("meta"), None, 2),
    }
    for name, (x, rope, heads) in cases.items():
        assert train_ops.attention_unsupported(x, rope, heads, KERNEL) is not None, name
        assert train_ops.attention(x, rope, heads, KERNEL) is None, name
    assert train_ops.attention(qkv, tables, 2, KERNEL) is not None
    monkeypatch.setattr(train_ops, "cpu_kernels", lambda: pytest.fail("loaded the library for a GPU-side test"))
    for x in (qkv.bfloat16(), qkv.to("meta"), torch.randn(2, 8, 3 * 16)):  # dtype, device, hs 8: no library needed
        assert train_ops.attention(x, None, 2) is None
    assert train_ops.gelu(qkv.to("meta")) is None


def test_torch_compile_traces_the_model_without_a_graph_break():
    """While torch.compile traces, the model takes PyTorch's operations (which it compiles) before
    anything would load the library: one graph, whatever the kernels."""
    import torch._dynamo

    torch.manual_seed(0)
    model = GPT(_baby()).train()
    ids = torch.randint(0, 29, (2, 12), generator=torch.Generator().manual_seed(4))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(ids, ids)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()


@pytest.mark.parametrize("n", [1, 15, 16, 17, 4096 + 3, 3 * 4096])
def test_gelu_and_its_derivative_match_float64_erf(kernel_variant, n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 4
    x[: min(n, 6)] = torch.tensor([0.0, -0.0, 1e-30, -9.0, 20.0, -40.0])[: min(n, 6)]
    x64 = x.double().requires_grad_()
    want = 0.5 * x64 * (1 + torch.erf(x64 / math.sqrt(2)))  # GELU from its definition
    upstream = torch.randn(n, generator=g, dtype=torch.float64)
    want.backward(upstream)

    xs = x.clone().requires_grad_()
    got = train_ops.gelu(xs, kernel_variant)
    got.backward(upstream.float())
    # Abramowitz and Stegun's erfc: 1.5e-7 at most, times |x| / 2; float32 rounding besides
    size = 1 + x.abs().double()
    assert ((got.double() - want.detach()).abs() <= 1e-7 * size + 2e-7 * want.detach().abs()).all()
    assert ((xs.grad.double() - x64.grad).abs() <= 4e-7 * size * upstream.abs()).all()
    if n >= 6:
        assert got[0].item() == 0.0 and got[5].item() == 0.0  # GELU(0) = 0; far left it underflows to 0


@needs_kernel
def test_gelu_keeps_shape_and_passes_nan_through():
    x = torch.tensor([[float("nan"), 1.0], [float("inf"), -1.0]], requires_grad=True)
    y = train_ops.gelu(x)
    assert y.shape == (2, 2)
    assert math.isnan(y[0, 0].item()) and y[1, 0].item() == float("inf")
    torch.testing.assert_close(y[:, 1].detach(), F.gelu(torch.tensor([1.0, -1.0])))


def _baby(**overrides) -> GPTConfig:
    values = dict(vocab_size=29, block_size=24, n_layer=2, n_head=2, n_embd=64, activation="gelu",
                  pos_embedding="rope", dropout=0.0)
    values.update(overrides)
    return GPTConfig(**values)


class _Spy:
    """Counts the compiled calls the model makes."""

    def __init__(self, monkeypatch):
        self.attention = self.gelu = 0
        real_attention, real_gelu = train_ops.attention, train_ops.gelu

        def attention(*args, **kwargs):
            out = real_attention(*args, **kwargs)
            self.attention += out is not None
            return out

        def gelu(*args, **kwargs):
            out = real_gelu(*args, **kwargs)
            self.gelu += out is not None
            return out

        monkeypatch.setattr(train_ops, "attention", attention)
        monkeypatch.setattr(train_ops, "gelu", gelu)


def _loss_and_grads(model: GPT, ids: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    _, loss = model(ids[:, :-1], ids[:, 1:])
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}


@needs_kernel
@pytest.mark.parametrize("pos", ["rope", "learned"])
def test_a_training_step_takes_the_compiled_path_and_matches_pytorchs(monkeypatch, pos):
    """The same model and batch with the compiled kernels and without them (cpu_kernels() None,
    as with SCRATCHLM_NO_KERNELS=1): one loss, one set of gradients, to float32 rounding."""
    torch.manual_seed(0)
    model = attach_training_kernels(GPT(_baby(pos_embedding=pos)).train())
    ids = torch.randint(0, 29, (3, 25), generator=torch.Generator().manual_seed(1))
    spy = _Spy(monkeypatch)
    loss, grads = _loss_and_grads(model, ids)
    assert (spy.attention, spy.gelu) == (2, 2)  # every layer, both
    monkeypatch.setattr(train_ops, "cpu_kernels", lambda: None)
    plain_loss, plain_grads = _loss_and_grads(model, ids)
    assert (spy.attention, spy.gelu) == (2, 2)  # no more: PyTorch's operations ran
    assert abs(loss - plain_loss) < 1e-5
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], atol=2e-5, rtol=1e-4, msg=name)


@needs_kernel
def test_the_model_steps_aside_where_the_kernels_do_not_apply(monkeypatch):
    spy = _Spy(monkeypatch)
    ids = torch.randint(0, 29, (2, 12), generator=torch.Generator().manual_seed(2))
    torch.manual_seed(0)
    model = attach_training_kernels(GPT(_baby(dropout=0.1)).train())
    model(ids)  # attention dropout: PyTorch's SDPA
    assert spy.attention == 0 and spy.gelu == 2
    model.eval()
    with torch.no_grad():
        model(ids)  # no dropout in eval: the compiled attention; GELU without a backward: F.gelu
    assert spy.attention == 2 and spy.gelu == 2
    model.set_attention_impl("explicit")  # the textbook lines asked for by name: PyTorch's operations
    with torch.no_grad():
        model(ids)
    assert spy.attention == 2
    model.set_attention_impl("sdpa")
    weights: list = []
    with torch.no_grad():
        model.forward_hidden(ids, attn_weights=weights)  # the weights are asked for: the explicit path
        model.forward_hidden(ids[:, :5], kv_cache=KVCache(model.config, batch_size=2))  # decoding: the cache's path
        padding = torch.ones(2, 12, dtype=torch.long)
        padding[0, :3] = 0
        model.forward_hidden(ids, attention_mask=padding)  # a padded batch: SDPA with the mask
    assert spy.attention == 2 and len(weights) == 2
    model.bfloat16()
    with torch.no_grad():
        model(ids)
    assert spy.attention == 2


@needs_kernel
def test_activation_checkpointing_recomputes_through_the_kernels(monkeypatch):
    torch.manual_seed(0)
    plain = attach_training_kernels(GPT(_baby()).train())
    torch.manual_seed(0)
    checkpointed = attach_training_kernels(GPT(_baby()).train())
    checkpointed.gradient_checkpointing = True
    ids = torch.randint(0, 29, (2, 25), generator=torch.Generator().manual_seed(3))
    spy = _Spy(monkeypatch)
    loss, grads = _loss_and_grads(plain, ids)
    loss_c, grads_c = _loss_and_grads(checkpointed, ids)
    assert spy.attention == 2 + 4  # the checkpointed blocks ran forward twice
    assert loss == loss_c
    for name, grad in grads.items():
        assert torch.equal(grad, grads_c[name]), name


@needs_kernel
def test_the_textbook_model_alone_runs_pytorchs_operations_only(monkeypatch):
    """scratchlm.model.gpt knows no fast path: a GPT nobody attached the training copy to trains
    on PyTorch's operations, and its loss and gradients are the training copy's to rounding."""
    spy = _Spy(monkeypatch)
    ids = torch.randint(0, 29, (3, 25), generator=torch.Generator().manual_seed(4))
    torch.manual_seed(0)
    plain = GPT(_baby()).train()
    loss, grads = _loss_and_grads(plain, ids)
    assert (spy.attention, spy.gelu) == (0, 0)
    fast = attach_training_kernels(GPT(_baby()).train())
    fast.load_state_dict(plain.state_dict())
    assert list(fast.state_dict()) == list(plain.state_dict())  # the same names: one checkpoint format
    fast_loss, fast_grads = _loss_and_grads(fast, ids)
    assert (spy.attention, spy.gelu) == (2, 2)
    assert abs(loss - fast_loss) < 1e-5
    for name, grad in grads.items():
        torch.testing.assert_close(fast_grads[name], grad, atol=2e-5, rtol=1e-4, msg=name)
    assert attach_training_kernels(fast) is fast and type(fast.transformer.h[0].attn.c_attn) is torch.nn.Linear


@needs_kernel
def test_a_cpu_run_trains_on_the_training_copy(monkeypatch, tmp_path):
    """scratchlm.training.parts attaches the training copy to the model a CPU run trains, and the
    checkpoint it writes loads into the model alone (the same parameter names)."""
    from helpers import train_tiny_run
    from scratchlm import checkpoint as ckpt_io

    spy = _Spy(monkeypatch)
    out = train_tiny_run(tmp_path, tmp_path / "run", model_overrides=dict(n_layer=1, n_head=1, n_embd=16,
                                                                          block_size=16, dropout=0.0,
                                                                          activation="gelu"))
    assert spy.attention >= 4 and spy.gelu >= 4  # one layer, four steps at least
    model, _, _ = ckpt_io.load_model(out)
    assert type(model.transformer.h[0].attn).__name__ == "CausalSelfAttention"
