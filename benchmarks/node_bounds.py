"""One node of k children at temperature 1: what recursive rejection sampling and the coupled rule accept against
the best any exact verifier of i.i.d. children could (speculant.analysis.multi_draft_bound).

    python benchmarks/train_pairs.py --stage gpt2 && python benchmarks/node_bounds.py [--windows 40] [--draws 8]

On the trained GPT-2 pair (train_pairs.GPT2_CPU), at every position after the first 16 of --windows windows of
128 held-out tokens (evenly spread over the held-out stream), p and q are the target's and the draft's
next-token laws at T = 1. For k = 1 .. 8 children at such a node:

* the acceptance of cpp/math/tree.h's rule (recursive rejection sampling: child j tried against what the earlier
  rejections left of p), with children drawn with replacement and without, estimated by Monte Carlo over
  --draws draws of the children per position (fixed seed; the accept coins integrated out: child j is accepted
  with probability prod_{i<j} (1 - a_i) a_j), mean over positions with its standard error;
* siblings="coupled" (cpp/math/tree.h: i.i.d. children, each coin looking at whether the next child could be
  accepted after it), in closed form (coupled()), mean over positions, and its per-rank shares;
* a selection rule for comparison (not in the engine): of k i.i.d. children keep the one with the largest
  p(x) / q(x) and verify it by one step of speculative sampling against the law of that choice,
  q_k(x) = F(x)^k - (F(x) - q(x))^k with F(x) the draft's mass of the tokens up to x in increasing p / q (exact
  for any k, as any proposal's speculative sampling is); its acceptance sum_x min(p(x), q_k(x)), mean over
  positions;
* analysis.multi_draft_bound(p, q, k): the largest acceptance of any exact verifier of k i.i.d. children (the
  optimal coupling, in closed form), mean over positions, and analysis.second_child_bound(p, q): the most a
  second child can be accepted while the first keeps beta (attained by some verifier), and the best tree of 16
  drafts under the positional model if the second child had that share;
* what the node laws give under the positional model for 16 drafts (positional()): chains, the best tree
  (Sequoia's, analysis.best_tree) under rejection sampling and under the coupled rule, the selection rule's
  best regular shape, and the best tree whose every node takes the better of the coupled and the selection
  rule (mixed_tree()), and the ceiling no exact verifier of i.i.d. children can pass (the prefix sums of a
  node's shares at most multi_draft_bound: positional()'s docstring);
* siblings drawn from the draft at other temperatures under the coupled rule (tempered_siblings()): per-rank
  shares and the best tree of 16 drafts under the positional model;
* a wider coupling of three children, the first child's coin looking at the second and the third
  (lookahead_three()): its shares and the best tree of 16 drafts.

Results: benchmarks/results/node-bounds-gpt2-cpu.json.

    python benchmarks/train_pairs.py --stage gpt2-sibling && python benchmarks/node_bounds.py --sibling

instead measures the trained sibling draft (sibling.pt, SpeculativeDecoder's sibling_draft=: children 1 .. k - 1
drawn from its law s, cpp/math/tree.h) at the same positions: the coupled rule's per-rank shares with s as the later
children's law (coupled(..., siblings=s)) against q's, the second child's share with independent coins (with
replacement: sum min(max(0, p - q), (1 - beta) s), distillation.sibling_share), and Sequoia's best tree of 16
drafts under the positional model with each, beside the chain of 16 and the ceiling of exact verifiers of i.i.d.
children (which drafts from two laws are not bound by). Results: benchmarks/results/node-bounds-sibling-gpt2-cpu.json.
"""
import argparse
import functools
import json
import math
import platform
import sys
from pathlib import Path

import torch

from speculant import analysis, distillation

sys.path.insert(0, str(Path(__file__).parent))
import train_pairs  # noqa: E402

LENGTH, SKIP = 128, 16
KS = range(1, 9)
TEMPERATURES = (0.75, 0.9, 1.0, 1.25, 1.5, 2.0)  # tempered_siblings()


def node_laws(windows: int, names=("target", "draft")):
    """(p, q) [N, V] float64 at T = 1 over the held-out windows' positions after the first SKIP (one law per model
    of `names`, each <name>.pt of the pair's directory)."""
    out = train_pairs.pair_dir(train_pairs.GPT2_CPU)
    if not (out / "pair.json").exists():
        raise SystemExit(f"{out}/pair.json: train the pair first (python benchmarks/train_pairs.py --stage gpt2)")
    _, val_texts, _ = train_pairs.load_corpus(train_pairs.GPT2_CPU)
    ids = train_pairs.stream(train_pairs.load_tokenizer(out / "tokenizer.json"), val_texts)
    starts = torch.linspace(0, len(ids) - LENGTH - 1, windows).long().tolist()
    laws = []
    for name in names:
        if not (out / f"{name}.pt").exists():
            raise SystemExit(f"{out}/{name}.pt: train it first (python benchmarks/train_pairs.py --stage gpt2-{name})")
        module = torch.jit.load(str(out / f"{name}.pt"))
        with torch.inference_mode():
            logits = torch.cat([module(ids[s:s + LENGTH][None])[0, SKIP:] for s in starts])
        laws.append(torch.softmax(logits.double(), -1))
    return laws


def rejection_sampling(p, q, k: int, replacement: bool, generator) -> torch.Tensor:
    """[N, k]: one draw of k children per row and the probability that child j is the one accepted (the coins
    integrated out)."""
    p_left, q_left = p.clone(), q.clone()
    shares, alive = [], torch.ones(len(p), dtype=p.dtype)
    for _ in range(k):
        q_j = q_left / q_left.sum(-1, keepdim=True)
        x = torch.multinomial(q_j, 1, generator=generator)  # [N, 1]
        a = (p_left.gather(1, x) / q_j.gather(1, x)).clamp(max=1.0).squeeze(1)
        shares.append(alive * a)
        alive = alive * (1.0 - a)
        residual = (p_left - q_j).clamp_min(0.0)
        mass = residual.sum(-1, keepdim=True)
        p_left = torch.where(mass > 0, residual / mass.clamp_min(1e-300), p_left)  # mass 0: p_j = q_j, all kept
        if not replacement:
            q_left.scatter_(1, x, 0.0)
    return torch.stack(shares, 1)


def coupled(p, q, k: int, siblings=None) -> torch.Tensor:
    """[N, k]: the probability that child j is the one accepted under siblings="coupled" (cpp/math/tree.h: i.i.d.
    children, child j's coin looking at whether child j + 1 is in H_j = {p_j > q_j}), in closed form: child j
    is accepted with sum min(p_j, q_j) of what reaches it, and a rejection leaves p_{j+1} = norm(max(0, p_j - q_j))
    and child j + 1's law q reweighted on H_j and off it (tree.h's q_{j+1}). Unnormalized: left is P(every child
    so far rejected, and the token then drawn is x). `siblings` [N, V]: children 1 .. k - 1 drawn independently
    from that law instead of q (the rule and its exactness hold for any law of the next child: its coins average
    to min(1, r) whatever w is), the first child from q."""
    left, law, shares = p.clone(), q.clone(), []
    nxt = q if siblings is None else siblings
    for j in range(k):
        reach = left.sum(-1, keepdim=True)
        taken = torch.minimum(left, reach * law)
        shares.append(taken.sum(-1))
        if j == k - 1:
            break
        p_j = left / reach.clamp_min(1e-300)
        in_h = p_j > law
        w = (nxt * in_h).sum(-1, keepdim=True)
        ratio = torch.where(law > 0, p_j / law.clamp_min(1e-300), torch.ones_like(law))
        coin_in = torch.where(w > 0, ((ratio - (1 - w)) / w.clamp_min(1e-300)).clamp(0.0, 1.0), torch.ones_like(law))
        coin_out = torch.where(w < 1, (ratio / (1 - w).clamp_min(1e-300)).clamp(max=1.0), torch.ones_like(law))
        keep_in = (law * (1 - coin_in)).sum(-1, keepdim=True)
        keep_out = (law * (1 - coin_out)).sum(-1, keepdim=True)
        law = nxt * torch.where(in_h, keep_in, keep_out)
        law = law / law.sum(-1, keepdim=True).clamp_min(1e-300)
        left = left - taken
    return torch.stack(shares, 1)


def lookahead_three(p, q, lookahead: bool = True) -> dict:
    """Three i.i.d. children under a wider coupling, in closed form: child 1's coin looks at whether child 2 OR
    child 3 lies in H_1 = {p > q} (w_A = 1 - (1 - q(H_1))^2, its coin min(1, r) on average as the coupled rule's),
    child 2's at whether child 3 lies in H_2 = {p_2 > q_2}, with w_2 = P(child 3 in H_2 | child 2 = y, child 1
    rejected), which depends on y (child 3's law given child 1's rejection is q reweighted by P(reject | A) on H_1
    and by the same for not-A off it, where child 2 is off H_1). Each child is verified against what the earlier
    rejections left of p, with its law given those rejections (q_2, q_3). lookahead=False is siblings="coupled"
    (coupled(p, q, 3)). Returns the shares [N, 3] and the laws a simulation needs (w_a, p2, q2, w2, p3, q3, and
    the coins' parts)."""
    tiny = 1e-300
    h1 = p > q
    w = (q * h1).sum(-1, keepdim=True)
    w_a = 1 - (1 - w) ** 2 if lookahead else w

    def coins(ratio, w_event):  # a candidate's acceptance when the event holds / does not (min(1, r) on average)
        hit = torch.where(w_event > 0, ((ratio - 1 + w_event) / w_event.clamp_min(tiny)).clamp(0, 1), 1.0)
        miss = torch.where(w_event < 1, (ratio / (1 - w_event).clamp_min(tiny)).clamp(max=1), 1.0)
        return hit, miss

    def residual(left, law):
        rest = (left - law).clamp_min(0)
        return rest / rest.sum(-1, keepdim=True).clamp_min(tiny)

    def normalized(law):
        return law / law.sum(-1, keepdim=True).clamp_min(tiny)

    hit1, miss1 = coins(torch.where(q > 0, p / q.clamp_min(tiny), 1.0), w_a)
    keep_a, keep_n = ((q * (1 - c)).sum(-1, keepdim=True) for c in (hit1, miss1))  # P(child 1 rejected | A, not A)
    beta = torch.minimum(p, q).sum(-1, keepdim=True)
    p2 = residual(p, q)
    q2 = normalized(q * torch.where(h1, keep_a, w * keep_a + (1 - w) * keep_n if lookahead else keep_n))
    h2 = p2 > q2
    off_h1 = torch.where(h1, keep_a, keep_n)  # child 3's weight given child 1 rejected, child 2 off H_1
    w2_off = (q * off_h1 * h2).sum(-1, keepdim=True) / (q * off_h1).sum(-1, keepdim=True).clamp_min(tiny)
    w2 = torch.where(h1, (q * h2).sum(-1, keepdim=True), w2_off) if lookahead else (q * h2).sum(-1, keepdim=True)
    w2 = w2.expand_as(q)
    hit2, miss2 = coins(torch.where(q2 > 0, p2 / q2.clamp_min(tiny), 1.0), w2)

    def both_rejected(z_in_h1: bool, z_in_h2: bool):  # sum_y q(y) P(child 1 rej | y, z) P(child 2 rej | y, z)
        first = torch.where(h1, keep_a, keep_a if (z_in_h1 and lookahead) else keep_n)
        return (q * first * (1 - (hit2 if z_in_h2 else miss2))).sum(-1, keepdim=True)

    q3 = normalized(q * torch.where(h1, torch.where(h2, both_rejected(True, True), both_rejected(True, False)),
                                    torch.where(h2, both_rejected(False, True), both_rejected(False, False))))
    p3 = residual(p2, q2)
    second = torch.minimum(p2, q2).sum(-1, keepdim=True)
    third = torch.minimum(p3, q3).sum(-1, keepdim=True)
    shares = torch.cat([beta, (1 - beta) * second, (1 - beta) * (1 - second) * third], -1)
    return {"shares": shares, "h1": h1, "w_a": w_a, "p2": p2, "q2": q2, "h2": h2, "w2": w2, "p3": p3, "q3": q3}


def ratio_selection(p, q, k: int) -> torch.Tensor:
    """[N]: the acceptance of keeping the child with the largest p / q of k i.i.d. children, then one step of
    speculative sampling against the law of that choice (ties broken by the sort's order, as the rule would)."""
    order = (p / q).argsort(-1)  # increasing p / q
    q_sorted = q.gather(1, order)
    mass = q_sorted.cumsum(-1).clamp(max=1.0)
    chosen = mass ** k - (mass - q_sorted).clamp(min=0.0) ** k  # P(the kept child is x), in that order
    return torch.minimum(p.gather(1, order), chosen).sum(-1)


def positional(rows, budget: int = 16) -> dict:
    """Tokens per target call under the positional model (the same node law at every depth): chains at the
    rank-0 share, Sequoia's best tree of `budget` drafts at rejection sampling's per-rank shares (without
    replacement) and at the coupled rule's (under both, rank j's share does not depend on the siblings after it,
    so the widest node's row gives the table), and the best regular shape at the selection rule's acceptance (its
    kept child's place among its siblings is random, so every child of a depth gets the same subtree:
    E = 1 + sum_t prod_(i<t) a(k_(i+1))).

    And a ceiling for every exact verifier of i.i.d. children: any m of a node's children are m i.i.d. draws of
    q, so the chance that the output is one of them is at most multi_draft_bound(m) = B_m (B_1 = beta). With a
    node's subtrees sorted by value, sum_j s_j (1 + V_j) over shares s_j whose prefix sums are at most B_m is
    largest at s_j = B_(j+1) - B_j (summation by parts; the V_j decrease), so Sequoia's best tree at those
    shares bounds what any verifier's tree keeps, under the positional model."""
    ranks = rows[-1]["without_ranks"]
    chains = {g: float(analysis.tree_expected_tokens([1] * g, [ranks[:1]] * g)) for g in (1, 2, 3, 4, 5, budget)}
    sequoia = analysis.best_tree(budget, [ranks] * budget)
    coupled_tree = analysis.best_tree(budget, [rows[-1]["coupled_ranks"]] * budget)
    best = [0.0]  # the selection rule's best acceptance with at most k children (fewer may be drawn)
    for row in rows:
        best.append(max(best[-1], row["ratio_selection"]))
    increments = [b - a for a, b in zip(best, best[1:])]  # prefix sums: that best acceptance
    selection = analysis.best_tree_shape(budget, [increments] * budget)
    mixed = mixed_tree(tuple(rows[-1]["coupled_ranks"]), tuple(row["ratio_selection"] for row in rows), budget)
    bounds = [row["bound"] for row in rows]
    ceiling = analysis.best_tree(budget, [[bounds[0]] + [b - a for a, b in zip(bounds, bounds[1:])]] * budget)
    return {"chains": chains, "ceiling": {"tree": ceiling.tree, "expected_tokens": float(ceiling.expected_tokens)},
            "rejection_sampling_tree": {"tree": sequoia.tree, "expected_tokens": float(sequoia.expected_tokens)},
            "coupled_tree": {"tree": coupled_tree.tree, "expected_tokens": float(coupled_tree.expected_tokens)},
            "selection_shape": {"tree": selection.tree, "expected_tokens": float(selection.expected_tokens)},
            "coupled_or_selection_per_node": mixed}


def mixed_tree(coupled_ranks, selection, budget: int, max_depth: int = 8) -> float:
    """The most tokens per target call under the positional model when every node of the tree takes, for its
    own k children, either the coupled rule (rank j accepted with coupled_ranks[j], j < len(coupled_ranks)) or
    the selection rule (selection[k - 1] in all, and each child accepted with selection[k - 1] / k: the kept
    child's place among i.i.d. siblings is uniform), the better per node, with at most `budget` drafts and
    depth `max_depth`. Whether trading the first child's chance for the node's total pays anywhere in a tree."""
    widest = min(len(coupled_ranks), len(selection))

    @functools.lru_cache(maxsize=None)
    def below(depth: int, nodes: int) -> float:  # the most accepted tokens under a node with `nodes` descendants
        if nodes == 0 or depth >= max_depth:
            return 0.0

        @functools.lru_cache(maxsize=None)
        def ranked(rank: int, left: int) -> float:  # coupled: children rank .. with `left` nodes among them
            if left == 0 or rank >= widest:
                return 0.0
            return max(coupled_ranks[rank] * (1 + below(depth + 1, size - 1)) + ranked(rank + 1, left - size)
                       for size in range(1, left + 1))

        @functools.lru_cache(maxsize=None)
        def even(k: int, child: int, left: int) -> float:  # selection with k children: children child .. k - 1
            if child == k:
                return 0.0 if left == 0 else -math.inf
            return max(selection[k - 1] / k * (1 + below(depth + 1, extra)) + even(k, child + 1, left - extra)
                       for extra in range(left + 1))

        choices = [ranked(0, nodes)] + [even(k, 0, nodes - k) for k in range(1, min(nodes, widest) + 1)]
        return max(choices)

    return 1.0 + max(below(0, n) for n in range(budget + 1))


def tempered_siblings(p, q, temperatures, budget: int = 16) -> dict:
    """Siblings drawn from the draft at another temperature, q^(1/t) normalized (the first child from q itself),
    under the coupled rule: per-rank shares with 8 children and Sequoia's best tree of `budget` drafts under the
    positional model, by t (t = 1: i.i.d. children). Whether a flatter law (more of the tokens a rejection leaves)
    or a sharper one draws better siblings than q."""
    out = {}
    for t in temperatures:
        ranks = [float(v) for v in coupled(p, q, 8, torch.softmax(q.log() / t, -1)).mean(0)]
        best = analysis.best_tree(budget, [ranks] * budget)
        out[str(t)] = {"ranks": ranks, "expected_tokens": float(best.expected_tokens), "tree": best.tree}
    return out


def sibling_draft(p, q, s, budget: int = 16) -> dict:
    """The sibling draft's law s beside q at every position: per-rank shares of the coupled rule with 8 children
    (the first from q, the others from s) against s = q, the second child's share under independent coins (with
    replacement), and the best tree of `budget` drafts under the positional model with each, beside the chain of
    `budget` and the i.i.d. ceiling."""
    out = {}
    for name, law in (("draft", q), ("sibling", s)):
        ranks = [float(v) for v in coupled(p, q, 8, law).mean(0)]
        independent = distillation.sibling_share_of_laws(p, q, law)
        best = analysis.best_tree(budget, [ranks] * budget)
        out[name] = {"coupled_ranks": ranks, "second_with_replacement": mean_se(independent),
                     "best_tree": best.tree, "expected_tokens": float(best.expected_tokens)}
    beta = out["draft"]["coupled_ranks"][0]
    out["chain"] = float(analysis.tree_expected_tokens([1] * budget, [[beta]] * budget))
    bounds = [float(analysis.multi_draft_bound(p, q, k).mean()) for k in KS]
    out["iid_ceiling"] = float(analysis.best_tree(budget, [[bounds[0]] + [b - a for a, b in zip(bounds, bounds[1:])]]
                                                  * budget).expected_tokens)
    return out


def mean_se(values: torch.Tensor):
    return float(values.mean()), float(values.std() / len(values) ** 0.5)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=40)
    parser.add_argument("--draws", type=int, default=8)
    parser.add_argument("--sibling", action="store_true", help="the sibling draft's shares only (see above)")
    parser.add_argument("--json", type=Path, default=None,
                        help="default: results/node-bounds-gpt2-cpu.json "
                             "(--sibling: node-bounds-sibling-gpt2-cpu.json)")
    args = parser.parse_args(argv)
    results = Path(__file__).parent / "results"
    torch.set_num_threads(1)
    if args.sibling:
        args.json = args.json or results / "node-bounds-sibling-gpt2-cpu.json"
        p, q, s = node_laws(args.windows, ("target", "draft", "sibling"))
        out = sibling_draft(p, q, s)
        print(f"# {len(p)} positions of {args.windows} held-out windows, T = 1")
        for name in ("draft", "sibling"):
            row = out[name]
            print(f"later children from the {name}: coupled shares "
                  + ", ".join(f"{v:.4f}" for v in row["coupled_ranks"][:4])
                  + f"; second child with independent coins {row['second_with_replacement'][0]:.4f} ± "
                  f"{row['second_with_replacement'][1]:.4f}; best tree of 16 drafts {row['expected_tokens']:.3f} "
                  f"tokens per target call ({row['expected_tokens'] / out['chain']:.3f}x the chain of 16's "
                  f"{out['chain']:.3f}), tree {row['best_tree']}")
        print(f"no exact verifier of i.i.d. children of q keeps more than {out['iid_ceiling']:.3f} "
              f"({out['iid_ceiling'] / out['chain']:.3f}x)")
        args.json.write_text(json.dumps({"machine": platform.platform(), "torch": torch.__version__,
                                         "windows": args.windows, "positions": len(p), **out}, indent=1))
        print(f"wrote {args.json}")
        return
    args.json = args.json or results / "node-bounds-gpt2-cpu.json"
    p, q = node_laws(args.windows)
    print(f"# {len(p)} positions of {args.windows} held-out windows, vocabulary {p.shape[1]}, T = 1, "
          f"{args.draws} draws of the children per position")
    print("| k | rejection sampling, with replacement | without replacement | coupled | keep the largest p / q | "
          "best coupling of i.i.d. children |")
    print("|---|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
    rows = []
    for k in KS:
        row = {"k": k, "bound": float(analysis.multi_draft_bound(p, q, k).mean()),
               "ratio_selection": float(ratio_selection(p, q, k).mean())}
        shares = coupled(p, q, k)
        row["coupled"] = mean_se(shares.sum(1))
        row["coupled_ranks"] = [float(v) for v in shares.mean(0)]
        for replacement in (True, False):
            per_position = torch.stack([rejection_sampling(p, q, k, replacement, generator)
                                        for _ in range(args.draws)]).mean(0)  # [N, k]
            row["with" if replacement else "without"] = mean_se(per_position.sum(1))
            row["with_ranks" if replacement else "without_ranks"] = [float(v) for v in per_position.mean(0)]
        rows.append(row)
        print(f"| {k} | {row['with'][0]:.4f} ± {row['with'][1]:.4f} | {row['without'][0]:.4f} ± "
              f"{row['without'][1]:.4f} | {row['coupled'][0]:.4f} | {row['ratio_selection']:.4f} | "
              f"{row['bound']:.4f} |", flush=True)
    second = {"with_replacement": rows[1]["with_ranks"][1], "coupled": rows[1]["coupled_ranks"][1],
              "bound": float(analysis.second_child_bound(p, q).mean())}
    ranks = list(rows[-1]["coupled_ranks"])
    ranks[1] = second["bound"]  # the second child at its optimum, the others at the coupled rule's shares
    second["best_tree_16"] = float(analysis.best_tree(16, [ranks] * 16).expected_tokens)
    print(f"\nthe second of two children: accepted {second['with_replacement']:.4f} under rejection sampling with "
          f"replacement, {second['coupled']:.4f} coupled; the most any exact verifier gives it while the first keeps "
          f"beta (analysis.second_child_bound): {second['bound']:.4f}; at that share (the other ranks coupled's) "
          f"the best tree of 16 drafts keeps {second['best_tree_16']:.3f} tokens per target call under the "
          "positional model")
    model = positional(rows)
    chains, sequoia, selection = model["chains"], model["rejection_sampling_tree"], model["selection_shape"]
    best_coupled = model["coupled_tree"]
    kept = ", ".join(f"{chains[g]:.3f}" for g in range(1, 6))
    print(f"\npositional model, 16 drafts: chains gamma = 1 .. 5 keep {kept} tokens per target call (gamma = 16: "
          f"{chains[16]:.3f}); rejection sampling's best tree (Sequoia) {sequoia['expected_tokens']:.3f} "
          f"({sequoia['expected_tokens'] / chains[5]:.3f}x gamma = 5); the coupled rule's "
          f"{best_coupled['expected_tokens']:.3f} ({best_coupled['expected_tokens'] / chains[5]:.3f}x, tree "
          f"{best_coupled['tree']}); the selection rule's best shape {selection['tree']} "
          f"{selection['expected_tokens']:.3f} ({selection['expected_tokens'] / chains[5]:.3f}x); each node taking "
          f"the better of the coupled and the selection rule: {model['coupled_or_selection_per_node']:.3f}; no "
          f"exact verifier of i.i.d. children can keep more than {model['ceiling']['expected_tokens']:.3f} "
          f"({model['ceiling']['expected_tokens'] / chains[5]:.3f}x, tree {model['ceiling']['tree']})")
    wider = [float(v) for v in lookahead_three(p, q)["shares"].mean(0)]
    ranks = wider + rows[-1]["coupled_ranks"][3:]
    wider_tree = float(analysis.best_tree(16, [ranks] * 16).expected_tokens)
    print(f"\nchild 1's coin looking at children 2 and 3 (lookahead_three): shares "
          f"{', '.join(f'{v:.4f}' for v in wider)} against coupled's {', '.join(f'{v:.4f}' for v in rows[2]['coupled_ranks'])}; best tree of 16 drafts "
          f"(ranks 4 .. 8 coupled's) {wider_tree:.4f} against {model['coupled_tree']['expected_tokens']:.4f}")
    tempered = tempered_siblings(p, q, TEMPERATURES)
    print("\nsiblings from the draft at temperature t (the first child from q), coupled rule, positional model, 16 "
          "drafts: " + "; ".join(f"t = {t}: second child {v['ranks'][1]:.4f}, best tree {v['expected_tokens']:.3f}"
                                 for t, v in tempered.items()))
    args.json.write_text(json.dumps({"machine": platform.platform(), "torch": torch.__version__,
                                     "windows": args.windows, "positions": len(p), "draws": args.draws,
                                     "rows": rows, "second_child": second, "positional": model,
                                     "tempered_siblings": tempered,
                                     "lookahead_three": {"shares": wider, "best_tree_16": wider_tree}}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
