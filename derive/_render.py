"""The steps of a derivation as LaTeX, Markdown and plain text.

All renderings walk the same list of :class:`_Step` objects, so the text the
CLI prints and the LaTeX a researcher pastes say the same thing.

The LaTeX is a fragment: a comment line, then per step a ``\\paragraph`` line
(prose, with inline math between ``$`` signs) and an ``align*`` environment
with one row per line of maths, ``lhs &rel rhs``: exactly one alignment ``&``
outside the right-hand side, no ``$`` inside the environment.

Each rendering takes the derivation ``dv`` (a :class:`~derive.derivation.Derivation`)
and reads its fields only; the record's own module imports this one
(:meth:`~derive.derivation.Derivation.latex` and its siblings).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sympy as sp


@dataclass(frozen=True)
class _Line:
    """One row of maths: ``lhs rel rhs`` (``rhs`` a SymPy expression or ready LaTeX)."""

    tex_lhs: str
    text_lhs: str
    rhs: object
    rel: str = "="  # the relation in LaTeX
    text_rel: str = "="
    text_rhs: str | None = None  # plain text for a LaTeX ``rhs`` that _plain cannot translate


@dataclass(frozen=True)
class _Step:
    title: str
    prose: str
    lines: tuple[_Line, ...]
    tex: str = ""  # the prose in LaTeX; defaults to the plain prose with its maths typeset


def _bracket_tex(lo: sp.Expr, hi: sp.Expr) -> str:
    return rf"\left[{sp.latex(lo)}, {sp.latex(hi)}\right]"


def _steps(dv) -> list[_Step]:
    reg = dv.regularizer
    params = ", ".join(f"{q.symbol} in ({q.lower}, {q.upper})" for q in reg.parameters)
    params_tex = ", ".join(
        rf"${sp.latex(q.symbol)} \in \left({sp.latex(q.lower)}, {sp.latex(q.upper)}\right)$" for q in reg.parameters
    )
    out = [
        _Step(
            "Problem",
            "Regularized argmax over the simplex with a separable regularizer"
            + (f" (parameters: {params})" if params else "")
            + ".",
            (
                _Line(r"p^\star(s)", "p*(s)", r"\arg\max_{p \in \triangle^{d}} \langle p, s \rangle - \sum_{i} \omega(p_i)"),
                _Line(r"\omega(p)", "omega(p)", dv.omega),
            ),
            "Regularized argmax over the simplex with a separable regularizer"
            + (f" (parameters: {params_tex})" if params else "")
            + ".",
        ),
        _Step(
            "Derivatives",
            f"Strict convexity: {dv.convexity}.",
            (_Line(r"\omega'(p)", "omega'(p)", dv.omega_prime), _Line(r"\omega''(p)", "omega''(p)", dv.omega_second)),
        ),
        _Step(
            "KKT conditions",
            "Lagrangian <p, s> - Omega(p) - tau (1^T p - 1) + mu^T p; stationarity, dual "
            "feasibility and complementary slackness:",
            (
                _Line(r"\omega'(p_i)", "omega'(p_i)", r"s_i - \tau + \mu_i,\quad \mu_i \geq 0,\quad \mu_i p_i = 0"),
            ),
            r"With the Lagrangian $\langle p, s\rangle - \Omega(p) - \tau(\mathbf{1}^\top p - 1) + \mu^\top p$, "
            r"stationarity, dual feasibility and complementary slackness read:",
        ),
    ]
    inv = dv.inversion
    link_lines: list = []
    if dv.link is not None:
        link_lines.append(_Line(r"g(z) = (\omega')^{-1}(z)", "g(z) = (omega')^-1(z)", dv.link))
    link_lines.append(_Line(r"p_{\text{next}}", "Newton step p_next", inv.newton_step))
    out.append(
        _Step(
            "Link",
            f"On the support p_i = g(z_i), z_i = s_i - tau. Numeric inversion: {inv.method} ({inv.reason}).",
            tuple(link_lines),
            rf"On the support $p_i = g(z_i)$ with $z_i = s_i - \tau$. Numeric inversion: "
            rf"\texttt{{{inv.method}}} ({_prose_tex(inv.reason)}).",
        )
    )
    support = (
        "omega'(0+) is finite, so the map is sparse: p_i = 0 where s_i - tau <= omega'(0+)."
        if dv.sparse
        else "omega'(0+) = -oo, so the map is dense: every p_i > 0."
    )
    support_tex = (
        r"$\omega'(0^+)$ is finite, so the map is sparse: $p_i = 0$ where $s_i - \tau \leq \omega'(0^+)$."
        if dv.sparse
        else r"$\omega'(0^+) = -\infty$, so the map is dense: every $p_i > 0$."
    )
    out.append(
        _Step(
            "Support",
            support,
            (_Line(r"\omega'(0^+)", "omega'(0+)", dv.clip), _Line(r"\omega(0^+)", "omega(0+)", dv.omega_zero))
            + (() if dv.omega_one is None else (_Line(r"\omega(1^-)", "omega(1-)", dv.omega_one),)),
            support_tex,
        )
    )
    out.append(
        _Step(
            "Jacobian",
            "Differentiating the KKT system on the support gives J = diag(w) - w w^T / sum(w).",
            (
                _Line(r"w(p) = 1/\omega''(p)", "w(p) = 1/omega''(p)", dv.weight),
                _Line(r"J v", "J v", r"w \odot v - w \, \frac{w^\top v}{\mathbf{1}^\top w}"),
            ),
            r"Differentiating the KKT system on the support gives "
            r"$J = \operatorname{diag}(w) - w w^\top / \mathbf{1}^\top w$.",
        )
    )
    th = dv.threshold
    lo, hi = th.bracket
    lines = [
        _Line(r"\sum_{i=1}^{d} g_+(s_i - \tau)", "sum_i g_+(s_i - tau)", sp.Integer(1)),
        _Line(r"\tau", "tau", _bracket_tex(lo, hi), r"\in", "in", f"[{sp.sstr(lo)}, {sp.sstr(hi)}]"),
    ]
    if th.kind == "closed":
        prose = "g(s - tau) factors as A(tau) B(s), so tau has a closed form in S = sum_i B(s_i)."
        tex = r"$g(s - \tau)$ factors as $A(\tau)\,B(s)$, so $\tau$ has a closed form in $S = \sum_i B(s_i)$."
        lines += [_Line(r"B(s)", "B(s)", th.term), _Line(r"\tau", "tau", th.solution), _Line(r"\tau", "tau", th.explicit)]
    elif th.kind == "sort":
        real = " (tau_k is real where Delta_k >= 0)" if th.discriminant is not None else ""
        real_tex = r" ($\tau_k$ is real where $\Delta_k \geq 0$)" if th.discriminant is not None else ""
        prose = (
            f"The link is a polynomial of degree {th.degree} in tau: with the scores sorted in "
            "decreasing order, S_1 and S_2 the sums of the k largest and of their squares, "
            f"tau = tau_k for the largest k with s_(k) - tau_k > omega'(0+){real}."
        )
        tex = (
            rf"The link is a polynomial of degree {th.degree} in $\tau$: with the scores sorted in "
            r"decreasing order, $S_1$ and $S_2$ the sums of the $k$ largest and of their squares, "
            rf"$\tau = \tau_k$ for the largest $k$ with $s_{{(k)}} - \tau_k > \omega'(0^+)${real_tex}."
        )
        lines += [_Line(r"\tau_k", "tau_k", th.candidate)]
        if th.discriminant is not None:
            lines += [_Line(r"\Delta_k", "Delta_k", th.discriminant)]
        lines += [_Line(r"s_{(k)} \in \text{support}", "s_(k) in support", th.condition, r"\Leftrightarrow", "<=>")]
    else:
        prose = (
            "No closed form: tau is the root of the equation in the bracket, found by Halley's "
            "method with a bisection safeguard; d/dtau g(s - tau) = -g'(z) and "
            "d2/dtau2 g(s - tau) = g''(z), with g'(z) = w(p), g''(z) = w'(p) w(p)."
        )
        tex = (
            r"No closed form: $\tau$ is the root of the equation in the bracket, found by Halley's "
            r"method with a bisection safeguard; $\frac{d}{d\tau} g(s - \tau) = -g'(z)$ and "
            r"$\frac{d^2}{d\tau^2} g(s - \tau) = g''(z)$, with $g'(z) = w(p)$, $g''(z) = w'(p)\,w(p)$."
        )
        lines += [_Line(r"g'(z)", "g'(z)", th.dlink), _Line(r"g''(z)", "g''(z)", th.d2link)]
    out.append(_Step(f"Threshold ({th.kind})", prose, tuple(lines), tex))
    if dv.conjugate is not None:
        out.append(
            _Step(
                "Conjugate",
                "Omega*(s) = <p*, s> - Omega(p*) = tau + sum_i omega*_+(s_i - tau).",
                (
                    _Line(r"\omega^*(z) = z g(z) - \omega(g(z))", "omega*(z)", dv.scalar_conjugate),
                    _Line(r"\Omega^*(s)", "Omega*(s)", dv.conjugate),
                ),
                r"$\Omega^*(s) = \langle p^\star, s\rangle - \Omega(p^\star) = \tau + \sum_i \omega^*_+(s_i - \tau)$.",
            )
        )
        out.append(
            _Step(
                "Fenchel-Young loss",
                "Non-negative, zero exactly at y = p*(s); its gradient in s is p*(s) - y.",
                (_Line(r"L(s; y)", "L(s; y)", dv.loss), _Line(r"\nabla_s L", "grad_s L", dv.loss_gradient)),
                r"Non-negative, zero exactly at $y = p^\star(s)$; its gradient in $s$ is $p^\star(s) - y$.",
            )
        )
    else:
        out.append(
            _Step(
                "Conjugate and loss",
                "The link has no closed form, so Omega*(s) = <p*, s> - Omega(p*) is evaluated "
                "at p*; the Fenchel-Young loss Omega*(s) + Omega(y) - <s, y> has gradient p*(s) - y.",
                (),
                r"The link has no closed form, so $\Omega^*(s) = \langle p^\star, s\rangle - \Omega(p^\star)$ "
                r"is evaluated at $p^\star$; the Fenchel-Young loss $\Omega^*(s) + \Omega(y) - \langle s, y\rangle$ "
                r"has gradient $p^\star(s) - y$.",
            )
        )
    return out


def _row_tex(line: _Line) -> str:
    body = line.rhs if isinstance(line.rhs, str) else sp.latex(line.rhs)
    return f"{line.tex_lhs} &{line.rel} {body}"


def render_latex(dv) -> str:
    parts = [f"% regattn derivation for {_one_line(dv.name)}: omega(p) = {_one_line(sp.sstr(dv.omega))}"]
    for step in _steps(dv):
        parts.append(rf"\paragraph{{{step.title}.}} {step.tex or _prose_tex(step.prose)}")
        if step.lines:
            rows = [f"  {_row_tex(line)}" for line in step.lines]
            parts.append("\\begin{align*}\n" + " \\\\\n".join(rows) + "\n\\end{align*}")
    return "\n".join(parts) + "\n"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _latex_escape(text: str) -> str:
    """Plain prose as LaTeX text: special characters escaped, comparison signs as inline maths."""
    for a, b in (
        ("\\", r"\textbackslash{}"),
        ("{", r"\{"),
        ("}", r"\}"),
        ("$", r"\$"),
        ("_", r"\_"),
        ("^", r"\^{}"),
        ("~", r"\~{}"),
        ("&", r"\&"),
        ("%", r"\%"),
        ("#", r"\#"),
        ("<=", r"$\leq$"),
        (">=", r"$\geq$"),
        ("<", r"$<$"),
        (">", r"$>$"),
    ):
        text = text.replace(a, b)
    return text


# maths inside the plain prose of convexity notes and inversion reasons: omega'(p) = z,
# omega''(p) > 0, omega'', (0, 1], degree >= 3
_PROSE_MATH = re.compile(r"omega('{1,2})(\(p\))?(?: (>|=) ([0-9z]+))?|\(0, 1\]|(>=|<=) ([0-9]+)")
_PROSE_RELATIONS = {">=": r"\geq", "<=": r"\leq", ">": ">", "=": "="}


def _prose_tex(text: str) -> str:
    """Plain prose as LaTeX with its bits of maths (``omega''(p) > 0``, ``(0, 1]``) typeset inline."""
    out, last = [], 0
    for match in _PROSE_MATH.finditer(text):
        out.append(_latex_escape(text[last : match.start()]))
        primes, arg, rel, rhs, bound_rel, bound = match.groups()
        if match.group(0) == "(0, 1]":
            out.append("$(0, 1]$")
        elif bound_rel:
            out.append(f"${_PROSE_RELATIONS[bound_rel]} {bound}$")
        else:
            out.append(f"$\\omega{primes}{arg or ''}" + (f" {_PROSE_RELATIONS[rel]} {rhs}" if rel else "") + "$")
        last = match.end()
    out.append(_latex_escape(text[last:]))
    return "".join(out)


def render_text(dv) -> str:
    out = [f"Derivation of the {dv.name} map: omega(p) = {sp.sstr(dv.omega)}", ""]
    for n, step in enumerate(_steps(dv), start=1):
        out.append(f"{n}. {step.title}")
        out.append(f"   {step.prose}")
        for line in step.lines:
            lhs, rel, rhs = line.text_lhs, line.text_rel, line.rhs
            if isinstance(rhs, str):
                out.append(f"   {lhs} {rel} {line.text_rhs or _plain(rhs)}")
                continue
            art = sp.pretty(rhs, use_unicode=True, wrap_line=False)
            if "\n" in art:
                out.append(f"   {lhs} {rel}")
                out.extend("       " + row for row in art.splitlines())
            else:
                out.append(f"   {lhs} {rel} {art}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _plain(latex: str) -> str:
    for a, b in (
        (r"\arg\max_{p \in \triangle^{d}}", "argmax_{p in simplex}"),
        (r"\langle p, s \rangle", "<p, s>"),
        (r"\sum_{i}", "sum_i"),
        (r"\omega", "omega"),
        (r"\tau", "tau"),
        (r"\mu", "mu"),
        (r"\quad", "  "),
        (r"\geq", ">="),
        (r"\odot", "*"),
        (r"\, \frac{w^\top v}{\mathbf{1}^\top w}", " (w.v) / sum(w)"),
        (",", ", "),
    ):
        latex = latex.replace(a, b)
    return " ".join(latex.split())


def render_markdown(dv) -> str:
    """The steps as Markdown with display math (MyST / MathJax), for documentation pages."""
    parts = [f"Regularizer `omega(p) = {sp.sstr(dv.omega)}` ({dv.name}).", ""]
    for n, step in enumerate(_steps(dv), start=1):
        prose = step.prose.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
        parts.append(f"**{n}. {step.title}.** {prose}")
        parts.append("")
        if step.lines:
            rows = [_row_tex(line) for line in step.lines]
            parts.append("$$")
            parts.append("\\begin{aligned}\n" + " \\\\\n".join(rows) + "\n\\end{aligned}")
            parts.append("$$")
            parts.append("")
    return "\n".join(parts)
