"""Distribution checks for your own target / draft pair, to call from your own test suite.

Speculative sampling keeps the output distributed exactly as the target's alone (§2.3, Appendix A.1), whatever
the draft. ``check_distribution`` tests that claim on your models and settings: it samples many speculative
generations through the engine and compares the law of their first k tokens with the target's own law, computed
exactly by running the target alone on every likely prefix and standardizing its logits with the same settings
(``speculant.sampling.standardize``, the engine's own function).

    from speculant.testing import assert_distribution

    def test_my_pair_is_exact():
        assert_distribution("target.pt", "draft.pt", prompt_ids, k=2, gamma=4, temperature=0.8, top_p=0.9)

The test: Pearson's chi-square goodness of fit over a partition of the k-token sequences. A prefix whose
probability is at least 5 / samples is expanded (one target call); a complete sequence that likely gets its own
cell, and the unlikely continuations of each expanded prefix are grouped, in order of probability, into bins
"prefix + (*, b)" each expected at least 5 times; cells still expected fewer than 5 times are grouped the same
way into ("pooled", i) bins. Bins rather than one pool keep the test's power when a law is spread thin over a
large vocabulary. So at most k * samples / 5 target calls are made, and a large vocabulary costs no more than a
small one. A sample that takes a token the target gives probability 0 after an
expanded prefix (outside top-k or top-p, a masked token) fails the check outright (p-value 0).

The report names each cell by its tokens (``NOTATION``, which it states): ``[5, 2]`` is token 5 then token 2,
``[5, *] * in {7, 9, ... 3 more}`` is 5 then a token of that bin, and a pooled cell lists the cells it joins; with
a tokenizer each sequence's text follows its ids.

Under a correct engine and exact reference logits the check fails with probability ``significance`` (the
false-failure rate; with a fixed seed the outcome is deterministic). Its power grows with ``samples``. The
reference logits come from a full forward pass while the engine uses the model's cache; a token sitting exactly
on a top-k / top-p boundary could fall on either side of it in the two (floating-point summation order).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import _core
from ..decoding import sampling
from ..decoding.sampling import SamplingSettings, overridden
from ..arguments import integer
from ..decoding.decoder import SpeculativeDecoder, bound_target
from ..decoding.drafters import Drafter
from ..models.model import Model, load
from ..models.sequence_logits import SequenceLogits, sequence_logits  # both public here too, as before
from ..decoding.trace import decoded_piece, decode_function

MIN_EXPECTED = 5.0  # Pearson's rule of thumb: cells expected fewer times than this are pooled
Logits = Callable[[List[int]], torch.Tensor]  # token ids -> next-token logits [V]
ModelLike = Union[Model, str, os.PathLike, torch.jit.ScriptModule, torch.nn.Module]  # what speculant.load takes
Cell = Tuple[Any, ...]  # token ids; a trailing ("*", b): bin b of the continuations not given their own cell;
# ("pooled", i): pooled cell i (DistributionCheck.pooled[i] says which)


@dataclass(frozen=True)
class DistributionCheck:
    """The outcome of ``check_distribution``.

    statistic: Pearson's chi-square; dof: its degrees of freedom (cells - 1); p_value: its upper tail (0 when a
    sample was impossible); passed: p_value >= significance; impossible: samples with a token of target
    probability 0; cells: (cell, observed, expected) rows the statistic sums over, most expected first (a cell is
    k token ids, or prefix ids + ("*", b): bin b of that prefix's unlikely continuations, or ("pooled", i));
    bins: (bin cell, its tokens most likely first) for every bin, pooled or not; pooled: the cells pooled into
    ("pooled", i), at index i, most expected first; report: all of it, readable (also ``str(check)``), the cells
    written as in ``NOTATION``. test: "chi-square" (the law is the target's), or with lenience < 1 "lenience
    bound" (statistic: the largest observed / bound ratio, dof: the cells tested, p_value: Bonferroni's) or
    "argmax rule" at temperature 0 (statistic: the samples breaking it).
    """

    statistic: float
    dof: int
    p_value: float
    significance: float
    samples: int
    impossible: int
    cells: Tuple[Tuple[Cell, int, float], ...]
    report: str
    test: str = "chi-square"
    bins: Tuple[Tuple[Cell, Tuple[int, ...]], ...] = ()
    pooled: Tuple[Tuple[Cell, ...], ...] = ()

    @property
    def passed(self) -> bool:
        return self.p_value >= self.significance

    def __str__(self) -> str:
        return self.report


@contextlib.contextmanager
def tensor_path() -> Iterator[None]:
    """Within the block, CPU tensors run the sampling and verification code that accelerators run (tensor
    operations with one device-to-host read per verification) instead of the CPU's host kernels: the GPU's loop,
    all of it but the CUDA graphs, checked on a machine without one. The laws are the same; the draws differ. The
    setting is process-wide: decoders running in other threads meanwhile take the same path."""
    previous = _core.set_host_kernels(False)
    try:
        yield
    finally:
        _core.set_host_kernels(previous)


def _engine_model(model: ModelLike):
    """A loaded Model; drafters (speculant.drafters) pass as they are."""
    return model if isinstance(model, (Model, Drafter)) else load(model)


def _module_logits(model: ModelLike, name: str, encoder_input_ids=None) -> Logits:
    """Next-token logits [V] after a sequence, from ``sequence_logits``."""
    logits = sequence_logits(model, name, encoder_input_ids)
    return lambda ids: logits(ids)[-1]


def _partition(logits: Logits, prompt: List[int], k: int, threshold: float, settings: sampling.SamplingSettings):
    """The target's law of the next k tokens on the partition described in the module docstring.

    Returns (cells: {cell: probability}, expanded: {prefix: (standardized probs [V] as float64 numpy, bin of
    each token not given its own cell or expansion [V], -1 for the others)}).
    """
    cells: Dict[Cell, float] = {}
    expanded: Dict[Tuple[int, ...], Tuple[np.ndarray, np.ndarray]] = {}
    stack: List[Tuple[Tuple[int, ...], float]] = [((), 1.0)]
    while stack:
        prefix, mass = stack.pop()
        row = torch.as_tensor(logits(prompt + list(prefix)))
        if row.dim() != 1:
            raise ValueError(f"target_logits must return next-token logits of shape [V], got {list(row.shape)}")
        probs = sampling.standardize(row[None], *settings.standardization())[0].double().cpu().numpy()  # [V]
        probs = probs / probs.sum()
        children = mass * probs  # [V]
        kept = children >= threshold  # [V]
        bins = np.full(len(probs), -1, dtype=np.int64)  # [V]
        rest = np.nonzero(~kept & (children > 0))[0]
        rest = rest[np.argsort(-children[rest], kind="stable")]  # most likely first
        bin_of, filled = 0, 0.0
        for token in rest.tolist():
            bins[token] = bin_of
            filled += children[token]
            if filled >= threshold:
                cells[prefix + ("*", bin_of)] = filled
                bin_of, filled = bin_of + 1, 0.0
        if filled > 0:  # the remainder joins the last bin, or is a bin of its own when it is the only one
            last = max(bin_of - 1, 0)
            bins[bins == bin_of] = last
            cells[prefix + ("*", last)] = cells.get(prefix + ("*", last), 0.0) + filled
        expanded[prefix] = (probs, bins)
        for token in np.nonzero(kept)[0].tolist():
            child = prefix + (token,)
            if len(child) == k:
                cells[child] = float(children[token])
            else:
                stack.append((child, float(children[token])))
    return cells, expanded


def _cell_of(sample: Sequence[int], law: Dict[Cell, float], expanded: Dict[Tuple[int, ...], np.ndarray],
             k: int) -> Optional[Cell]:
    """The cell a sample of k tokens falls in, or None when it took a token of target probability 0."""
    for j in range(k):
        prefix = tuple(sample[:j])
        (probs, bins), token = expanded[prefix], sample[j]
        if not 0 <= token < len(probs) or probs[token] == 0:
            return None
        child = prefix + (token,)
        if child not in (expanded if j + 1 < k else law):  # not likely enough for its own cell or expansion
            return prefix + ("*", int(bins[token]))
    return tuple(sample)


def pool_cells(expected: np.ndarray, observed: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Groups the cells expected fewer than MIN_EXPECTED times, in order of expected count, into consecutive
    bins expected at least MIN_EXPECTED times (a remainder joins the last bin, or the smallest large cell when
    there is no bin); cells expected at least MIN_EXPECTED times stay as they are. The grouping depends on the
    expected counts only, so Pearson's statistic over the result is a valid goodness-of-fit test.

    Returns (expected, observed, group): the pooled cells' counts and, for each original cell, the index of
    the pooled cell it went to."""
    expected, observed = np.asarray(expected, dtype=np.float64), np.asarray(observed, dtype=np.float64)
    group = np.empty(len(expected), dtype=np.int64)
    large = np.nonzero(expected >= MIN_EXPECTED)[0]
    small = np.nonzero(expected < MIN_EXPECTED)[0]
    small = small[np.argsort(expected[small], kind="stable")]
    group[large] = np.arange(len(large))
    count, filled, open_members = len(large), 0.0, []
    for index in small.tolist():
        group[index] = count
        open_members.append(index)
        filled += expected[index]
        if filled >= MIN_EXPECTED:
            count, filled, open_members = count + 1, 0.0, []
    if open_members:  # an incomplete last bin: into the previous bin, else the smallest large cell
        if count > len(large):
            group[open_members] = count - 1
        elif len(large):
            group[open_members] = int(np.argmin(expected[large]))  # large cell i is group i
        else:
            count += 1  # nothing else: the incomplete bin is the only cell
    cells = int(group.max()) + 1 if len(group) else 0
    return (np.bincount(group, weights=expected, minlength=cells), np.bincount(group, weights=observed,
                                                                                minlength=cells), group)


def _pooled(rows: List[Tuple[Cell, int, float]]) -> Tuple[List[Tuple[Cell, int, float]], List[Tuple[Cell, ...]]]:
    """pool_cells over (cell, observed, expected) rows: the pooled rows, most expected first, where a cell that is
    kept keeps its name and the others become ("pooled", i); and the cells ("pooled", i) holds, at index i, most
    expected first."""
    expected, observed, group = pool_cells([row[2] for row in rows], [row[1] for row in rows])
    members: Dict[int, List[Tuple[Cell, float]]] = {}
    for row, g in zip(rows, group.tolist()):
        members.setdefault(g, []).append((row[0], row[2]))
    out, pooled = [], []
    for g in sorted(members, key=lambda g: -expected[g]):
        if len(members[g]) == 1:
            name = members[g][0][0]
        else:
            name = ("pooled", len(pooled))
            pooled.append(tuple(cell for cell, _ in sorted(members[g], key=lambda member: -member[1])))
        out.append((name, int(round(observed[g])), float(expected[g])))
    return out, pooled


def _bin_tokens(law: Dict[Cell, float], expanded: Dict[Tuple[int, ...], Tuple[np.ndarray, np.ndarray]]
                ) -> Dict[Cell, Tuple[int, ...]]:
    """The tokens each bin cell prefix + ("*", b) of the partition groups, most likely first."""
    out = {}
    for cell in law:
        if _is_bin(cell):
            probs, bins = expanded[cell[:-2]]
            tokens = np.nonzero(bins == cell[-1])[0]
            out[cell] = tuple(tokens[np.argsort(-probs[tokens], kind="stable")].tolist())
    return out


def check_distribution(target: ModelLike, draft: ModelLike, prompt_ids=None, *, k: int = 2, gamma: int = 4,
                       temperature: Optional[float] = None, top_k: Optional[int] = None,
                       top_p: Optional[float] = None, lenience: Optional[float] = None,
                       samples: int = 2000, significance: float = 1e-3, seed: int = 0,
                       target_logits: Optional[Logits] = None, generate_kwargs: Optional[Mapping[str, Any]] = None,
                       tokenizer=None, progress: bool = True,
                       sampling: Optional[SamplingSettings] = None,
                       verification: str = "token") -> DistributionCheck:
    """Tests at level ``significance`` that the first ``k`` tokens speculative decoding generates after
    ``prompt_ids`` follow the target's own law (see the module docstring for the test).

    target, draft: anything ``speculant.load`` takes (TorchScript files, .pt2 packages, transformers model
    objects, save_pretrained directories, ScriptModules) or the ``speculant.Model`` it returned; a path or
    transformers model is loaded once, for the engine and for the reference. draft may also be a drafter
    (speculant.drafters, speculant.cross_tokenizer).
    Generation i uses seed ``seed + i`` and runs to max(k, gamma + 1) tokens, so the first iteration drafts the
    full gamma. ``generate_kwargs`` go to every generation: an encoder-decoder pair takes its source as
    ``encoder_input_ids`` there, and ``prompt_ids`` then defaults to the target's ``decoder_start_token_id``.

    The settings: temperature (default 1.0), top_k (0), top_p (1.0) and lenience (1.0), or ``sampling``, the four
    as one speculant.SamplingSettings, whose fields those keywords override where given (SpeculativeDecoder's
    rule). ``verification``: SpeculativeDecoder's, "token" (the default) or "block".

    The target's law comes from ``target_logits(ids) -> logits [V]`` (the next-token logits after the token ids
    ``ids``, prompt included) when given, which models whose logits need more than the ids require; otherwise
    from the target itself over the whole sequence: its TorchScript module (``prefill`` if it has one, else
    ``forward``), a second copy of its .pt2 package called at position 0, or its transformers forward without a
    cache; an encoder-decoder's source is encoded first. A Model loaded from an in-memory ScriptModule needs
    ``target_logits`` (or the ScriptModule itself). The logits are standardized with the same temperature,
    top_k and top_p.

    ``lenience`` l < 1 changes the output law on purpose (Appendix A.5), so the check then tests what lenience
    promises instead of equality: no token is drawn with probability above p(x) / l given its prefix, so no
    k-token cell above its target probability / l^k (one-sided binomial tests, one per cell, Bonferroni over the
    cells); the chi-square against the target's law is reported beside it, as how far the law moved. At
    temperature 0 the promise is A.5's argmax rule: every token drawn has p(x) >= l max p given its prefix, p the
    target's softmax of its raw logits.

    ``tokenizer`` (anything ``Trace.with_tokenizer`` takes: a transformers tokenizer, an object with ``decode``, a
    callable ids -> str) adds each cell's text to the report, decoded after the prompt. ``progress`` shows a
    progress bar of the generations (done, left, time left).
    """
    decode = decode_function(tokenizer)
    k = integer(k, "k", 1)
    samples = integer(samples, "samples", 1)
    seed = integer(seed, "seed", 0)
    if isinstance(significance, bool) or not isinstance(significance, numbers.Real) or not 0 < significance < 1:
        raise ValueError(f"significance must be in (0, 1), got {significance!r}")
    reserved = sorted({"prompt_ids", "max_new_tokens", "seed", "eos_token_id"}.intersection(generate_kwargs or {}))
    if reserved:
        raise ValueError(f"generate_kwargs must not set {reserved}: check_distribution sets them (no EOS: every "
                         "sample has k tokens)")
    generate_kwargs = dict(generate_kwargs or {})
    settings = overridden(sampling, temperature=temperature, top_k=top_k, top_p=top_p, lenience=lenience)
    engine_target = _engine_model(bound_target(target, draft))  # a bound draft's own target handle
    decoder = SpeculativeDecoder(engine_target, _engine_model(draft), gamma=gamma, sampling=settings,
                                 verification=verification)
    logits = target_logits if target_logits is not None else \
        _module_logits(target if isinstance(target, torch.jit.ScriptModule) else engine_target, "target",
                       generate_kwargs.get("encoder_input_ids"))
    # Sampling before enumerating: the engine checks the prompt and the arguments and says what is wrong.
    max_new_tokens = max(k, int(gamma) + 1)  # gamma was checked by SpeculativeDecoder
    with tqdm(total=samples, desc="speculant check_distribution: generations", unit="gen",
              disable=not progress) as bar:
        drawn = []
        for i in range(samples):
            drawn.append(decoder.generate(prompt_ids, max_new_tokens=max_new_tokens, seed=seed + i,
                                          **generate_kwargs).tokens[:k])
            bar.update()
    prompt = [engine_target.decoder_start_token_id] if prompt_ids is None else \
        torch.as_tensor(prompt_ids).reshape(-1).tolist()
    settings = decoder.sampling
    settings_text = f"gamma={gamma}, " + ", ".join(f"{name}={value}" for name, value in settings.as_dict().items())
    lenience = settings.lenience
    if lenience < 1.0 and settings.temperature == 0.0:
        return _argmax_rule(logits, prompt, drawn, lenience, significance, samples, k, seed, settings_text,
                            _Labels(decode, prompt))
    law, expanded = _partition(logits, prompt, k, MIN_EXPECTED / samples, settings)

    observed: Dict[Cell, int] = dict.fromkeys(law, 0)
    impossible: Dict[Tuple[int, ...], int] = {}
    for tokens in drawn:
        cell = _cell_of(tokens, law, expanded, k)
        if cell is None:
            impossible[tuple(tokens)] = impossible.get(tuple(tokens), 0) + 1
        else:
            observed[cell] += 1

    rows, pooled = _pooled([(cell, observed[cell], law[cell] * samples) for cell in law])
    bins = _bin_tokens(law, expanded)
    label = _Labels(decode, prompt, bins, pooled)
    statistic = float(sum((o - e) ** 2 / e for _, o, e in rows))
    dof = len(rows) - 1
    if impossible:
        p_value = 0.0
    elif dof == 0:
        p_value = 1.0
    else:  # chi-square upper tail: Q(dof / 2, statistic / 2)
        p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                                torch.tensor(statistic / 2, dtype=torch.float64)))
    report = _report(statistic, dof, p_value, significance, samples, k, len(prompt), seed, settings_text, rows,
                     impossible, len(expanded), label)
    test = "chi-square"
    if lenience < 1.0:  # the law moved on purpose: the verdict is the bound's, the chi-square says by how much
        test = "lenience bound"
        bound_p, worst = _bound_test(rows, samples, lenience ** k) if not impossible else (0.0, None)
        report = _bound_report(report, bound_p, worst, significance, lenience, k, len(rows), label)
        statistic, dof, p_value = (worst[1] / worst[2] if worst else float("inf")), len(rows), bound_p
    return DistributionCheck(statistic=statistic, dof=dof, p_value=p_value, significance=float(significance),
                             samples=samples, impossible=sum(impossible.values()), cells=tuple(rows),
                             report=report, test=test, bins=tuple(bins.items()), pooled=tuple(pooled))


def _upper_tail(observed: int, n: int, probability: float) -> float:
    """P(X >= observed) for X ~ Binomial(n, probability), summed exactly in log space."""
    if observed <= 0:
        return 1.0
    if probability >= 1.0:
        return 1.0
    if probability <= 0.0:
        return 0.0
    log_p, log_q = math.log(probability), math.log1p(-probability)
    terms = [math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * log_p + (n - j) * log_q
             for j in range(observed, n + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def _bound_test(rows: List[Tuple[Cell, int, float]], samples: int, scale: float):
    """(Bonferroni p-value, the row with the smallest tail) of the one-sided tests "the cell's probability is at
    most its target probability / scale" (scale = l^k)."""
    tails = [(_upper_tail(o, samples, min(1.0, e / samples / scale)), (cell, o, min(samples, e / scale)))
             for cell, o, e in rows]
    smallest, worst = min(tails, key=lambda t: t[0])
    return min(1.0, smallest * len(rows)), worst


def _bound_report(chi_square_report: str, p_value: float, worst, significance: float, lenience: float, k: int,
                  cells: int, label: "_Labels") -> str:
    verdict = "passed" if p_value >= significance else "FAILED"
    lines = [f"speculant lenience check {verdict} at significance {significance:g}",
             f"  lenience {lenience:g} < 1 changes the output law by design (Appendix A.5): what it promises is "
             f"that no token is drawn with probability above p(x) / l given its prefix, so no cell of {k} "
             f"token(s) above its target probability / l^{k} = x{lenience ** -k:.4g}",
             f"  one-sided binomial tests of that bound on {cells} cells, Bonferroni p-value = {p_value:.4g}"]
    if worst is not None:
        cell, observed, bound = worst
        lines.append(f"  closest to the bound: {label(cell)}, observed {observed} times, at most {bound:.1f} "
                     "expected")
    lines.append("  how far the law moved from the target's (information, not the verdict):")
    lines += ["  " + line for line in chi_square_report.splitlines()[1:]]
    return "\n".join(lines)


def _argmax_rule(logits: Logits, prompt: List[int], drawn: List[List[int]], lenience: float, significance: float,
                 samples: int, k: int, seed: int, settings_text: str, label: "_Labels") -> DistributionCheck:
    """Temperature 0 with lenience l < 1 (A.5): every token drawn must have p(x) >= l max p given its prefix, p
    the softmax of the target's raw logits. Deterministic: passes (p-value 1) or fails (0)."""
    counts: Dict[Tuple[int, ...], int] = {}
    for tokens in drawn:
        counts[tuple(tokens)] = counts.get(tuple(tokens), 0) + 1
    broken: Dict[Tuple[int, ...], int] = {}
    for tokens, count in counts.items():
        for i, token in enumerate(tokens):
            raw = torch.as_tensor(logits(prompt + list(tokens[:i]))).double().softmax(-1)  # [V]
            if raw[token] < lenience * raw.max() * (1 - 1e-9):
                broken[tokens] = count
                break
    p_value = 0.0 if broken else 1.0
    verdict = "passed" if p_value >= significance else "FAILED"
    lines = [f"speculant lenience check {verdict} (the argmax rule)",
             f"  speculative decoding ({settings_text}): the first {k} token(s) of {samples} generations "
             f"(seeds {seed}..{seed + samples - 1}); lenience {lenience:g} < 1 at temperature 0 changes the output "
             "by design (Appendix A.5): every token drawn must have p(x) >= l max p given its prefix",
             f"  {len(counts)} distinct sequence(s), {sum(broken.values())} sample(s) breaking the rule"]
    lines += [f"    {label(tokens)} x{count}" for tokens, count in sorted(broken.items())[:8]]
    cells = tuple((tokens, count, float(count)) for tokens, count in sorted(counts.items()))
    return DistributionCheck(statistic=float(sum(broken.values())), dof=0, p_value=p_value,
                             significance=float(significance), samples=samples, impossible=sum(broken.values()),
                             cells=cells, report="\n".join(lines), test="argmax rule")


NOTATION = ("[5, 2] is token 5 then token 2; [5, *] * in {7, 9, ... 3 more} is token 5 then token 7, 9 or one of 3 "
            "less likely ones",
            "(a bin of the continuations too unlikely for cells of their own, most likely first); 'pooled' joins "
            f"cells expected fewer than {MIN_EXPECTED:g} times each")


def _is_bin(cell: Cell) -> bool:
    return len(cell) >= 2 and cell[-2] == "*"


class _Labels:
    """Cells written for the report, as NOTATION says: token ids in brackets, each sequence's text beside it (decoded
    after the prompt, as a trace decodes a piece after the text before it) when there is a decode function; a bin's
    tokens and a pooled cell's members listed, the first ``tokens`` / ``members`` of them and a count of the rest."""

    def __init__(self, decode, prompt: List[int], bins: Optional[Dict[Cell, Tuple[int, ...]]] = None,
                 pooled: Sequence[Tuple[Cell, ...]] = (), tokens: int = 4, members: int = 3):
        self.decode, self.prompt, self.bins, self.pooled = decode, list(prompt), bins or {}, pooled
        self.tokens, self.members = tokens, members

    def text(self, context: List[int], ids: List[int]) -> str:
        """The text ``ids`` add after the prompt and ``context``, quoted after a space; "" without a decode
        function."""
        return f" {decoded_piece(self.decode, self.prompt + context, ids)!r}" if self.decode is not None and ids else ""

    def __call__(self, cell: Cell, tokens: Optional[int] = None) -> str:
        tokens = self.tokens if tokens is None else tokens
        if cell[0] == "pooled":
            members = self.pooled[cell[1]]
            listed = "; ".join(self(member, tokens=2) for member in members[:self.members])
            more = f"; ... {len(members) - self.members} more" if len(members) > self.members else ""
            return f"pooled, {len(members)} cells: {listed}{more}"
        if not _is_bin(cell):
            return f"[{', '.join(map(str, cell))}]{self.text([], list(cell))}"
        prefix, members = list(cell[:-2]), self.bins.get(cell, ())
        listed = ", ".join(f"{t}{self.text(prefix, [t])}" for t in members[:tokens])
        more = f", ... {len(members) - tokens} more" if len(members) > tokens else ""
        return f"[{', '.join([*map(str, prefix), '*'])}]{self.text([], prefix)} * in {{{listed}{more}}}"


def _report(statistic, dof, p_value, significance, samples, k, prompt_length, seed, settings, rows, impossible,
            target_calls, label: _Labels, shown: int = 8) -> str:
    verdict = "passed" if p_value >= significance else "FAILED"
    lines = [
        f"speculant distribution check {verdict} at significance {significance:g}",
        f"  speculative decoding ({settings}) against the target alone: the first {k} token(s) of {samples} "
        f"generations after a {prompt_length}-token prompt (seeds {seed}..{seed + samples - 1})",
        f"  Pearson chi-square = {statistic:.4g} on {dof} degrees of freedom, p-value = {p_value:.4g} "
        f"({len(rows)} cells; the target's law from {target_calls} target call(s))",
    ]
    pooled = [len(members) for members in label.pooled]
    if pooled:
        lines.append(f"  {sum(pooled)} cells expected fewer than {MIN_EXPECTED:g} times each are pooled into "
                     f"{len(pooled)}")
    if impossible:
        listed = ", ".join(f"{label(tokens)} x{count}" for tokens, count in sorted(impossible.items())[:shown])
        lines.append(f"  {sum(impossible.values())} sample(s) took a token of target probability 0: {listed}")
    worst = sorted(rows, key=lambda row: -(row[1] - row[2]) ** 2 / row[2])[:shown]
    if worst and dof > 0:
        text = "; text decoded after the prompt" if label.decode is not None else ""
        lines += [f"  cells: {NOTATION[0]}", f"  {NOTATION[1]}{text}"]
        lines.append(f"  largest contributions:\n    {'observed':>8}{'expected':>10}{'(O-E)^2/E':>11}  cell")
        for cell, o, e in worst:
            lines.append(f"    {o:>8}{e:>10.1f}{(o - e) ** 2 / e:>11.2f}  {label(cell)}")
    return "\n".join(lines)


def assert_distribution(target: ModelLike, draft: ModelLike, prompt_ids=None, **kwargs) -> DistributionCheck:
    """``check_distribution``, raising AssertionError with its report when the check fails; returns the check
    when it passes."""
    __tracebackhide__ = True  # pytest shows the caller's line
    check = check_distribution(target, draft, prompt_ids, **kwargs)
    if not check.passed:
        raise AssertionError(check.report)
    return check
