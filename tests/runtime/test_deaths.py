"""What a rank's last words say about why it died (the gloo case runs for real in
tests/collectives/test_faults.py)."""

from __future__ import annotations

from viceroy.runtime.deaths import GLOO_SIZE_MISMATCH, explain

TERMINATED = ("some output\nterminate called after throwing an instance of 'c10::Error'\n"
              "  what():  [enforce fail at /src/x.cpp:12] index out of range. Exception raised from f\n"
              "Fatal Python error: Aborted\n")


def test_an_uncaught_cpp_exception_is_named_with_its_message():
    assert explain("SIGABRT", lambda: TERMINATED) == "C++ code ended it: uncaught c10::Error: index out of range. Exception raised from f"


def test_gloo_receiving_more_than_it_expected_is_a_size_mismatch():
    words = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  [enforce fail at "
             "pair.cc:456] op.preamble.length <= op.nbytes. 8 vs 4. Received data size doesn't match expected size.\n")
    assert explain("SIGABRT", lambda: words) == GLOO_SIZE_MISMATCH


def test_other_deaths_and_silent_aborts_are_not_explained():
    assert explain("SIGKILL", lambda: TERMINATED) is None
    assert explain("SIGABRT", lambda: "Fatal Python error: Aborted\n") is None
