"""LF-EM for BREAK: do two QDMRs denote the same logical form? (pure functions, no model).

Our implementation of the published definition (Wolfson et al. 2020, "Break It Down", operator identification;
Hasson & Berant 2021, "Question Decomposition with Dependency Graphs", the structural logical-form matcher that the
EPR paper's LF-EM numbers use):

1. Split the QDMR into steps; identify each step's operator (one of 14: select, filter, project, aggregate, group,
   superlative, comparative, union, intersection, discard, sort, boolean, arithmetic, comparison) with the rule set
   of the Break evaluator, its properties (``max``, ``count``, ``logical_and`` ...) and its typed arguments. A
   reference ``#k`` becomes a typed edge to step k; the rest of an argument is a bag of tokens. This step, with the
   evaluator's lexicon, is ``epr.tasks.qdmr_steps``; the rest is here.
2. Normalise the tokens: lower-case; drop the words that signal the operator or its properties (``for each``,
   ``number of``, ``besides`` ...) and the function words annotators add (``the``, ``of``, ``from``, ``to`` ...);
   split off punctuation; map each word to a representative form.
3. Merge chains: a filter of a filter, a filter of a select and a project of a select collapse into one step, so
   ``flights ; #1 from denver ; #2 to boston`` and ``flights from denver to boston`` agree.
4. Renumber the steps canonically (level by level, ties broken by the step's own key) and compare the whole graph.

One difference from the published matcher, by necessity: it maps words to representatives with spaCy's tagger plus
WordNet and ``inflect`` (question-specific inflection groups), which need downloads we cannot make offline. Here a
word's representative comes from fixed equivalence groups (the evaluator's own, e.g. ``highest/largest/longest``)
and a rule-based suffix normaliser (plural, -ing, -ed). Expect small differences on inflection-heavy steps.
A QDMR whose steps cannot be identified does not match anything (as in the reference, where such cases score 0).
"""

from __future__ import annotations

import re
from functools import lru_cache

from epr.tasks.qdmr_steps import GROUP_OF, Step, UnparsableQDMR, identify, indicator_words, parse_steps

__all__ = ["logical_form", "lf_key", "lf_match", "Step", "UnparsableQDMR"]


# ---------------------------------------------------------------- normalisation

# Function words annotators add to steps (the evaluator's list, plus "be" and "as"; its two-word entries never
# match a single token there, so they are left out here).
_FUNCTION_WORDS = {
    "a", "if", "how", "where", "when", "which", "who", "what", "with", "was", "were", "did", "to", "from", "both",
    "and", "or", "the", "of", "is", "are", "besides", "that", "have", "has", "not", "than", "those", "on", "in",
    "any", "there", "distinct", ",", "be", "as",
}  # fmt: skip


def _representative(word: str) -> str:
    g = GROUP_OF.get(word)
    if g:
        return sorted(x for x in g if " " not in x)[0]
    for suf, rep in (("ies", "y"), ("sses", "ss"), ("ches", "ch"), ("shes", "sh"), ("xes", "x")):
        if word.endswith(suf) and len(word) > len(suf) + 2:
            return word[: -len(suf)] + rep
    if word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) > 3:
        return word[:-1]
    for suf in ("ing", "ed"):
        if word.endswith(suf) and len(word) > len(suf) + 3:
            return word[: -len(suf)]
    return word


def _normalise(step: Step) -> None:
    ind_words = indicator_words(step)
    for k, toks in step.args.items():
        toks = [t.lower() for t in toks]
        toks = [t for t in toks if t not in ind_words]  # the operator's and properties' own words
        toks = [t for t in toks if t not in _FUNCTION_WORDS]
        toks = [w for t in toks for w in re.split(r"\W+", t) if w]
        step.args[k] = [_representative(t) for t in toks]


def _merge(steps: dict[int, Step]) -> None:
    """Collapse filter->filter, filter->select (into a filter) and project->select (into a project) chains."""
    changed = True
    while changed:
        changed = False
        users = {i: [j for j, s in steps.items() for _, r in s.refs if r == i] for i in steps}
        for i in sorted(steps):
            u = steps[i]
            if u.operator not in ("filter", "project"):
                continue
            subs = [r for a, r in u.refs if a == "sub" and r in steps]
            if len(subs) != 1:
                continue
            v = steps[subs[0]]
            if not (
                (u.operator == "filter" and v.operator in ("filter", "select"))
                or (u.operator == "project" and v.operator == "select")
            ):
                continue
            # the merged step: u's operator; every token of both under u's argument names; v's references kept
            merged = Step(u.operator, u.properties, {k: list(t) for k, t in u.args.items()})
            for k, toks in v.args.items():
                key = k if v.operator == u.operator else "sub"
                merged.args.setdefault(key, []).extend(toks)
            merged.refs = [(a, r) for a, r in u.refs if r != subs[0]]
            merged.refs += [(a if v.operator == u.operator else "sub", r) for a, r in v.refs]
            if not merged.refs:  # nothing referenced any more: a select of all the tokens
                merged = Step("select", (), {"sub": [t for ts in merged.args.values() for t in ts]})
            steps[i] = merged
            if all(j == i for j in users[subs[0]]):
                del steps[subs[0]]
            changed = True
            break


def _canonical_key(steps: dict[int, Step]) -> str:
    """Renumber level by level (a step's level: one more than its deepest reference), ties by the step's key."""
    level: dict[int, int] = {}

    def lvl(i: int, seen: frozenset = frozenset()) -> int:
        if i not in level:
            if i in seen:
                raise UnparsableQDMR("cyclic references")
            deps = [r for _, r in steps[i].refs if r in steps]
            level[i] = 1 + max((lvl(r, seen | {i}) for r in deps), default=-1)
        return level[i]

    for i in steps:
        if any(r not in steps for _, r in steps[i].refs):
            raise UnparsableQDMR(f"step {i} refers to a missing step")
        lvl(i)
    new_id: dict[int, int] = {}
    keys = []
    for lv in sorted(set(level.values())):
        ids = [i for i in steps if level[i] == lv]
        local = sorted((_node_key(steps[i], new_id), i) for i in ids)
        for k, i in local:
            new_id[i] = len(new_id) + 1
            keys.append(k)
    return "; ".join(keys)


def _node_key(s: Step, new_id: dict[int, int]) -> str:
    props = ",".join(sorted(s.properties))
    deps = ",".join(sorted(f"({new_id[r]},{s.operator}-{a})" for a, r in s.refs))
    toks = ",".join(sorted({t for ts in s.args.values() for t in ts}))
    return f"{s.operator.upper()}[{props}]{deps}{{{toks}}}"


def logical_form(qdmr: str) -> dict[int, Step]:
    """Steps (1-based ids) after identification, normalisation and chain merging."""
    texts = parse_steps(qdmr)
    if not texts:
        raise UnparsableQDMR("empty QDMR")
    steps = {i + 1: identify(t) for i, t in enumerate(texts)}
    for i, s in steps.items():
        bad = [r for _, r in s.refs if not 1 <= r < i]
        if bad:
            raise UnparsableQDMR(f"step {i} refers to #{bad[0]}, not an earlier step")
    for s in steps.values():
        _normalise(s)
    _merge(steps)
    return steps


@lru_cache(maxsize=4096)  # the gold side is parsed once, not once per retriever
def lf_key(qdmr: str) -> str:
    """A canonical string for the QDMR's logical form; equal keys = LF-EM match. Raises UnparsableQDMR."""
    return _canonical_key(logical_form(qdmr))


def lf_match(prediction: str, gold: str) -> bool:
    """LF-EM of one prediction: False when either side cannot be parsed into a logical form."""
    try:
        return lf_key(prediction) == lf_key(gold)
    except (UnparsableQDMR, IndexError, StopIteration, ValueError):
        return False
