"""Token trees against chains, with the tree theory of speculant.analysis next to the measurement.

    python benchmarks/trees.py [--threads 1] [--tokens 128] [--prompts 8] [--repeats 5] [--temperatures 0 1]
    python benchmarks/train_pairs.py --stage gpt2 && python benchmarks/trees.py --pair gpt2

For the demo pair (speculant.demo_pair: byte-level TinyGPTs, 4 layers d128 target and 1 layer d64 draft) or the
trained GPT-2 pair (train_pairs.GPT2_CPU: a 12.3M target, a 0.76M draft, one BPE vocabulary) on held-out
prompts, batch 1, each temperature:

1. Costs, timed directly at a cached prefix of 48 tokens, each a ratio of medians of --calls calls of two kinds
   made alternately: verify_cost(w), the target's masked tree call of width w over its width-1 call (w = 1 .. 64),
   and c, the draft's one-token call over the target's.
2. A probe run with the tree PROBE = [4, 2, 2, 1, 1, 1] estimates the acceptance table by depth and rank
   (analysis.acceptance_from_counts of stats.tree_visits / tree_accepted), one probe per way of drawing siblings
   in --siblings but "top" (the first one's also predicts the chains).
3. For every chain gamma in --gammas (default 1 .. 5; Algorithm 1's loop) and every shape in SHAPES: tokens
   per target call measured and predicted
   (analysis.tree_expected_tokens at the probe's table, its deepest row repeated below a setting deeper than the
   probe; and, as speculant.sweep predicts, from the setting's own
   measured acceptance: Equation (1) for chains, the tree theory at its own table for trees, timing.summarize),
   and the speedup over plain decoding of the same target
   measured (speculant.timing: warm-up, then --repeats rounds interleaved ABBA; median with min-max) and
   predicted (analysis.tree_speedup at the table, c and the measured verify_cost; one draft call per depth).
   Each setting (and the probe, and each width of step 1) runs on freshly loaded models: see fresh().
   The shape the analysis ranks first among them is marked. Beside the shapes, Sequoia's trees: the best tree of
   each of --budgets drafts at each rule's probe table (analysis.best_tree), run as given (breadth-first parents).
4. Grown trees (speculant.DynamicTree in GROWN: EAGLE-2's expansion by draft confidence, kept exact), each
   iteration's shape its own: timing.tree_prediction, the mean over the iterations of the expected tokens of the
   tree each drafted (Iteration.tree) at the acceptance table the setting's own first round measured (the probe
   has one rank at depths 3 to 5), and the predicted speedup that mean over the mean of (depth c +
   verify_cost(width)).
5. The fastest tree against the fastest chain, timed against each other directly (--duel rounds, ABBA), with
   the count of rounds the tree won and its sign test (timing.head_to_head).

At temperature 0 the children of a node are the draft's top k (ranks by draft probability); at temperature 1 they
are drawn by each of --siblings (default: "coupled", the library's). With --sibling (the GPT-2 pair, after
`python benchmarks/train_pairs.py --stage gpt2-sibling`) every independent rule (coupled, with_replacement) also
runs with the trained sibling draft (sibling.pt: SpeculativeDecoder's sibling_draft=, cpp/math/tree.h), its rows marked
"+ sibling", with a probe and Sequoia's trees of their own; their predicted speedups charge the sibling's calls
too, one per depth down to the deepest that branches (analysis.tree_draft_calls), each at the draft's c (the
sibling has the draft's shape). Under siblings="top" (q's k - 1 most probable
tokens, then one draw) a rank's acceptance depends on whether it is its node's last child, so no probe's table
predicts those rows: they show the prediction from their own table only.
"""
import argparse
import functools
import json
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

import speculant
from speculant import analysis, demo_pair, timing

sys.path.insert(0, str(Path(__file__).parent))
from drafters import demo_prompts  # noqa: E402  (benchmarks/drafters.py, beside this script)

SHAPES = [[2, 1], [2, 2], [3, 1], [4, 1], [2, 1, 1], [2, 2, 1], [3, 2, 1], [4, 2, 1], [2, 2, 2], [3, 1, 1, 1],
          [4, 2, 2, 1]]
# Grown trees of at most 16 drafts.
GROWN = [speculant.DynamicTree(budget=8, depth=4, children=2, width=2),
         speculant.DynamicTree(budget=12, depth=5, children=2, width=2),
         speculant.DynamicTree(budget=16, depth=5, children=2, width=4),
         speculant.DynamicTree(budget=16, depth=5, children=4, width=1)]
PROBE = [4, 2, 2, 1, 1, 1]  # the ranks of every setting below, 76 drafts (it fits beside 48 + 128 tokens in 256)
PREFIX = 48
MAX_WIDTH = 64


WARMUP = 30  # untimed calls of each first: TorchScript's profiling executor optimizes a graph after its first runs


def paired(first, second, calls: int):
    """(median seconds of `first`, of `second`): WARMUP untimed calls of each, then `calls` of each alternating,
    so that a drift of the machine's speed hits both (each is a (call, reset) pair; reset is not timed)."""
    times = ([], [])
    for i in range(WARMUP + calls):
        for j, (call, reset) in enumerate((first, second)):
            reset()
            start = time.perf_counter()
            call()
            if i >= WARMUP:
                times[j].append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


SIBLING = " + sibling"  # a rule's name with the sibling draft (--sibling)


def tree_decoder(target, draft, tree, sib, temperature, sibling_path):
    """A decoder of `tree` whose children are drawn by the rule `sib`, with the sibling draft (loaded anew, see
    fresh()) where `sib` names it."""
    with_sibling = sib.endswith(SIBLING)
    return speculant.SpeculativeDecoder(target, draft, tree=tree, siblings=sib.removesuffix(SIBLING),
                                        temperature=temperature,
                                        sibling_draft=speculant.load(sibling_path) if with_sibling else None)


def fresh(target_path, draft_path):
    """The pair loaded anew: TorchScript's profiling executor specializes each method of a loaded module on the
    shapes it has seen and, after too many different ones (a wide probe tree, other widths), runs it unoptimized
    from then on, about 1.4x slower here. Each setting gets models of its own, so that none inherits another's
    state; the timed rounds' warm-up then sees its shapes."""
    return speculant.load(target_path), speculant.load(draft_path)


def pair_paths(name: str):
    """(target path, draft path, prompt ids): the demo pair's, or the trained GPT-2 pair's (train_pairs)."""
    if name == "demo":
        target_path, draft_path = demo_pair.default_pair()
        return target_path, draft_path, lambda count: demo_prompts(count)
    import train_pairs
    out = train_pairs.pair_dir(train_pairs.GPT2_CPU)
    if not (out / "pair.json").exists():
        raise SystemExit(f"{out}/pair.json: train the pair first (python benchmarks/train_pairs.py --stage gpt2)")
    return (out / "target.pt", out / "draft.pt",
            lambda count: [p["prompt_ids"] for p in train_pairs.heldout_prompts(train_pairs.GPT2_CPU, out, count)])


def costs(target_path, draft_path, calls: int):
    """(verify_cost [w - 1] for w = 1 .. MAX_WIDTH, c, the target's one-token seconds, its width-1 tree call's):
    the target's tree call of width w (a chain mask, as wide as a tree of w nodes) over its tree call of width 1,
    timed alternately on a module loaded anew for each w (see fresh()); c, the draft's one-token extend over the
    target's, timed alternately."""
    torch.manual_seed(0)
    vocab = speculant.load(target_path).vocab_size
    prefix = torch.randint(0, vocab, (1, PREFIX))
    one = torch.randint(0, vocab, (1, 1))
    target, draft = (torch.jit.load(str(path)) for path in (target_path, draft_path))
    for module in (target, draft):
        module.prefill(prefix)
    target_call, draft_call = paired((lambda: target.extend(one), lambda: target.truncate(PREFIX)),
                                     (lambda: draft.extend(one), lambda: draft.truncate(PREFIX)), calls)
    verify, width_one = [1.0], None
    for w in range(2, MAX_WIDTH + 1):
        module = torch.jit.load(str(target_path))
        module.start_rows(1)
        positions = torch.arange(PREFIX).unsqueeze(0)
        module.extend_rows(prefix, torch.tensor([0]), positions, positions, PREFIX)

        def tree_call(width):
            ids = torch.randint(0, vocab, (1, width))
            at = torch.arange(PREFIX, PREFIX + width).unsqueeze(0)
            mask = torch.ones(1, width, PREFIX + width, dtype=torch.bool).tril(PREFIX)
            return lambda: module.extend_rows_masked(ids, torch.tensor([0]), at, at, mask), lambda: None

        base, wide = paired(tree_call(1), tree_call(w), calls)
        verify.append(wide / base)
        width_one = base if width_one is None else width_one
    return verify, draft_call / target_call, target_call, width_one


def probe_table(target_path, draft_path, prompts, temperature, siblings, tokens, sibling_path=None):
    """The acceptance table by depth and rank (analysis.acceptance_from_counts) of the PROBE tree under
    `siblings`, over the prompts."""
    probe = tree_decoder(*fresh(target_path, draft_path), PROBE, siblings, temperature, sibling_path)
    results = [probe.generate(p, max_new_tokens=tokens, seed=1000 + i) for i, p in enumerate(prompts)]
    visits = [sum(r.stats.tree_visits[i] for r in results) for i in range(len(PROBE))]
    accepted = [[sum(r.stats.tree_accepted[i][j] for r in results) for j in range(k)] for i, k in enumerate(PROBE)]
    # depths no iteration reached (short generations, early rejections) have no estimate: the table stops above
    # them and `below` repeats its deepest row there
    depth = visits.index(0) if 0 in visits else len(visits)
    if depth < len(visits):
        print(f"probe ({siblings}): depths {depth}..{len(visits) - 1} never verified; the table stops at depth "
              f"{depth - 1}", flush=True)
    return analysis.acceptance_from_counts(accepted[:depth], visits[:depth])


def below(table, tree):
    """The probe's table with a row for every depth of `tree` (a shape or parents): a tree deeper than the probe
    (a long chain) is predicted with the probe's deepest row repeated below it, the positional model."""
    return table + [table[-1]] * max(0, len(tree) - len(table))


def decoder_for(row, target_path, draft_path, temperature, sibling_path=None):
    """A fresh decoder of a row of the table: a chain, a shape or parents, or a grown tree."""
    shape = row["shape"]
    if row["siblings"] is None:
        return speculant.SpeculativeDecoder(*fresh(target_path, draft_path), gamma=len(shape), temperature=temperature)
    tree = speculant.DynamicTree(**shape) if isinstance(shape, dict) else shape
    return tree_decoder(*fresh(target_path, draft_path), tree, row["siblings"], temperature, sibling_path)


def head_to_head(rows, target_path, draft_path, temperature, calls, args, sibling_path=None) -> dict:
    """The fastest tree row against the fastest chain (by median speedup over plain decoding), timed against
    each other directly (timing.head_to_head: --duel rounds interleaved ABBA after a warm-up)."""
    tree = max((r for r in rows if r["siblings"] is not None), key=lambda r: r["speedup"])
    chain = max((r for r in rows if r["siblings"] is None), key=lambda r: r["speedup"])
    duel = timing.head_to_head(decoder_for(tree, target_path, draft_path, temperature, sibling_path).generate,
                               decoder_for(chain, target_path, draft_path, temperature).generate, calls,
                               max_new_tokens=args.tokens, seed=0, repeats=args.duel)
    print(f"\nhead to head: {tree['draft']} against {chain['draft']}: {duel.ratio:.3f}x [{duel.ratio_min:.3f}-"
          f"{duel.ratio_max:.3f}], the tree faster in {duel.first_faster} of {len(duel.ratios)} rounds (sign test "
          f"p = {duel.sign_test_p:.3g})", flush=True)
    return {"tree": tree["draft"], "chain": chain["draft"], **duel._asdict()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--pair", choices=["demo", "gpt2"], default="demo")
    parser.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 3, 4, 5], help="the chains' lengths")
    parser.add_argument("--shapes", type=lambda s: [int(k) for k in s.split(",")], nargs="*", default=SHAPES,
                        help="tree shapes besides the chains, each as k1,k2,... (default: SHAPES)")
    parser.add_argument("--siblings", nargs="+", choices=speculant.decoder.SIBLINGS, default=["coupled"],
                        help="how the trees' children are drawn at temperature > 0, each a set of rows (the chains "
                             "are the same under all; at temperature 0 children are the draft's top k)")
    parser.add_argument("--duel", type=int, default=12,
                        help="rounds of the fastest tree against the fastest chain, timed directly (0: none)")
    parser.add_argument("--budgets", type=int, nargs="*", default=[8, 16],
                        help="node budgets of Sequoia's best trees (analysis.best_tree at the probe's table)")
    parser.add_argument("--sibling", action="store_true",
                        help="also each independent rule with the GPT-2 pair's sibling draft (train_pairs.py --stage "
                             "gpt2-sibling)")
    parser.add_argument("--json", type=Path, default=None, help="default: results/trees-<pair>-cpu.json")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=r".*TorchScript.*")
    torch.set_num_threads(args.threads)
    args.json = args.json or Path(__file__).parent / "results" / f"trees-{args.pair}-cpu.json"

    target_path, draft_path, make_prompts = pair_paths(args.pair)
    sibling_path = None
    if args.sibling:
        sibling_path = Path(draft_path).with_name("sibling.pt")
        if args.pair != "gpt2" or not sibling_path.exists():
            raise SystemExit("--sibling: the GPT-2 pair's sibling draft, trained by python benchmarks/train_pairs.py "
                             "--stage gpt2-sibling (use --pair gpt2)")
    prompts = make_prompts(args.prompts)
    calls = [{"prompt_ids": p} for p in prompts]
    verify, c, target_call, tree_one = costs(target_path, draft_path, args.calls)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} thread(s); "
          f"{len(prompts)} held-out prompts x {args.tokens} tokens; median of {args.repeats} ABBA rounds [min-max]")
    print(f"# target one-token call {target_call * 1e3:.3f} ms (tree call of width 1: {tree_one * 1e3:.3f} ms); "
          f"c = {c:.3f}; verify_cost(w) for w = 2, 4, 8, 16, 32, 64: "
          + ", ".join(f"{verify[w - 1]:.2f}" for w in (2, 4, 8, 16, 32, 64)))
    report = {"pair": args.pair, "machine": platform.platform(), "torch": torch.__version__, "threads": args.threads,
              "tokens": args.tokens, "prompts": len(prompts), "repeats": args.repeats, "c": c,
              "siblings": args.siblings, "sibling_draft": str(sibling_path) if sibling_path else None,
              "verify_cost": verify, "temperatures": {}}

    for temperature in args.temperatures:
        # (name, shape, siblings); the chains are the same under every siblings rule, and at temperature 0 so are
        # the trees (the draft's top k)
        modes = args.siblings if temperature > 0 else args.siblings[:1]
        if sibling_path and temperature > 0:
            modes = modes + [sib + SIBLING for sib in modes if sib in ("coupled", "with_replacement")]
        label = (lambda sib: f" {sib}" if len(modes) > 1 else "")
        # one probe per sampled rule but "top": under "top" a rank's acceptance depends on whether it is a node's
        # last child (the one drawn), so a table transfers only between equal widths: those rows are predicted
        # from their own tables alone. The probe of the first rule predicts the chains.
        sampled = [sib for sib in modes if sib != "top"] or ["without_replacement"]  # the latter for the chains
        tables = {sib: probe_table(target_path, draft_path, prompts, temperature, sib, args.tokens, sibling_path)
                  for sib in sampled}
        table = tables[sampled[0]]
        print(f"\n## temperature {temperature}\n")
        for sib, rule_table in tables.items():
            print(f"acceptance by depth (rows) and rank (columns), from the {PROBE} probe{label(sib)}: "
                  + "; ".join("[" + ", ".join(f"{a:.3f}" for a in row) + "]" for row in rule_table))
        print("\n| draft | drafts | tokens / target call ± s.e. (probe's prediction) | own prediction | "
              "speedup [min-max] | predicted speedup |")
        print("|---|---|---|---|---|---|")
        settings = [(f"chain gamma = {g}", [1] * g, sampled[0]) for g in args.gammas]
        for sib in modes:
            settings += [(f"{s}{label(sib)}", s, sib) for s in args.shapes]
        # Sequoia's trees: the best of each budget at each rule's probe table (analysis.best_tree), run as given
        settings += [(f"best of {b} (Sequoia){label(sib)}", analysis.best_tree(b, rule_table).tree, sib)
                     for sib, rule_table in tables.items() if sib in modes for b in args.budgets]
        # the draft calls of a tree: the sibling draft's too, each costing the draft's (its shape is the draft's)
        predicted = {name: analysis.tree_speedup(shape, below(tables[sib], shape), c, verify,
                                                 draft_calls=analysis.tree_draft_calls(shape, sib.endswith(SIBLING)))
                     for name, shape, sib in settings if sib in tables}
        pick = max(predicted, key=predicted.get)
        settings += [(f"grown {g.budget}, depth {g.depth}, {g.children} x {g.width}{label(modes[0])}", g, modes[0])
                     for g in GROWN]
        rows = []
        for name, shape, sib in settings:
            chain = name.startswith("chain")  # Algorithm 1's own loop, not a tree of one child per node
            target, draft = fresh(target_path, draft_path)
            if chain:
                decoder = speculant.SpeculativeDecoder(target, draft, temperature=temperature, gamma=len(shape))
            else:
                decoder = tree_decoder(target, draft, shape, sib, temperature, sibling_path)
            plain = functools.partial(speculant.generate, target, temperature=temperature)
            rounds = timing.timed_rounds(decoder.generate, plain, calls, max_new_tokens=args.tokens, seed=0,
                                         repeats=args.repeats)
            speedups = [r.plain_seconds / timing.totals(r.plain)["new_tokens"]
                        / (r.speculative_seconds / timing.totals(r.speculative)["new_tokens"]) for r in rounds]
            median, low, high = timing.median_range(speedups)
            spec = timing.totals(rounds[0].speculative)
            per_call = spec["new_tokens"] / spec["target_calls"]
            # its standard error over the prompts (each prompt's own tokens per call; the same seeds every round)
            each = [r.stats.new_tokens / r.stats.target_calls for r in rounds[0].speculative]
            per_call_se = statistics.stdev(each) / len(each) ** 0.5 if len(each) > 1 else float("nan")
            # the sweep's prediction: from this setting's own measured acceptance (Equation (1) for chains)
            depth = shape.depth if isinstance(shape, speculant.DynamicTree) else len(shape)
            own = timing.summarize(rounds, gamma=depth, lenience=1.0, tree=None if chain else shape)["expected_tokens"]
            if isinstance(shape, speculant.DynamicTree):
                expected, predicted[name] = timing.tree_prediction(rounds[0].speculative, shape, c, verify)
                drafts = spec["drafted_tokens"] / spec["target_calls"]
                shape = vars(shape)
                probe = "-"
            elif name not in predicted:  # siblings="top": its own table only
                expected, predicted[name] = timing.tree_prediction(rounds[0].speculative, shape, c, verify)
                drafts, probe = analysis.tree_size(shape), "-"
            else:
                expected = analysis.tree_expected_tokens(shape, below(tables[sib], shape))
                drafts = analysis.tree_size(shape)
                probe = f"{expected:.2f}"
            rows.append({"draft": name, "shape": shape, "siblings": None if chain else sib, "drafts": drafts,
                         "tokens_per_target_call": per_call, "tokens_per_target_call_se": per_call_se,
                         "expected_tokens": expected, "own_expected": own,
                         "speedup": median, "speedup_min": low, "speedup_max": high,
                         "predicted_speedup": predicted[name]})
            mark = " (analysis's pick)" if name == pick else ""
            print(f"| {name}{mark} | {drafts:.3g} | {per_call:.2f} ± {per_call_se:.2f} ({probe}) | {own:.2f} | "
                  f"{median:.2f}x [{low:.2f}-{high:.2f}] | {predicted[name]:.2f}x |", flush=True)
        duel = (head_to_head(rows, target_path, draft_path, temperature, calls, args, sibling_path) if args.duel
                else None)
        report["temperatures"][str(temperature)] = {"table": table, "tables": tables, "rows": rows, "pick": pick,
                                                    "duel": duel}

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    print(f"\n# raw results: {args.json}")


if __name__ == "__main__":
    main()
