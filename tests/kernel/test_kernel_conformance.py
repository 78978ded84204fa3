"""jupyter_kernel_test's protocol conformance suite against the Viceroy kernel."""

from __future__ import annotations

import os
import sys
import tempfile
import unittest
from typing import ClassVar

import jupyter_kernel_test

from viceroy.kernel.kernelspec import write_kernel_spec


class ViceroyKernelConformance(jupyter_kernel_test.KernelTests):
    kernel_name = "viceroy"
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    completion_samples: ClassVar = [{"text": "zi", "matches": {"zip"}}]
    complete_code_samples: ClassVar = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n"]
    incomplete_code_samples: ClassVar = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples: ClassVar = ["import = 7q"]
    code_page_something = "zip?"
    code_generate_error = "raise ValueError('boom')"
    code_execute_result: ClassVar = [{"code": "1+2+3", "result": "6"}]
    code_display_data: ClassVar = [
        {
            "code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))",
            "mime": "text/html",
        },
    ]
    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"

    _jupyter_path: ClassVar[tempfile.TemporaryDirectory]
    _saved_path: ClassVar[str | None]

    @classmethod
    def setUpClass(cls) -> None:
        cls._jupyter_path = tempfile.TemporaryDirectory()
        write_kernel_spec(
            os.path.join(cls._jupyter_path.name, "kernels", "viceroy"), executable=sys.executable
        )
        cls._saved_path = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = cls._jupyter_path.name
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        if cls._saved_path is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = cls._saved_path
        cls._jupyter_path.cleanup()


if __name__ == "__main__":
    unittest.main()
