"""What ``%mesh push`` / ``%mesh scatter`` take: ``NAME=EXPRESSION`` items (any Python expression,
spaces and all) and bare names, read with Python's own tokenizer and parser; every mistake is a
one-line UsageError.

>>> parse_assignments("lr=0.1 * 2, model")
[('lr', '0.1 * 2'), ('model', 'model')]
"""

from __future__ import annotations

import ast
import io
import keyword
import tokenize

from IPython.core.error import UsageError


def parse_assignments(text: str, prog: str = "%mesh push", example: str = "`%mesh push lr=0.1`") -> list[tuple[str, str]]:
    """``a=1 + 2, b=f(x, y) c`` -> ``[("a", "1 + 2"), ("b", "f(x, y)"), ("c", "c")]``.

    Items are separated by commas or spaces; an item is NAME=EXPRESSION (any Python expression,
    spaces and all) or a bare NAME (pushed under its own name). A new item starts at a NAME
    followed by ``=`` outside brackets (``f(a=1)`` and ``lambda a=1: a`` stay one expression).
    """
    usage = f"give NAME=EXPRESSION or NAME, e.g. {example}"
    text = text.strip()
    try:
        toks = [
            t for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type not in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT)
        ]
    except (tokenize.TokenError, SyntaxError) as e:
        msg = e.args[0] if e.args else str(e)
        raise UsageError(f"{prog}: cannot parse {text!r} ({msg}); {usage}") from None
    bad = next((t for t in toks if t.type == tokenize.ERRORTOKEN and t.string.strip()), None)
    if bad is not None:
        raise UsageError(f"{prog}: cannot parse {text!r} (at {bad.string!r}); {usage}")

    def src(a: tokenize.TokenInfo, b: tokenize.TokenInfo) -> str:
        return text[a.start[1] : b.end[1]]

    # Cut the tokens into items: at commas outside brackets, and where a NAME= begins.
    pieces: list[list[tokenize.TokenInfo]] = [[]]
    depth = lambdas = 0
    for i, t in enumerate(toks):
        if t.type == tokenize.OP and depth == 0 and not lambdas and t.string == ",":
            pieces.append([])
            continue
        starts_item = (
            depth == 0 and not lambdas and t.type == tokenize.NAME and not keyword.iskeyword(t.string)
            and i + 1 < len(toks) and toks[i + 1].string == "="
            and (i == 0 or t.start[1] > toks[i - 1].end[1])  # after a space: `a=b=1` is one item
        )
        if starts_item and pieces[-1]:
            pieces.append([])
        pieces[-1].append(t)
        if t.type == tokenize.OP:
            if t.string in "([{":
                depth += 1
            elif t.string in ")]}":
                depth = max(depth - 1, 0)
            elif t.string == ":" and depth == 0 and lambdas:
                lambdas -= 1
        elif t.string == "lambda" and depth == 0:
            lambdas += 1

    def bare(ts: list[tokenize.TokenInfo]) -> list[tuple[str, str]]:
        for t in ts:
            if t.type != tokenize.NAME or keyword.iskeyword(t.string):
                raise UsageError(f"{prog}: {usage}; got {src(ts[0], ts[-1])!r}")
        return [(t.string, t.string) for t in ts]

    out: list[tuple[str, str]] = []
    for piece in pieces:
        if not piece:
            continue
        if len(piece) < 2 or piece[1].string != "=" or piece[0].type != tokenize.NAME:
            out.extend(bare(piece))
            continue
        name, body = piece[0].string, piece[2:]
        if keyword.iskeyword(name) or not body:
            raise UsageError(f"{prog}: {usage}; got {src(piece[0], piece[-1])!r}")
        # `a=1 b c`: bare names may follow the expression, after a space
        cuts = [len(body)]
        for cut in range(len(body) - 1, 0, -1):
            if not (body[cut].type == tokenize.NAME and not keyword.iskeyword(body[cut].string)):
                break
            if body[cut].start[1] > body[cut - 1].end[1]:
                cuts.append(cut)
        errors = []
        for cut in cuts:
            expr = src(body[0], body[cut - 1])
            try:
                ast.parse(expr, mode="eval")
            except SyntaxError as e:
                errors.append(e.msg)
                continue
            out.append((name, expr))
            out.extend(bare(body[cut:]))
            break
        else:
            raise UsageError(
                f"{prog}: {name}={src(body[0], body[-1])} is not a Python expression ({errors[0]}); {usage}"
            )
    return out
