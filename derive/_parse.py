"""Safe parsing of regularizer text into SymPy expressions.

Nothing the user types is evaluated as Python.  The text is parsed by
:func:`ast.parse` into a syntax tree and every node is checked against a
whitelist: numbers, the symbol ``p`` (and declared parameter names), the
constants ``pi`` and ``E``, the operators ``+ - * / ** ^`` and calls of a fixed
set of functions with positional arguments.  Each accepted node is then turned
into the corresponding SymPy object directly; ``eval``, ``sympify`` and
``parse_expr`` are never called on user text.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Mapping
from fractions import Fraction

import sympy as sp

from .errors import DerivationError

__all__ = ["FUNCTIONS", "parse_expression"]

#: Functions accepted in regularizer text, by the name the user types.
FUNCTIONS: Mapping[str, object] = {
    "log": sp.log,
    "ln": sp.log,
    "exp": sp.exp,
    "sqrt": sp.sqrt,
    "cbrt": sp.cbrt,
    "sin": sp.sin,
    "cos": sp.cos,
    "tan": sp.tan,
    "sinh": sp.sinh,
    "cosh": sp.cosh,
    "tanh": sp.tanh,
    "asinh": sp.asinh,
    "atan": sp.atan,
    "erf": sp.erf,
}

_CONSTANTS = {"pi": sp.pi, "E": sp.E}
_MAX_LENGTH = 2000
_MAX_DEPTH = 60
_MAX_EXPONENT = 1000


def _number(value: object) -> sp.Expr:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DerivationError(f"only real numbers are accepted as constants, got {value!r}")
    if isinstance(value, float):
        # decimal text such as 0.1 becomes the exact rational 1/10
        return sp.Rational(str(Fraction(repr(value))))
    if abs(value) > 10**100:
        raise DerivationError(f"integer constant {value} is too large (limit 1e100)")
    return sp.Integer(value)


class _Converter:
    def __init__(self, symbols: Mapping[str, sp.Symbol]):
        self.symbols = dict(symbols)

    def convert(self, node: ast.AST, depth: int = 0) -> sp.Expr:
        if depth > _MAX_DEPTH:
            raise DerivationError(f"expression nests deeper than {_MAX_DEPTH} levels")
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            raise DerivationError(
                f"{type(node).__name__} is not allowed in a regularizer; use numbers, "
                f"{', '.join(sorted(self.symbols))}, + - * / ** and the functions "
                f"{', '.join(sorted(FUNCTIONS))}"
            )
        return method(node, depth + 1)

    def _Expression(self, node: ast.Expression, depth: int) -> sp.Expr:
        return self.convert(node.body, depth)

    def _Constant(self, node: ast.Constant, depth: int) -> sp.Expr:
        return _number(node.value)

    def _Name(self, node: ast.Name, depth: int) -> sp.Expr:
        if node.id in self.symbols:
            return self.symbols[node.id]
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        if node.id in FUNCTIONS:
            raise DerivationError(f"function {node.id!r} must be called, as in {node.id}(p)")
        raise DerivationError(
            f"unknown name {node.id!r}: a regularizer may use only "
            f"{', '.join(sorted(self.symbols))}, pi and E"
        )

    def _UnaryOp(self, node: ast.UnaryOp, depth: int) -> sp.Expr:
        operand = self.convert(node.operand, depth)
        if isinstance(node.op, ast.USub):
            return -operand
        if isinstance(node.op, ast.UAdd):
            return operand
        raise DerivationError(f"operator {type(node.op).__name__} is not allowed")

    def _BinOp(self, node: ast.BinOp, depth: int) -> sp.Expr:
        left = self.convert(node.left, depth)
        right = self.convert(node.right, depth)
        op = node.op
        if isinstance(op, ast.Add):
            return left + right
        if isinstance(op, ast.Sub):
            return left - right
        if isinstance(op, ast.Mult):
            return left * right
        if isinstance(op, ast.Div):
            if right == 0:
                raise DerivationError("division by zero in the regularizer")
            return left / right
        if isinstance(op, ast.Pow):
            if right.is_Number and abs(right) > _MAX_EXPONENT:
                raise DerivationError(f"exponent {right} is too large (limit {_MAX_EXPONENT})")
            if left.is_Number and right.is_Number and abs(left) > 1:
                if float(abs(right)) * float(sp.log(abs(left), 10)) > 100:
                    raise DerivationError(f"constant {left}**{right} is too large (limit 1e100)")
            return sp.Pow(left, right)
        raise DerivationError(f"operator {type(op).__name__} is not allowed")

    def _Call(self, node: ast.Call, depth: int) -> sp.Expr:
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            name = node.func.id if isinstance(node.func, ast.Name) else ast.dump(node.func)
            raise DerivationError(
                f"function {name!r} is not allowed; allowed: {', '.join(sorted(FUNCTIONS))}"
            )
        if node.keywords:
            raise DerivationError(f"{node.func.id}() takes no keyword arguments")
        if len(node.args) != 1:
            raise DerivationError(
                f"{node.func.id}() takes exactly one argument, got {len(node.args)}"
            )
        if isinstance(node.args[0], ast.Starred):
            raise DerivationError("starred arguments are not allowed")
        return FUNCTIONS[node.func.id](self.convert(node.args[0], depth))


def _xor_to_pow(text: str) -> str:
    """Rewrite the token ``^`` as ``**`` (power, with power's precedence)."""
    if "^" not in text:
        return text
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError) as exc:
        raise DerivationError(f"cannot parse {text!r}: {exc}") from None
    out = [(tok.type, "**" if tok.type == tokenize.OP and tok.string == "^" else tok.string) for tok in tokens]
    return tokenize.untokenize(out).strip()


def parse_expression(text: str, symbols: Mapping[str, sp.Symbol]) -> sp.Expr:
    """Parse ``text`` into a SymPy expression without evaluating any code.

    Parameters
    ----------
    text:
        The expression, e.g. ``"p*log(p) + p**2/2"``; ``^`` means power.
    symbols:
        The names the text may use, mapped to their SymPy symbols.

    Raises
    ------
    DerivationError
        If the text is not an expression, is too long or deep, or uses a name,
        operator or function outside the whitelist.
    """
    if not isinstance(text, str):
        raise DerivationError(f"regularizer text must be a str, got {type(text).__name__}")
    if len(text) > _MAX_LENGTH:
        raise DerivationError(f"regularizer text is {len(text)} characters long (limit {_MAX_LENGTH})")
    if not text.strip():
        raise DerivationError("regularizer text is empty")
    try:
        tree = ast.parse(_xor_to_pow(text.strip()), mode="eval")
    except SyntaxError as exc:
        raise DerivationError(f"cannot parse {text!r}: {exc.msg}") from None
    return _Converter(symbols).convert(tree)
