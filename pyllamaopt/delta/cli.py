"""`pyllamaopt delta decompose | reconstruct | report`. The work is imported when a command runs,
so that the rest of the CLI does not pay for importing gguf."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from ..errors import DeltaError
from .names import DEFAULT_MATRICES

EPILOG = """\
examples:
  pyllamaopt delta report model.gguf --ranks 16,32,64,128          error against rank, nothing written
  pyllamaopt delta decompose model.gguf model.delta.gguf --rank 64
  pyllamaopt delta decompose model.gguf model.delta.gguf --target-error 0.05 --bases 3
  pyllamaopt delta decompose finetune.gguf ft.delta.gguf --parent base.gguf --target-error 0.01
  pyllamaopt delta reconstruct model.delta.gguf model.rebuilt.gguf

Model("model.delta.gguf") loads a delta file directly (rebuilt once into ~/.cache/pyllamaopt/delta).
See docs/delta.md for the format and measured results.
"""


def _list_of(convert: Callable[[str], object], what: str) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        try:
            values = tuple(convert(x.strip()) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}")
        return values
    return parse


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `delta` command and its actions to the main parser's subcommands."""
    parser = sub.add_parser(
        "delta", help="GGUF delta decomposition: shared bases + per-layer low-rank deltas",
        description="Store a model's layer matrices as shared bases plus per-layer low-rank deltas, "
                    "rebuild standard GGUFs from them, and measure how much error each rank costs.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    def choice_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--bases", type=int, default=1,
                       help="k-means clusters of layers, one base each (default 1: the mean of all layers)")
        p.add_argument("--matrices", type=_list_of(str, "matrix names"), default=DEFAULT_MATRICES,
                       help=f"matrix types to decompose (default {','.join(DEFAULT_MATRICES)})")
        p.add_argument("--parent", type=Path, default=None,
                       help="take each layer's base from this model (a fine-tune against its parent)")
        p.add_argument("--base-type", default="F16", help="type of the stored bases (default F16)")

    p = actions.add_parser("decompose", help="write a delta file and its report",
                           description="Write OUTPUT, the delta file of INPUT, and its report as JSON "
                                       "(model.delta.gguf: model.delta.report.json), and print the report. "
                                       "Matrices whose delta would not be smaller are stored whole.")
    p.add_argument("input", type=Path)
    p.add_argument("output", type=Path)
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--rank", type=int, help="the same rank for every matrix")
    how.add_argument("--target-error", type=float,
                     help="relative error ‖W−Ŵ‖/‖W‖ to meet: the smallest rank per matrix that does (0.05 = 5 %%)")
    choice_args(p)
    p.add_argument("--report", type=Path, default=None,
                   help="JSON report path (default: OUTPUT with .report.json for .gguf)")
    p.set_defaults(func=decompose_command)

    p = actions.add_parser("reconstruct", help="rebuild a standard GGUF from a delta file",
                           description="Write OUTPUT, a standard GGUF rebuilt from the delta file INPUT "
                                       "(decomposed matrices in F16).")
    p.add_argument("input", type=Path)
    p.add_argument("output", type=Path)
    p.add_argument("--parent", type=Path, default=None,
                   help="the parent model, for a delta made with --parent (default: the path it recorded)")
    p.set_defaults(func=reconstruct_command)

    p = actions.add_parser("report", help="error against rank per matrix type (writes no model)",
                           description="Relative error at each rank and the rank each target error needs, "
                                       "per matrix type, with the size ratio each implies.")
    p.add_argument("input", type=Path)
    p.add_argument("--ranks", type=_list_of(int, "ranks"), help="default 16,32,64,128 (0: the base alone)")
    p.add_argument("--target-errors", type=_list_of(float, "errors"), help="default 0.01,0.05,0.1")
    choice_args(p)
    p.add_argument("--json", type=Path, default=None, help="also write the curves as JSON here")
    p.add_argument("--plot", type=Path, default=None, help="also plot error against rank to this PNG (matplotlib)")
    p.set_defaults(func=report_command)


def default_report_path(output: Path) -> Path:
    stem = output.name[:-len(".gguf")] if output.name.endswith(".gguf") else output.name
    return output.with_name(stem + ".report.json")


def _inputs(args: argparse.Namespace) -> list[Path]:
    return [args.input] + ([args.parent] if args.parent else [])


def decompose_command(args: argparse.Namespace) -> int:
    from .decomposition import DecomposeOptions, decompose
    from .writer import check_output

    options = DecomposeOptions(rank=args.rank, target_error=args.target_error, n_bases=args.bases,
                               matrices=args.matrices, parent=args.parent, base_type=args.base_type)
    report_path = args.report or default_report_path(args.output)
    if Path(report_path).resolve() == Path(args.output).resolve():
        raise DeltaError(f"--report {report_path} is the output model's path too: give the report another file")
    check_output(report_path, _inputs(args))  # before the work: it could be the model itself
    report = decompose(args.input, args.output, options)
    report.save_json(report_path)
    print(report.table())
    print(f"\nwrote {args.output} and {report_path}")
    return 0


def reconstruct_command(args: argparse.Namespace) -> int:
    from .reconstruction import reconstruct

    size = reconstruct(args.input, args.output, parent=args.parent)
    print(f"wrote {args.output} ({size / 1e6:.1f} MB)")
    return 0


def report_command(args: argparse.Namespace) -> int:
    from .analysis import analyze, require_matplotlib

    from .writer import check_output

    if args.plot:
        require_matplotlib()   # before the work, not after it
    for written in filter(None, (args.json, args.plot)):
        check_output(written, _inputs(args))
    given = {name: value for name, value in (("ranks", args.ranks), ("target_errors", args.target_errors)) if value}
    curves = analyze(args.input, matrices=args.matrices, n_bases=args.bases, parent=args.parent,
                     base_type=args.base_type, **given)
    print(curves.table())
    if args.json:
        curves.save_json(args.json)
        print(f"wrote {args.json}")
    if args.plot:
        curves.plot(args.plot)
        print(f"wrote {args.plot}")
    return 0
