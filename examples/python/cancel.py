"""Cancelling a generation, with the blocking client (leave the loop) and with asyncio (a
deadline): the server stops generating between two steps and the session stays usable; its
history keeps the tokens generated until then, as an in-process Session's does.

    pyllamaopt serve --model smollm2-135m --grpc-port 50051
    python examples/python/cancel.py
"""
from __future__ import annotations

import argparse
import asyncio
import sys

from chatformat import client_of, connection_args, detect, tokens
from pyllamaopt.client import AsyncClient

PROMPT = "Count from 1 to 1000, one number per line."
LONG = 1000  # tokens: more than the deadlines let through


async def cancel_by_deadline(args: argparse.Namespace, session_id: str, next_turn: list[int]) -> None:
    """asyncio: a deadline around the loop; leaving the ``async with`` block cancels the call."""
    async with AsyncClient(args.address, api_key=args.api_key, root_certificates=args.tls_ca) as client:
        session = client.session(session_id)
        received = 0
        try:
            async with asyncio.timeout(args.after_seconds), session.generate(LONG) as generation:
                async for _ in generation:
                    received += 1
            print(f"async: the generation ended by itself ({generation.finish_reason}) after {received} tokens")
        except TimeoutError:
            print(f"async: cancelled at the {args.after_seconds} s deadline, {received} tokens received")
        await session.append(next_turn)  # right after a cancel, "busy" is retried until the server has stopped
        print(f"async: appended the next turn; the session has {(await session.info()).n_tokens} tokens")


def main() -> None:
    parser = connection_args(__doc__.splitlines()[0])
    parser.add_argument("--after-tokens", type=int, default=20, help="the blocking client stops reading here")
    parser.add_argument("--after-seconds", type=float, default=1.0, help="the asyncio deadline")
    args = parser.parse_args()

    with client_of(args) as client:
        fmt = detect(client)
        prompt = tokens(client, fmt.opening(None) + fmt.user_turn(PROMPT), bos=fmt.bos)
        next_turn = tokens(client, fmt.after_reply("interrupted") + fmt.user_turn("Go on."))
        with client.create_session(prompt) as session:
            # blocking: leaving the `with` block (here by break) cancels the call on the server
            with session.generate(LONG) as generation:
                for i, token in enumerate(generation, 1):
                    print(token.text, end="", flush=True)
                    if i == args.after_tokens:
                        break
            print(f"\nsync: {generation.finish_reason} after {len(generation.tokens)} tokens")
            session.append(next_turn)  # waits for the server to stop (a "busy" answer is retried)
            kept = session.n_tokens - len(prompt) - len(next_turn)
            print(f"sync: appended the next turn; the history kept the {kept} tokens generated before the stop "
                  "(the server may have made one more than this client read)")

            asyncio.run(cancel_by_deadline(args, session.id, next_turn))

            print(f"after: {session.generate_text(16, stop=fmt.stop)!r}")  # still usable


if __name__ == "__main__":
    sys.exit(main())
