"""The `speculant` command: `speculant demo [options]` and `speculant export MODEL_DIR OUT.pt [options]`."""

import argparse
import sys
import warnings

USAGE = """usage: speculant demo [options]            run the demo (speculant demo --help)
       speculant export MODEL_DIR OUT [opts]  transformers model -> TorchScript (speculant export --help)"""


def export_main(argv) -> int:
    parser = argparse.ArgumentParser(prog="speculant export",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                     description="Export a transformers model (a local save_pretrained "
                                                 "directory) to a file that speculant.load reads: TorchScript "
                                                 "(GPT-2, Llama, T5) or a torch.export / AOTInductor package "
                                                 "(.pt2: decoder-only models with a static KV cache).")
    parser.add_argument("model_dir", help="a save_pretrained directory (config.json and weights)")
    parser.add_argument("out", help="the file to write (.pt2 selects the pt2 format)")
    parser.add_argument("--format", choices=["torchscript", "pt2"], default=None,
                        help="the file format (default: from OUT's suffix)")
    parser.add_argument("--max-length", type=int, default=None,
                        help="decoder positions the KV cache holds (default: per architecture)")
    parser.add_argument("--max-source-length", type=int, default=None,
                        help="T5: the longest encoder input (default: 512)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="export in this dtype (default: the model's own)")
    args = parser.parse_args(argv)
    from .export import export

    try:
        meta = export(args.model_dir, args.out, format=args.format, max_length=args.max_length,
                      max_source_length=args.max_source_length, dtype=args.dtype)
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
