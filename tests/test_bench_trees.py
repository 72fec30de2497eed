"""benchmarks/trees.py end to end on the smoke-sized demo pair: chains, shapes under two ways of drawing
siblings, Sequoia's best tree run as given, a grown tree, and the fastest tree timed against the fastest chain,
written to its record. benchmarks/node_bounds.py's parts (it needs the trained GPT-2 pair to run whole): its
Monte Carlo of rejection sampling, its closed form of the coupled rule and its selection rule against
enumeration, and its positional model."""
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import trees as bench  # noqa: E402

from speculant import analysis, demo_pair  # noqa: E402


def test_trees_benchmark_runs(smoke_pair, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo_pair, "default_pair", lambda *args, **kwargs: smoke_pair)
    monkeypatch.setattr(bench, "GROWN", bench.GROWN[:1])
    out = tmp_path / "trees.json"
    bench.main(["--temperatures", "1", "--prompts", "1", "--tokens", "12", "--repeats", "1", "--calls", "3",
                "--shapes", "2,1", "--siblings", "without_replacement", "top", "coupled", "--budgets", "4", "--duel",
                "2", "--json", str(out)])
    record = json.loads(out.read_text())
    assert record["siblings"] == ["without_replacement", "top", "coupled"]
    assert len(record["verify_cost"]) == bench.MAX_WIDTH
    result = record["temperatures"]["1.0"]
    assert set(result["tables"]) == {"without_replacement", "coupled"}  # a probe per sampled rule
    assert result["table"] == result["tables"]["without_replacement"]
    rows = {row["draft"]: row for row in result["rows"]}
    assert list(rows) == [f"chain gamma = {g}" for g in range(1, 6)] + [
        "[2, 1] without_replacement", "[2, 1] top", "[2, 1] coupled", "best of 4 (Sequoia) without_replacement",
        "best of 4 (Sequoia) coupled", "grown 8, depth 4, 2 x 2 without_replacement"]
    for sib in result["tables"]:
        sequoia = rows[f"best of 4 (Sequoia) {sib}"]
        assert sequoia["siblings"] == sib and sequoia["drafts"] == 4
        assert sequoia["shape"] == analysis.best_tree(4, result["tables"][sib]).tree
        assert sequoia["expected_tokens"] == pytest.approx(float(analysis.tree_expected_tokens(
            sequoia["shape"], result["tables"][sib])))
    top = rows["[2, 1] top"]
    assert top["siblings"] == "top" and top["drafts"] == 4  # predicted from its own table only
    assert top["expected_tokens"] == pytest.approx(top["own_expected"])
    for row in rows.values():
        assert row["speedup_min"] <= row["speedup"] <= row["speedup_max"]
        assert "tokens_per_target_call_se" in row  # NaN here: one prompt
        assert (row["siblings"] is None) == row["draft"].startswith("chain")
    duel = result["duel"]
    fastest = max((r for r in rows.values() if r["siblings"]), key=lambda r: r["speedup"])
    assert duel["tree"] == fastest["draft"] and duel["chain"].startswith("chain gamma")
    assert len(duel["ratios"]) == 2 and duel["first_faster"] == sum(r > 1 for r in duel["ratios"])
    assert duel["ratio_min"] <= duel["ratio"] <= duel["ratio_max"] and 0 < duel["sign_test_p"] <= 1
    assert "head to head:" in capsys.readouterr().out


def test_the_probe_table_stops_above_depths_never_verified(smoke_pair, capsys):
    """Two tokens leave room for a tree of depth 1 only (then none): the probe's deeper depths are never verified,
    and its table stops above them (the fourth GPU lease's suite failed where a short smoke run missed depth 5)."""
    table = bench.probe_table(*smoke_pair, [list(range(1, 9))], 1.0, "coupled", 2)
    assert len(table) == 1 and len(table[0]) == bench.PROBE[0]
    assert "never verified; the table stops at depth 0" in capsys.readouterr().out


def test_node_bounds_rejection_sampling_is_unbiased():
    """benchmarks/node_bounds.py's Monte Carlo of one node of k children against the node's exact acceptance
    (tests/support/tree_laws.py's iteration_law, enumerated), with and without replacement: 40,000 draws of one node,
    within 5 standard errors (a correct estimator fails by chance with probability below 1e-6; fixed seed)."""
    import torch
    import node_bounds
    from support.tree_laws import iteration_law, standardized, tables

    target, draft = tables(seed=5)
    p_table, q_table = standardized(target, (1.0, 0, 1.0)), standardized(draft, (1.0, 0, 1.0))
    generator = torch.Generator().manual_seed(3)
    for k in (1, 2, 3):
        for replacement, siblings in ((True, "with_replacement"), (False, "without_replacement")):
            law = iteration_law(p_table, q_table, 2, [k], siblings)
            exact = sum(prob for seq, prob in law.items() if len(seq) == 2)
            shares = node_bounds.rejection_sampling(p_table[2].expand(40000, -1), q_table[2].expand(40000, -1), k,
                                                    replacement, generator)
            assert shares.shape == (40000, k)
            draws = shares.sum(1)
            assert abs(float(draws.mean()) - exact) < 5 * float(draws.std()) / 200, (k, siblings)


def test_node_bounds_coupled_is_the_enumerated_rule():
    """node_bounds.coupled's closed form against tests/support/tree_laws.py's enumeration of siblings="coupled" at every
    node of a table, k = 1 .. 4: its shares sum to the node's exact acceptance, the first is sum min(p, q) (the
    first child keeps Algorithm 1's chance), and k = 1 is that alone."""
    import node_bounds
    import torch
    from support.tree_laws import VOCAB, iteration_law, standardized, tables

    target, draft = tables(seed=5)
    p_table, q_table = standardized(target, (1.0, 0, 1.0)), standardized(draft, (1.0, 0, 1.0))
    for k in (1, 2, 3, 4):
        shares = node_bounds.coupled(p_table, q_table, k)
        assert shares.shape == (VOCAB, k)
        for root in range(VOCAB):
            law = iteration_law(p_table, q_table, root, [k], "coupled")
            exact = sum(prob for seq, prob in law.items() if len(seq) == 2)
            assert float(shares[root].sum()) == pytest.approx(exact, abs=1e-12), (k, root)
            beta = float(torch.minimum(p_table[root], q_table[root]).sum())
            assert float(shares[root, 0]) == pytest.approx(beta, abs=1e-12)


def test_node_bounds_sibling_draft_is_the_enumerated_rule():
    """node_bounds.sibling_draft (--sibling): the coupled shares with the later children from a sibling table sum to
    the node's exact acceptance under tests/support/tree_laws.py's enumeration of that rule (k = 2, 3 and 8), the second
    child's share with independent coins is the enumerated with-replacement one, and s = q gives the draft's rows."""
    import node_bounds
    import torch
    from support.tree_laws import VOCAB, iteration_law, sibling_table, standardized, tables

    config = (1.0, 0, 1.0)
    target, draft = tables(seed=5, masked=False)
    p, q, s = standardized(target, config), standardized(draft, config), standardized(sibling_table(5), config)
    for k in (2, 3):
        shares = node_bounds.coupled(p, q, k, s)
        for root in range(VOCAB):
            law = iteration_law(p, q, root, [k], "coupled", s)
            assert float(shares[root].sum()) == pytest.approx(sum(v for seq, v in law.items() if len(seq) == 2),
                                                              abs=1e-12)
    out = node_bounds.sibling_draft(p, q, s, budget=6)
    same = node_bounds.sibling_draft(p, q, q, budget=6)
    assert same["sibling"] == same["draft"] and out["draft"] == same["draft"]
    second = []
    for root in range(VOCAB):
        beta = float(torch.minimum(p[root], q[root]).sum())
        law = iteration_law(p, q, root, [2], "with_replacement", s)
        second.append(sum(v for seq, v in law.items() if len(seq) == 2) - beta)
    assert out["sibling"]["second_with_replacement"][0] == pytest.approx(sum(second) / VOCAB, abs=1e-12)
    assert out["sibling"]["coupled_ranks"][0] == pytest.approx(out["draft"]["coupled_ranks"][0], abs=1e-12)
    assert out["chain"] <= out["draft"]["expected_tokens"] + 1e-12 <= out["iid_ceiling"] + 2e-12


def test_node_bounds_coupled_with_siblings_of_another_law_is_exact():
    """node_bounds.coupled with the second child drawn from another law s (tempered_siblings): a simulation of the
    rule (400,000 draws of both children and the coins; the second child verified against its law given the first's
    rejection, and a rejection of both resolved from the residual) outputs p exactly, and accepts each child as
    often as the closed form says. Chi-square of the output at significance 1e-3 and the shares within 4.5
    standard errors, fixed seed."""
    import node_bounds
    import torch
    from support.chisquare import chi_square_pvalue

    generator = torch.Generator().manual_seed(3)
    p, q, s = (torch.softmax(2 * torch.randn(1, 6, generator=generator, dtype=torch.float64), -1) for _ in range(3))
    shares = node_bounds.coupled(p, q, 2, siblings=s)[0]
    n = 400_000
    x = torch.multinomial(q[0], n, replacement=True, generator=generator)
    y = torch.multinomial(s[0], n, replacement=True, generator=generator)
    in_h = p[0] > q[0]
    w = s[0][in_h].sum()
    r = p[0][x] / q[0][x]
    coin = torch.where(in_h[y], ((r - 1 + w) / w).clamp(0, 1), (r / (1 - w)).clamp(max=1))
    first = torch.rand(n, generator=generator, dtype=torch.float64) < coin
    # what the first child's rejection leaves: p_2, and the second child's law given that rejection
    p2 = (p[0] - q[0]).clamp(min=0)
    p2 = p2 / p2.sum()
    keep_in = (q[0] * (1 - ((p[0] / q[0] - 1 + w) / w).clamp(0, 1))).sum()
    keep_out = (q[0] * (1 - (p[0] / q[0] / (1 - w)).clamp(max=1))).sum()
    s2 = s[0] * torch.where(in_h, keep_in, keep_out)
    s2 = s2 / s2.sum()
    second = ~first & (torch.rand(n, generator=generator, dtype=torch.float64) < (p2[y] / s2[y]).clamp(max=1))
    residual = (p2 - s2).clamp(min=0)
    rest = torch.multinomial(residual / residual.sum(), n, replacement=True, generator=generator)
    out = torch.where(first, x, torch.where(second, y, rest))
    assert chi_square_pvalue(p[0], out.numpy()[:, None]) > 1e-3
    for got, want in ((first.double().mean(), shares[0]), (second.double().mean(), shares[1])):
        assert abs(float(got - want)) < 4.5 * (float(want) * (1 - float(want)) / n) ** 0.5


def test_node_bounds_lookahead_three_is_exact():
    """node_bounds.lookahead_three: without the lookahead it is the coupled rule's closed form; with it, a
    simulation of the rule from the laws it returns (400,000 draws of three children and every coin, rejections of
    all three resolved from the last residual) outputs p (chi-square at significance 1e-3) and accepts each child
    as often as its shares say (within 4.5 standard errors). Fixed seed."""
    import node_bounds
    import torch
    from support.chisquare import chi_square_pvalue

    generator = torch.Generator().manual_seed(4)
    p, q = (torch.softmax(2 * torch.randn(1, 6, generator=generator, dtype=torch.float64), -1) for _ in range(2))
    assert torch.allclose(node_bounds.lookahead_three(p, q, lookahead=False)["shares"], node_bounds.coupled(p, q, 3))
    law = node_bounds.lookahead_three(p, q)
    n = 400_000
    x1, x2, x3 = (torch.multinomial(q[0], n, replacement=True, generator=generator) for _ in range(3))
    h1, h2, w_a, w2 = law["h1"][0], law["h2"][0], law["w_a"][0, 0], law["w2"][0]
    p2, q2, p3, q3 = law["p2"][0], law["q2"][0], law["p3"][0], law["q3"][0]

    def coin(ratio, w, hit):
        return torch.where(hit, ((ratio - 1 + w) / w).clamp(0, 1), (ratio / (1 - w)).clamp(max=1))

    def flip(prob):
        return torch.rand(n, generator=generator, dtype=torch.float64) < prob

    first = flip(coin(p[0][x1] / q[0][x1], w_a, h1[x2] | h1[x3]))
    second = ~first & flip(coin(p2[x2] / q2[x2], w2[x2], h2[x3]))
    third = ~first & ~second & flip((p3[x3] / q3[x3]).clamp(max=1))
    rest = (p3 - q3).clamp(min=0)
    drawn = torch.multinomial(rest / rest.sum(), n, replacement=True, generator=generator)
    out = torch.where(first, x1, torch.where(second, x2, torch.where(third, x3, drawn)))
    assert chi_square_pvalue(p[0], out.numpy()[:, None]) > 1e-3
    for got, want in zip((first, second, third), law["shares"][0]):
        assert abs(float(got.double().mean() - want)) < 4.5 * (float(want) * (1 - float(want)) / n) ** 0.5


def test_node_bounds_mixed_tree_is_the_best_per_node_choice():
    """mixed_tree against brute force: every tree of at most 5 drafts (breadth-first parents), every choice of
    rule per internal node (coupled: rank j accepted with ranks[j]; selection with k children: each accepted with
    selection[k - 1] / k), the expected tokens 1 + sum over nodes of the product of acceptances on its path."""
    import itertools
    import node_bounds

    def trees(n):
        def grow(parents):
            yield parents
            if len(parents) <= n:
                for parent in range(parents[-1] if len(parents) > 1 else 0, len(parents)):
                    yield from grow(parents + [parent])
        yield from grow([-1])

    for ranks, selection in (((0.6, 0.15, 0.04), (0.6, 0.78, 0.8)), ((0.5, 0.3, 0.1), (0.5, 0.9, 0.97))):
        best = 0.0
        for parents in trees(5):
            children = {v: [i for i, p in enumerate(parents) if p == v] for v in range(len(parents))}
            internal = [v for v in children if children[v]]
            if any(len(children[v]) > len(ranks) for v in internal):
                continue
            for rules in itertools.product(("coupled", "selection"), repeat=len(internal)):
                rule = dict(zip(internal, rules))
                reach = {0: 1.0}
                for node in range(1, len(parents)):
                    parent = parents[node]
                    kids = children[parent]
                    share = (ranks[kids.index(node)] if rule[parent] == "coupled"
                             else selection[len(kids) - 1] / len(kids))
                    reach[node] = reach[parent] * share
                best = max(best, sum(reach.values()))
        assert node_bounds.mixed_tree(ranks, selection, 5) == pytest.approx(best)
    # the second pair's selection rule keeps far more per node than its coupled rule: it is chosen somewhere
    assert node_bounds.mixed_tree((0.5, 0.3, 0.1), (0.5, 0.9, 0.97), 5) > node_bounds.mixed_tree(
        (0.5, 0.3, 0.1), (0.5, 0.5, 0.5), 5)


def test_node_bounds_positional_model():
    """positional(): chains at the rank-0 share, Sequoia's tree at the per-rank shares, the ceiling at the bound's
    increments, and the selection rule's best regular shape against every shape of at most 6 drafts enumerated
    (a node may draw fewer children than the rule's best, so its acceptance with k children is the best with at
    most k)."""
    import itertools
    import node_bounds

    rows = [{"k": 1, "ratio_selection": 0.6, "without_ranks": [0.6], "coupled_ranks": [0.6], "bound": 0.6},
            {"k": 2, "ratio_selection": 0.78, "without_ranks": [0.6, 0.1], "coupled_ranks": [0.6, 0.15],
             "bound": 0.8},
            {"k": 3, "ratio_selection": 0.75, "without_ranks": [0.6, 0.1, 0.05], "coupled_ranks": [0.6, 0.15, 0.04],
             "bound": 0.9}]
    model = node_bounds.positional(rows, budget=6)
    assert model["chains"][1] == pytest.approx(1.6) and model["chains"][2] == pytest.approx(1.96)
    for key, ranks in (("rejection_sampling_tree", [0.6, 0.1, 0.05]), ("coupled_tree", [0.6, 0.15, 0.04])):
        best = analysis.best_tree(6, [ranks] * 6)
        assert model[key]["expected_tokens"] == pytest.approx(float(best.expected_tokens))
        assert model[key]["tree"] == best.tree
    assert model["coupled_tree"]["expected_tokens"] > model["rejection_sampling_tree"]["expected_tokens"]
    assert model["coupled_or_selection_per_node"] == pytest.approx(node_bounds.mixed_tree((0.6, 0.15, 0.04),
                                                                                          (0.6, 0.78, 0.75), 6))
    # the ceiling: Sequoia's tree at the bound's increments, above every rule's tree
    ceiling = analysis.best_tree(6, [[0.6, 0.2, 0.1]] * 6)
    assert model["ceiling"]["expected_tokens"] == pytest.approx(float(ceiling.expected_tokens))
    assert model["ceiling"]["tree"] == ceiling.tree
    assert model["ceiling"]["expected_tokens"] > model["coupled_or_selection_per_node"]
    assert model["ceiling"]["expected_tokens"] > model["coupled_tree"]["expected_tokens"]
    best = {1: 0.6, 2: 0.78, 3: 0.78}

    def tokens(shape):
        total, reach = 1.0, 1.0
        for k in shape:
            reach *= best[k]
            total += reach
        return total

    shapes = [list(s) for d in range(1, 7) for s in itertools.product((1, 2, 3), repeat=d)
              if sum(int(np.prod(s[:i + 1])) for i in range(d)) <= 6]
    want = max(tokens(shape) for shape in shapes)
    assert model["selection_shape"]["expected_tokens"] == pytest.approx(want)
    assert tokens(model["selection_shape"]["tree"]) == pytest.approx(want)
    assert 3 not in model["selection_shape"]["tree"]  # three children keep no more than two: fewer drafts


def test_node_bounds_ratio_selection_is_the_law_of_the_kept_child():
    """ratio_selection's closed form against the enumeration of every k-tuple of i.i.d. children (k = 1, 2, 3):
    the kept child's law, and the acceptance of verifying it by speculative sampling; never above the bound."""
    import itertools
    import torch
    import node_bounds
    from speculant import analysis
    from support.tree_laws import VOCAB, standardized, tables

    target, draft = tables(seed=2)
    p_table, q_table = standardized(target, (1.0, 0, 1.0)), standardized(draft, (1.0, 0, 1.0))
    p, q = p_table[1], q_table[1]
    order = (p / q).argsort().tolist()
    rank = {x: order.index(x) for x in range(VOCAB)}
    for k in (1, 2, 3):
        kept = torch.zeros(VOCAB, dtype=torch.float64)
        for children in itertools.product(range(VOCAB), repeat=k):
            kept[max(children, key=lambda x: rank[x])] += float(torch.prod(q[list(children)]))
        got = float(node_bounds.ratio_selection(p[None], q[None], k)[0])
        assert got == pytest.approx(float(torch.minimum(p, kept).sum()), abs=1e-12)
        assert got <= float(analysis.multi_draft_bound(p, q, k)) + 1e-12
