"""What users type after %mesh / %%mesh; mistakes are one-line UsageErrors."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from viceroy.extension.args import (
    parse_command,
    parse_run_options,
    parse_where,
    split_line_code,
)
from viceroy.extension.assignments import parse_assignments
from viceroy.extension.rank_lists import parse_ranks


def test_where_takes_an_index_or_a_range():
    assert parse_where("gpus=0:2") == ("gpus", slice(0, 2))
    assert parse_where("gpus=:2") == ("gpus", slice(None, 2))
    assert parse_where("gpus=-1") == ("gpus", -1)


@pytest.mark.parametrize("bad", ["gpus", "=1", "gpus=", "gpus=a:b", "gpus=1:2:3:4"])
def test_bad_where_says_the_expected_form(bad: str):
    with pytest.raises(UsageError, match="gpus=0:2"):
        parse_where(bad)


def test_dims_may_have_any_python_name():
    # `%mesh up ñ=2` was refused ("dims are NAME=SIZE") while `größe=2` and Mesh.local(ñ=2) worked:
    # the name had to start with an ASCII letter
    assert parse_command("up ñ=2 größe=2").dims == {"ñ": 2, "größe": 2}
    assert parse_where("ñ=0:1") == ("ñ", slice(0, 1))
    assert parse_run_options("--where ñ=1").where == {"ñ": 1}
    with pytest.raises(UsageError, match="NAME=SIZE"):
        parse_command("up 1ñ=2")


def test_ranks_take_lists_and_ranges():
    assert parse_ranks("0,3,5-7") == [0, 3, 5, 6, 7]
    with pytest.raises(UsageError, match="0-2,5"):
        parse_ranks("zero")
    with pytest.raises(UsageError, match=r"^--ranks: the range '3-1' runs backwards; write LOW-HIGH"):
        parse_ranks("0,3-1")  # was dropped without a word: --ranks 0,3-1 ran on rank 0 alone


@pytest.mark.parametrize(
    ("text", "mesh_ranks", "message"),
    [
        (f"0-{10**30}", range(2), f"--ranks: rank(s) 2-{10**30} not in this mesh (its ranks are 0-1)"),
        ("1,0-3000000", range(4), "--ranks: rank(s) 4-3000000 not in this mesh (its ranks are 0-3)"),
        ("0-5,9", [1, 3], "--ranks: rank(s) 0,2,4-5,9 not in this mesh (its ranks are 1,3)"),
        (f"0-{10**30}", None, "--ranks: 0-" + str(10**30) + " goes past rank 1,048,575, the last a mesh can have; "
                              "give ranks of the mesh, e.g. --ranks 0,3"),
        ("0-3000000", None, "--ranks: 0-3000000 goes past rank 1,048,575, the last a mesh can have; "
                            "give ranks of the mesh, e.g. --ranks 0,3"),
    ],
)
def test_ranks_are_checked_against_the_mesh_before_ranges_are_expanded(text, mesh_ranks, message):
    # A range was expanded into a list first: 0-3000000 took seconds to refuse, a longer one
    # ran out of memory (or, this long, raised OverflowError from the expansion).
    with pytest.raises(UsageError) as e:
        parse_ranks(text, mesh_ranks)
    assert str(e.value) == message
    assert parse_ranks("3,0-1", range(4)) == [3, 0, 1]


def test_run_options():
    opts = parse_run_options(
        "--where gpus=0:2 --where hosts=1 --ranks 0 --no-fail-fast --timeout 30"
    )
    assert opts.where == {"gpus": slice(0, 2), "hosts": 1}
    assert opts.ranks == [0] and opts.fail_fast is False and opts.timeout == 30.0
    assert parse_run_options("").fail_fast is True


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--bogus", "unknown option '--bogus'"),
        ("print(1)", "code goes in the cell body"),
        ("--timeout -1", "positive number of seconds"),
        ("--timeout inf", "positive number of seconds, at most 1,000,000; got inf"),
        ("--timeout nan", "positive number of seconds, at most 1,000,000; got nan"),
        ("--timeout 1e12", "at most 1,000,000"),
        ("--timeout x", "--timeout"),
        ("--where gpus=1 --where gpus=0", "names dim 'gpus' twice"),
        ("--where 'gpus=1", "cannot parse"),
        # both were read, and the last one used
        ("--ranks 0 --ranks 1", r"^%%mesh: --ranks given 2 times \(--ranks 0, --ranks 1\); give it once, e\.g\. --ranks 0,1$"),
        ("--timeout 5 --timeout 30", r"^%%mesh: --timeout given 2 times \(--timeout 5, --timeout 30\); give it once"),
    ],
)
def test_bad_run_options_are_one_line(line: str, message: str):
    with pytest.raises(UsageError, match=message) as e:
        parse_run_options(line)
    assert "\n" not in str(e.value)


def test_line_form_splits_options_from_code():
    opts, code = split_line_code("--ranks 0 --where=gpus=0 print('a b', rank)")
    assert opts.ranks == [0] and opts.where == {"gpus": 0}
    assert code == "print('a b', rank)"
    with pytest.raises(UsageError, match="give code"):
        split_line_code("--ranks 0")


@pytest.mark.parametrize(
    "line, ranks, code",
    [("-- rank", None, "rank"), ("--ranks 0 -- rank", [0], "rank"), ("--ranks 0 -- --x", [0], "--x")],
)
def test_a_lone_double_dash_ends_the_options(line: str, ranks: list[int] | None, code: str):
    # `%px -- rank` was an AssertionError traceback from the parser
    opts, rest = split_line_code(line)
    assert (opts.ranks, rest) == (ranks, code)


@pytest.mark.parametrize("line", ["--(x) + 1", "--=1 rank", "--ranks 0 --", "--", "--é rank"])
def test_a_line_the_options_cannot_be_read_from_is_one_usage_error(line: str):
    with pytest.raises(UsageError, match=r"^%px: ") as e:
        split_line_code(line)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("line", "ranks"), [
    ("--targets 1", [1]), ("--targets=0:2", [0, 1]), ("-t ::2", [0, 2]), ("--targets [1,3]", [1, 3]),
    ("-t (0,3)", [0, 3]), ("--targets all", None), ("--targets 2 --block --stream", [2]),
])
def test_px_takes_ipyparallels_targets_and_its_default_flags(line: str, ranks: list[int] | None):
    assert parse_run_options(line, "%%px", [0, 1, 2, 3]).ranks == ranks
    opts, code = split_line_code(f"{line} print(rank)", "%px", [0, 1, 2, 3])
    assert (opts.ranks, code) == (ranks, "print(rank)")


@pytest.mark.parametrize(("line", "message"), [
    ("--noblock", r"^%%px: ipyparallel's --noblock has no counterpart here: a cell waits for its ranks .*block=False"),
    ("--local", r"^%%px: ipyparallel's --local has no counterpart here: the cell runs on the ranks only"),
    ("--group-outputs=engine", r"^%%px: ipyparallel's --group-outputs has no counterpart here: identical lines"),
    ("--targets x", r"^%%px: --targets x: give a rank \(3\), ranks \(0,2 or \[0,2\]\), a slice"),
    ("--targets 1,9", r"^%%px: --targets 1,9: rank\(s\) 9 not in this mesh \(its ranks are 0-3\)$"),
    ("--targets 5:", r"^%%px: --targets 5: picks none of the mesh's 4 ranks$"),
    ("--targets", r"^%%px: --targets needs the engines to run on"),
])
def test_ipyparallel_options_without_a_counterpart_say_what_to_do(line: str, message: str):
    with pytest.raises(UsageError, match=message):
        parse_run_options(line, "%%px", [0, 1, 2, 3])


def test_mesh_cells_point_ipyparallels_options_to_their_own():
    with pytest.raises(UsageError, match=r"^%%mesh: --targets is ipyparallel's; here choose ranks with --ranks"):
        parse_run_options("--targets 0", "%%mesh", [0, 1])
    with pytest.raises(UsageError, match=r"^%%mesh: --block is ipyparallel's; a %%mesh cell does it anyway"):
        parse_run_options("--block", "%%mesh", [0, 1])


def test_up_parses_dims_and_options():
    cmd = parse_command("up hosts=2 gpus=4 --preload none")
    assert cmd.name == "up" and cmd.dims == {"hosts": 2, "gpus": 4} and cmd.preload == []
    assert parse_command("up gpus=2 --preload torch,numpy").preload == ["torch", "numpy"]
    env = parse_command("up gpus=2 --env NCCL_DEBUG=INFO --env OPTS=a=b --env EMPTY=").env
    assert env == {"NCCL_DEBUG": "INFO", "OPTS": "a=b", "EMPTY": ""}
    assert parse_command("up gpus=2 --output-limit 4096").output_limit == 4096
    assert parse_command("up gpus=2").output_limit is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("up", "name the mesh dims"),
        ("up gpus=0", "positive whole size"),
        ("up gpus=2 gpus=3", "given twice"),
        ("up 4", "NAME=SIZE"),
        ("up gpus=2 --backend mpi", "invalid choice"),
        ("up gpus=2 --env DEBUG", "--env takes NAME=VALUE"),
        ("up gpus=2 --env 1X=2", "--env takes NAME=VALUE"),
        ("restart --all", "unknown option"),
        ("logs two", "invalid int value"),
        ("logs 1 --tail 0", "--tail takes a positive number of lines, got 0"),
        ("logs 1 --tail -1", "--tail takes a positive number of lines, got -1"),
        ("pull", "give the names"),
        ("pull a,1x", r"^%mesh pull: '1x' is not a valid Python name; give the names to fetch, e\.g\. `%mesh pull t`$"),
        ("gather 1x None", r"^%mesh gather: '1x', 'None' are not valid Python names; give the names to join"),
        ("pull lr --ranks 0", r"^%mesh pull takes no options, got '--ranks': it reads every rank; for some ranks "
                              r"only, use the mesh, e\.g\. mesh\.select\(\[0\]\)\.pull\('lr'\)$"),
        ("gather --where=gpus=0 part", r"^%mesh gather takes no options, got '--where'.*mesh\.select\(\[0\]\)\.gather\('part'\)$"),
        ("push", "NAME=EXPRESSION"),
        ("push 1x=2", r"^%mesh push: '1x' \(in '1x=2'\) is not a valid Python name; give NAME=EXPRESSION or NAME"),
        ("scatter 1x", r"^%mesh scatter: '1x' is not a valid Python name; give NAME=EXPRESSION or NAME, e\.g\. `%mesh scatter part=data`$"),
        ("push x=1 --ranks 0", r"^%mesh push takes no options, got '--ranks': it sends to every rank; for some "
                               r"ranks only, use the mesh, e\.g\. mesh\.select\(\[0\]\)\.push\(lr=0\.1\)$"),
        ("push --ranks=0 x", r"^%mesh push takes no options, got '--ranks'"),
        ("scatter part=data --where gpus=0", r"^%mesh scatter takes no options, got '--where'.*mesh\.select\(\[0, 1\]\)\.scatter\('part', data\)$"),
        ("scatter", "`%mesh scatter part=data`"),
        ("gather", "give the names to join, e.g. `%mesh gather part`"),
        ("down now", "takes no arguments"),
        ("frob", "unknown %mesh command 'frob'"),
    ],
)
def test_bad_commands_are_one_line_usage_errors(line: str, message: str):
    with pytest.raises(UsageError, match=message) as e:
        parse_command(line)
    assert "\n" not in str(e.value)


def test_commands():
    assert parse_command("").name == "status"
    assert parse_command("restart --failed").failed_only is True
    cmd = parse_command("logs 3 --tail 5")
    assert (cmd.rank, cmd.tail) == (3, 5)
    assert parse_command("pull a b,c").names == ["a", "b", "c"]
    assert parse_command("scatter part=range(4) rows").assignments == [("part", "range(4)"), ("rows", "rows")]
    assert parse_command("gather part").names == ["part"]
    assert parse_command("auto on").on is True and parse_command("auto off").on is False


def test_push_takes_expressions_with_spaces_and_bare_names():
    cmd = parse_command("push lr=0.1 cfg=dict(a=1, b='x y') model")
    assert cmd.assignments == [("lr", "0.1"), ("cfg", "dict(a=1, b='x y')"), ("model", "model")]
    assert parse_assignments("a = 1, b=[1, 2]") == [("a", "1"), ("b", "[1, 2]")]


@pytest.mark.parametrize(
    "text, assignments",
    [
        ("x=1 + 2", [("x", "1 + 2")]),  # was "got '+'": the line was cut at its spaces
        ("x=1 + 2, lr=0.1 * 2", [("x", "1 + 2"), ("lr", "0.1 * 2")]),
        ("lr=0.1 * 2 y=3", [("lr", "0.1 * 2"), ("y", "3")]),
        ("f=lambda: 1", [("f", "lambda: 1")]),
        ("f=lambda a=1, b=2: a + b g=3", [("f", "lambda a=1, b=2: a + b"), ("g", "3")]),
        ("a=x if y else z w", [("a", "x if y else z"), ("w", "w")]),
        ("a=1 b c", [("a", "1"), ("b", "b"), ("c", "c")]),
        ('s="a=1 b" t=f (1)', [("s", '"a=1 b"'), ("t", "f (1)")]),
        ("a={1: 2} b={c: d for c, d in e}", [("a", "{1: 2}"), ("b", "{c: d for c, d in e}")]),
        ("x=a - -b y=f(--c)", [("x", "a - -b"), ("y", "f(--c)")]),  # not options: spaced, or in brackets
    ],
)
def test_push_values_are_python_expressions_spaces_and_all(text: str, assignments: list[tuple[str, str]]):
    assert parse_command(f"push {text}").assignments == assignments


@pytest.mark.parametrize(
    "text, message",
    [
        ("x=1 +", r"x=1 \+ is not a Python expression \(invalid syntax\)"),
        ("a=b=2", r"a=b=2 is not a Python expression"),
        ("x='a", r"cannot parse"),
        ("x=(1", r"cannot parse"),
        ("None=1", r"'None' \(in 'None=1'\) is not a valid Python name"),
        # a WORD= that is not a name is named; it was read into the expression before it
        ("x=1 a.b=2", r"'a\.b' \(in 'a\.b=2'\) is not a valid Python name"),
        ("x=1 2y=3", r"'2y' \(in '2y=3'\) is not a valid Python name"),
        ("x=1 None=2", r"'None' \(in 'None=2'\) is not a valid Python name"),
        ("x=", r"nothing after '=' in 'x='"),
    ],
)
def test_push_values_that_are_not_expressions_are_one_line(text: str, message: str):
    with pytest.raises(UsageError, match=r"^%mesh push: .*" + message) as e:
        parse_command(f"push {text}")
    assert "\n" not in str(e.value) and "e.g. `%mesh push lr=0.1`" in str(e.value)


def test_help_is_a_command_not_a_mistake():
    assert parse_command("--help").name == "help"
    assert parse_command("up gpus=4 -h").name == "help"
    assert parse_command("push help").assignments == [("help", "help")]  # a variable named help
    with pytest.raises(UsageError, match=r"`%mesh --help` shows their options"):
        parse_command("frob")
