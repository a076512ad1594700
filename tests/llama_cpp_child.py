"""One llama.cpp session in a process of its own, for tests/test_gguf_llama_cpp.py.

A native crash inside llama.cpp (a segmentation fault, an abort) ends this process only: the test
that asked fails, naming the signal, and the rest of the test run goes on.

    python tests/llama_cpp_child.py REQUEST.json

REQUEST: {"model": path, "n_ctx": n, "options": {keyword arguments of llama_cpp.Llama},
"calls": [...], "out": path}. Each call, and what it answers in the JSON list written to "out":
  {"op": "scores", "ids": [...], "npy": path}  every position's logits, from an empty cache, saved
                                              as float64 .npy at "npy"; answers the row count
  {"op": "greedy", "ids": [...], "n": n}       llama.cpp's greedy continuation: {"ids", "text"}
  {"op": "tokenize", "text": s}                the ids of s (no BOS, specials read as text)
  {"op": "detokenize", "ids": [...]}           the text of the ids
  {"op": "chat", "messages": [...], "n": n}    create_chat_completion's greedy reply of at most n
                                              tokens, through the file's own chat template:
                                              {"text", "finish", "prompt_ids"}, the last the ids of
                                              the prompt that template renders
"""

from __future__ import annotations

import json
import sys

import numpy as np


def greedy(llm, ids: list[int], n: int) -> dict:
    """llama.cpp's own greedy sampler (temperature 0, no penalty) continuing `ids` by `n` tokens."""
    llm.reset()
    out: list[int] = []
    for token in llm.generate(ids, temp=0.0, repeat_penalty=1.0, reset=True):
        out.append(token)
        if len(out) == n:
            break
    return {"ids": out, "text": llm.detokenize(out).decode("utf-8", errors="replace")}


def chat(llm, messages: list[dict], n: int) -> dict:
    """A chat completion as an application makes one, greedy, and the prompt ids it was made from."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm.reset()
    reply = llm.create_chat_completion(messages, temperature=0.0, repeat_penalty=1.0, max_tokens=n)
    vocab = llm._model
    formatter = Jinja2ChatFormatter(llm.metadata["tokenizer.chat_template"], eos_token=vocab.token_get_text(vocab.token_eos()),
                                    bos_token=vocab.token_get_text(vocab.token_bos()))
    prompt = formatter(messages=messages).prompt
    return {"text": reply["choices"][0]["message"]["content"], "finish": reply["choices"][0]["finish_reason"],
            "prompt_ids": llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)}


def scores(llm, ids: list[int], npy: str) -> int:
    llm.reset()  # the next eval starts at position 0 and drops what the cache held past it
    llm.eval(ids)
    np.save(npy, np.asarray(llm.scores[: len(ids)], dtype=np.float64))
    return len(ids)


def main(path: str) -> None:
    import llama_cpp

    with open(path, encoding="utf-8") as f:
        request = json.load(f)
    llm = llama_cpp.Llama(request["model"], n_ctx=request["n_ctx"], n_threads=1, verbose=False,
                          **request.get("options", {}))
    answers = []
    for call in request["calls"]:
        op = call["op"]
        if op == "scores":
            answers.append(scores(llm, call["ids"], call["npy"]))
        elif op == "greedy":
            answers.append(greedy(llm, call["ids"], call["n"]))
        elif op == "tokenize":
            answers.append(llm.tokenize(call["text"].encode("utf-8"), add_bos=False, special=False))
        elif op == "chat":
            answers.append(chat(llm, call["messages"], call["n"]))
        elif op == "detokenize":
            answers.append(llm.detokenize(call["ids"]).decode("utf-8"))
        else:
            raise ValueError(f"unknown op {op!r}")
    with open(request["out"], "w", encoding="utf-8") as f:
        json.dump(answers, f)


if __name__ == "__main__":
    main(sys.argv[1])
