"""Rank output made readable: lines, progress, grouping by rank set, stable order."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import pytest

from viceroy.extension.output import (
    LineGroup,
    LineGrouper,
    format_line,
    format_progress,
    format_rank_set,
)
from viceroy.extension.terminal import RankStreams, terminal_line


def lines_of(grouper_groups) -> list[str]:
    return [format_line(g) for g in grouper_groups]


def test_rank_sets_are_written_as_ranges():
    assert format_rank_set([3, 0, 1, 2, 5]) == "0-3,5"
    assert format_rank_set([4]) == "4"


def test_chunks_are_reassembled_into_lines_per_rank_and_stream():
    s = RankStreams()
    assert s.feed(0, "stdout", "hel").lines == []
    assert s.feed(1, "stdout", "other\n").lines == [("stdout", "other")]
    assert s.feed(0, "stdout", "lo\nwor").lines == [("stdout", "hello")]
    assert [(rank, fed.lines) for rank, fed in s.flush().items()] == [
        (0, [("stdout", "wor")]), (1, [])
    ]


def test_a_line_still_being_written_is_live_until_it_ends():
    # print("epoch 1 ...", end="", flush=True) showed nothing until its newline came (a
    # terminal, and a stock kernel, show it at once)
    s = RankStreams()
    fed = s.feed(0, "stdout", "epoch 1 ...")
    assert fed.lines == [] and fed.progress == {"stdout": ["epoch 1 ..."]}
    assert s.feed(0, "stdout", "..").progress == {"stdout": ["epoch 1 ....."]}
    fed = s.feed(0, "stdout", " done\nnext")
    assert fed.lines == [("stdout", "epoch 1 ..... done")] and fed.progress == {"stdout": ["next"]}
    assert s.feed(0, "stdout", "\n").progress == {"stdout": []}
    long = "w" * 5000  # a long one shows its end
    assert s.feed(1, "stdout", long).progress == {"stdout": ["…" + "w" * 1000]}
    assert [(r, fed.lines, fed.progress) for r, fed in s.flush().items()] == [
        (0, [], {}), (1, [("stdout", long)], {"stdout": []})]


def test_carriage_returns_make_progress_not_lines():
    s = RankStreams()
    fed = s.feed(0, "stderr", "\r 10%|#   |")
    assert fed.lines == [] and fed.progress == {"stderr": [" 10%|#   |"]}
    assert s.feed(0, "stderr", "\r 20%|##  |").progress == {"stderr": [" 20%|##  |"]}
    fed = s.feed(0, "stderr", "\r100%|####|\n")
    assert fed.lines == [] and fed.progress == {"stderr": ["100%|####|"]}, "held: a stacked bar may follow"
    fed = s.feed(0, "stdout", "done\n")
    assert fed.lines == [("stderr", "100%|####|"), ("stdout", "done")]
    assert fed.progress == {"stderr": []}


def test_a_long_running_progress_bar_stays_progress_and_never_leaks_lines():
    """A bar redrawn with \r for minutes adds up to more than MAX_PARTIAL characters without a
    newline; only what the terminal shows is kept, so no frozen copy of it becomes a line."""
    from viceroy.extension.terminal import MAX_PARTIAL

    s = RankStreams()
    bar = "{:3d}%|" + "#" * 70 + "|"
    for i in range(3 * MAX_PARTIAL // len(bar)):
        fed = s.feed(0, "stderr", "\r" + bar.format(i % 100))
        assert fed.lines == [], f"redraw {i} leaked {fed.lines[:1]}"
        assert fed.progress == {"stderr": [bar.format(i % 100)]}
    s.feed(0, "stderr", "\n")
    assert s.flush()[0].lines == [("stderr", bar.format(i % 100))]
    s.feed(0, "stdout", "50%\r")  # a redraw that ends on its carriage return
    assert s.feed(0, "stdout", "60%\nnext\n").lines == [("stdout", "60%"), ("stdout", "next")]


def test_windows_line_endings_are_not_progress():
    assert RankStreams().feed(0, "stdout", "hi\r\n").lines == [("stdout", "hi")]
    assert terminal_line("abc\r") == "abc"


def test_the_same_line_from_every_rank_is_released_at_once_as_one_group():
    g = LineGrouper(ranks=[0, 1, 2, 3], window=10)
    for r in (2, 0, 3, 1):
        g.add(r, "stdout", "hello", now=0)
    assert lines_of(g.ready(now=0)) == ["[0-3] hello"]


def test_lines_wait_for_the_window_then_come_out_in_rank_order():
    g = LineGrouper(ranks=[0, 1, 2], window=0.1)
    g.add(2, "stdout", "from 2", now=0)
    g.add(0, "stdout", "from 0", now=0.01)
    g.add(1, "stdout", "from 0", now=0.02)
    assert g.ready(now=0.05) == []
    assert lines_of(g.ready(now=0.2)) == ["[0-1] from 0", "[2] from 2"]


def test_a_ranks_own_lines_never_change_order():
    g = LineGrouper(ranks=[0, 1], window=0.1)
    for text in ("x", "a"):
        g.add(0, "stdout", text, now=0)
    for text in ("a", "x"):
        g.add(1, "stdout", text, now=0)
    out = lines_of(g.drain())
    assert out.index("[0] x") < out.index("[0-1] a") < out.index("[1] x")


def test_stdout_and_stderr_lines_do_not_merge():
    g = LineGrouper(ranks=[0, 1], window=0.1)
    g.add(0, "stdout", "same", now=0)
    g.add(1, "stderr", "same", now=0)
    assert [(x.stream, sorted(x.ranks)) for x in g.drain()] == [("stdout", [0]), ("stderr", [1])]


def test_log_lines_that_differ_only_in_their_timestamp_are_grouped():
    """logging's asctime and torch's C++ log prefix (``[W1203 16:06:28.606863991 file:line]``)
    differ by a few milliseconds from rank to rank: the same record from every rank is still
    one line, with the time of the rank that wrote it first."""
    g = LineGrouper(ranks=[0, 1, 2, 3], window=10)
    for r in (1, 0, 3, 2):
        g.add(r, "stderr", f"2026-12-03 16:03:22,51{r} WARNING same warning", now=0)
        g.add(r, "stderr", f"[W1203 16:06:28.60{r}863991 TCPStore.cpp:340] [c10d] retrying", now=0)
        # torch.distributed's Python logs: glog's header, with the logging process's id
        g.add(r, "stderr", f"W1203 16:17:17.98{r}000 2272{r} Cell In[5]:3] dist warn", now=0)
    assert lines_of(g.ready(now=0)) == [
        "[0-3] 2026-12-03 16:03:22,511 WARNING same warning",
        "[0-3] [W1203 16:06:28.601863991 TCPStore.cpp:340] [c10d] retrying",
        "[0-3] W1203 16:17:17.981000 22721 Cell In[5]:3] dist warn",
    ]


def test_lines_that_differ_in_anything_but_a_log_timestamp_stay_apart():
    g = LineGrouper(ranks=[0, 1], window=10)
    g.add(0, "stderr", "train: 100%|##| 20/20 [00:01<00:00, 48.70it/s]", now=0)
    g.add(1, "stderr", "train: 100%|##| 20/20 [00:01<00:00, 48.91it/s]", now=0)
    g.add(0, "stdout", "2026-12-03 16:03:22,510 loss 0.5", now=0)
    g.add(1, "stdout", "2026-12-03 16:03:22,511 loss 0.6", now=0)
    g.add(0, "stdout", "finished at 16:03:22", now=0)
    g.add(1, "stdout", "finished at 16:03:23", now=0)
    assert [sorted(x.ranks) for x in g.drain()] == [[0], [0], [0], [1], [1], [1]]


def test_torch_distributed_rank_prefixes_give_way_to_the_rank_tag():
    """torch's C++ logs start ``[rankN]:`` once a process group exists: the line is tagged
    with its rank already, and the same warning from every rank is one line."""
    g = LineGrouper(ranks=[0, 1], window=10)
    for r in (0, 1):
        g.add(r, "stderr", f"[rank{r}]:[W1203 16:06:28.60{r}863991 socket.cpp:752] [c10d] timed out", now=0)
    g.add(1, "stdout", "[rank0]: a rank naming another keeps what it wrote", now=0)
    assert lines_of(g.drain()) == [
        "[0-1] [W1203 16:06:28.600863991 socket.cpp:752] [c10d] timed out",
        "[1] [rank0]: a rank naming another keeps what it wrote",
    ]


def test_the_progress_block_groups_equal_progress():
    assert format_progress({2: ["10%"], 0: ["50%"], 1: ["50%"]}) == "[0-1] 50%\n[2] 10%"
    assert format_progress({0: ["a", "b"], 1: ["a", "b"], 2: []}) == "[0-1] a\n[0-1] b"


def test_a_shared_line_after_different_lines_is_still_grouped():
    g = LineGrouper(ranks=[0, 1], window=0.1)
    g.add(0, "stdout", "api 0", now=0)
    g.add(0, "stdout", "same", now=0)
    g.add(1, "stdout", "api 1", now=0.01)
    g.add(1, "stdout", "same", now=0.01)
    assert lines_of(g.ready(now=0.2)) == ["[0] api 0", "[1] api 1", "[0-1] same"]


def test_lines_arriving_within_one_window_are_ordered_by_rank():
    g = LineGrouper(ranks=[0, 1], window=0.1)
    g.add(1, "stdout", "from 1", now=0.0)
    g.add(0, "stdout", "from 0", now=0.05)
    assert lines_of(g.ready(now=0.1)) == ["[0] from 0", "[1] from 1"]


def assert_linear(work: Callable[[int], object], n: int) -> None:
    """`work(4 * n)` takes less than 10 times as long as `work(n)`: linear work takes 4-5 times
    as long here, the quadratic walks these tests guard against 16 times. Timed in this thread's
    CPU time, which a loaded machine's preemptions do not add to (wall time did: 0.12 s against
    0.008 s beside a CPU hog), with the garbage collector off (a collection is not the work
    timed), and the best of three runs each (in one full `make test` the larger took 10.7 times
    the smaller, in CPU time, its two runs both slowed); no absolute time, which a slow hour of
    this VM would miss."""
    def seconds(size: int) -> float:
        gc.collect()
        gc.disable()  # a full collection of this long test run's heap landing in one run is not its work
        try:
            t0 = time.thread_time()
            work(size)
            return time.thread_time() - t0
        finally:
            gc.enable()

    small = min(seconds(n) for _ in range(3))
    big = min(seconds(4 * n) for _ in range(3))
    assert big < 10 * small, f"{4 * n} took {big:.2f} s, {n} took {small:.2f} s: not linear"


def test_a_flood_of_lines_is_grouped_in_linear_time():
    def flood(n: int) -> None:
        g = LineGrouper(ranks=[0, 1, 2, 3], window=0.1)
        for r in range(4):
            for i in range(n):
                g.add(r, "stdout", f"step {i}" if i % 2 else "loss: nan", now=0)
        out = g.drain()
        assert len(out) == n and all(x.ranks == {0, 1, 2, 3} for x in out)
        assert format_line(out[0]) == "[0-3] loss: nan"

    assert_linear(flood, 1250)


@pytest.mark.parametrize("speakers", [[0, 1, 2, 3], [0]], ids=["every rank its own lines", "rank 0 of 4"])
def test_a_flood_of_different_lines_is_shown_in_linear_time(speakers):
    """Lines that never group (each rank numbers its own; or only rank 0 logs, the others
    silent) made every line shown walk all pending lines: 8,000 lines per rank took 30 s."""

    def flood(n: int) -> None:
        g = LineGrouper(ranks=[0, 1, 2, 3], window=0.1)
        shown: list[LineGroup] = []
        for chunk in range(n // 200):  # as they arrive: chunks of lines, some due while more come
            for r in speakers:
                for i in range(chunk * 200, chunk * 200 + 200):
                    g.add(r, "stdout", f"line {i} of rank {r}", now=chunk * 0.01)
            shown += g.ready(now=chunk * 0.01)
        shown += g.drain()
        assert len(shown) == n * len(speakers)
        for r in speakers:  # every rank's lines, each once, in its order
            assert [x.text for x in shown if x.ranks == {r}] == [f"line {i} of rank {r}" for i in range(n)]

    assert_linear(flood, 2000)


def test_lines_wait_longer_for_ranks_that_have_said_nothing_yet():
    g = LineGrouper(ranks=[0, 1], window=0.1, silent_window=0.5)
    g.add(0, "stdout", "hello", now=0)
    assert g.ready(now=0.2) == [], "rank 1 may be late, not different"
    g.add(1, "stdout", "hello", now=0.3)
    assert lines_of(g.ready(now=0.3)) == ["[0-1] hello"]
    g.add(0, "stdout", "alone", now=1)
    assert lines_of(g.ready(now=1.2)) == ["[0] alone"], "both ranks spoke: the short window"


def test_a_finished_rank_is_not_waited_for():
    g = LineGrouper(ranks=[0, 1], window=0.1, silent_window=5)
    g.rank_done(1)
    g.add(0, "stdout", "solo", now=0)
    assert lines_of(g.ready(now=0.2)) == ["[0] solo"]


def test_a_line_longer_than_the_cut_comes_out_in_pieces_with_no_empty_line_after():
    from viceroy.extension.terminal import MAX_PARTIAL

    s = RankStreams()
    text = "x" * (MAX_PARTIAL + 36_000) + "\n"
    lines = []
    for i in range(0, len(text), 50_000):  # as a rank's output arrives: in chunks
        lines += s.feed(2, "stdout", text[i : i + 50_000]).lines
    lines += [line for fed in s.flush().values() for line in fed.lines]
    assert "".join(t for _, t in lines) == text[:-1]
    assert all(t for _, t in lines), "no empty line where the long line ends"
    # the next line is unaffected, and an empty line of its own still shows
    assert s.feed(2, "stdout", "next\n\n").lines == [("stdout", "next"), ("stdout", "")]


def test_a_cut_line_ended_by_a_newline_in_its_own_chunk_adds_no_empty_line():
    from viceroy.extension.terminal import MAX_PARTIAL

    s = RankStreams()
    assert [t for _, t in s.feed(0, "stdout", "y" * (MAX_PARTIAL + 1)).lines] == ["y" * (MAX_PARTIAL + 1)]
    assert s.feed(0, "stdout", "\nafter\n").lines == [("stdout", "after")]


# --- a rank's stream as a terminal shows it: finished lines stay, bars are live rows ---------


def tqdm_chunks(run) -> list[str]:
    """What tqdm bars made by ``run(file)`` write, one chunk per flush (as a rank sends it)."""
    tqdm = pytest.importorskip("tqdm")

    class Recorder:
        def __init__(self) -> None:
            self.chunks: list[str] = []
            self._buf = ""

        def write(self, text: str) -> None:
            self._buf += text

        def flush(self) -> None:
            if self._buf:
                self.chunks.append(self._buf)
                self._buf = ""

    rec = Recorder()
    run(rec, tqdm.tqdm)
    rec.flush()
    return rec.chunks


def feed_all(chunks: list[str], rank: int = 0) -> tuple[list[str], list[list[str]]]:
    """Finished lines and every progress state, after the stream ends."""
    s = RankStreams()
    lines: list[str] = []
    progress: list[list[str]] = []
    feds = [s.feed(rank, "stderr", c) for c in chunks]
    feds += list(s.flush().values())
    for fed in feds:
        lines += [t for _, t in fed.lines]
        if "stderr" in fed.progress:
            progress.append(fed.progress["stderr"])
    return lines, progress


def test_a_line_drawn_with_a_carriage_return_is_finished_by_its_newline():
    s = RankStreams()
    assert s.feed(0, "stdout", "\rstep 0").progress == {"stdout": ["step 0"]}
    s.feed(0, "stdout", " loss=0\n")
    fed = s.feed(0, "stderr", "warned\n")
    assert fed.lines == [("stdout", "step 0 loss=0"), ("stderr", "warned")]
    fed = s.feed(0, "stdout", "\repoch 0 100%\n\repoch 1   0%")
    assert fed.lines == [] and fed.progress == {"stdout": ["epoch 0 100%", "epoch 1   0%"]}, "stacked bars?"
    fed = s.feed(0, "stdout", "\repoch 1  10%")  # no: the bar below is redrawn in place
    assert fed.lines == [("stdout", "epoch 0 100%")] and fed.progress == {"stdout": ["epoch 1  10%"]}
    assert s.feed(0, "stdout", "\repoch 1 100%\nepoch 1 loss=3\n").lines == [
        ("stdout", "epoch 1 100%"), ("stdout", "epoch 1 loss=3")
    ]


def test_stacked_tqdm_bars_are_live_rows_and_both_finished_bars_are_lines():
    def run(f, tqdm):
        b1 = tqdm(total=3, desc="loss-bar", position=0, file=f, mininterval=0)
        b2 = tqdm(total=3, desc="data-bar", position=1, file=f, mininterval=0)
        for _ in range(3):
            b1.update()
            b2.update()
        b1.close()
        b2.close()

    chunks = tqdm_chunks(run)
    assert any("\x1b[A" in c for c in chunks), "tqdm moves the cursor up to redraw bar 0"
    lines, progress = feed_all(chunks)
    assert [line.split("|")[0] for line in lines] == ["loss-bar: 100%", "data-bar: 100%"]
    assert [[row.split("|")[0] for row in p] for p in progress][:2] == [
        ["loss-bar:   0%"], ["loss-bar:   0%", "data-bar:   0%"]
    ], "the block shows both bars"
    assert not any("\x1b" in text for p in progress for text in p) and not any("\x1b" in t for t in lines)


@pytest.mark.parametrize("leave", [True, False])
def test_nested_tqdm_bars_end_as_a_terminal_shows_them(leave):
    def run(f, tqdm):
        for _ in tqdm(range(2), desc="outer", file=f, mininterval=0):
            for _ in tqdm(range(2), desc="inner", file=f, mininterval=0, leave=leave):
                pass

    lines, progress = feed_all(tqdm_chunks(run))
    finished = ["inner: 100%", "inner: 100%", "outer: 100%"] if leave else ["outer: 100%"]
    assert [line.split("|")[0] for line in lines] == finished
    assert ["outer:  50%", "inner:  50%"] in [[row.split("|")[0] for row in p] for p in progress]
    assert all(row.strip() for p in progress for row in p), "an erased bar leaves no blank row"


def test_erasing_escapes_leave_no_junk_and_colours_stay():
    s = RankStreams()
    fed = s.feed(0, "stdout", "\x1b[2K\r")  # IPython's clear_output without a shell
    assert fed.lines == [] and fed.progress == {}
    assert s.feed(0, "stdout", "old\x1b[2K\rnew\n").lines == []
    assert s.feed(0, "stdout", "\x1b[?25lplain \x1b[31mred\x1b[0m\n").lines == [
        ("stdout", "new"), ("stdout", "plain \x1b[31mred\x1b[0m")
    ]
    assert s.flush()[0].lines == []


def test_an_escape_cut_between_chunks_is_put_back_together():
    s = RankStreams()
    assert s.feed(0, "stderr", "\rbar 0\n\rbar 1\x1b").progress == {"stderr": ["bar 0", "bar 1"]}
    assert s.feed(0, "stderr", "[").progress == {}
    fed = s.feed(0, "stderr", "A\rbar 0 done")
    assert fed.lines == [] and fed.progress == {"stderr": ["bar 0 done", "bar 1"]}
    fed = s.feed(0, "stderr", "\n\rbar 1 done\x1b[A")
    assert fed.progress == {"stderr": ["bar 0 done", "bar 1 done"]}
