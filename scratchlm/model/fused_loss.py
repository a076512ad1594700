"""The output layer and cross-entropy in one pass over row chunks, for training.

The plain path, `F.cross_entropy(h @ W.T + b, y)`, materialises the (N, V) logits, then softmax
and gradient tensors of the same size: at the `smoke` shape (N = 8 * 256 rows, V = 50304) each is
412 MB of float32, and the time goes to streaming them through memory rather than to arithmetic.
Here the rows go through in chunks of a few hundred, so one chunk's (rows, V) scores are the
largest temporary and stay near the cache:

    for each chunk of rows:   z = h_c @ W.T + b                      (rows, V)
                              lse = logsumexp(z)                      (rows,)
                              loss += sum(lse - z[target])
                              when a gradient is wanted:
                                  g = softmax(z) - onehot(target)     (rows, V)   (in z's memory)
                                  dh_c = g @ W,  dW += g.T @ h_c,  db += g.sum(0)

The loss is a scalar at the end of the graph, so its gradient with respect to h, W and b is
already known during the forward pass; backward only multiplies by the incoming scalar. That
saves recomputing every chunk's logits in backward (a fourth (N, C) x (C, V) matmul).
"""

from __future__ import annotations

from typing import Sequence

import torch

# Rows per chunk: 256 rows x 50304 float32 scores is 51 MB. Fewer rows add per-chunk overhead
# (the dW update reads and writes the whole (V, C) matrix once per chunk); more leave the cache.
CHUNK_ROWS = 256


def _compute_dtype(h: torch.Tensor) -> torch.dtype:
    """bf16/fp16 under autocast (as a Linear would run), else the hidden states' own dtype."""
    kind = h.device.type
    if h.dtype in (torch.float32, torch.bfloat16, torch.float16) and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return h.dtype


def _spans(blocks) -> list[tuple[int, int]]:
    """The columns of the scores each row block of the weight gives: block i's are lo:hi."""
    edges = [0]
    for w in blocks:
        edges.append(edges[-1] + w.shape[0])
    return list(zip(edges, edges[1:]))


def _add_weight_grads(dw_ts, spans, h_w: torch.Tensor, g: torch.Tensor) -> None:
    """One chunk's share of each trained block's dW (kept transposed, float32): h_w.T @ g's columns."""
    for dw_t, (lo, hi) in zip(dw_ts, spans):
        if dw_t is None:  # a frozen block
            continue
        if g.dtype == dw_t.dtype:
            dw_t.addmm_(h_w.t(), g[:, lo:hi])  # (C [+ 1], n) @ (n, V_i)
        else:
            dw_t += h_w.t() @ g[:, lo:hi]  # 16-bit product, summed over chunks in float32


class LinearCrossEntropy(torch.autograd.Function):
    """mean over non-ignored rows of cross_entropy(h @ weight.T + bias, targets), chunked; the
    weight comes as its row blocks (one block: the whole matrix), and only the blocks in `grads`
    get a gradient."""

    @staticmethod
    def forward(ctx, h, bias, targets, ignore_index, chunk_rows, compute_dtype, want_grad, grads, *blocks):
        # h (N, C), blocks (V_i, C) stacked in order = weight (V, C), bias (V,) or None, targets (N,) int64
        N, C = h.shape
        acc = torch.float64 if h.dtype == torch.float64 else torch.float32  # scores and sums
        spans = _spans(blocks)
        with torch.autocast(h.device.type, enabled=False):
            # The bias rides along as one more input column: [h, 1] @ [W, b].T = h @ W.T + b, and
            # the same matmul that gives dW then gives db (the column sums of the scores' gradient).
            if bias is not None:
                h = torch.cat([h, h.new_ones(N, 1)], dim=1)  # (N, C + 1)
                blocks = [torch.cat([w, bias[lo:hi, None]], dim=1) for w, (lo, hi) in zip(blocks, spans)]  # (V_i, C + 1)
            hc, wcs = h.to(compute_dtype), [w.to(compute_dtype) for w in blocks]
            valid = targets != ignore_index  # (N,)
            n_valid = valid.sum().to(acc)  # the mean's divisor; 0 gives 0/0 = nan, as F.cross_entropy does
            # each row's gradient weight: the mean's 1/n, or 0 for an ignored row
            row_weight = valid.to(acc) / n_valid.clamp(min=1)  # (N,)
            total = torch.zeros((), dtype=acc, device=h.device)
            if want_grad:
                dh = torch.empty(N, C, dtype=compute_dtype, device=h.device)
                # dW kept transposed: (C [+ 1], n) @ (n, V) runs 15-25% faster here than (V, n) @ (n, C);
                # none for a frozen block (a fine-tune's old head rows: model/lora.py)
                dw_ts = [torch.zeros(hc.shape[1], hi - lo, dtype=acc, device=h.device) if wanted else None
                         for wanted, (lo, hi) in zip(grads, spans)]  # (C [+ 1], V_i)
            rows = min(chunk_rows, N)
            # reused for every chunk: (rows, V) scores, and their float32 copy for a 16-bit matmul
            z = torch.empty(rows, spans[-1][1], dtype=compute_dtype, device=h.device)
            zf = z if compute_dtype == acc else torch.empty(z.shape, dtype=acc, device=h.device)
            logp = torch.empty_like(zf)
            for start in range(0, N, rows):
                end = min(start + rows, N)
                n = end - start
                h_c = hc[start:end]  # (n, C [+ 1])
                for wc, (lo, hi) in zip(wcs, spans):
                    torch.mm(h_c, wc.t(), out=z[:n, lo:hi])  # scores (n, V_i)
                if zf is not z:
                    zf[:n].copy_(z[:n])
                torch._log_softmax(zf[:n], 1, False, out=logp[:n])  # one fused pass per row
                y = torch.where(valid[start:end], targets[start:end], 0)[:, None]  # (n, 1); ignored rows read column 0
                w_c = row_weight[start:end]  # (n,)
                total -= (logp[:n].gather(1, y).squeeze(1) * (w_c > 0)).sum()
                if want_grad:
                    g = logp[:n].exp_()  # softmax, in place
                    g.scatter_add_(1, y, g.new_full((n, 1), -1.0))  # minus the one-hot target
                    if g.dtype != compute_dtype:
                        # the scores' own buffer is free again (exp(out=) into bf16 was slower:
                        # benchmarks/measurements.md)
                        g = z[:n].copy_(g)
                    # the 1/n weights (and zeros of ignored rows) go on the small (n, C) operands
                    dh_c = g[:, : spans[0][1]] @ wcs[0][:, :C]  # (n, C)
                    for wc, (lo, hi) in zip(wcs[1:], spans[1:]):
                        dh_c += g[:, lo:hi] @ wc[:, :C]
                    dh[start:end] = dh_c * w_c[:, None].to(compute_dtype)
                    h_w = h_c * w_c[:, None].to(compute_dtype)  # (n, C [+ 1])
                    _add_weight_grads(dw_ts, spans, h_w, g)
        loss = total / n_valid
        if want_grad:
            ctx.save_for_backward(dh, *dw_ts)
            ctx.has_bias = bias is not None
            ctx.dtypes = (h.dtype, [w.dtype for w in blocks])
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        dh, *dw_ts = ctx.saved_tensors
        h_dtype, w_dtypes = ctx.dtypes
        C = dh.shape[1]
        grad_h = (dh * grad_loss.to(dh.dtype)).to(h_dtype) if ctx.needs_input_grad[0] else None
        dw_ts = [None if d is None else d * grad_loss.to(d.dtype) for d in dw_ts]  # (C [+ 1], V_i) each
        grad_ws = [None if d is None or not wanted else d[:C].t().to(dtype).contiguous()  # (V_i, C)
                   for d, dtype, wanted in zip(dw_ts, w_dtypes, ctx.needs_input_grad[8:])]
        grad_b = None
        if ctx.has_bias and ctx.needs_input_grad[1]:  # every block has its dW then (linear_cross_entropy)
            grad_b = torch.cat([d[C] for d in dw_ts]).to(w_dtypes[0])
        return grad_h, grad_b, None, None, None, None, None, None, *grad_ws


def linear_cross_entropy(
    h: torch.Tensor,
    weight: torch.Tensor | Sequence[torch.Tensor],
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    ignore_index: int = -100,
    chunk_rows: int = CHUNK_ROWS,
) -> torch.Tensor:
    """Mean cross-entropy of the scores h @ weight.T + bias against targets, never holding all
    (N, V) scores at once. h (..., C), targets (...) with the same leading shape; returns a
    float32 scalar (float64 for a float64 model), like the plain path's loss. `weight` (V, C), or
    its rows as blocks stacked in order (a fine-tune's head whose new rows alone train,
    model/lora.py): a frozen block gets no (V_i, C) gradient made."""
    C = h.shape[-1]
    blocks = (weight,) if isinstance(weight, torch.Tensor) else tuple(weight)
    # forward runs with grad mode off, so whether backward will come is decided here; a trained
    # bias needs every block's dW, whose extra column it is
    on = torch.is_grad_enabled()
    bias_grad = on and bias is not None and bias.requires_grad
    grads = tuple(on and (w.requires_grad or bias_grad) for w in blocks)
    want_grad = (on and h.requires_grad) or any(grads)
    return LinearCrossEntropy.apply(
        h.reshape(-1, C), bias, targets.reshape(-1).long(), ignore_index, chunk_rows, _compute_dtype(h), want_grad,
        grads, *blocks,
    )
