"""What the generation tests share (test_generate*.py, test_sampling.py, test_decoding.py,
test_decode_step.py): a tiny model, the plain loop of station 19 written out independently, two
stand-in tokenizers, and the model on bfloat16-rounded weights. Test files import from here, never
from one another."""

from __future__ import annotations

import torch

from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT

TINY = dict(vocab_size=23, block_size=16, n_layer=2, n_head=2, n_embd=32)


def tiny_model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **overrides})).eval()


def lively_model(pos: str) -> GPT:
    """A random model whose greedy output wanders instead of repeating one token at once:
    embeddings of unit scale (not 0.02) make the next token depend on the context."""
    model = tiny_model(seed=1, pos_embedding=pos)
    with torch.no_grad():
        model.transformer.wte.weight.normal_(0.0, 1.0)
        if pos == "learned":
            model.transformer.wpe.weight.normal_(0.0, 1.0)
    return model


@torch.no_grad()
def plain_loop(model: GPT, idx: torch.Tensor, steps: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """station 19 written out independently: crop to block_size, full forward, last position, argmax."""
    block = model.config.block_size
    logits_seen = []
    for _ in range(steps):
        logits, _ = model(idx[:, -block:])
        last = logits[:, -1, :]  # (B, V)
        logits_seen.append(last)
        idx = torch.cat([idx, last.argmax(dim=-1, keepdim=True)], dim=1)
    return idx, logits_seen


class ByteTokenizer:
    """A stand-in tokenizer: one id per UTF-8 byte, then BOS and end-of-text. Decoding a cut
    multi-byte character gives U+FFFD, as byte-level BPE does."""

    kind = "byte"
    vocab_size = 258
    bos_id = 256
    eos_id = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class LettersTokenizer:
    """One id per letter of a small alphabet, then BOS and end-of-text."""

    kind = "char"
    alphabet = "abcdefghij "
    vocab_size = len(alphabet) + 2
    bos_id = len(alphabet)

    def __init__(self, eos_id: int | None = None):
        self.eos_id = len(self.alphabet) + 1 if eos_id is None else eos_id

    def encode(self, text: str) -> list[int]:
        return [self.alphabet.index(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(self.alphabet[i] if i < len(self.alphabet) else "" for i in ids)


def letters_model(seed=12, **kw) -> GPT:
    return tiny_model(seed=seed, vocab_size=LettersTokenizer.vocab_size, **kw)


def bf16_reference(model: GPT, round_output: bool = True, round_input: bool = True) -> GPT:
    """The model with every Linear weight and bias rounded to bfloat16 (kept in float32), and
    each Linear's input rounded too when `round_input`, as a bfloat16 matmul sees it (the kernels'
    portable loop keeps float32 inputs); its output rounded as well when `round_output` (a
    bfloat16 matmul returns bfloat16; the gemv kernel returns float32)."""
    ref = GPT(model.config).eval()
    ref.load_state_dict(model.state_dict())
    ref.set_attention_impl("sdpa")  # PyTorch's SDPA, as before the compiled training attention (the tests' tolerances are tight)
    if model.config.tie_weights:  # the copy's lm_head is rounded, the embedding table is not
        ref.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    for module in ref.modules():
        if isinstance(module, torch.nn.Linear):
            with torch.no_grad():
                module.weight.copy_(module.weight.bfloat16().float())
                if module.bias is not None:
                    module.bias.copy_(module.bias.bfloat16().float())
            if round_input:
                module.register_forward_pre_hook(lambda m, args: (args[0].bfloat16().float(),))
            if round_output:
                module.register_forward_hook(lambda m, args, out: out.bfloat16().float())
    return ref
