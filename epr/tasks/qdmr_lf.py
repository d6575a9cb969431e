"""LF-EM for BREAK: do two QDMRs denote the same logical form? (pure functions, no model).

Our implementation of the published definition (Wolfson et al. 2020, "Break It Down", operator identification;
Hasson & Berant 2021, "Question Decomposition with Dependency Graphs", the structural logical-form matcher that the
EPR paper's LF-EM numbers use):

1. Split the QDMR into steps; identify each step's operator (one of 14: select, filter, project, aggregate, group,
   superlative, comparative, union, intersection, discard, sort, boolean, arithmetic, comparison) with the rule set
   of the Break evaluator, its properties (``max``, ``count``, ``logical_and`` ...) and its typed arguments. A
   reference ``#k`` becomes a typed edge to step k; the rest of an argument is a bag of tokens.
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
from dataclasses import dataclass, field
from functools import cache, lru_cache

__all__ = ["Step", "parse_steps", "identify", "logical_form", "lf_key", "lf_match", "UnparsableQDMR"]


class UnparsableQDMR(ValueError):
    pass


@dataclass
class Step:
    operator: str
    properties: tuple[str, ...] = ()
    args: dict[str, list[str]] = field(default_factory=dict)  # argument type -> tokens (no references)
    refs: list[tuple[str, int]] = field(default_factory=list)  # (argument type, step index 0-based)


# ---------------------------------------------------------------- step splitting and small helpers


def parse_steps(qdmr: str) -> list[str]:
    """``return a ;return #1 of b`` -> ``["a", "#1 of b"]`` (commas spaced, whitespace collapsed)."""
    steps = []
    for raw in qdmr.replace(",", " , ").split(";"):
        toks = raw.split()
        if toks and toks[0].lower() == "return":
            toks = toks[1:]
        if toks:
            steps.append(" ".join(toks))
    return steps


def _refs(step: str) -> list[int]:
    return [int(m) for m in re.findall(r"#(\d+)", step)]


def _has(part: str, text: str) -> bool:
    """``part`` occurs in ``text`` as whole words (digits at a boundary must not continue a number)."""
    return part in text and _word_re(part).search(text) is not None


@cache
def _word_re(part: str) -> re.Pattern:
    pre = "0-9" if part[:1].isdigit() else ""
    suf = "0-9" if part[-1:].isdigit() else ""
    return re.compile(rf"(^|[^a-zA-Z{pre}]){re.escape(part)}([^a-zA-Z{suf}]|$)")


def _variants(words: list[str]) -> list[str]:
    """Words plus their equivalence-group members (the Break lexicon's fixed groups)."""
    out = set(words)
    for w in words:
        out.update(_GROUP_OF.get(w, ()))
    return sorted(out)


# Equivalence groups of the Break evaluator's lexicon (operator words and their synonyms).
_GROUPS = [
    ["who", "which"],
    ["max", "maximum"],
    ["more", "at least", "no less"],
    ["highest", "largest", "longest", "biggest"],
    ["higher", "larger", "longer", "bigger"],
    ["min", "minimum"],
    ["less", "at most", "no more"],
    ["lowest", "smallest", "shortest", "fewest"],
    ["lower", "smaller", "shorter", "fewer"],
    ["count", "number of", "total number of"],
    ["sum", "total"],
    ["avg", "average", "mean"],
    ["multiply", "multiplication"],
    ["difference", "decline"],
    ["division", "divide"],
    ["100", "hundred"],
    ["0", "zero"],
    ["1", "one"],
    ["2", "two"],
    ["same", "same as", "equal", "equals"],
    ["contain", "contains", "include", "includes"],
    ["start", "starts", "begin", "begins"],
    ["end", "ends"],
    ["besides", "not in", "discard", "not"],
    ["sort", "sorted", "order", "ordered"],
    ["and", ",", "both"],
    ["height", "elevation"],
]
_GROUP_OF = {w: g for g in _GROUPS for w in g}

# Function words annotators add to steps (the evaluator's list, plus "be" and "as"; its two-word entries never
# match a single token there, so they are left out here).
_FUNCTION_WORDS = {
    "a", "if", "how", "where", "when", "which", "who", "what", "with", "was", "were", "did", "to", "from", "both",
    "and", "or", "the", "of", "is", "are", "besides", "that", "have", "has", "not", "than", "those", "on", "in",
    "any", "there", "distinct", ",", "be", "as",
}  # fmt: skip


# ---------------------------------------------------------------- properties per operator

_AGG_PROPS = {
    "max": _variants(["max", "most", "more", "last", "bigger", "biggest", "larger", "largest", "higher", "highest",
                      "longer", "longest"]),
    "min": _variants(["min", "least", "less", "first", "fewer", "smaller", "smallest", "lower", "lowest", "shortest",
                      "shorter", "earlier"]),
    "count": _variants(["number of", "total number of"]),
    "sum": _variants(["sum", "total"]),
    "avg": _variants(["avg", "average", "mean"]),
}  # fmt: skip
_AGG_ORDER = [["max", "min"], ["avg"], ["count", "sum"]]


def _conditional_props() -> dict[str, list[str]]:
    out = {"equals": _variants(["equal", "equals", "same as"])}
    for num in ("0", "1", "2"):
        nums = _variants([num])
        out[f"equals_{num}"] = [f"{a} {b} {n}".replace("  ", " ") for a in _variants(["equals", "is"])
                                for b in ("", "to") for n in nums]  # fmt: skip
        out[f"more_than_{num}"] = [f"{a} {b} {n}".replace("  ", " ") for a in _variants(["bigger", "more"])
                                   for b in ("", "than") for n in nums]  # fmt: skip
        out[f"less_than_{num}"] = [f"{a} {b} {n}".replace("  ", " ") for a in _variants(["lower", "less"])
                                   for b in ("", "than") for n in nums]  # fmt: skip
    return out


_COND_PROPS = _conditional_props()

# operator -> (property -> indicator terms, search order of property groups or None)
_PROPS: dict[str, tuple[dict[str, list[str]], list[list[str]] | None]] = {
    "aggregate": (_AGG_PROPS, _AGG_ORDER),
    "group": (_AGG_PROPS, _AGG_ORDER),
    "comparison": (_AGG_PROPS | {"true": ["true"], "false": ["false"]}, _AGG_ORDER + [["true", "false"]]),
    "superlative": (
        {
            "max": _variants(["most", "biggest", "largest", "highest", "longest"]),
            "min": _variants(["least", "fewest", "smallest", "lowest", "shortest", "earliest"]),
        },
        None,
    ),
    "comparative": (
        {
            "equals": _variants(["equal", "equals", "same as"]),
            "more": _variants(["more", "at least"])
            + [f"{x} than" for x in _variants(["higher", "larger", "bigger"])],
            "less": _variants(["less", "at most"]) + [f"{x} than" for x in _variants(["smaller", "lower"])],
            **_COND_PROPS,
        },
        None,
    ),
    "boolean": (
        {
            "logical_and": ["both", "and"],
            "logical_or": ["either", "or"],
            "true": ["true"],
            "false": ["false"],
            "if_exist": ["any", "there"],
            **_COND_PROPS,
        },
        [list(_COND_PROPS)],
    ),  # fmt: skip
    "arithmetic": (
        {p: _variants([p]) for p in ("sum", "difference", "multiplication", "division")},
        None,
    ),
}
_OPERATOR_WORDS = {
    "boolean": ["#REF"],
    "project": ["#REF"],
    "discard": _variants(["besides", "not in"]),
    "group": ["for each"],
    "intersection": ["of both", "in both", "at both", "by both", "between both", "for both", "are both", "both of",
                     "both", "and"],
    "sort": ["sort by", "sorted by", "order by", "ordered by"],
}  # fmt: skip


@cache
def _term_order(op: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(term, properties) pairs to try in order: group by group, longest term first."""
    props, order = _PROPS.get(op, ({}, None))
    groups = [props] if not order else [{k: v for k, v in props.items() if k in g} for g in order]
    out = []
    for g in groups:
        term_props: dict[str, list[str]] = {}
        for p, terms in g.items():
            for t in terms:
                term_props.setdefault(t, []).append(p)
        out += sorted(((t, tuple(ps)) for t, ps in term_props.items()), key=lambda x: len(x[0]), reverse=True)
    return tuple(out)


def _properties(op: str, step: str, refs: list[int]) -> tuple[str, ...]:
    low = step.lower()
    if op == "boolean":
        if len(refs) == 2 and _has("both", low) and _has("and", low):
            return ("logical_and", "false" if _has("false", low) else "true")
        if len(refs) == 2 and _has("either", low) and _has("or", low):
            return ("logical_or", "false" if _has("false", low) else "true")
        if len(refs) == 2:
            prefix = low.split(f"#{refs[0]}")[0]
            if any(x in prefix for x in ("any", "is there", "there is", "there are")):
                return ("if_exist",)
    for term, props in _term_order(op):
        if _has(term, low):
            return props
    if op == "comparison":
        raise UnparsableQDMR(f"comparison step without a comparison word: {step!r}")
    return ()


# ---------------------------------------------------------------- operator identification


def _terms(op: str) -> list[str]:
    return [t for ts in _PROPS[op][0].values() for t in ts]


# the words each rule looks for, built once
_AGG_TERMS = _terms("aggregate")
_SUP_PHRASES = [f"{p} {s}" for p in ("is", "is the", "are", "are the") for s in _terms("superlative")]
_COMP_TERMS = (
    _terms("comparative")
    + _variants(["contain", "include", "has", "have"])
    + [f"{x} with" for x in _variants(["start", "starts", "begin", "begins", "end", "ends"])]
    + ["is", "are", "was"]
)
_ARITH_TERMS = _terms("arithmetic")


def _is_op(op: str, step: str, refs: list[int]) -> bool:
    n, low = len(refs), step.lower()
    if op == "select":
        return n == 0
    if op == "filter":
        return 0 < n <= 3 and step.startswith("#")
    if op == "project":
        return n == 1 and re.search(r"\s+#+[0-9\s]+", step) is not None
    if op == "aggregate":
        return n == 1 and any(_has(t + " #", step) or _has(t + " of #", step) for t in _AGG_TERMS)
    if op == "group":
        return n > 0 and _has("for each", step)
    if op == "superlative":
        return (
            n == 2
            and step.startswith("#")
            and _has("where", step)
            and any(_has(p, step) for p in _SUP_PHRASES)
        )
    if op == "comparative":
        return (
            2 <= n <= 3
            and _has("where", step)
            and (step.startswith("#") or step.startswith("the #"))
            and any(_has(c, step) for c in _COMP_TERMS)
        )
    if op == "union":
        return n > 1 and re.fullmatch(r"[#0-9,\s]+", step.replace("and", ",").replace("or", ",")) is not None
    if op == "intersection":
        return n >= 2 and _has("both", step) and _has("and", step)
    if op == "discard":
        return (
            1 <= n <= 2
            and (re.search(r"^#+[0-9]+\s+", step) is not None or re.search(r"#+[0-9]+$", step) is not None)
            and any(_has(x, step) for x in _OPERATOR_WORDS["discard"])
        )
    if op == "sort":
        return any(_has(x, step) for x in _OPERATOR_WORDS["sort"])
    if op == "boolean":
        return low.startswith(("if ", "is ", "are ", "did "))
    if op == "arithmetic":
        return any(
            (step.startswith(a) or step.startswith("the " + a)) and (n > 1 or (n == 1 and _has("and", step)))
            for a in _ARITH_TERMS
        )
    if op == "comparison":
        return low.startswith("which") and n > 1
    raise KeyError(op)


_OPERATORS = ("select", "filter", "project", "aggregate", "group", "superlative", "comparative", "union",
              "intersection", "discard", "sort", "boolean", "arithmetic", "comparison")  # fmt: skip
# When several operators match, the first of these that matched wins (the evaluator's precedence).
_PRECEDENCE = ("boolean", "superlative", "group", "comparative", "intersection", "arithmetic")


def operator_of(step: str) -> str:
    refs = _refs(step)
    ops = {op for op in _OPERATORS if _is_op(op, step, refs)}
    if len(ops) > 1:
        ops -= {"project", "filter"}
        for p in _PRECEDENCE:
            if p in ops:
                ops = {p}
                break
    if len(ops) != 1:
        raise UnparsableQDMR(
            f"step {step!r}: {'no operator' if not ops else 'operators ' + str(sorted(ops))}"
        )
    return ops.pop()


def _args(op: str, step: str, refs: list[int], props: tuple[str, ...]) -> dict[str, list[str]]:
    """Argument type -> argument strings (which may contain references)."""
    r0 = f"#{refs[0]}" if refs else ""
    if op == "select":
        return {"sub": [step]}
    if op == "filter":
        return {"sub": [r0], "condition": [step.split(r0, 1)[1]]}
    if op == "project":
        return {"projection": [step.replace(r0, "#REF")], "sub": [r0]}
    if op == "aggregate":
        return {"arg": [r0]}
    if op == "group":
        value, key = step.split("for each", 1)
        vr, kr = _refs(value), _refs(key)
        return {
            "value": [f"#{vr[0]}" if vr else (value.split() or [""])[-1]],
            "key": [f"#{kr[0]}" if kr else (key.split() or [""])[-1]],
        }
    if op == "superlative":
        return {"sub": [f"#{refs[0]}"], "attribute": [f"#{refs[1]}"]}
    if op == "comparative":
        attr = f"#{refs[1]}"
        return {"sub": [r0], "attribute": [attr], "condition": [step.split(attr, 1)[1]]}
    if op in ("union", "comparison"):
        return {"sub" if op == "union" else "arg": [f"#{r}" for r in refs]}
    if op == "intersection":
        expr = next(x for x in _OPERATOR_WORDS["intersection"][:-1] if _has(x, step))
        projection, inter = step.split(expr, 1)
        return {"projection": [projection], "intersection": [f"#{r}" for r in _refs(inter)]}
    if op == "discard":
        expr = [x for x in _OPERATOR_WORDS["discard"] if _has(x, step)][-1]
        keep, drop = step.split(expr, 1)
        return {"sub": [keep], "exclude": [drop]}
    if op == "sort":
        expr = [x for x in _OPERATOR_WORDS["sort"] if _has(x, step)][-1]
        objects, order = step.split(expr, 1)
        return {"sub": [objects], "order": [order]}
    if op == "boolean":
        if "logical_and" in props:
            return {"sub": [f"#{r}" for r in refs]}
        toks = step.split()
        if "if_exist" in props or (len(toks) > 1 and toks[1].startswith("#")):
            return {"sub": [r0], "condition": [step.split(r0, 1)[1]]}
        if len(refs) == 1:
            return {"sub": [r0], "condition": [step.replace(r0, "#REF")]}
        return {"condition": [step]}
    if op == "arithmetic":
        parts = re.split("and|,", step)
        if len(parts) != 2 or "sum" in props or "multiplication" in props:
            return {"arg": [f"#{r}" for r in refs]}
        prefix, suffix = parts
        left = (prefix.split() or [""])[-1]
        return {
            "left": [f"#{r}" for r in _refs(left)] or [left],
            "right": [f"#{r}" for r in _refs(suffix)] or [suffix],
        }
    raise KeyError(op)


def identify(step: str) -> Step:
    """One QDMR step -> its operator, properties, argument tokens and typed references (1-based step ids)."""
    op = operator_of(step)
    refs = _refs(step)
    props = _properties(op, step, refs)
    out = Step(op, tuple(props))
    for name, values in _args(op, step, refs, props).items():
        for v in values:
            out.refs += [(name, int(k)) for k in re.findall(r"#(\d+)", v)]
            out.args.setdefault(name, []).extend(re.sub(r"#(\d+)", " ", v).split())
    return out


# ---------------------------------------------------------------- normalisation


def _representative(word: str) -> str:
    g = _GROUP_OF.get(word)
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
    props, _ = _PROPS.get(step.operator, ({}, None))
    indicators = [t for p in step.properties for t in props.get(p, [])] + _OPERATOR_WORDS.get(
        step.operator, []
    )
    ind_words = {w for t in indicators for w in t.lower().split()}
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
