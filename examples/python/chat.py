"""A multi-turn chat that keeps one session: each turn appends only its new tokens, and the server
computes only those (the previous turns' KV stays in the session).

    pyllamaopt serve --model smollm2-135m --grpc-port 50051      # a model with a chat format
    python examples/python/chat.py "What is the capital of France?" "And of Italy?"
    python examples/python/chat.py                               # type the messages; an empty line ends

Each reply is followed by what the turn cost: the tokens appended, and how many tokens of the
history the server computed in this turn (the session's ``tokens_prefilled`` counter): the new
ones and, in exact mode, the previous reply's tokens once more (and a history shorter than one
64-token block: docs/exactness.md), never the earlier turns.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator

from chatformat import client_of, connection_args, detect, tokens


# long enough (more than one 64-token block) that the turns after the first show the reuse: a history
# shorter than a block is computed again whole (docs/exactness.md)
SYSTEM = ("You are a helpful assistant for travellers. Answer in one short sentence, with facts only: no "
          "greetings, no questions back, no lists. If you do not know, say so in a few words. Names of places "
          "are written in English. Numbers are written as digits. Keep the tone friendly and plain.")


def messages(given: list[str]) -> Iterator[str]:
    yield from given
    if not given:  # interactive
        while (line := input("> ").strip()):
            yield line


def main() -> None:
    parser = connection_args(__doc__.splitlines()[0])
    parser.add_argument("messages", nargs="*", help="the user's messages (default: read them from the terminal)")
    parser.add_argument("--system", default=SYSTEM)
    parser.add_argument("--max-tokens", type=int, default=96, help="per reply")
    args = parser.parse_args()

    with client_of(args) as client:
        fmt = detect(client)
        print(f"[chat format: {fmt.name}]")
        with client.create_session(tokens(client, fmt.opening(args.system), bos=fmt.bos)) as session:
            finish_reason = None
            computed = session.info().stats["tokens_prefilled"]
            for turn, text in enumerate(messages(args.messages), 1):
                new = tokens(client, fmt.after_reply(finish_reason) if turn > 1 else [])
                new += tokens(client, fmt.user_turn(text, system=args.system if turn == 1 else None))
                session.append(new)
                generation = session.generate(args.max_tokens, stop=fmt.stop)
                for token in generation:
                    print(token.text, end="", flush=True)
                finish_reason = generation.finish_reason
                info = session.info()
                print(f"\n[turn {turn}: {len(new)} tokens appended, {len(generation.tokens)} generated ({finish_reason}); "
                      f"history {info.n_tokens} tokens, {info.stats['tokens_prefilled'] - computed} computed this turn]")
                computed = info.stats["tokens_prefilled"]
            print(f"[session {session.id}: {session.n_tokens} tokens]")


if __name__ == "__main__":
    sys.exit(main())
