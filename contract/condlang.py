"""Conditions over a closed window's aggregates (HAVING, alert rules), parsed by hand, never ``eval``.

The same approach as :mod:`contract.filterlang`: a whitelisted grammar, tokenised and parsed by
recursive descent into a typed AST that only knows the query's aggregate names and numbers; the AST
is evaluated vectorised with numpy over the columns of many (window, group) rows at once. Why a
second small language and not the filter's: a filter runs per packet in Numba over integer fields,
a condition runs on the driver over finalized aggregates, which include floats (``avg``) and need
arithmetic (``bytes / packets > 1200``).

Grammar::

    expr   := and ('or' and)*
    and    := not ('and' not)*
    not    := 'not' not | cmp
    cmp    := sum (== != < <= > >=) sum | '(' expr ')'
    sum    := prod (('+' | '-') prod)*
    prod   := unary (('*' | '/') unary)*
    unary  := '-' unary | NUMBER | AGGREGATE | 'total' '(' AGGREGATE ')' | '(' sum ')'

``total(bytes)`` is the window's total of an aggregate over all its groups (dissertation Q6-4, heavy
hitters: ``bytes >= 0.05 * total(bytes)``); only aggregates whose result kind has a total in
:data:`contract.aggregates.RESULT_KINDS` (count, sum: the sum; min, max: the extreme) take one. The
caller evaluates it from a column named :func:`total_column`, one value per row (its window's total):
the language only says where it is read, the job decides when it is exact (every partition closed
the window, ``high_level/results/windowtotal.py``).

Division by zero yields NaN (or +-inf), and every comparison with NaN is false, so an ``avg`` of an
empty group or a ratio over a zero count never fires a rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>==|!=|<=|>=|<|>|\+|-|\*|/|\(|\)))"
)
_CMP = ("==", "!=", "<", "<=", ">", ">=")
_KEYWORDS = ("and", "or", "not")
MAX_DEPTH = 64


class ConditionError(ValueError):
    """A condition that does not parse or names an unknown aggregate; ``pos`` is a character offset."""

    def __init__(self, reason: str, pos: int) -> None:
        super().__init__(f"{reason} (at character {pos + 1})")
        self.reason = reason
        self.pos = pos


@dataclass(frozen=True)
class Cond:
    """A node: kind in {'num', 'agg', 'total', 'neg', 'arith', 'cmp', 'and', 'or', 'not'}; typ 'num' or 'bool'."""

    kind: str
    typ: str
    args: tuple
    pos: int


def _tokens(src: str) -> list[tuple[str, str, int]]:
    toks, i = [], 0
    while src[i:].strip():
        m = _TOKEN.match(src, i)
        if not m or m.end() == i:
            j = i + len(src[i:]) - len(src[i:].lstrip())
            raise ConditionError(f"unexpected character {src[j]!r}", j)
        kind = m.lastgroup or ""
        toks.append((kind, m.group(kind), m.start(kind)))
        i = m.end()
    toks.append(("end", "", len(src)))
    return toks


class _Parser:
    def __init__(self, src: str, names: Sequence[str], totals: Sequence[str]) -> None:
        self.toks = _tokens(src)
        self.i = 0
        self.names = tuple(names)
        self.totals = tuple(totals)
        self.depth = 0

    def peek(self) -> tuple[str, str, int]:
        return self.toks[self.i]

    def take(self) -> tuple[str, str, int]:
        self.i += 1
        return self.toks[self.i - 1]

    def word(self, w: str) -> bool:
        k, t, _ = self.peek()
        return k == "name" and t.lower() == w

    def nest(self, pos: int) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ConditionError("condition nested too deeply", pos)

    def parse(self) -> Cond:
        node = self.expr()
        k, t, pos = self.peek()
        if k != "end":
            raise ConditionError(f"unexpected {t!r}", pos)
        if node.typ != "bool":
            raise ConditionError("a condition must compare, e.g. 'syns > 1000'", node.pos)
        return node

    def expr(self) -> Cond:
        return self.chain("or", self.conj)

    def conj(self) -> Cond:
        return self.chain("and", self.neg)

    def chain(self, word: str, operand: Callable[[], Cond]) -> Cond:
        """``operand (word operand)*``, left-associative: 'or' over 'and' terms, 'and' over 'not' terms."""
        left = operand()
        while self.word(word):
            pos = self.take()[2]
            left = Cond(word, "bool", (_bool(left), _bool(operand())), pos)
        return left

    def neg(self) -> Cond:
        if self.word("not"):
            pos = self.take()[2]
            self.nest(pos)
            return Cond("not", "bool", (_bool(self.neg()),), pos)
        return self.cmp()

    def cmp(self) -> Cond:
        left = self.sum()
        k, t, pos = self.peek()
        if k == "op" and t in _CMP:
            self.take()
            right = self.sum()
            for side in (left, right):
                if side.typ != "num":
                    raise ConditionError(f"{t!r} compares numbers, not conditions", side.pos)
            return Cond("cmp", "bool", (t, left, right), pos)
        return left

    def sum(self) -> Cond:
        return self.arith(("+", "-"), self.prod)

    def prod(self) -> Cond:
        return self.arith(("*", "/"), self.unary)

    def arith(self, ops: tuple[str, str], operand: Callable[[], Cond]) -> Cond:
        """``operand (op operand)*``, left-associative: sums over products, products over unary terms."""
        left = operand()
        while self.peek()[1] in ops and self.peek()[0] == "op":
            _, op, pos = self.take()
            left = Cond("arith", "num", (op, _num(left), _num(operand())), pos)
        return left

    def unary(self) -> Cond:
        k, t, pos = self.take()
        if t == "-" and k == "op":
            self.nest(pos)
            return Cond("neg", "num", (_num(self.unary()),), pos)
        if t == "(" and k == "op":
            self.nest(pos)
            node = self.expr()
            if self.take()[1] != ")":
                raise ConditionError("expected ')'", self.toks[self.i - 1][2])
            self.depth -= 1
            return node
        if k == "num":
            v: int | float = float(t) if any(c in t for c in ".eE") else int(t)
            if isinstance(v, int) and v >= 2**63:  # beyond int64: compare as a float, never as an object
                v = float(v)
            return Cond("num", "num", (v,), pos)
        if k == "name":
            if t.lower() in _KEYWORDS:
                raise ConditionError(f"unexpected keyword {t!r}", pos)
            if t == "total" and self.peek()[:2] == ("op", "("):
                return self.total(pos)
            if t not in self.names:
                known = ", ".join(self.names) or "none"
                raise ConditionError(f"unknown aggregate {t!r} (the query's aggregates: {known})", pos)
            return Cond("agg", "num", (t,), pos)
        raise ConditionError(f"unexpected {t or 'end of condition'!r}", pos)

    def total(self, pos: int) -> Cond:
        self.take()  # '('
        k, t, at = self.take()
        if k != "name" or t not in self.names:
            known = ", ".join(self.names) or "none"
            raise ConditionError(f"total() takes one of the query's aggregates ({known})", at)
        if t not in self.totals:
            ok = ", ".join(self.totals) or "none here"
            raise ConditionError(
                f"total({t}): {t!r} has no window total (aggregates with one: {ok}; a total needs a "
                "count, sum, min or max aggregate, and no holistic aggregate or landmark window in the query)",
                at,
            )
        if self.take()[1] != ")":
            raise ConditionError("expected ')' after total's aggregate", self.toks[self.i - 1][2])
        return Cond("total", "num", (t,), pos)


def _bool(node: Cond) -> Cond:
    if node.typ != "bool":
        raise ConditionError("a number is not a condition; compare it, e.g. 'syns > 1000'", node.pos)
    return node


def _num(node: Cond) -> Cond:
    if node.typ != "num":
        raise ConditionError("a condition is not a number", node.pos)
    return node


def parse(src: str, aggregates: Sequence[str], totals: Sequence[str] = ()) -> Cond:
    """Parse a condition over the named aggregates (``totals``: those that may appear as ``total(x)``),
    or raise :class:`ConditionError` with the position."""
    if not isinstance(src, str) or not src.strip():
        raise ConditionError("empty condition", 0)
    return _Parser(src, aggregates, totals).parse()


def names(node: Cond) -> set[str]:
    """The aggregates a condition reads (its own row's or, in ``total()``, its window's)."""
    if node.kind in ("agg", "total"):
        return {node.args[0]}
    return set().union(*(names(a) for a in node.args if isinstance(a, Cond)))


def totals(node: Cond) -> set[str]:
    """The aggregates whose window total a condition reads."""
    if node.kind == "total":
        return {node.args[0]}
    return set().union(*(totals(a) for a in node.args if isinstance(a, Cond)))


def total_column(name: str) -> str:
    """The column :func:`evaluate` reads ``total(name)`` from (per row: the total of its window)."""
    return f"total({name})"


_ARITH = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide}
_CMPF = {
    "==": np.equal,
    "!=": np.not_equal,
    "<": np.less,
    "<=": np.less_equal,
    ">": np.greater,
    ">=": np.greater_equal,
}


def evaluate(node: Cond, columns: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """bool[n]: the condition over ``n`` rows, given each aggregate as a numpy column (vectorised).

    Integer aggregates stay int64 until a division or a float constant makes them float64, so a
    count compared with an integer is exact beyond 2**53.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = _eval(node, columns, n)
    return np.broadcast_to(np.asarray(out, bool), (n,)).copy()


def _eval(node: Cond, cols: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    k, a = node.kind, node.args
    if k == "num":
        return np.asarray(a[0])
    if k == "agg":
        return np.asarray(cols[a[0]])
    if k == "total":
        return np.asarray(cols[total_column(a[0])])
    if k == "neg":
        return np.negative(_eval(a[0], cols, n))
    if k == "arith":
        x, y = _eval(a[1], cols, n), _eval(a[2], cols, n)
        if a[0] == "/":
            x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        return _ARITH[a[0]](x, y)
    if k == "cmp":
        return _CMPF[a[0]](_eval(a[1], cols, n), _eval(a[2], cols, n))
    if k == "not":
        return np.logical_not(_eval(a[0], cols, n))
    return (np.logical_and if k == "and" else np.logical_or)(_eval(a[0], cols, n), _eval(a[1], cols, n))
