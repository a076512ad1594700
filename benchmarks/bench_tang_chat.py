"""Tang chat: does the fine-tuned poet write the form it is asked for? `tang-poems`, then `tang-chat`.

`scratchlm train --preset tang-poems` trains the base on `--data tang`; `scratchlm sft --preset
tang-chat --init_from BASE` fine-tunes it on `--data tang-sft` (scratchlm.data.tang_sft), both in
this process for their --time_limit. Then REQUESTS held-out requests of each kind (title, heads,
continue: titles and poems training never saw) are answered by both models, and
scratchlm.text.verse_requests.obeys counts the replies in the requested form:

    tang-chat   the request as a user turn of the chat template; the reply ends at <|end|>
    base        the same words as plain text and a newline (characters the base's vocabulary
                lacks, such as 《》“”：, left out); the reply is its run of verse lines

Each is answered greedily and with generate's defaults (temperature 1, no top-k), seeded.
Goal: tang-chat in form on at least 90% of each kind's requests.

    python -m benchmarks --only tang-chat
    python -m benchmarks.bench_tang_chat --requests 50 --json out.json

Needs the corpus (see scratchlm/text/tang.py); without it skipped, with the reason. Takes about
ten minutes on 2 cores; never run as a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python benchmarks/bench_tang_chat.py`

REQUESTS = 200
KINDS = ("title", "heads", "continue")
TOKENS = 100
GOAL = 0.90
SEED = 1337
SETTINGS = {"greedy": {"greedy": True}, "sampled": {}}


def held_out_requests(per_kind: int) -> dict[str, list[str]]:
    """The first `per_kind` held-out requests of each kind, in the file's order."""
    from scratchlm.data.tang_sft import tang_sft
    from scratchlm.text.verse_requests import form_of

    chosen: dict[str, list[str]] = {k: [] for k in KINDS}
    for line in tang_sft("held-out").read_text(encoding="utf-8").splitlines():
        request = json.loads(line)["prompt"]
        kind = form_of(request).kind
        if len(chosen[kind]) < per_kind:
            chosen[kind].append(request)
    return chosen


def _verse_run(text: str) -> str:
    """The lines of `text` up to the first that is not a verse line (a title, a blank line)."""
    from scratchlm.text.verse import is_verse_line

    lines = []
    for line in text.split("\n"):
        if not is_verse_line(line):
            break
        lines.append(line)
    return "\n".join(lines)


def answer(model, tokenizer, request: str, chat: bool, settings: dict, seed: int) -> str:
    import torch

    from scratchlm.data.conversations import Message
    from scratchlm.generation.generate import generate_ids
    from scratchlm.text.chat import END_TOKEN, ChatTemplate

    if chat:
        template = ChatTemplate.of(tokenizer)
        prompt, end = template.prompt([Message("user", request)]), tokenizer.specials[END_TOKEN]
    else:
        known = tokenizer.piece_ids()
        prompt, end = [tokenizer.bos_id, *tokenizer.encode("".join(c for c in request if c in known) + "\n")], None
    out = generate_ids(model, torch.tensor([prompt]), max_new_tokens=TOKENS, eos_id=end,
                       generator=torch.Generator().manual_seed(seed), **settings)[0, len(prompt):].tolist()
    if end is not None and end in out:
        out = out[: out.index(end)]
    text = tokenizer.decode(out)
    return text if chat else _verse_run(text)


def form_rates(run: Path, requests: dict[str, list[str]], chat: bool) -> dict[str, Any]:
    from scratchlm.checkpoint import load_model
    from scratchlm.text.verse_requests import obeys

    model, tokenizer, _ = load_model(run)
    model.eval()
    rates: dict[str, Any] = {}
    for name, settings in SETTINGS.items():
        rates[name], examples = {}, {}
        for kind, asked in requests.items():
            replies = [answer(model, tokenizer, r, chat, settings, SEED + i) for i, r in enumerate(asked)]
            rates[name][kind] = sum(obeys(r, a) for r, a in zip(asked, replies)) / len(asked)
            examples[kind] = {"request": asked[0], "reply": replies[0]}
        rates[name + "_examples"] = examples
    return rates


def _train(preset: str, out: Path, **fields) -> dict[str, Any]:
    from scratchlm.training.train import config_from_preset, train

    cfg = config_from_preset(preset, out_dir=str(out), progress="quiet", **fields)
    t0 = time.perf_counter()
    result = train(cfg)
    first = json.loads((out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[0])
    return {"train_s": result.elapsed_s, "wall_s": time.perf_counter() - t0, "steps": result.step,
            "val_loss": result.val_loss, "dtype": first["config"]["dtype"]}


def run(per_kind: int = REQUESTS, base: Path | None = None, chat: Path | None = None) -> dict[str, Any]:
    from scratchlm.errors import UserError

    try:
        requests = held_out_requests(per_kind)
    except UserError as exc:  # no npm, offline, no OpenCC: say why
        return {"skipped": str(exc).splitlines()[0]}
    with tempfile.TemporaryDirectory(prefix="bench-tang-chat-") as tmp:
        trained = {}
        if base is None:
            base = Path(tmp) / "tang-poems"
            trained["tang_poems"] = _train("tang-poems", base, seed=SEED)
        if chat is None:
            chat = Path(tmp) / "tang-chat"
            trained["tang_chat"] = _train("tang-chat", chat, init_from=str(base), seed=SEED)
        rates = {"base": form_rates(base, requests, chat=False), "tang_chat": form_rates(chat, requests, chat=True)}
    worst = min(rates["tang_chat"]["sampled"].values())
    return {"requests_per_kind": per_kind, "tokens": TOKENS, "trained": trained, "rates": rates,
            "targets": [{"target": "tang-chat replies in the requested form, worst kind (sampled)", "ratio": worst,
                         "goal": GOAL, "met": worst >= GOAL}]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=REQUESTS, help="held-out requests of each kind")
    parser.add_argument("--base", type=Path, help="a trained tang-poems run to use instead of training one")
    parser.add_argument("--chat", type=Path, help="a trained tang-chat run to use instead of training one")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    result = run(args.requests, args.base, args.chat)
    text = json.dumps(result, indent=2, ensure_ascii=False)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
