"""`scratchlm chat`: talk to a fine-tuned run in the terminal, or answer one message for a script.

    scratchlm chat --checkpoint runs/tang-chat                       # a conversation
    scratchlm chat --checkpoint runs/tang-chat --message "续写：床前看月光，疑是地上霜。"

In a conversation each reply streams as it comes; `/reset` forgets the history, `/quit` (or
Ctrl-D) leaves, and Ctrl-C stops a reply (what was written stays in the history) without leaving.
Every generation flag of `generate` applies to each reply (scratchlm.generation.chat).
"""

from __future__ import annotations

import sys

from scratchlm.cli.flags import add_generation_flags
from scratchlm.errors import UserError

HELP = "/reset forgets the conversation, /quit (or Ctrl-D) leaves, Ctrl-C stops a reply"


def add_chat(sub) -> None:
    p = sub.add_parser("chat", help="talk to a fine-tuned run (`scratchlm sft`): a conversation in the terminal, "
                                    "or one reply with --message")
    p.add_argument("--checkpoint", required=True, metavar="RUN_OR_CKPT_DIR",
                   help="a run fine-tuned on conversations (its latest checkpoint), or one checkpoint directory")
    p.add_argument("--message", metavar="TEXT", help="answer this one message, print the reply alone, and exit")
    p.add_argument("--system", metavar="TEXT", help="a system message before the conversation")
    add_generation_flags(p)
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "auto"], default=None,
                   help="decode with the weights cast to this (see `scratchlm generate --help`)")
    p.set_defaults(run=run_chat)


def _session(args):
    from scratchlm.checkpoint import load_model
    from scratchlm.generation.chat import ChatSession
    from scratchlm.generation.sampling import MAX_NEW_TOKENS_LIMIT
    from scratchlm.generation.settings import GenerationSettings, generation_fields
    from scratchlm.machine.devices import pick_device
    from scratchlm.text.text_files import argument_text

    if args.beams != 1 or args.num_samples != 1:
        raise UserError("a chat reply is one sampled continuation: drop --beams and --num-samples")
    if not 0 <= args.max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
        raise UserError(f"--max-new-tokens must be between 0 and {MAX_NEW_TOKENS_LIMIT}, got {args.max_new_tokens}")
    given = {f.name: getattr(args, f.name) for f in generation_fields()}
    stops = [s.replace("\\n", "\n").replace("\\t", "\t") for s in args.stop if s]
    settings = GenerationSettings.of(**{**given, "stop": stops})
    system = argument_text(args.system, "--system") if args.system is not None else None
    model, tokenizer, info = load_model(args.checkpoint, device=pick_device(args.device, allow_mps=False))
    if tokenizer is None:
        raise UserError(f"{info['checkpoint']}: no tokenizer saved with this checkpoint or its run")
    return ChatSession.of(model, tokenizer, settings, system=system, dtype=args.dtype)


def run_chat(args) -> int:
    from scratchlm.text.text_files import argument_text

    session = _session(args)
    if args.message is not None:
        print("".join(session.reply(argument_text(args.message, "--message"))), flush=True)
        return 0
    print(f"chatting with {args.checkpoint} ({HELP})", file=sys.stderr, flush=True)
    while True:
        try:
            text = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        except KeyboardInterrupt:
            print(f"\n({HELP})", file=sys.stderr, flush=True)
            continue
        if text.strip() in ("/quit", "/exit"):
            return 0
        if text.strip() == "/reset":
            session.reset()
            print("(the conversation starts again)", file=sys.stderr, flush=True)
            continue
        if not text.strip():
            continue
        _say(session, text)


def _say(session, text: str) -> None:
    """Stream one reply; Ctrl-C ends it early, and a message that cannot be answered is one line."""
    pieces = None
    try:
        pieces = session.reply(text)
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
        print()
    except KeyboardInterrupt:
        if pieces is not None:
            pieces.close()
        print("\n(stopped)", file=sys.stderr, flush=True)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
    if session.dropped:
        print(f"(the {session.dropped} oldest exchange(s) no longer fit the context and were left out)", file=sys.stderr,
              flush=True)
