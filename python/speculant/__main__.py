"""The `speculant` command: `speculant demo [options]` and `speculant export MODEL_DIR OUT.pt [options]`."""

import argparse
import sys
import warnings

USAGE = """usage: speculant demo [options]            run the demo (speculant demo --help)
       speculant export MODEL_DIR OUT [opts]  transformers model -> TorchScript (speculant export --help)"""


def export_main(argv) -> int:
    parser = argparse.ArgumentParser(prog="speculant export",
                                     description="Export a transformers model (a local save_pretrained "
                                                 "directory: GPT-2, Llama or T5) to a TorchScript file that "
                                                 "speculant.load reads.")
    parser.add_argument("model_dir")
    parser.add_argument("out")
    parser.add_argument("--max-length", type=int, default=None,
                        help="decoder positions the KV cache holds (default: per architecture)")
    parser.add_argument("--max-source-length", type=int, default=None, help="T5: the longest encoder input")
    args = parser.parse_args(argv)
    from .export import export

    try:
        meta = export(args.model_dir, args.out, max_length=args.max_length,
                      max_source_length=args.max_source_length)
    except (ValueError, OSError, ImportError) as error:  # OSError: unreadable or missing weight files
        print(f"speculant export: {error}", file=sys.stderr)
        return 2
    print(f"{meta['architecture']} -> {args.out}: vocab_size {meta['vocab_size']}, max_length "
          f"{meta['max_length']}, {meta['dtype']}, {meta['export_seconds']:.1f} s")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    # TorchScript is deprecated since torch 2.11 and warns on every save/load; the CLI says it once here.
    warnings.filterwarnings("ignore", message=r".*TorchScript.*", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=r".*TorchScript.*", category=FutureWarning)
    command, rest = argv[0], argv[1:]
    if command == "demo":
        from . import demo

        return demo.main(rest)
    if command == "export":
        return export_main(rest)
    print(f"speculant: unknown command {command!r}; known: demo, export", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
