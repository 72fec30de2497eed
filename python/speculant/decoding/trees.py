"""Token tree shapes: what a tree is, checked, and its size, depth and draft calls.

A tree is given in one of two forms (the C++ Tree's, cpp/math/tree.h):
  * a shape [k1, ..., kd] (d >= 1, each k >= 1): every node of depth i - 1 has k_i children; [1] * gamma is
    Algorithm 1's chain of gamma drafts; 1 + k1 + k1 k2 + ... nodes, the root included;
  * breadth-first parents [-1, p1, ..., pN]: node 0 is the root (the last decided token), nodes 1 .. N are the
    drafts, parent[i] < i and parents nondecreasing, so a node's children are contiguous and numbered in the
    order they were drawn: that order is their rank (0: the draft's first sample, or its top token at T = 0).
    [-1] is the root alone (no drafts); an empty list is no tree at all.
The root has depth 0; a tree of depth d has drafts at depths 1 .. d and is verified by one target call of width
N + 1 (the root's row and one per draft).

``SpeculativeDecoder`` takes trees in these forms, and ``speculant.analysis`` prices them. Both import this module.
"""

from __future__ import annotations

import numbers
from fractions import Fraction
from typing import List, NamedTuple, Optional, Sequence, Union

import numpy as np

TreeLike = Union[Sequence[int], np.ndarray]

MAX_TREE_NODES = 1 << 20  # the most drafts a shape may expand to in tree_parents


class TreeChoice(NamedTuple):
    """A tree chosen by best_tree / best_tree_shape and its expected tokens per target call."""
    tree: List[int]  # breadth-first parents (best_tree) or a shape (best_tree_shape)
    expected_tokens: Union[float, Fraction]  # tree_expected_tokens(tree, acceptance)


class TreeSpeedup(NamedTuple):
    """The tree chosen by optimal_tree, its expected tokens per target call and its walltime improvement."""
    tree: List[int]  # breadth-first parents
    expected_tokens: Union[float, Fraction]  # tree_expected_tokens(tree, acceptance)
    speedup: float  # tree_speedup(tree, acceptance, c, verify_cost)


class Tree:
    """A validated tree: its shape when given as one (not expanded), else its parents, depths and ranks."""

    def __init__(self, tree: TreeLike):
        values = tree.tolist() if isinstance(tree, np.ndarray) else tree
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) \
                or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in values):
            raise ValueError(f"tree must be a shape [k1, ..., kd] or breadth-first parents [-1, p1, ..., pN] "
                             f"(integers), got {tree!r}")
        values = [int(v) for v in values]
        if not values:
            raise ValueError("tree is empty: give a shape [k1, ..., kd] (d >= 1, each k >= 1) or breadth-first "
                             "parents [-1, p1, ..., pN] ([-1] is the root alone, no drafts)")
        self.shape: Optional[List[int]] = None
        self.parents: Optional[List[int]] = None
        if values[0] == -1:
            self._parents(values)
        else:
            for i, k in enumerate(values):
                if k < 1:
                    raise ValueError(f"tree[{i}] = {k}: a shape [k1, ..., kd] needs every k >= 1 (parents start "
                                     f"with -1)")
            self.shape = values
            self.depth = len(values)
            self.max_children = list(values)  # per depth 0 .. d - 1
            level, self.size = 1, 0
            for k in values:
                level *= k
                self.size += level

    def _parents(self, parents: List[int]) -> None:
        depth, rank, children = [0], [0], [0] * len(parents)
        for i in range(1, len(parents)):
            up = parents[i]
            if not 0 <= up < i:
                raise ValueError(f"tree node {i} has parent {up}: in breadth-first parents a node's parent is an "
                                 f"earlier node")
            if i > 1 and up < parents[i - 1]:
                raise ValueError(f"tree node {i} has parent {up} after a node with parent {parents[i - 1]}: "
                                 f"breadth-first parents are nondecreasing (siblings contiguous)")
            depth.append(depth[up] + 1)
            rank.append(children[up])
            children[up] += 1
        self.parents, self.node_depth, self.rank = parents, depth, rank
        self.depth, self.size = depth[-1], len(parents) - 1
        self.max_children = [0] * self.depth
        for node, k in enumerate(children):
            if k:
                self.max_children[depth[node]] = max(self.max_children[depth[node]], k)


def tree_parents(tree: TreeLike) -> List[int]:
    """The breadth-first parents [-1, p1, ..., pN] of a tree (cpp/math/tree.h's Tree::from_shape for a shape; parents
    are returned as given, validated). A shape may expand to at most MAX_TREE_NODES drafts."""
    t = Tree(tree)
    if t.parents is not None:
        return list(t.parents)
    if t.size > MAX_TREE_NODES:
        raise ValueError(f"tree: the shape {t.shape} has {t.size} drafts, more than {MAX_TREE_NODES} to list")
    parents, begin, end = [-1], 0, 1  # the nodes of the current depth: begin .. end - 1
    for k in t.shape:
        for node in range(begin, end):
            parents.extend([node] * k)
        begin, end = end, len(parents)
    return parents


def tree_size(tree: TreeLike) -> int:
    """The number of draft nodes N (the root excluded): the target verifies the tree in one call of width N + 1.
    A shape [k1, ..., kd] has k1 + k1 k2 + ... + k1 ... kd; the chain [1] * gamma has gamma."""
    return Tree(tree).size


def tree_depth(tree: TreeLike) -> int:
    """The depth d of the deepest draft (0 for [-1]): d draft calls build the tree, one per depth."""
    return Tree(tree).depth


def tree_draft_calls(tree: TreeLike, sibling: bool = False) -> int:
    """The draft model calls that draft a tree: one per depth, d; with a sibling draft (SpeculativeDecoder's
    sibling_draft=) also the sibling's, one per depth down to the deepest node with two or more children (deeper,
    every child is the draft's: the engine does not run the sibling there)."""
    t = Tree(tree)
    if not sibling:
        return t.depth
    branching = [i for i, k in enumerate(t.max_children) if k >= 2]
    return t.depth + (branching[-1] + 1 if branching else 0)

