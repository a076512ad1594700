"""Decoding speed: our loop with and without the KV cache beside Hugging Face's `generate`.

One run times batch-1 greedy decoding of 128 new tokens after a 16-token prompt, at the `smoke`
and `gpt2-124m` shapes (random weights), for three decoders on the same weights:

    ours+cache    scratchlm.generation.engine.Engine(use_cache=True).generate_ids
    ours-nocache  the plain loop of S20 (use_cache=False): the whole window every step
    hf+cache      transformers.GPT2LMHeadModel.generate(use_cache=True, do_sample=False)

Each decoder runs once to warm up, then `--repeats` times, interleaved so that a busy machine
slows all three alike. Prints the min and median tokens/s of each, the ratios, and whether the
three produced the same token ids (they must: same weights, greedy).

    python benchmarks/bench_generate.py                      # both shapes, 3 repeats
    python benchmarks/bench_generate.py --shapes smoke --repeats 10 --device cuda

Never run as a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from scratchlm.generation.engine import Engine
from scratchlm.generation.settings import GenerationSettings
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT

PROMPT_LEN = 16
NEW_TOKENS = 128


def to_hf(model: GPT):
    """The same network as a transformers GPT2LMHeadModel, sharing no storage with ours."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from scratchlm.hf.interop import hf_config_from_gpt, hf_state_dict_from_gpt

    config = hf_config_from_gpt(model.config)
    hf = GPT2LMHeadModel(GPT2Config(**{k: v for k, v in config.items() if k not in ("architectures", "dtype")}))
    missing, unexpected = hf.load_state_dict(hf_state_dict_from_gpt(model), strict=False)
    # GPT-2's causal-mask buffers (attn.bias) are not weights; anything else missing is a bug
    missing = [k for k in missing if not k.endswith(("attn.bias", "attn.masked_bias")) and k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"state-dict mapping is incomplete: missing {missing}, unexpected {unexpected}")
    if model.config.tie_weights:
        hf.tie_weights()
    return hf.eval()


def build(shape: str, device: str) -> tuple[GPT, object, torch.Tensor]:
    torch.manual_seed(0)
    config = GPTConfig.from_name(shape)
    model = GPT(config).eval()
    hf = to_hf(model).to(device)
    model = model.to(device)
    prompt = torch.randint(0, config.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    return model, hf, prompt.to(device)


def decoders(model: GPT, hf, prompt: torch.Tensor) -> dict:
    mask = torch.ones_like(prompt)
    hf.generation_config.eos_token_id = None  # never stop early: always NEW_TOKENS tokens
    hf.generation_config.pad_token_id = 0

    greedy = GenerationSettings.of(max_new_tokens=NEW_TOKENS, greedy=True)

    def ours(use_cache: bool):
        engine = Engine(model, use_cache=use_cache)
        return lambda: engine.generate_ids(prompt, greedy)

    def theirs():
        with torch.inference_mode():
            return hf.generate(
                prompt, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                do_sample=False, use_cache=True, num_beams=1,
            )

    return {"ours+cache": ours(True), "ours-nocache": ours(False), "hf+cache": theirs}


def timed(fn, device: str) -> tuple[float, torch.Tensor]:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def bench_shape(shape: str, repeats: int, device: str) -> None:
    model, hf, prompt = build(shape, device)
    runs = decoders(model, hf, prompt)
    outputs = {name: timed(fn, device)[1] for name, fn in runs.items()}  # warm-up, and the ids
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            times[name].append(timed(fn, device)[0])

    n_params = model.num_params()
    print(f"\n{shape}: {n_params / 1e6:.1f}M parameters, batch 1, prompt {PROMPT_LEN}, "
          f"{NEW_TOKENS} new tokens, greedy, {repeats} repeats, {device}")
    print(f"  {'decoder':<14}{'best tok/s':>12}{'median tok/s':>14}{'min s':>9}{'median s':>10}")
    best = {n: NEW_TOKENS / min(t) for n, t in times.items()}
    median = {n: NEW_TOKENS / statistics.median(t) for n, t in times.items()}
    for name, t in times.items():
        print(f"  {name:<14}{best[name]:>12.1f}{median[name]:>14.1f}{min(t):>9.3f}{statistics.median(t):>10.3f}")
    for a, b in (("ours+cache", "ours-nocache"), ("ours+cache", "hf+cache")):
        print(f"  {a} / {b}: {best[a] / best[b]:.2f}x (best), {median[a] / median[b]:.2f}x (median)")
    reference = outputs["hf+cache"].cpu()
    same = {name: torch.equal(out.cpu(), reference) for name, out in outputs.items()}
    print("  same ids as hf+cache: " + ", ".join(f"{n}={s}" for n, s in same.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["smoke", "gpt2-124m"], help="model presets to time")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per decoder (default: 3)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    load = ", load average %.1f %.1f %.1f" % os.getloadavg() if hasattr(os, "getloadavg") else ""
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} CPU threads of {os.cpu_count()}{load}")
    for shape in args.shapes:
        bench_shape(shape, args.repeats, args.device)


if __name__ == "__main__":
    main()
