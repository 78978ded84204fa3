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

    def adjacent(ts: list[tokenize.TokenInfo], i: int) -> bool:  # no space before ts[i]
        return i > 0 and ts[i].start[1] == ts[i - 1].end[1]

    def assigned_at(ts: list[tokenize.TokenInfo], i: int) -> int | None:
        """Where the ``=`` is if ts[i:] begins WORD= (WORD: tokens with no space between, so
        `1x` or `a.b` too, for the message that says it is not a name); else None."""
        j = i + 1
        while j < len(ts) and ts[j].string != "=" and adjacent(ts, j):
            j += 1
        return j if j < len(ts) and ts[j].string == "=" else None

    word = prog.split()[-1]
    api = "mesh.select([0]).push(lr=0.1)" if word == "push" else f"mesh.select([0, 1]).{word}('part', data)"

    # Cut the tokens into items: at commas outside brackets, and where a WORD= begins.
    pieces: list[list[tokenize.TokenInfo]] = [[]]
    depth = lambdas = 0
    for i, t in enumerate(toks):
        if t.type == tokenize.OP and depth == 0 and not lambdas and t.string == ",":
            pieces.append([])
            continue
        spaced = not adjacent(toks, i)  # `a=b=1` is one item
        if (
            spaced and depth == 0 and t.string == "-" and i + 2 < len(toks) and toks[i + 1].string == "-"
            and toks[i + 2].type == tokenize.NAME and adjacent(toks, i + 1) and adjacent(toks, i + 2)
        ):  # `x=1 --ranks 0` read as 1 - (-ranks), then an item `0`
            raise UsageError(
                f"{prog} takes no options, got '--{toks[i + 2].string}': it sends to every rank; "
                f"for some ranks only, use the mesh, e.g. {api}"
            )
        if spaced and depth == 0 and not lambdas and pieces[-1] and assigned_at(toks, i) is not None:
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

    def not_a_name(what: str, ts: list[tokenize.TokenInfo]) -> UsageError:
        item = src(ts[0], ts[-1])
        where = f" (in {item!r})" if item != what else ""
        return UsageError(f"{prog}: {what!r}{where} is not a valid Python name; {usage}")

    def bare(ts: list[tokenize.TokenInfo]) -> list[tuple[str, str]]:
        words: list[list[tokenize.TokenInfo]] = []
        for i, t in enumerate(ts):
            if adjacent(ts, i):
                words[-1].append(t)
            else:
                words.append([t])
        for w in words:
            if len(w) > 1 or w[0].type != tokenize.NAME or keyword.iskeyword(w[0].string):
                raise not_a_name(src(w[0], w[-1]), ts)
        return [(w[0].string, w[0].string) for w in words]

    out: list[tuple[str, str]] = []
    for piece in pieces:
        if not piece:
            continue
        at = assigned_at(piece, 0)
        if at is None:
            out.extend(bare(piece))
            continue
        if at != 1 or piece[0].type != tokenize.NAME or keyword.iskeyword(piece[0].string):
            raise not_a_name(src(piece[0], piece[at - 1]), piece)
        name, body = piece[0].string, piece[2:]
        if not body:
            raise UsageError(f"{prog}: nothing after '=' in {src(piece[0], piece[-1])!r}; {usage}")
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
