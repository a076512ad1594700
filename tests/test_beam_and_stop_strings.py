"""Two details of generation that survived hand mutations of issue 30 (scripts/mutate.py): beam
search runs under inference mode, as sampling does (no graph, no grad, on the model itself and on
its decoding copy), and a text is cut at the first stop string it holds, not at the last."""

from __future__ import annotations

import pytest
import torch

from scratchlm.generation.generate import beam_search
from scratchlm.generation.text_rows import TextRow
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=23, block_size=16, n_layer=2, n_head=2, n_embd=32)).eval()


@pytest.mark.parametrize("steps", [3, 30])  # 3: the model itself decodes; 30: its decoding copy
def test_beam_search_builds_no_graph(steps):
    model = _model()
    modes = []
    hooks = [m.register_forward_hook(lambda mod, args, out: modes.append(
        (torch.is_inference_mode_enabled(), torch.is_grad_enabled()))) for m in model.modules()]
    beams = beam_search(model, torch.zeros(3, dtype=torch.long), beams=2, max_new_tokens=steps, num_samples=2)
    for h in hooks:
        h.remove()
    assert len(beams) == 2 and all(len(ids) == 3 + steps for ids, _ in beams)
    assert all(mode == (True, False) for mode in modes)  # every forward of the model itself, if any
    assert all(p.grad is None for p in model.parameters())
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()  # and both come back


class _Chars:
    """A tokenizer of one character per id, enough for TextRow."""

    def __init__(self, alphabet: str):
        self.alphabet = alphabet

    def decode(self, ids: list[int]) -> str:
        return "".join(self.alphabet[i] for i in ids)


@pytest.mark.parametrize("stops", [["b", "ab"], ["ab", "b"]])
def test_the_text_ends_before_the_first_stop_string_it_holds(stops):
    """The token 'b' completes both "ab" (from position 1) and "b" (from position 2) at once:
    the text ends before the earlier one, "x", whichever order the stops were given in."""
    tok = _Chars("xab")
    row = TextRow(tok, eos_id=None, stops=stops)
    for token in (0, 1, 2):  # x, a, b
        row.push(token)
    assert row.text == "x" and row.reason == "stop"
    assert row.ids == [0, 1, 2]  # the ids keep the token that completed the stop
