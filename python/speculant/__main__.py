"""The `speculant` command: `speculant demo [options]` (see `speculant demo --help`)."""

import sys
import warnings


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: speculant demo [options]   run the demo (speculant demo --help)")
        return 0 if argv else 2
    # TorchScript is deprecated since torch 2.11 and warns on every save/load; the CLI says it once here.
    warnings.filterwarnings("ignore", message=r".*TorchScript.*", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=r".*TorchScript.*", category=FutureWarning)
    command, rest = argv[0], argv[1:]
    if command == "demo":
        from . import demo

        return demo.main(rest)
    print(f"speculant: unknown command {command!r}; known: demo", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
