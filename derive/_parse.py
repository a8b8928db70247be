"""Safe parsing of regularizer text into SymPy expressions.

Nothing the user types is evaluated as Python.  The text is parsed by
:func:`ast.parse` into a syntax tree and every node is checked against a
whitelist: numbers, the symbol ``p`` (and declared parameter names), the
constants ``pi`` and ``E``, the operators ``+ - * / ** ^`` and calls of the
functions in :data:`FUNCTIONS`, by name, with one positional argument (a call
of anything else, such as ``exp(p)(p)`` or ``(p**2)(7)``, is refused).  Each accepted
node is then turned into the corresponding SymPy object directly; ``eval``,
``sympify`` and ``parse_expr`` are never called on user text.

The text must be printable ASCII: Python folds look-alike letters such as the
fullwidth ``ｐ`` into ``p`` when it parses names, so any other character is
refused with its Unicode name.  Number literals are read exactly from their
digits (``0.1`` is ``1/10``, ``1e-30`` is ``10**-30``), never through a binary
float; a nonzero literal must lie within ``[1e-100, 1e100]`` in magnitude.
"""

from __future__ import annotations

import ast
import io
import tokenize
import unicodedata
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from types import MappingProxyType

import sympy as sp

from .errors import DerivationError

__all__ = ["FUNCTIONS", "parse_expression"]

#: Functions accepted in regularizer text, by the name the user types (read-only).
FUNCTIONS: Mapping[str, object] = MappingProxyType({
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
})

_CONSTANTS = {"pi": sp.pi, "E": sp.E}
_MAX_LENGTH = 2000
_MAX_DEPTH = 60
_MAX_EXPONENT = 1000
#: Nonzero number literals must lie in [10**-_MAX_DECADE, 10**_MAX_DECADE] in magnitude.
_MAX_DECADE = 100

# what each refused kind of syntax is, in words
_SYNTAX_WORDS = {
    "Attribute": "attribute access",
    "Subscript": "indexing",
    "Slice": "slicing",
    "Compare": "comparison",
    "BoolOp": "and/or",
    "IfExp": "a conditional expression",
    "Lambda": "a lambda",
    "NamedExpr": "an assignment expression",
    "Await": "await",
    "Yield": "yield",
    "YieldFrom": "yield",
    "Tuple": "a tuple",
    "List": "a list",
    "Set": "a set",
    "Dict": "a dict",
    "ListComp": "a comprehension",
    "SetComp": "a comprehension",
    "DictComp": "a comprehension",
    "GeneratorExp": "a generator expression",
    "JoinedStr": "an f-string",
    "FormattedValue": "an f-string",
    "Starred": "a starred argument",
}
_OPERATOR_WORDS = {
    "Mod": "%",
    "FloorDiv": "//",
    "MatMult": "@",
    "LShift": "<<",
    "RShift": ">>",
    "BitOr": "|",
    "BitXor": "^",
    "BitAnd": "&",
    "Invert": "~",
    "Not": "not",
}


# letters that NFKC leaves alone but that look like the Latin ones a regularizer uses
_LOOK_ALIKES = {
    "\u0440": "p",  # CYRILLIC SMALL LETTER ER
    "\u03c1": "p",  # GREEK SMALL LETTER RHO
    "\u0435": "e",  # CYRILLIC SMALL LETTER IE
    "\u043e": "o",  # CYRILLIC SMALL LETTER O
    "\u03bf": "o",  # GREEK SMALL LETTER OMICRON
    "\u0441": "c",  # CYRILLIC SMALL LETTER ES
    "\u0430": "a",  # CYRILLIC SMALL LETTER A
    "\u0445": "x",  # CYRILLIC SMALL LETTER HA
    "\u0456": "i",  # CYRILLIC SMALL LETTER BYELORUSSIAN-UKRAINIAN I
    "\u2212": "-",  # MINUS SIGN
    "\u00d7": "*",  # MULTIPLICATION SIGN
    "\u00b7": "*",  # MIDDLE DOT
}


def _check_characters(text: str) -> None:
    """Refuse anything but printable ASCII, naming the character and where it is."""
    for pos, ch in enumerate(text, start=1):
        if " " <= ch <= "~" or ch in "\t\n":
            continue
        name = unicodedata.name(ch, "a control character" if unicodedata.category(ch).startswith("C") else "unnamed")
        folded = _LOOK_ALIKES.get(ch) or unicodedata.normalize("NFKC", ch)
        hint = f" (did you mean {folded!r}?)" if folded.isascii() and folded.isprintable() and folded.strip() else ""
        raise DerivationError(
            f"character {ch!r} (U+{ord(ch):04X} {name}) at position {pos} is not allowed: "
            f"regularizer text is plain ASCII{hint}"
        )


def _literal(node: ast.Constant, source: str) -> sp.Expr:
    """The number a literal stands for, read exactly from its digits."""
    value = node.value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "an imaginary number" if isinstance(value, complex) else f"a {type(value).__name__}"
        raise DerivationError(f"only real numbers are accepted as constants, got {value!r} ({kind})")
    if isinstance(value, int):
        if abs(value) > 10**_MAX_DECADE:
            raise DerivationError(f"integer constant {value} is too large (limit 1e{_MAX_DECADE})")
        return sp.Integer(value)
    digits = (ast.get_source_segment(source, node) or repr(value)).replace("_", "")
    try:
        exact = Decimal(digits)
    except InvalidOperation:  # pragma: no cover - Python accepted it as a float literal
        raise DerivationError(f"cannot read the number {digits!r}") from None
    if exact != 0 and not -_MAX_DECADE <= exact.adjusted() < _MAX_DECADE:
        raise DerivationError(
            f"number {digits} is outside [1e-{_MAX_DECADE}, 1e{_MAX_DECADE}] in magnitude; "
            "regattn's numeric side cannot represent it"
        )
    return sp.Rational(Fraction(exact))


class _Converter:
    def __init__(self, symbols: Mapping[str, sp.Symbol], source: str):
        self.symbols = dict(symbols)
        self.source = source

    def _segment(self, node: ast.AST) -> str:
        text = ast.get_source_segment(self.source, node) or ""
        text = " ".join(text.split())
        return text if len(text) <= 60 else text[:57] + "..."

    def _allowed(self) -> str:
        return (
            f"a regularizer uses numbers, {', '.join(sorted(self.symbols) + ['pi', 'E'])}, + - * / ** ^ "
            f"and the functions {', '.join(sorted(FUNCTIONS))}"
        )

    def convert(self, node: ast.AST, depth: int = 0) -> sp.Expr:
        if depth > _MAX_DEPTH:
            raise DerivationError(f"expression nests deeper than {_MAX_DEPTH} levels")
        kind = type(node).__name__
        method = getattr(self, "_" + kind, None)
        if method is None:
            words = _SYNTAX_WORDS.get(kind, "this syntax")
            raise DerivationError(f"{kind} is not allowed: {words} `{self._segment(node)}`; {self._allowed()}")
        result = method(node, depth + 1)
        if result.has(sp.nan, sp.zoo, sp.oo, -sp.oo):
            value = "undefined (nan)" if result.has(sp.nan) else "infinite"
            raise DerivationError(f"`{self._segment(node)}` is {value}: a regularizer must be finite")
        return result

    def _Expression(self, node: ast.Expression, depth: int) -> sp.Expr:
        return self.convert(node.body, depth)

    def _Constant(self, node: ast.Constant, depth: int) -> sp.Expr:
        return _literal(node, self.source)

    def _Name(self, node: ast.Name, depth: int) -> sp.Expr:
        if node.id in self.symbols:
            return self.symbols[node.id]
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        if node.id in FUNCTIONS:
            raise DerivationError(f"function {node.id!r} must be called, as in {node.id}(p)")
        raise DerivationError(
            f"unknown name {node.id!r}: a regularizer may use only "
            f"{', '.join(sorted(self.symbols) + ['pi', 'E'])} and numbers"
        )

    def _UnaryOp(self, node: ast.UnaryOp, depth: int) -> sp.Expr:
        operand = self.convert(node.operand, depth)
        if isinstance(node.op, ast.USub):
            return -operand
        if isinstance(node.op, ast.UAdd):
            return operand
        raise DerivationError(f"operator {_OPERATOR_WORDS.get(type(node.op).__name__, '?')} is not allowed; {self._allowed()}")

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
        raise DerivationError(f"operator {_OPERATOR_WORDS.get(type(op).__name__, '?')} is not allowed; {self._allowed()}")

    def _Call(self, node: ast.Call, depth: int) -> sp.Expr:
        if not isinstance(node.func, ast.Name):
            self.convert(node.func, depth)  # refuses the callee's own syntax first: attribute access, a lambda, ...
            raise DerivationError(
                f"`{self._segment(node.func)}` is not a function: only a function's name may be called, "
                f"as in exp(p), in `{self._segment(node)}`; allowed: {', '.join(sorted(FUNCTIONS))}"
            )
        if node.func.id not in FUNCTIONS:
            name = node.func.id
            raise DerivationError(
                f"unknown function {name!r}: {name!r} is not allowed; allowed: {', '.join(sorted(FUNCTIONS))}"
            )
        if node.keywords:
            raise DerivationError(f"{node.func.id}() takes no keyword arguments")
        if len(node.args) != 1:
            raise DerivationError(
                f"{node.func.id}() takes exactly one argument, got {len(node.args)}"
            )
        if isinstance(node.args[0], ast.Starred):
            raise DerivationError(f"starred arguments are not allowed: `{self._segment(node)}`")
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
        If the text is not an expression, is too long or deep, holds a
        character other than printable ASCII, a number outside
        ``[1e-100, 1e100]``, or a name, operator or function outside the
        whitelist.  The message is one line.
    """
    if not isinstance(text, str):
        raise DerivationError(f"regularizer text must be a str, got {type(text).__name__}")
    if len(text) > _MAX_LENGTH:
        raise DerivationError(f"regularizer text is {len(text)} characters long (limit {_MAX_LENGTH})")
    _check_characters(text)
    if not text.strip():
        raise DerivationError("regularizer text is empty")
    source = _xor_to_pow(text.strip())
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise DerivationError(f"cannot parse {text!r}: {getattr(exc, 'msg', exc)}") from None
    return _Converter(symbols, source).convert(tree)
