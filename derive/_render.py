"""The steps of a derivation as LaTeX and as plain text.

Both renderings walk the same list of :class:`_Step` objects, so the text the
CLI prints and the LaTeX a researcher pastes say the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from .argmax import Derivation


@dataclass(frozen=True)
class _Step:
    title: str
    prose: str
    lines: tuple[tuple[str, str, object], ...]  # (latex lhs, text lhs, rhs expr or text)
    tex: str = ""  # the prose in LaTeX; defaults to the escaped plain prose


def _steps(dv: Derivation) -> list[_Step]:
    reg = dv.regularizer
    params = ", ".join(f"{q.symbol} in ({q.lower}, {q.upper})" for q in reg.parameters)
    out = [
        _Step(
            "Problem",
            "Regularized argmax over the simplex with a separable regularizer"
            + (f" (parameters: {params})" if params else "")
            + ".",
            (
                (r"p^\star(s)", "p*(s)", r"\arg\max_{p \in \triangle^{d}} \langle p, s \rangle - \sum_{i} \omega(p_i)"),
                (r"\omega(p)", "omega(p)", dv.omega),
            ),
        ),
        _Step(
            "Derivatives",
            f"Strict convexity: {dv.convexity}.",
            ((r"\omega'(p)", "omega'(p)", dv.omega_prime), (r"\omega''(p)", "omega''(p)", dv.omega_second)),
        ),
        _Step(
            "KKT conditions",
            "Lagrangian <p, s> - Omega(p) - tau (1^T p - 1) + mu^T p; stationarity, dual "
            "feasibility and complementary slackness:",
            (
                (r"\omega'(p_i)", "omega'(p_i)", r"s_i - \tau + \mu_i,\quad \mu_i \ge 0,\quad \mu_i p_i = 0"),
            ),
            r"With the Lagrangian $\langle p, s\rangle - \Omega(p) - \tau(\mathbf{1}^\top p - 1) + \mu^\top p$, "
            r"stationarity, dual feasibility and complementary slackness read:",
        ),
    ]
    inv = dv.inversion
    link_lines: list = []
    if dv.link is not None:
        link_lines.append((r"g(z) = (\omega')^{-1}(z)", "g(z) = (omega')^-1(z)", dv.link))
    link_lines.append((r"p_{\text{next}}", "Newton step p_next", inv.newton_step))
    out.append(
        _Step(
            "Link",
            f"On the support p_i = g(z_i), z_i = s_i - tau. Numeric inversion: {inv.method} ({inv.reason}).",
            tuple(link_lines),
            rf"On the support $p_i = g(z_i)$ with $z_i = s_i - \tau$. Numeric inversion: "
            rf"\texttt{{{inv.method}}} ({_latex_escape(inv.reason)}).",
        )
    )
    support = (
        "omega'(0+) is finite, so the map is sparse: p_i = 0 where s_i - tau <= omega'(0+)."
        if dv.sparse
        else "omega'(0+) = -oo, so the map is dense: every p_i > 0."
    )
    support_tex = (
        r"$\omega'(0^+)$ is finite, so the map is sparse: $p_i = 0$ where $s_i - \tau \le \omega'(0^+)$."
        if dv.sparse
        else r"$\omega'(0^+) = -\infty$, so the map is dense: every $p_i > 0$."
    )
    out.append(
        _Step(
            "Support",
            support,
            ((r"\omega'(0^+)", "omega'(0+)", dv.clip), (r"\omega(0^+)", "omega(0+)", dv.omega_zero)),
            support_tex,
        )
    )
    out.append(
        _Step(
            "Jacobian",
            "Differentiating the KKT system on the support gives J = diag(w) - w w^T / sum(w).",
            (
                (r"w(p) = 1/\omega''(p)", "w(p) = 1/omega''(p)", dv.weight),
                (r"J v", "J v", r"w \odot v - w \, \frac{w^\top v}{\mathbf{1}^\top w}"),
            ),
            r"Differentiating the KKT system on the support gives "
            r"$J = \operatorname{diag}(w) - w w^\top / \mathbf{1}^\top w$.",
        )
    )
    th = dv.threshold
    lines = [
        (r"\sum_{i=1}^{d} g_+(s_i - \tau)", "sum_i g_+(s_i - tau)", sp.Integer(1)),
        (r"\tau \in", "bracket of tau", sp.Tuple(*th.bracket)),
    ]
    if th.kind == "closed":
        prose = "g(s - tau) factors as A(tau) B(s), so tau has a closed form in S = sum_i B(s_i)."
        lines += [(r"B(s)", "B(s)", th.term), (r"\tau", "tau", th.solution), (r"\tau", "tau", th.explicit)]
    elif th.kind == "sort":
        prose = (
            f"The link is a polynomial of degree {th.degree} in tau: with the scores sorted in "
            "decreasing order, S_1 and S_2 the sums of the k largest and of their squares, "
            "tau = tau_k for the largest k with s_(k) - tau_k > omega'(0+)."
        )
        lines += [(r"\tau_k", "tau_k", th.candidate)]
        if th.discriminant is not None:
            lines += [(r"\Delta_k \ge 0", "Delta_k >= 0", th.discriminant)]
        lines += [(r"\text{support}", "support", th.condition)]
    else:
        prose = (
            "No closed form: tau is the root of the equation in the bracket, found by Halley's "
            "method with a bisection safeguard; d/dtau g(s - tau) = -g'(z) and "
            "d2/dtau2 g(s - tau) = g''(z), with g'(z) = w(p), g''(z) = w'(p) w(p)."
        )
        lines += [(r"g'(z)", "g'(z)", th.dlink), (r"g''(z)", "g''(z)", th.d2link)]
    out.append(_Step(f"Threshold ({th.kind})", prose, tuple(lines)))
    if dv.conjugate is not None:
        out.append(
            _Step(
                "Conjugate",
                "Omega*(s) = <p*, s> - Omega(p*) = tau + sum_i omega*_+(s_i - tau).",
                (
                    (r"\omega^*(z) = z g(z) - \omega(g(z))", "omega*(z)", dv.scalar_conjugate),
                    (r"\Omega^*(s)", "Omega*(s)", dv.conjugate),
                ),
                r"$\Omega^*(s) = \langle p^\star, s\rangle - \Omega(p^\star) = \tau + \sum_i \omega^*_+(s_i - \tau)$.",
            )
        )
        out.append(
            _Step(
                "Fenchel-Young loss",
                "Non-negative, zero exactly at y = p*(s); its gradient in s is p*(s) - y.",
                ((r"L(s; y)", "L(s; y)", dv.loss), (r"\nabla_s L", "grad_s L", dv.loss_gradient)),
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
            )
        )
    return out


def render_latex(dv: Derivation) -> str:
    parts = [f"% regattn derivation for {dv.name}: omega(p) = {sp.sstr(dv.omega)}"]
    for step in _steps(dv):
        parts.append(rf"\paragraph{{{step.title}.}} {step.tex or _latex_escape(step.prose)}")
        if step.lines:
            rows = []
            for lhs, _, rhs in step.lines:
                body = rhs if isinstance(rhs, str) else sp.latex(rhs)
                rows.append(rf"  {lhs} &= {body}")
            parts.append("\\begin{align*}\n" + " \\\\\n".join(rows) + "\n\\end{align*}")
    return "\n".join(parts) + "\n"


def _latex_escape(text: str) -> str:
    for a, b in (
        ("\\", r"\textbackslash{}"),
        ("_", r"\_"),
        ("^", r"\^{}"),
        ("&", r"\&"),
        ("%", r"\%"),
        ("#", r"\#"),
        ("<=", r"$\le$"),
        (">=", r"$\ge$"),
        ("<", r"$<$"),
        (">", r"$>$"),
    ):
        text = text.replace(a, b)
    return text


def render_text(dv: Derivation) -> str:
    out = [f"Derivation of the {dv.name} map: omega(p) = {sp.sstr(dv.omega)}", ""]
    for n, step in enumerate(_steps(dv), start=1):
        out.append(f"{n}. {step.title}")
        out.append(f"   {step.prose}")
        for _, lhs, rhs in step.lines:
            if isinstance(rhs, str):
                out.append(f"   {lhs} = {_plain(rhs)}")
                continue
            art = sp.pretty(rhs, use_unicode=True, wrap_line=False)
            if "\n" in art:
                out.append(f"   {lhs} =")
                out.extend("       " + row for row in art.splitlines())
            else:
                out.append(f"   {lhs} = {art}")
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
        (r"\ge", ">="),
        (r"\odot", "*"),
        (r"\, \frac{w^\top v}{\mathbf{1}^\top w}", " (w.v) / sum(w)"),
        (",", ", "),
    ):
        latex = latex.replace(a, b)
    return " ".join(latex.split())


def render_markdown(dv: Derivation) -> str:
    """The steps as Markdown with display math (MyST / MathJax), for documentation pages."""
    parts = [f"Regularizer `omega(p) = {sp.sstr(dv.omega)}` ({dv.name}).", ""]
    for n, step in enumerate(_steps(dv), start=1):
        prose = step.prose.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
        parts.append(f"**{n}. {step.title}.** {prose}")
        parts.append("")
        if step.lines:
            rows = []
            for lhs, _, rhs in step.lines:
                body = rhs if isinstance(rhs, str) else sp.latex(rhs)
                rows.append(f"{lhs} &= {body}")
            parts.append("$$")
            parts.append("\\begin{aligned}\n" + " \\\\\n".join(rows) + "\n\\end{aligned}")
            parts.append("$$")
            parts.append("")
    return "\n".join(parts)
