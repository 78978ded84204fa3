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

