"""LiveOutput turns one call's runtime events into what the cell shows."""

from __future__ import annotations

from typing import Any

from viceroy.extension.echo import CallCells
from viceroy.extension.live import LiveOutput


class FakeSink:
    """Records the sink calls, and keeps the cell's outputs as a front end would: displays
    updated in place by display_id, the progress block a display of its own."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str]] = []
        self.displays: list[tuple[dict, dict]] = []
        self.progress_updates: list[str] = []
        self.outputs: list[dict[str, Any]] = []  # {"stream": name, "text": ...} or {"data": ..., "id": ...}
        self._block: dict[str, Any] | None = None

    def write(self, stream: str, text: str) -> None:
        self.writes.append((stream, text))
        self.outputs.append({"stream": stream, "text": text})

    def display(
        self, data: dict[str, Any], metadata: dict[str, Any], display_id: str | None = None, update: bool = False
    ) -> None:
        self.displays.append((data, metadata))
        if update:
            for o in self.outputs:
                if display_id is not None and o.get("id") == display_id:
                    o["data"] = data
        else:
            self.outputs.append({"data": data, "id": display_id})

    def progress(self, text: str) -> None:
        self.progress_updates.append(text)
        data = {"text/plain": text} if text else {}
        if self._block is None:
            self._block = {"data": data, "id": "progress"}
            self.outputs.append(self._block)
        else:
            self._block["data"] = data

    def text(self, stream: str = "stdout") -> str:
        return "".join(t for s, t in self.writes if s == stream)

    def shown(self) -> list[str]:
        """The lines the cell shows now, top to bottom (an empty display shows nothing)."""
        lines: list[str] = []
        for o in self.outputs:
            text = o["text"] if "stream" in o else o["data"].get("text/plain", "")
            lines += text.splitlines()
        return lines


def out(rank: int, text: str, call: int | None = 1, stream: str = "stdout") -> dict:
    return {"type": "output", "rank": rank, "stream": stream, "text": text, "call": call}


def test_output_of_other_calls_is_not_shown_in_this_cell():
    sink = FakeSink()
    live = LiveOutput([0, 1], call_id=1, sink=sink)
    live.handle(out(0, "mine\n"), now=0)
    live.handle(out(0, "not mine\n", call=2), now=0)
    live.handle(out(1, "background\n", call=None), now=0)
    live.close()
    assert sink.text() == "[0] mine\n[1] background\n"


def test_lines_are_shown_when_their_window_passes_not_only_at_the_end():
    sink = FakeSink()
    live = LiveOutput([0, 1], call_id=1, sink=sink, window=0.1)
    live.handle({"type": "rank_done", "call": 1, "rank": 1, "ok": True}, now=0)
    live.handle(out(0, "early\n"), now=0)
    assert sink.text() == ""
    live.tick(now=0.2)
    assert sink.text() == "[0] early\n"


def test_a_display_keeps_its_place_among_lines_and_is_tagged_with_its_rank():
    sink = FakeSink()
    live = LiveOutput([0, 1], call_id=1, sink=sink)
    order: list[str] = []
    sink.write = lambda stream, text: order.append(text)  # type: ignore[method-assign]
    sink.display = lambda data, md, **_: order.append(f"display {md['viceroy']['rank']}")  # type: ignore[method-assign]
    bundle = {"data": {"text/plain": "<Figure>"}, "metadata": {}}
    for r in (1, 0):
        live.handle(out(r, "before\n"), now=0)
        live.handle(
            {"type": "publish", "rank": r, "call": 1, "kind": "display", "data": bundle}, now=0
        )
    live.close()
    assert order == ["[0-1] before\n", "display 0", "display 1"]


def figure_at_end(rank: int) -> dict:
    """A figure a call left open, shown by the rank after the call's code (as inline does)."""
    bundle = {"data": {"text/plain": f"<Figure {rank}>"}, "metadata": {}, "end_of_call": True}
    return {"type": "publish", "rank": rank, "call": 1, "kind": "display", "data": bundle}


def test_figures_left_open_by_a_call_are_shown_at_its_end_in_rank_order():
    """Ranks finish (and show their open figures) at different times, so the figures arrive
    in any order: the cell shows them at its end, rank 0's first. Lines meanwhile are not
    held back for them."""
    sink = FakeSink()
    live = LiveOutput([0, 1], call_id=1, sink=sink, window=0.1)
    live.handle(figure_at_end(1), now=0)
    live.handle({"type": "rank_done", "call": 1, "rank": 1, "ok": True}, now=0)
    live.handle(out(0, "still working\n"), now=0.6)
    live.tick(now=0.8)
    assert sink.shown() == ["[0] still working"], "the line is shown live; rank 1's figure waits"
    live.handle(figure_at_end(0), now=1.0)
    live.handle(out(0, "a line after its figure\n"), now=1.0)
    live.close()
    assert sink.shown() == [
        "[0] still working", "[0] a line after its figure", "[0] <Figure 0>", "[1] <Figure 1>"
    ]


def test_displays_are_tagged_with_their_rank():
    sink = FakeSink()
    live = LiveOutput([0, 1], call_id=1, sink=sink)
    bundle = {"data": {"text/plain": "<Figure>", "image/png": "AAAA"}, "metadata": {}}
    live.handle({"type": "publish", "rank": 1, "call": 1, "kind": "display", "data": bundle}, now=0)
    live.close()
    data, md = sink.displays[0]
    assert md["viceroy"] == {"rank": 1}
    assert data["text/plain"] == "[1] <Figure>" and data["image/png"] == "AAAA"


def test_a_ranks_html_and_markdown_show_their_rank_where_a_front_end_renders_them():
    """A front end renders a display's richest form (HTML, then markdown, then an image), not
    its text/plain: four notes from four ranks must say which rank made each. An image is left
    as it is (a figure has its label drawn in; see test_ext_display_hook)."""
    sink = FakeSink()
    live = LiveOutput([0, 1], call_id=1, sink=sink)
    figure = {"data": {"text/plain": "<Image>", "image/png": "iVBORw0KGgo="}, "metadata": {"image/png": {"width": 200}}}
    note = {"data": {"text/plain": "<Markdown>", "text/markdown": "**loss** 0.1"}, "metadata": {}}
    live.handle({"type": "publish", "rank": 1, "call": 1, "kind": "display", "data": figure}, now=0)
    live.handle({"type": "publish", "rank": 1, "call": 1, "kind": "display", "data": note}, now=0)
    live.close()
    (fig, _), (md, _) = sink.displays
    assert fig == {"text/plain": "[1] <Image>", "image/png": "iVBORw0KGgo="}, "no copy of the image"
    assert ">[1]</div>" in md["text/markdown"] and md["text/markdown"].endswith("**loss** 0.1")


def test_a_flushed_unfinished_line_shows_at_once_and_ends_as_a_line():
    sink = FakeSink()
    live = LiveOutput([0, 1], call_id=1, sink=sink)
    for r in (0, 1):
        live.handle(out(r, "epoch 1 ..."), now=0.0)
    live.tick(0.3)
    assert sink.progress_updates[-1] == "[0-1] epoch 1 ...", "shown while the ranks still work"
    assert sink.writes == []
    for r in (0, 1):
        live.handle(out(r, " done\n"), now=2.0)
    live.close()
    assert sink.text() == "[0-1] epoch 1 ... done\n"
    assert sink.progress_updates[-1] == "", "the block is left empty once the line ended"


def test_progress_updates_are_throttled_and_end_on_the_final_state():
    sink = FakeSink()
    live = LiveOutput([0], call_id=1, sink=sink)
    for i in range(100):
        live.handle(out(0, f"\r{i:3d}%", stream="stderr"), now=i * 0.01)
    assert 2 <= len(sink.progress_updates) <= 8
    live.handle(out(0, "\r100%\n", stream="stderr"), now=1.0)
    live.close()
    assert sink.text("stderr") == "[0] 100%\n", "the finished bar, once"
    assert sink.progress_updates[-1] == "", "is not left in the block too"


def test_a_rank_exit_is_reported_as_it_happens():
    sink = FakeSink()
    live = LiveOutput([0, 1], call_id=1, sink=sink)
    live.handle({"type": "rank_exit", "rank": 1, "reason": "SIGKILL"}, now=0)
    assert sink.text("stderr") == "[1] rank exited (SIGKILL)\n"


def test_a_flood_is_cut_with_a_pointer_to_the_logs():
    sink = FakeSink()
    live = LiveOutput([0], call_id=1, sink=sink, max_lines=10)
    live.handle(out(0, "".join(f"line {i}\n" for i in range(1000))), now=0)
    live.close()
    assert sink.text().count("\n") == 10
    assert "990 more lines not shown" in sink.text("stderr")
    assert "%mesh logs" in sink.text("stderr")


def test_past_the_line_cap_a_cell_still_says_what_the_ranks_dropped_and_which_died():
    # A flood past the cell's cap hid the ranks' own notices in the count of lines not shown:
    # the cell said "N more lines not shown; `%mesh logs RANK` shows ...", never that the ranks
    # had dropped far more (in no log either), nor that a rank exited.
    sink = FakeSink()
    live = LiveOutput([0, 1], call_id=1, sink=sink, max_lines=10)
    for r in (0, 1):
        live.handle(out(r, "".join(f"line {r} {i}\n" for i in range(100))), now=0)
        live.handle(out(r, f"[viceroy] rank {r}: output of this call passed the limit of 100 bytes; the rest "
                           "is dropped\n", stream="stderr"), now=0)
    live.handle({"type": "rank_exit", "rank": 1, "reason": "SIGKILL"}, now=0)
    live.handle(out(0, "[viceroy] rank 0: 5000 more bytes of output dropped\n", stream="stderr"), now=0)
    live.close()
    assert sink.text().count("\n") == 10
    err = sink.text("stderr").splitlines()
    assert err == [
        "[0] [viceroy] rank 0: output of this call passed the limit of 100 bytes; the rest is dropped",
        "[1] [viceroy] rank 1: output of this call passed the limit of 100 bytes; the rest is dropped",
        "[1] rank exited (SIGKILL)",
        "[0] [viceroy] rank 0: 5000 more bytes of output dropped",
        "[viceroy] 190 more lines not shown; `%mesh logs RANK` shows a rank's recent output",
    ]


def test_call_finished_is_noticed():
    live = LiveOutput([0], call_id=1, sink=FakeSink())
    live.handle({"type": "call_finished", "call": 2, "ok": True}, now=0)
    assert not live.finished
    live.handle({"type": "call_finished", "call": 1, "ok": True}, now=0)
    assert live.finished


def test_a_batch_writes_once_per_run_of_one_stream_in_order():
    sink = FakeSink()
    live = LiveOutput([0], call_id=1, sink=sink)
    with live.batch():
        live.handle(out(0, "".join(f"a{i}\n" for i in range(500))), now=0)
        live.handle(out(0, "warned\n", stream="stderr"), now=0)
        live.handle(out(0, "b\nc\n"), now=0)
        assert sink.writes == [], "nothing is written before the batch ends"
    assert sink.writes == [
        ("stdout", "".join(f"[0] a{i}\n" for i in range(500))),
        ("stderr", "[0] warned\n"),
        ("stdout", "[0] b\n[0] c\n"),
    ]


def test_a_display_in_a_batch_comes_after_the_lines_before_it():
    sink = FakeSink()
    live = LiveOutput([0], call_id=1, sink=sink)
    order: list[str] = []
    sink.write = lambda stream, text: order.append(text)  # type: ignore[method-assign]
    sink.display = lambda data, md, **_: order.append("display")  # type: ignore[method-assign]
    sink.progress = lambda text: order.append(f"progress {text}")  # type: ignore[method-assign]
    bundle = {"data": {"text/plain": "<Figure>"}, "metadata": {}}
    with live.batch():
        live.handle(out(0, "one\ntwo\n"), now=0)
        live.handle({"type": "publish", "rank": 0, "call": 1, "kind": "display", "data": bundle}, now=0)
        live.handle(out(0, "three\n\r50%", stream="stderr"), now=0)
    assert order == ["[0] one\n[0] two\n", "display", "[0] three\n", "progress [0] 50%"]


def test_an_interrupt_while_a_batch_is_written_loses_and_repeats_nothing():
    """Ctrl-C lands where the cell's sink waits for the kernel's IO thread: the lines held
    after the interrupted write go out with the next ones, and batching still ends."""
    sink = FakeSink()
    live = LiveOutput([0], call_id=1, sink=sink)
    write = sink.write
    calls = []

    def interrupted_once(stream: str, text: str) -> None:
        write(stream, text)
        calls.append(text)
        if len(calls) == 1:
            raise KeyboardInterrupt

    sink.write = interrupted_once  # type: ignore[method-assign]
    try:
        with live.batch():
            live.handle(out(0, "a\n"), now=0)
            live.handle(out(0, "warned\n", stream="stderr"), now=0)
            live.handle(out(0, "b\n"), now=0)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the interrupt was swallowed")
    live.handle(out(0, "stopped\n"), now=0)  # not in a batch: written at once, after the rest
    assert sink.writes == [
        ("stdout", "[0] a\n"), ("stderr", "[0] warned\n"), ("stdout", "[0] b\n[0] stopped\n")
    ]


# --- progress bars: finished ones stay, running ones are one live block below them ----------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def feed(self, live: LiveOutput, *events: dict, step: float = 0.05) -> None:
        for ev in events:
            self.now += step
            live.handle(ev, now=self.now)


def test_sequential_bars_each_stay_in_the_cell_and_the_block_shows_the_running_one():
    """tqdm(leave=True), one per epoch: a terminal keeps every finished bar."""
    sink = FakeSink()
    live = LiveOutput([0], call_id=1, sink=sink)
    clock = Clock()
    for epoch in range(3):
        clock.feed(live, *(out(0, f"\repoch {epoch}: {p:3d}%", stream="stderr") for p in (0, 50, 100)))
        clock.feed(live, out(0, "\n", stream="stderr"), out(0, f"loss {epoch}\n"), step=0.3)
        if epoch == 1:
            clock.feed(live, out(0, "\repoch 2:   0%", stream="stderr"), step=0.3)
            assert sink.shown() == [
                "[0] epoch 2:   0%", "[0] epoch 0: 100%", "[0] loss 0", "[0] epoch 1: 100%", "[0] loss 1"
            ], "the block, where the first bar appeared, shows the running one"
    live.close()
    assert sink.shown() == [
        "[0] epoch 0: 100%", "[0] loss 0", "[0] epoch 1: 100%", "[0] loss 1", "[0] epoch 2: 100%", "[0] loss 2"
    ]
    assert sink.text("stderr") == "[0] epoch 0: 100%\n[0] epoch 1: 100%\n[0] epoch 2: 100%\n"


def test_lines_drawn_with_a_carriage_return_are_kept_once_finished():
    """print(f'\\rstep {i}', end=''); print(f' loss={i}'): each line is finished, none lost."""
    sink = FakeSink()
    live = LiveOutput([0], call_id=1, sink=sink)
    clock = Clock()
    for i in range(4):
        clock.feed(live, out(0, f"\rstep {i}"), out(0, f" loss={i}\n"), step=0.3)
    clock.feed(live, out(0, "end\n"))
    live.close()
    assert sink.shown() == [f"[0] step {i} loss={i}" for i in range(4)] + ["[0] end"]


def test_ranks_finishing_a_bar_together_leave_one_grouped_line():
    sink = FakeSink()
    live = LiveOutput([0, 1], call_id=1, sink=sink)
    clock = Clock()
    for p in (10, 60, 100):
        clock.feed(live, out(0, f"\r{p:3d}%", stream="stderr"), out(1, f"\r{p:3d}%", stream="stderr"))
    live.tick(clock.now + 0.3)
    assert sink.shown() == ["[0-1] 100%"]
    clock.feed(live, out(0, "\n", stream="stderr"), out(0, "done\n"), step=0.1)
    clock.feed(live, out(1, "\n", stream="stderr"), out(1, "done\n"), step=0.1)
    live.close()
    assert sink.shown() == ["[0-1] 100%", "[0-1] done"]
    assert len([o for o in sink.outputs if "id" in o]) == 1, "one block"


def test_stacked_bars_show_in_the_block_and_both_stay_when_finished():
    """tqdm(position=0) and tqdm(position=1): tqdm moves the cursor up to redraw bar 0."""
    sink = FakeSink()
    live = LiveOutput([0], call_id=1, sink=sink)
    clock = Clock()
    clock.feed(live, out(0, "\rloss-bar:   0%", stream="stderr"), out(0, "\n\rdata-bar:   0%", stream="stderr"))
    for p in (50, 100):
        clock.feed(
            live,
            out(0, f"\x1b[A\rloss-bar: {p:3d}%", stream="stderr"),
            out(0, f"\n\rdata-bar: {p:3d}%", stream="stderr"),
            step=0.25,
        )
    clock.feed(live, out(0, "\x1b[A", stream="stderr"))
    assert sink.shown() == ["[0] loss-bar: 100%", "[0] data-bar: 100%"]
    clock.feed(live, out(0, "\rloss-bar: 100%\n", stream="stderr"), out(0, "\rdata-bar: 100%\n", stream="stderr"))
    clock.feed(live, out(0, "done\n"))
    live.close()
    assert sink.shown() == ["[0] loss-bar: 100%", "[0] data-bar: 100%", "[0] done"]
    assert not any("\x1b" in text for text in [*sink.progress_updates, sink.text("stderr")])


# --- displays from ranks ---------------------------------------------------------------------


def shown_display(rank: int, data: dict, call: int = 1, **fields: Any) -> dict:
    return {"type": "publish", "rank": rank, "call": call, "kind": "display",
            "data": {"data": data, "metadata": {}, **fields}}


def test_a_ranks_display_id_updates_that_ranks_display_in_place_and_no_other():
    sink = FakeSink()
    live = LiveOutput([0, 1], call_id=1, sink=sink)
    for r in (0, 1):
        live.handle(shown_display(r, {"text/plain": "step 0"}, display_id="status"), now=0)
    live.handle(shown_display(1, {"text/plain": "step 1"}, display_id="status", update=True), now=0)
    live.handle(shown_display(0, {"text/plain": "step 2"}, display_id="status", update=True), now=0)
    live.close()
    assert sink.shown() == ["[0] step 2", "[1] step 1"]
    ids = [o["id"] for o in sink.outputs]
    assert len(set(ids)) == 2 and all(ids), "each rank's display has its own id"


def cleared(rank: int, wait: bool, call: int = 1) -> dict:
    return {"type": "publish", "rank": rank, "call": call, "kind": "clear_output", "data": {"wait": wait}}


def test_clear_output_wait_then_display_replaces_that_ranks_displays_in_place():
    """The live-plot loop: clear_output(wait=True); display(fig). Each rank keeps one figure,
    updated, where it first appeared; other ranks' output and the lines stay."""
    sink = FakeSink()
    live = LiveOutput([0, 1], call_id=1, sink=sink)
    live.handle(out(1, "start\n"), now=0)
    live.handle(shown_display(1, {"text/plain": "rank 1 figure"}), now=0)
    for i in range(3):
        live.handle(cleared(0, wait=True), now=0)
        live.handle(shown_display(0, {"text/plain": f"frame {i}"}), now=0)
        live.handle(shown_display(0, {"text/plain": f"legend {i}"}), now=0)
        live.handle(out(0, f"step {i}\n"), now=0)
    live.close()
    assert sink.shown() == [
        "[0] frame 2", "[0] legend 2", "[0] step 0", "[0] step 1", "[0] step 2",
        "[1] start", "[1] rank 1 figure",
    ]
    assert len(sink.outputs) < 10, "frames are updates, not new outputs"


def test_clear_output_empties_that_ranks_displays_and_a_shorter_frame_leaves_no_stale_one():
    sink = FakeSink()
    live = LiveOutput([0, 1], call_id=1, sink=sink)
    for r in (0, 1):
        live.handle(shown_display(r, {"text/plain": "a"}), now=0)
        live.handle(shown_display(r, {"text/plain": "b"}), now=0)
    live.handle(cleared(1, wait=False), now=0)
    live.tick(now=1)
    assert sink.shown() == ["[0] a", "[0] b"]
    live.handle(cleared(0, wait=True), now=1)
    live.handle(shown_display(0, {"text/plain": "c"}), now=1)
    live.close()
    assert sink.shown() == ["[0] c"]
    assert not any("\x1b" in line for line in sink.shown())


def test_a_widget_from_a_rank_is_shown_as_its_text_with_one_note():
    """Its model lives in the rank's process: a front end would say "model not found"."""
    sink = FakeSink()
    live = LiveOutput([0, 1], call_id=1, sink=sink)
    widget = {"text/plain": "IntSlider(value=0)", "application/vnd.jupyter.widget-view+json": {"model_id": "x"}}
    for r in (0, 1):
        live.handle(shown_display(r, widget), now=0)
    live.handle(shown_display(0, {"application/vnd.jupyter.widget-view+json": {"model_id": "y"}}), now=0)
    live.close()
    assert all("application/vnd.jupyter.widget-view+json" not in data for data, _ in sink.displays)
    assert sink.shown()[1:] == ["[0] IntSlider(value=0)", "[1] IntSlider(value=0)"]
    (note,) = sink.text("stderr").splitlines()
    assert "widget" in note and "rank" in note


def test_a_bar_appears_below_the_lines_its_rank_printed_before_it():
    # The lines wait (up to the group window) for the same line from other ranks; the block
    # waited for nothing: a bar started right after a print was drawn above it.
    sink = FakeSink()
    live = LiveOutput([0, 1], call_id=1, sink=sink, window=0.15)
    live.handle(out(0, "before bar\n"), now=0.0)  # rank 1, scheduled later, prints it 0.1 s after
    for i in range(5):
        live.handle(out(0, f"\rstep {i}", stream="stderr"), now=0.01 * i)
    live.tick(now=0.05)
    assert sink.shown() == [], sink.shown()
    live.handle(out(1, "before bar\n"), now=0.1)
    live.handle(out(1, "\rstep 0", stream="stderr"), now=0.1)
    live.tick(now=0.3)
    assert sink.shown()[0] == "[0-1] before bar", sink.shown()
    assert "step 4" in sink.shown()[1], sink.shown()
    live.close()
    assert sink.shown()[0] == "[0-1] before bar", sink.shown()


def test_output_between_calls_belongs_to_the_cell_of_the_ranks_latest_call():
    """What a rank writes while no call runs there (a thread a cell started, printing later)
    goes to the cell that ran the rank's latest call; calls no rank ran last are forgotten."""
    cells = CallCells()
    cells.started({"call": 1, "ranks": [0, 1]}, {"msg_id": "cell-a"})
    cells.started({"call": 2, "ranks": [1]}, {"msg_id": "cell-b"})
    assert cells.call_of({"rank": 0, "call": None}) == 1
    assert cells.call_of({"rank": 1, "call": None}) == 2
    assert cells.call_of({"rank": 0, "call": 2}) == 2
    assert cells.call_of({"rank": 5, "call": None}) is None
    assert cells.cell_of(1) == {"msg_id": "cell-a"}
    for call in range(3, 200):
        cells.started({"call": call, "ranks": [1]}, {"msg_id": f"cell-{call}"})
    assert cells.cell_of(1) == {"msg_id": "cell-a"}, "rank 0 ran it last"
    assert cells.cell_of(2) is None and len(cells._cell) < 100
