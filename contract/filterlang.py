"""The whitelisted filter language, parsed by hand and compiled to a postfix program of integers.

Nothing here ever calls ``eval``/``exec``: a filter is tokenised, parsed by recursive descent into a
small AST that only knows catalog fields, numbers, addresses, prefixes and named constants, and then
compiled to a flat int64 postfix program. The low level never interprets that program per packet:
``low_level.kernel.filter`` turns it, at kernel generation time, into straight-line Numba statements (one
named value per instruction) inside the generated per-query-set kernel (``low_level.kernel.codegen``), so
only integers from the validated program reach generated code. :func:`evaluate` is the plain-Python
reference the generated statements are tested against.

Grammar::

    expr    := and ('or' and)*
    and     := not ('and' not)*
    not     := 'not' not | cmp
    cmp     := term [ (== != < <= > >=) term | ['not'] 'in' set ]
    set     := '[' item (',' item)* ']' | item
    term    := atom ('&' atom)*
    atom    := NUMBER | FIELD | CONSTANT | ADDRESS | PREFIX | '(' expr ')'
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from contract import fields as F

# --- program encoding: fixed-width instructions of INSTR_WIDTH int64 slots: [op, a0, a1, a2, a3, a4]
INSTR_WIDTH = 6
OP_CONST = 1  # push a0
OP_LOAD = 2  # push row[a0]
OP_LOAD_DSCP = 3  # push row[TOS] >> 2
OP_BITAND = 4
OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE = 5, 6, 7, 8, 9, 10
OP_AND, OP_OR, OP_NOT = 11, 12, 13
OP_IP_MATCH = 14  # push ((row[a0] & a3) == a1) and ((row[a0+1] & a4) == a2)
OP_TRUTHY = 15
OP_LOAD_NET = 16  # push the networks-file lookup of an enrichment field (a0: F.SRC_NET .. F.DST_ASN)
MAX_STACK = 32  # deepest expression accepted (values live at once); the generated code itself has no stack

CONSTANTS = {
    **{k: v for k, v in F.TCP_FLAG_BITS.items()},
    **{k.upper(): v for k, v in F.PROTOCOL_NUMBERS.items()},
}
CONSTANTS.update({k: v for k, v in F.PROTOCOL_NUMBERS.items()})

_CMP = {"==": OP_EQ, "!=": OP_NE, "<": OP_LT, "<=": OP_LE, ">": OP_GT, ">=": OP_GE}


class FilterError(ValueError):
    """A filter expression that does not parse or does not type-check; ``pos`` is a character offset."""

    def __init__(self, reason: str, pos: int) -> None:
        super().__init__(f"{reason} (at character {pos + 1})")
        self.reason = reason
        self.pos = pos


_TOKEN = re.compile(
    r"\s*(?:"
    r"(?P<addr>(?:\d{1,3}\.){3}\d{1,3}(?:/\d{1,3})?|[0-9A-Fa-f]*:[0-9A-Fa-f:.]*(?:/\d{1,3})?)"
    r"|(?P<num>0x[0-9A-Fa-f]+|\d+)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>==|!=|<=|>=|<|>|&|\(|\)|\[|\]|,)"
    r")"
)


@dataclass(frozen=True)
class Tok:
    kind: str
    text: str
    pos: int


def tokenize(src: str) -> list[Tok]:
    toks: list[Tok] = []
    i = 0
    while i < len(src):
        if src[i:].strip() == "":
            break
        m = _TOKEN.match(src, i)
        if not m or m.end() == i:
            j = i + (len(src[i:]) - len(src[i:].lstrip()))
            raise FilterError(f"unexpected character {src[j]!r}", j)
        kind = m.lastgroup or ""
        text = m.group(kind)
        toks.append(Tok(kind, text, m.start(kind)))
        i = m.end()
    toks.append(Tok("end", "", len(src)))
    return toks


# --- AST: tuples ("kind", ...) with a type: "int" | "bool" | "ip" | "prefix"
@dataclass(frozen=True)
class Node:
    kind: str
    typ: str
    args: tuple
    pos: int


class _Parser:
    def __init__(self, src: str) -> None:
        self.toks = tokenize(src)
        self.i = 0

    def peek(self) -> Tok:
        return self.toks[self.i]

    def take(self) -> Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def expect(self, text: str) -> Tok:
        t = self.take()
        if t.text != text:
            raise FilterError(f"expected {text!r}, found {t.text or 'end of expression'!r}", t.pos)
        return t

    def is_word(self, word: str) -> bool:
        t = self.peek()
        return t.kind == "name" and t.text.lower() == word

    def parse(self) -> Node:
        node = self.expr()
        t = self.peek()
        if t.kind != "end":
            raise FilterError(f"unexpected {t.text!r}", t.pos)
        return _as_bool(node)

    def expr(self) -> Node:
        return self.chain("or", self.conj)

    def conj(self) -> Node:
        return self.chain("and", self.neg)

    def chain(self, word: str, operand: Callable[[], Node]) -> Node:
        """``operand (word operand)*``, left-associative: 'or' over 'and' terms, 'and' over 'not' terms."""
        left = operand()
        while self.is_word(word):
            pos = self.take().pos
            left = Node(word, "bool", (_as_bool(left), _as_bool(operand())), pos)
        return left

    def neg(self) -> Node:
        if self.is_word("not"):
            pos = self.take().pos
            return Node("not", "bool", (_as_bool(self.neg()),), pos)
        return self.cmp()

    def cmp(self) -> Node:
        left = self.term()
        t = self.peek()
        if t.kind == "op" and t.text in _CMP:
            self.take()
            right = self.term()
            return _compare(t.text, left, right, t.pos)
        negate = False
        if self.is_word("not") and self.toks[self.i + 1].text.lower() == "in":
            self.take()
            negate = True
        if self.is_word("in"):
            pos = self.take().pos
            items = self.set_items()
            alts = [_membership(left, it, pos) for it in items]
            node = alts[0]
            for alt in alts[1:]:
                node = Node("or", "bool", (node, alt), pos)
            return Node("not", "bool", (node,), pos) if negate else node
        return left

    def set_items(self) -> list[Node]:
        if self.peek().text == "[":
            self.take()
            items = [self.term()]
            while self.peek().text == ",":
                self.take()
                items.append(self.term())
            self.expect("]")
            return items
        return [self.term()]

    def term(self) -> Node:
        left = self.atom()
        while self.peek().text == "&":
            pos = self.take().pos
            right = self.atom()
            for side in (left, right):
                if side.typ != "int":
                    raise FilterError("'&' needs integer operands", side.pos)
            left = Node("bitand", "int", (left, right), pos)
        return left

    def atom(self) -> Node:
        t = self.take()
        if t.text == "(":
            node = self.expr()
            self.expect(")")
            return node
        if t.kind == "num":
            return Node("const", "int", (int(t.text, 0),), t.pos)
        if t.kind == "addr":
            return _address(t)
        if t.kind == "name":
            if t.text in F.CATALOG:
                fld = F.CATALOG[t.text]
                return Node("field", "ip" if fld.kind == "ip" else "int", (fld,), t.pos)
            if t.text in CONSTANTS:
                return Node("const", "int", (CONSTANTS[t.text],), t.pos)
            if t.text.lower() in ("and", "or", "not", "in"):
                raise FilterError(f"unexpected keyword {t.text!r}", t.pos)
            raise FilterError(f"unknown field or constant {t.text!r}", t.pos)
        raise FilterError(f"unexpected {t.text or 'end of expression'!r}", t.pos)


def _address(t: Tok) -> Node:
    try:
        if "/" in t.text:
            net = ipaddress.ip_network(t.text, strict=False)
            return Node("prefix", "prefix", (net,), t.pos)
        return Node("prefix", "prefix", (ipaddress.ip_network(t.text),), t.pos)
    except ValueError as exc:
        raise FilterError(f"bad address {t.text!r}: {exc}", t.pos) from None


def _as_bool(node: Node) -> Node:
    if node.typ == "bool":
        return node
    if node.typ == "int":
        return Node("truthy", "bool", (node,), node.pos)
    raise FilterError("an address is not a condition; compare it with == or in", node.pos)


def _compare(op: str, left: Node, right: Node, pos: int) -> Node:
    if left.typ == "ip" or right.typ == "ip":
        if op not in ("==", "!=") or {left.typ, right.typ} != {"ip", "prefix"}:
            raise FilterError("addresses compare only with == / != / in against an address or prefix", pos)
        field, pref = (left, right) if left.typ == "ip" else (right, left)
        node = Node("ipmatch", "bool", (field, pref), pos)
        return node if op == "==" else Node("not", "bool", (node,), pos)
    for side in (left, right):
        if side.typ != "int":
            raise FilterError(f"cannot compare {side.typ} with {op!r}", side.pos)
    return Node("cmp", "bool", (op, left, right), pos)


def _membership(left: Node, item: Node, pos: int) -> Node:
    if left.typ == "ip":
        if item.typ != "prefix":
            raise FilterError("an address field is tested 'in' prefixes like 10.0.0.0/8", item.pos)
        return Node("ipmatch", "bool", (left, item), pos)
    if left.typ == "int" and item.typ == "int":
        return Node("cmp", "bool", ("==", left, item), pos)
    raise FilterError("'in' needs an integer field with numbers or an address field with prefixes", pos)


def parse(src: str) -> Node:
    """Parse a filter into a typed AST, or raise FilterError with the position."""
    return _Parser(src).parse()


def prefix_words(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> tuple[int, int, int, int]:
    """(value_hi, value_lo, mask_hi, mask_lo) of a prefix in lowwater's 128-bit address space."""
    if net.version == 4:
        plen = 96 + net.prefixlen
        value = (F.IPV4_MAPPED_PREFIX << 64 >> 64) | int(net.network_address)
        value128 = value  # high word 0
    else:
        plen = net.prefixlen
        value128 = int(net.network_address)
    mask128 = ((1 << 128) - 1) ^ ((1 << (128 - plen)) - 1) if plen else 0
    value128 &= mask128
    return (
        F.to_int64(value128 >> 64),
        F.to_int64(value128),
        F.to_int64(mask128 >> 64),
        F.to_int64(mask128),
    )


def compile_filter(src: str | None) -> np.ndarray:
    """Compile a filter to a program of shape (n, INSTR_WIDTH); an empty program accepts every IP packet."""
    if src is None or not src.strip():
        return np.zeros((0, INSTR_WIDTH), dtype=np.int64)
    code: list[list[int]] = []
    depth = _emit(parse(src), code)
    if depth > MAX_STACK:
        raise FilterError(f"expression too deep (needs a stack of {depth} > {MAX_STACK})", 0)
    return np.array(code, dtype=np.int64).reshape(-1, INSTR_WIDTH)


def _ins(code: list[list[int]], op: int, *args: int) -> None:
    code.append([op, *args, *([0] * (INSTR_WIDTH - 1 - len(args)))])


def _emit(node: Node, code: list[list[int]]) -> int:
    """Append the node's instructions; return the stack depth it needs."""
    k = node.kind
    if k == "const":
        _ins(code, OP_CONST, node.args[0])
        return 1
    if k == "field":
        fld: F.Field = node.args[0]
        if fld.name == "dscp":
            _ins(code, OP_LOAD_DSCP)
        elif fld.kind == "enrich":
            _ins(code, OP_LOAD_NET, F.ENRICH_FIELDS[fld.name])
        else:
            _ins(code, OP_LOAD, fld.columns[0])
        return 1
    if k in ("bitand", "and", "or"):
        a = _emit(node.args[0], code)
        b = _emit(node.args[1], code)
        _ins(code, {"bitand": OP_BITAND, "and": OP_AND, "or": OP_OR}[k])
        return max(a, b + 1)
    if k == "cmp":
        a = _emit(node.args[1], code)
        b = _emit(node.args[2], code)
        _ins(code, _CMP[node.args[0]])
        return max(a, b + 1)
    if k in ("not", "truthy"):
        d = _emit(node.args[0], code)
        _ins(code, OP_NOT if k == "not" else OP_TRUTHY)
        return d
    if k == "ipmatch":
        fld = node.args[0].args[0]
        vh, vl, mh, ml = prefix_words(node.args[1].args[0])
        _ins(code, OP_IP_MATCH, fld.columns[0], vh, vl, mh, ml)
        return 1
    raise FilterError(f"cannot compile {k}", node.pos)  # pragma: no cover - parser never builds others


_BINARY = {
    OP_BITAND: lambda a, b: a & b,
    OP_EQ: lambda a, b: int(a == b),
    OP_NE: lambda a, b: int(a != b),
    OP_LT: lambda a, b: int(a < b),
    OP_LE: lambda a, b: int(a <= b),
    OP_GT: lambda a, b: int(a > b),
    OP_GE: lambda a, b: int(a >= b),
    OP_AND: lambda a, b: int(bool(a) and bool(b)),
    OP_OR: lambda a, b: int(bool(a) or bool(b)),
}


def evaluate(program: np.ndarray, row: np.ndarray, enrich: Any = None) -> bool:
    """Reference interpreter in plain Python: the oracle the generated filter statements
    (``low_level.kernel.filter``) and the tests' offline aggregates are checked against.

    ``enrich(source, row) -> int`` gives the enrichment fields (contract.networks); without it they are 0."""
    stack: list[int] = []
    for ins in program:
        op = int(ins[0])
        if op == OP_CONST:
            stack.append(int(ins[1]))
        elif op == OP_LOAD_NET:
            stack.append(0 if enrich is None else int(enrich(int(ins[1]), row)))
        elif op == OP_LOAD:
            stack.append(int(row[int(ins[1])]))
        elif op == OP_LOAD_DSCP:
            stack.append(int(row[F.TOS]) >> 2)
        elif op == OP_IP_MATCH:
            c = int(ins[1])
            hi_ok = (int(row[c]) & int(ins[4])) == int(ins[2])
            lo_ok = (int(row[c + 1]) & int(ins[5])) == int(ins[3])
            stack.append(int(hi_ok and lo_ok))
        elif op in (OP_NOT, OP_TRUTHY):
            v = stack.pop()
            stack.append(int(v == 0) if op == OP_NOT else int(v != 0))
        else:
            b, a = stack.pop(), stack.pop()
            stack.append(_BINARY[op](a, b))
    return bool(stack[-1]) if stack else True
