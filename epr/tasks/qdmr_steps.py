"""QDMR steps -> operator, properties and typed arguments: step 1 of LF-EM (pure functions, no model).

The rule set of the Break evaluator (Wolfson et al. 2020, "Break It Down", operator identification; the later
rules of Hasson & Berant 2021 that the LF-EM matcher uses): split a QDMR into steps; identify each step's
operator (one of 14: select, filter, project, aggregate, group, superlative, comparative, union, intersection,
discard, sort, boolean, arithmetic, comparison), its properties (``max``, ``count``, ``logical_and`` ...) and its
typed arguments. A reference ``#k`` becomes a typed edge to step k; the rest of an argument is a bag of tokens.
The evaluator's lexicon (fixed equivalence groups, the words that signal each operator and property) lives here
too; ``epr.tasks.qdmr_lf`` uses it to normalise the tokens and compares the resulting graphs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache

__all__ = ["Step", "UnparsableQDMR", "parse_steps", "operator_of", "identify", "indicator_words", "GROUP_OF"]


class UnparsableQDMR(ValueError):
    pass


@dataclass
class Step:
    operator: str
    properties: tuple[str, ...] = ()
    args: dict[str, list[str]] = field(default_factory=dict)  # argument type -> tokens (no references)
    refs: list[tuple[str, int]] = field(default_factory=list)  # (argument type, step id 1-based)


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
        out.update(GROUP_OF.get(w, ()))
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
GROUP_OF = {w: g for g in _GROUPS for w in g}  # word -> its equivalence group


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


def indicator_words(step: Step) -> set[str]:
    """The words that signal the step's operator and its properties (``number``, ``of``, ``for``, ``each`` ...)."""
    props, _ = _PROPS.get(step.operator, ({}, None))
    terms = [t for p in step.properties for t in props.get(p, [])] + _OPERATOR_WORDS.get(step.operator, [])
    return {w for t in terms for w in t.lower().split()}
