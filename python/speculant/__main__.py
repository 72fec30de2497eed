"""The `speculant` command: `speculant demo [options]` and `speculant export MODEL_DIR OUT [options]`."""

import argparse
import logging
import sys
import warnings

import torch

from . import __version__

DESCRIPTION = """Exact speculative decoding (Leviathan, Kalman & Matias, ICML 2023) with a C++ core over LibTorch.
From Python: import speculant (see README.md)."""


TORCHSCRIPT_DEPRECATION = r"`torch\.jit\.\w+` is deprecated"  # torch's message for every torch.jit function


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default; a help that states its default in words keeps its own."""

    def _get_help_string(self, action):
        return action.help if "(default" in (action.help or "") else super()._get_help_string(action)


def _demo(args) -> int:
    from . import demo

    color = {"auto": None, "always": True, "never": False}[args.color]
    # The demo's models are tiny: a second intra-op thread only adds waiting, and on a machine busy with other
    # work each operation's threads wait for a core in turn (a 200-token run took 25 s with 2 threads, 0.6 s
    # with one, beside a 2-job build on 2 cores).
    if args.threads < 1:
        print(f"speculant demo: threads must be an integer >= 1, got {args.threads}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    try:
        demo.run(prompt=args.prompt, gamma=args.gamma, temperature=args.temperature, top_k=args.top_k,
                 top_p=args.top_p, lenience=args.lenience, max_new_tokens=args.max_new_tokens, seed=args.seed,
                 repeats=args.repeats, color=color, device=args.device, dtype=args.dtype, threads=args.threads,
                 verification=args.verification)
    except (ValueError, FileNotFoundError) as error:  # FileNotFoundError: the demo pair's weights are missing
        print(f"speculant demo: {error}", file=sys.stderr)
        return 2
    return 0


def _export(args) -> int:
    from .models.export import export

    if not torch.cuda.is_available():  # Inductor's import says so on a CPU machine, where it is no news
        logging.getLogger("torch.utils.cpp_extension").addFilter(
            lambda record: not record.getMessage().startswith("No CUDA runtime is found"))
    pt2 = args.format == "pt2" or (args.format is None and args.out.endswith(".pt2"))
    if pt2:
        print(f"speculant export: {args.model_dir} -> {args.out}: torch.export, then AOTInductor compiles C++ for "
              "this machine (about 20 s for a small model on 2 cores, minutes for a large one)", file=sys.stderr,
              flush=True)
    try:
        meta = export(args.model_dir, args.out, format=args.format, max_length=args.max_length,
                      max_source_length=args.max_source_length, dtype=args.dtype, kernels=args.kernels,
                      features=False if args.features is None else tuple(args.features) or True)
    except (ValueError, OSError, ImportError) as error:  # OSError: a missing path, unreadable weight files
        print(f"speculant export: {error}", file=sys.stderr)
        return 2
    print(f"{meta['architecture']} -> {args.out}: vocab_size {meta['vocab_size']}, max_length "
          f"{meta['max_length']}, {meta['dtype']}, {meta['export_seconds']:.1f} s")
    return 0


def parser() -> argparse.ArgumentParser:
    from .decoding.decoder import DEFAULT_GAMMA
    from .demo import DEFAULT_PROMPT

    top = argparse.ArgumentParser(prog="speculant", description=DESCRIPTION, formatter_class=HelpFormatter)
    top.add_argument("--version", action="version", version=f"speculant {__version__} (torch {torch.__version__})")
    commands = top.add_subparsers(title="commands", metavar="COMMAND", dest="command", required=True)

    demo = commands.add_parser(
        "demo", formatter_class=HelpFormatter,
        help="speculative decoding with the demo pair (shipped with the package): the paper's Figure 1 "
             "trace, the statistics, and the speedup over plain decoding next to Theorem 3.8's prediction",
        description="Speculative decoding with the demo's target / draft pair (byte-level GPTs trained on "
                    "Python's standard library, shipped with the package): the trace drawn like the paper's "
                    "Figure 1, the statistics next to plain decoding of the same target, and the speedup "
                    "(after an untimed warm-up, the median and range of interleaved timed rounds) next to "
                    "Theorem 3.8's prediction from the measured alpha and c.")
    demo.add_argument("--prompt", default=DEFAULT_PROMPT,
                      help="the text to continue, its UTF-8 bytes the demo models' tokens (default: %(default)r)")
    demo.add_argument("--gamma", type=int, default=DEFAULT_GAMMA, help="draft tokens per iteration (γ)")
    demo.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (0 is argmax)")
    demo.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 is off)")
    demo.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 is off)")
    demo.add_argument("--lenience", type=float, default=1.0,
                      help="A.5's lenience in (0, 1]: 1 is exact, below 1 trades exactness for speed")
    demo.add_argument("--verification", choices=["token", "block"], default="token",
                      help="how the drafts are verified: token by token (Algorithm 1) or as a block (Sun et al.)")
    demo.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate")
    demo.add_argument("--seed", type=int, default=0, help="the seed (the same seed gives the same tokens)")
    demo.add_argument("--repeats", type=int, default=3,
                      help="timed rounds of speculative and plain decoding, after an untimed warm-up")
    demo.add_argument("--threads", type=int, default=1,
                      help="torch's intra-op threads (the demo's models are too small to gain from more)")
    demo.add_argument("--device", default="cpu", help="where the models run: cpu, cuda, cuda:1, ...")
    demo.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                      help="the models' dtype (default: bfloat16 on a GPU, float32 on the CPU)")
    demo.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                      help="ANSI colours in the trace (auto: when writing to a terminal and NO_COLOR is unset)")
    demo.set_defaults(main=_demo)

    export = commands.add_parser(
        "export", formatter_class=HelpFormatter,
        help="a transformers model (a save_pretrained directory) -> a TorchScript .pt or an AOTInductor .pt2 "
             "file that speculant.load reads",
        description="Export a transformers model (a local save_pretrained directory) to a file that "
                    "speculant.load reads: TorchScript (GPT-2, Llama, T5) or a torch.export / AOTInductor "
                    "package (.pt2: decoder-only models and T5, with a static KV cache).")
    export.add_argument("model_dir", help="a save_pretrained directory (config.json and weights)")
    export.add_argument("out", help="the file to write: .pt (TorchScript) or .pt2 (an AOTInductor package)")
    export.add_argument("--format", choices=["torchscript", "pt2"], default=None,
                        help="the file format (default: from OUT's suffix)")
    export.add_argument("--max-length", type=int, default=None,
                        help="decoder positions the KV cache holds (default: per architecture)")
    export.add_argument("--max-source-length", type=int, default=None,
                        help="T5: the longest encoder input (default: 512)")
    export.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="export in this dtype (default: the model's own)")
    export.add_argument("--kernels", choices=["aten", "speculant"], default="aten",
                        help="TorchScript GPT-2 and Llama: torch's operations (aten) or speculant's fused norms "
                             "and split-KV attention (CUDA kernels; the same results on the CPU)")
    export.add_argument("--features", type=int, nargs="*", default=None, metavar="LAYER",
                        help=".pt2: keep each slot's features for EagleDraft / MedusaDraft: the LM head's input "
                             "(--features alone) or these decoder layers' outputs (EAGLE-3) (default: none)")
    export.set_defaults(main=_export)
    return top


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # TorchScript is deprecated since torch 2.11 and warns on every save and load ("`torch.jit.save` is
    # deprecated"); the exports and the demo's files are TorchScript by design, so the command line hides it.
    for category in (DeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", message=TORCHSCRIPT_DEPRECATION, category=category)
    command_line = parser()
    if not argv:
        command_line.print_help(sys.stderr)
        return 2
    args = command_line.parse_args(argv)
    return args.main(args)


if __name__ == "__main__":
    sys.exit(main())
