"""Where user code was when it was interrupted or failed (shown in `interrupted (at ...)`)."""

from viceroy.runtime.execution import register_source, user_location


def _raised_inside_a_library(code: str):
    ns: dict = {}
    register_source("<mesh-cell-7>", code)  # as a rank does for the cells it runs
    try:
        exec(compile(code, "<mesh-cell-7>", "exec"), ns)
    except BaseException as exc:
        return exc
    raise AssertionError("no exception")


def test_the_users_line_is_named_with_the_library_frame_below_it():
    exc = _raised_inside_a_library("import json\nx = 1\njson.loads('{')\n")
    where = user_location(exc)
    assert where.startswith("<mesh-cell-7>, line 3: json.loads('{')"), where
    assert "(in json/" in where and where.endswith(")"), where  # json: the stdlib, a library


def test_a_failure_in_the_users_own_code_names_only_that_line():
    exc = _raised_inside_a_library("def f():\n    return 1 / 0\nf()\n")
    assert user_location(exc) == "<mesh-cell-7>, line 2: return 1 / 0"



def test_a_failures_summary_is_the_first_line_of_its_message_with_its_type():
    from viceroy.runtime.execution import format_user_traceback

    multi = _raised_inside_a_library("raise ValueError('shape mismatch:\\n expected (3, 4)\\n got (4, 3)')")
    etype, summary, tb = format_user_traceback(multi)
    assert (etype, summary) == ("ValueError", "ValueError: shape mismatch: ...")
    assert "got (4, 3)" in tb  # the whole message stays in the traceback
    noted = _raised_inside_a_library(
        "e = KeyError('step')\ne.add_note('while loading checkpoint step 10')\nraise e")
    assert format_user_traceback(noted)[1] == "KeyError: 'step' ..."
    plain = _raised_inside_a_library("1 / 0")
    assert format_user_traceback(plain)[1] == "ZeroDivisionError: division by zero"


def test_a_trailing_semicolon_silences_the_last_expression_as_in_ipython():
    from viceroy.runtime.execution import Executor

    ex = Executor({})
    assert ex.run_code("x = 5\nx", "<mesh-cell-8>") == 5
    assert ex.run_code("x = 5\nx;", "<mesh-cell-9>") is None
    assert ex.run_code("x = 5\nx;  # quiet", "<mesh-cell-10>") is None
    assert ex.run_code("x = 5\nx; x + 1", "<mesh-cell-11>") == 6
    assert ex.run_code("s = ';'\ns", "<mesh-cell-12>") == ";"


def test_after_call_hooks_run_once_each_after_code_and_functions_even_failing_ones(capsys):
    from viceroy.runtime import execution

    ran = []

    def hook():
        ran.append(len(ran))

    def broken():
        raise RuntimeError("hook bug")

    saved = list(execution._after_each_call)
    try:
        execution.after_each_call(hook)
        execution.after_each_call(hook)  # once, however often registered
        execution.after_each_call(broken)
        ex = execution.Executor({})
        assert ex.run_code("7", "<mesh-cell-20>") == 7  # a failing hook does not fail the call
        assert ex.call(lambda: 8, (), {}) == 8
        try:
            ex.run_code("1 / 0", "<mesh-cell-21>")
        except ZeroDivisionError:
            pass
        assert ran == [0, 1, 2]
        assert capsys.readouterr().err.count("an after-call hook failed: RuntimeError: hook bug") == 3
    finally:
        execution._after_each_call[:] = saved
