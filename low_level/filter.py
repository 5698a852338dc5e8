"""The Numba interpreter for compiled filter programs (see contract.filterlang for the encoding)."""

from __future__ import annotations

import numpy as np
from numba import njit

from contract import fields as F
from contract.filterlang import (
    MAX_STACK,
    OP_AND,
    OP_BITAND,
    OP_CONST,
    OP_EQ,
    OP_GE,
    OP_GT,
    OP_IP_MATCH,
    OP_LE,
    OP_LOAD,
    OP_LOAD_DSCP,
    OP_LT,
    OP_NE,
    OP_NOT,
    OP_OR,
    OP_TRUTHY,
)
from low_level.refcount import pin


@njit(cache=True, nogil=True, inline="always")
def run_filter_at(prog: np.ndarray, start: int, length: int, row: np.ndarray, roff: int, stack: np.ndarray) -> bool:
    """Evaluate instructions prog[start:start+length] on the parsed row at row[roff:]; empty means accept.

    One exit and no array rebinding, so it inlines into the per-packet loop without refcount calls.
    """
    sp = 0
    for k in range(start, start + length):
        op = prog[k, 0]
        if op == OP_CONST:
            stack[sp] = prog[k, 1]
            sp += 1
        elif op == OP_LOAD:
            stack[sp] = row[roff + prog[k, 1]]
            sp += 1
        elif op == OP_LOAD_DSCP:
            stack[sp] = row[roff + F.TOS] >> 2
            sp += 1
        elif op == OP_IP_MATCH:
            c = prog[k, 1]
            ok = ((row[roff + c] & prog[k, 4]) == prog[k, 2]) and ((row[roff + c + 1] & prog[k, 5]) == prog[k, 3])
            stack[sp] = 1 if ok else 0
            sp += 1
        elif op == OP_NOT:
            stack[sp - 1] = 1 if stack[sp - 1] == 0 else 0
        elif op == OP_TRUTHY:
            stack[sp - 1] = 1 if stack[sp - 1] != 0 else 0
        else:
            b = stack[sp - 1]
            a = stack[sp - 2]
            sp -= 1
            if op == OP_BITAND:
                r = a & b
            elif op == OP_EQ:
                r = 1 if a == b else 0
            elif op == OP_NE:
                r = 1 if a != b else 0
            elif op == OP_LT:
                r = 1 if a < b else 0
            elif op == OP_LE:
                r = 1 if a <= b else 0
            elif op == OP_GT:
                r = 1 if a > b else 0
            elif op == OP_GE:
                r = 1 if a >= b else 0
            elif op == OP_AND:
                r = 1 if (a != 0 and b != 0) else 0
            elif op == OP_OR:
                r = 1 if (a != 0 or b != 0) else 0
            else:
                r = 0
            stack[sp - 1] = r
    res = length == 0 or stack[sp - 1] != 0
    pin(prog)
    pin(row)
    pin(stack)
    return res


@njit(cache=True, nogil=True)
def run_filter(prog: np.ndarray, start: int, length: int, row: np.ndarray, stack: np.ndarray) -> bool:
    """Evaluate instructions prog[start:start+length] on one parsed packet row; empty means accept."""
    return run_filter_at(prog, start, length, row, 0, stack)


def new_stack() -> np.ndarray:
    return np.zeros(MAX_STACK, dtype=np.int64)
