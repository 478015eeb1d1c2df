"""How a conversation becomes the tokens of one session: a model family's turn markup, kept in
the application (specification 003 §2.4, §3.4: the server applies no chat template).

The examples build every piece of a history themselves and only ever *append* to their session:
the model's replies stay in the history as the very tokens it wrote (no re-rendering, no
re-tokenizing of earlier turns), so each turn computes only its own new tokens.

Tokens come from the server's tokenizer (``client.tokenize``): markup with ``special=True`` (so
that ``<|im_start|>`` is that one token), what a user typed with ``special=False`` (so that a user
cannot forge markup). ``detect`` picks the format the served model's vocabulary has.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from pyllamaopt.client import Client

Piece = tuple[str, bool]  # text, and whether special-token text in it is parsed as those tokens


@dataclass(frozen=True)
class ChatFormat:
    name: str
    begin: str                    # opens a turn; {role} is the format's name of the role
    end: str                      # closes a turn: the marker the model writes when its reply is over
    separator: str                # what follows the end marker
    roles: dict[str, str]
    marker: str = ""              # a special token of this family's vocabulary (how detect() finds it)
    bos: bool = False             # the history starts with the model's BOS token
    stop: list[str] = field(default_factory=list)  # for a model that ends its reply with text, not a token

    def opening(self, system: str | None) -> list[Piece]:
        """The system message, where the family has a role for it (else ``user_turn`` puts it before
        the first user message); ``tokens(..., bos=fmt.bos)`` adds the BOS token."""
        return self.turn("system", system) if system and "system" in self.roles else []

    def turn(self, role: str, text: str) -> list[Piece]:
        return [(self.begin.format(role=self.roles[role]), True), (text, False), (self.end + self.separator, True)]

    def user_turn(self, text: str, system: str | None = None) -> list[Piece]:
        """A user message and the header of the reply that follows it (the generation prompt)."""
        if system and "system" not in self.roles:
            text = f"{system}\n\n{text}"
        return self.turn("user", text) + [(self.begin.format(role=self.roles["assistant"]), True)]

    def after_reply(self, finish_reason: str | None) -> list[Piece]:
        """What closes the model's turn in the history: the separator after the end marker the model
        wrote, or the end marker too when the reply was cut short (max_tokens, a cancel)."""
        wrote_end = finish_reason == "eos" or (finish_reason == "stop" and bool(self.stop))
        return [(self.separator if wrote_end else self.end + self.separator, True)]


FORMATS = [
    ChatFormat("chatml", "<|im_start|>{role}\n", "<|im_end|>", "\n",  # SmolLM2, Qwen...
               {"system": "system", "user": "user", "assistant": "assistant"}, marker="<|im_start|>"),
    ChatFormat("gemma", "<start_of_turn>{role}\n", "<end_of_turn>", "\n",  # no system role
               {"user": "user", "assistant": "model"}, marker="<start_of_turn>", bos=True),
]
# a model without chat markup (a base model, the test suite's tiny model): one line per turn
PLAIN = ChatFormat("plain", "{role}: ", "\n", "", {"system": "System", "user": "User", "assistant": "Assistant"},
                   bos=True, stop=["\n"])


def detect(client: Client) -> ChatFormat:
    """The format whose marker the served model's vocabulary has as one special token."""
    for fmt in FORMATS:
        if len(client.tokenize(fmt.marker, special=True)) == 1:
            return fmt
    return PLAIN


def tokens(client: Client, pieces: list[Piece], *, bos: bool = False) -> list[int]:
    """The token ids of the pieces, after the model's BOS token with ``bos`` (the start of a history)."""
    ids = client.tokenize("", add_bos=True) if bos else []
    for text, special in pieces:
        ids += client.tokenize(text, special=special) if text else []
    return ids


def connection_args(description: str) -> argparse.ArgumentParser:
    """The command line every example takes to reach `pyllamaopt serve --grpc-port`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--address", default="127.0.0.1:50051", help="the server's gRPC host:port")
    parser.add_argument("--api-key", default=None, help="the server's --api-key")
    parser.add_argument("--tls-ca", default=None,
                        help="a PEM file to trust (a server with --tls-cert whose certificate is self-signed)")
    return parser


def client_of(args: argparse.Namespace) -> Client:
    return Client(args.address, api_key=args.api_key, root_certificates=args.tls_ca, timeout=120)
