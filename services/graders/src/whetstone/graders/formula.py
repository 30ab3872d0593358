"""`calculate_output` of a multi grader: a small arithmetic language, parsed here, never `eval`ed.

    expr   := term (("+" | "-") term)*
    term   := unary (("*" | "/") unary)*
    unary  := ("-" | "+") unary | power
    power  := atom ("^" unary)?
    atom   := NUMBER | NAME | FUNC "(" expr ("," expr)* ")" | "(" expr ")"

NAME is one of the multi grader's grader names (the keys of `graders`); FUNC is min, max, abs,
floor, ceil, sqrt, exp or log. Anything else (an unknown name, `__import__`, attribute access,
strings, a call of something that is not one of those functions) is a `FormulaError` naming the
position. Evaluation is over floats: a division by zero or a math domain error is an
`EvaluationError`, not a crash."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

MAX_DEPTH = 64
TOKEN = re.compile(r"\s*(?:(?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)"
                   r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>[-+*/^(),]))")
FUNCTIONS: dict[str, tuple[Callable[..., float], int, int]] = {   # name -> (function, min args, max args)
    "min": (min, 1, 64), "max": (max, 1, 64), "abs": (abs, 1, 1), "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1), "sqrt": (math.sqrt, 1, 1), "exp": (math.exp, 1, 1), "log": (math.log, 1, 1),
}


class FormulaError(ValueError):
    """The formula cannot be parsed, or names something that is not a grader."""


class EvaluationError(ArithmeticError):
    """The formula parsed but its value is undefined for these scores (x/0, log(0), overflow)."""


@dataclass(frozen=True)
class Num:
    value: float


@dataclass(frozen=True)
class Name:
    name: str


@dataclass(frozen=True)
class Unary:
    op: str
    operand: Node


@dataclass(frozen=True)
class Binary:
    op: str
    left: Node
    right: Node


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Node, ...]


Node = Num | Name | Unary | Binary | Call


def tokenize(text: str) -> list[tuple[str, str, int]]:
    out, pos = [], 0
    while pos < len(text):
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            break
        match = TOKEN.match(text, pos)
        if match is None:
            raise FormulaError(f"unexpected character {text[pos]!r} at position {pos}")
        kind = match.lastgroup or ""
        out.append((kind, match.group(kind), match.start(kind)))
        pos = match.end()
    return out


class Parser:
    def __init__(self, text: str, names: frozenset[str]) -> None:
        self.tokens = tokenize(text)
        self.names = names
        self.i = 0
        self.depth = 0

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str, int]:
        token = self.peek()
        if token is None:
            raise FormulaError(f"unexpected end of formula{f', expected {value!r}' if value else ''}")
        if value is not None and token[1] != value:
            raise FormulaError(f"expected {value!r} at position {token[2]}, found {token[1]!r}")
        self.i += 1
        return token

    def parse(self) -> Node:
        if not self.tokens:
            raise FormulaError("the formula is empty")
        node = self.expr()
        extra = self.peek()
        if extra is not None:
            raise FormulaError(f"unexpected {extra[1]!r} at position {extra[2]}")
        return node

    def nested(self, parse: Callable[[], Node]) -> Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise FormulaError(f"the formula nests deeper than {MAX_DEPTH} levels")
        try:
            return parse()
        finally:
            self.depth -= 1

    def expr(self) -> Node:
        node = self.term()
        while (t := self.peek()) is not None and t[1] in "+-" and t[0] == "op":
            self.take()
            node = Binary(t[1], node, self.term())
        return node

    def term(self) -> Node:
        node = self.unary()
        while (t := self.peek()) is not None and t[1] in "*/" and t[0] == "op":
            self.take()
            node = Binary(t[1], node, self.unary())
        return node

    def unary(self) -> Node:
        t = self.peek()
        if t is not None and t[0] == "op" and t[1] in "+-":
            self.take()
            return Unary(t[1], self.nested(self.unary))
        return self.power()

    def power(self) -> Node:
        base = self.atom()
        t = self.peek()
        if t is not None and t[1] == "^":
            self.take()
            return Binary("^", base, self.nested(self.unary))
        return base

    def atom(self) -> Node:
        kind, value, pos = self.take()
        if kind == "num":
            return Num(float(value))
        if kind == "name":
            nxt = self.peek()
            if nxt is not None and nxt[1] == "(":
                if value not in FUNCTIONS:
                    raise FormulaError(f"{value!r} at position {pos} is not a function "
                                       f"(functions: {', '.join(FUNCTIONS)})")
                return self.call(value, pos)
            if value not in self.names:
                raise FormulaError(f"{value!r} at position {pos} is not one of the graders "
                                   f"({', '.join(sorted(self.names)) or 'none'})")
            return Name(value)
        if value == "(":
            node = self.nested(self.expr)
            self.take(")")
            return node
        raise FormulaError(f"unexpected {value!r} at position {pos}")

    def call(self, func: str, pos: int) -> Node:
        self.take("(")
        args = [self.nested(self.expr)]
        while (t := self.peek()) is not None and t[1] == ",":
            self.take()
            args.append(self.nested(self.expr))
        self.take(")")
        _, low, high = FUNCTIONS[func]
        if not low <= len(args) <= high:
            raise FormulaError(f"{func}() at position {pos} takes {low if low == high else f'{low} to {high}'} "
                               f"argument(s), got {len(args)}")
        return Call(func, tuple(args))


def parse(text: str, names: frozenset[str] | set[str]) -> Node:
    """The formula's tree; every name in it is one of `names`."""
    return Parser(text, frozenset(names)).parse()


def evaluate(node: Node, scores: Mapping[str, float]) -> float:
    try:
        value = float(_eval(node, scores))
    except ZeroDivisionError as exc:
        raise EvaluationError("division by zero") from exc
    except (OverflowError, ValueError) as exc:
        raise EvaluationError(str(exc)) from exc
    if not math.isfinite(value):
        raise EvaluationError(f"the formula's value is {value}")
    return value


def _eval(node: Node, scores: Mapping[str, float]) -> float:
    match node:
        case Num(value):
            return value
        case Name(name):
            return scores[name]
        case Unary(op, operand):
            v = _eval(operand, scores)
            return -v if op == "-" else v
        case Binary(op, left, right):
            a, b = _eval(left, scores), _eval(right, scores)
            if op == "+":
                return a + b
            if op == "-":
                return a - b
            if op == "*":
                return a * b
            if op == "/":
                return a / b
            return math.pow(a, b)
        case Call(func, args):
            values = [_eval(a, scores) for a in args]
            return float(FUNCTIONS[func][0](*values))
    raise EvaluationError(f"unknown node {node!r}")


def names_in(node: Node) -> set[str]:
    match node:
        case Name(name):
            return {name}
        case Unary(_, operand):
            return names_in(operand)
        case Binary(_, left, right):
            return names_in(left) | names_in(right)
        case Call(_, args):
            return set().union(*(names_in(a) for a in args))
    return set()
