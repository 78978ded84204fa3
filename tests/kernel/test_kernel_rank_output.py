"""What a %%mesh cell finally shows, as a front end renders its messages: progress bars that
finished stay, displays from ranks update in place, widgets from ranks are not half-shown."""

from __future__ import annotations

import re
from typing import Any

import pytest
from kernel_harness import Execution, Kernel

pytestmark = pytest.mark.timeout(180)


def rendered(ex: Execution) -> list[str]:
    """The cell's output lines at its end, as a front end shows them: stream messages in a
    row joined, displays updated in place by their transient display_id."""
    outputs: list[dict[str, Any]] = []
    for m in ex.outputs:
        kind, content = m["msg_type"], m["content"]
        display_id = content.get("transient", {}).get("display_id")
        if kind == "stream":
            if outputs and outputs[-1].get("stream") == content["name"]:
                outputs[-1]["text"] += content["text"]
            else:
                outputs.append({"stream": content["name"], "text": content["text"]})
        elif kind == "update_display_data":
            for o in outputs:
                if display_id is not None and o.get("id") == display_id:
                    o["data"] = content["data"]
        elif kind in ("display_data", "execute_result"):
            outputs.append({"data": content["data"], "id": display_id})
    lines: list[str] = []
    for o in outputs:
        lines += (o["text"] if "stream" in o else o["data"].get("text/plain", "")).splitlines()
    return lines


def of_rank(lines: list[str], rank: int) -> list[str]:
    """What ``rank`` wrote, in its order: the lines tagged with a rank set that has it
    (``[0-1] hi``, ``[1] hi``), untagged; whether or not they were grouped."""
    out = []
    for line in lines:
        m = re.match(r"\[([0-9,-]+)\] ", line)
        if m:
            ranks: set[int] = set()
            for part in m.group(1).split(","):
                lo, _, hi = part.partition("-")
                ranks.update(range(int(lo), int(hi or lo) + 1))
            if rank in ranks:
                out.append(line[m.end() :])
    return out


def ranks_showing(lines: list[str], text: str) -> set[int]:
    """The ranks (of 0 and 1) that wrote a line containing ``text``."""
    return {r for r in (0, 1) if any(text in line for line in of_rank(lines, r))}


def all_text(ex: Execution) -> str:
    return "".join(
        m["content"].get("text", "") + str(m["content"].get("data", "")) for m in ex.outputs
    )


# --- progress bars ---------------------------------------------------------------------------


def test_every_finished_tqdm_bar_of_a_loop_stays_in_the_cell(mesh_kernel: Kernel):
    pytest.importorskip("tqdm")
    ex = mesh_kernel.ok(
        "%%mesh\nfrom tqdm import tqdm\nimport time\n"
        "for epoch in range(3):\n"
        "    for _ in tqdm(range(3), desc=f'epoch {epoch}'):\n"
        "        time.sleep(0.05)\n"
        "print('trained')"
    )
    lines = rendered(ex)
    for rank in (0, 1):
        shown = of_rank(lines, rank)
        assert [line.split("|")[0] for line in shown] == [
            "epoch 0: 100%", "epoch 1: 100%", "epoch 2: 100%", "trained"
        ], lines


def test_lines_drawn_with_a_carriage_return_are_all_kept(mesh_kernel: Kernel):
    ex = mesh_kernel.ok(
        "%%mesh\nimport time\nfor i in range(4):\n"
        "    print(f'\\rstep {i}', end='')\n    print(f' loss={i}')\n    time.sleep(0.1)\n"
        "print('end')"
    )
    lines = rendered(ex)
    for rank in (0, 1):
        assert of_rank(lines, rank) == [f"step {i} loss={i}" for i in range(4)] + ["end"], lines


def test_stacked_tqdm_bars_both_stay_and_leave_no_escapes(mesh_kernel: Kernel):
    pytest.importorskip("tqdm")
    ex = mesh_kernel.ok(
        "%%mesh\nfrom tqdm import tqdm\nimport time\n"
        "b1 = tqdm(total=3, desc='loss-bar', position=0)\n"
        "b2 = tqdm(total=3, desc='data-bar', position=1)\n"
        "for i in range(3):\n    b1.update(); b2.update(); time.sleep(0.3)\n"
        "b1.close(); b2.close()\nprint('done')"
    )
    lines = rendered(ex)
    assert ranks_showing(lines, "loss-bar: 100%") == ranks_showing(lines, "data-bar: 100%") == {0, 1}
    assert "\x1b" not in all_text(ex), "no cursor movement shown as text"
    blocks = [m["content"]["data"].get("text/plain", "") for m in ex.outputs
              if m["msg_type"] in ("display_data", "update_display_data")]
    assert any("loss-bar" in b and "data-bar" in b for b in blocks), "the live block shows both bars"


# --- output after its cell ended ----------------------------------------------------------------


def test_what_a_ranks_thread_prints_after_its_cell_ended_goes_to_that_cell(mesh_kernel: Kernel, tmp_path):
    """A thread a %%mesh cell started prints later, while other cells run: into the cell that
    started it, not whichever cell runs (or ran last) when the line comes."""
    go = tmp_path / "go"
    started = mesh_kernel.ok(
        "%%mesh\nimport os, threading, time\n"
        "def later():\n"
        "    deadline = time.monotonic() + 60\n"
        f"    while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:\n"
        "        time.sleep(0.02)\n"
        "    print('late line', flush=True)\n"
        "threading.Thread(target=later, daemon=True).start()\nprint('thread started')"
    )
    first_id = started.messages[0][1]["parent_header"]["msg_id"]
    other = mesh_kernel.ok(f"open({str(go)!r}, 'w').close()\nprint('released')")
    assert "late line" not in other.stream(), "not in the cell that ran when the line came"
    late = mesh_kernel.iopub_until(
        lambda m: m["msg_type"] == "stream" and "late line" in m["content"]["text"], timeout=30, what="the late line"
    )
    assert late["parent_header"]["msg_id"] == first_id
    assert "] late line" in late["content"]["text"]


def test_a_background_calls_output_goes_to_the_cell_that_made_the_call(mesh_kernel: Kernel, tmp_path):
    go = tmp_path / "go"
    on_ranks = (
        "import os, time\n"
        "deadline = time.monotonic() + 60\n"
        f"while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.02)\n"
        "print('background done')"
    )
    made = mesh_kernel.ok(f"fut = mesh.run({on_ranks!r}, block=False)")
    made_id = made.messages[0][1]["parent_header"]["msg_id"]
    other = mesh_kernel.ok(f"open({str(go)!r}, 'w').close()\nfut.get(timeout=30); None")
    assert "background done" not in other.stream()
    done = mesh_kernel.iopub_until(
        lambda m: m["msg_type"] == "stream" and "background done" in m["content"]["text"], timeout=30,
        what="the background call's line",
    )
    assert done["parent_header"]["msg_id"] == made_id


# --- logs ------------------------------------------------------------------------------------


def test_the_same_log_record_from_every_rank_is_one_line(mesh_kernel: Kernel):
    """Log records carry the time (to the ms, or ns) they were made, which differs from rank to
    rank; torch's C++ logs also name the rank ("[rank1]:"). Each record is still one line."""
    ex = mesh_kernel.ok(
        "%%mesh\nimport logging, os\n"
        "logging.basicConfig(format='%(asctime)s %(levelname)s %(message)s', force=True)\n"
        "_ = os.write(2, f'[rank{rank}]:[W1203 16:06:28.60{rank}863991 TCPStore.cpp:340] retrying\\n'.encode())\n"
        "logging.warning('same warning')"
    )
    lines = ex.stream("stderr").splitlines()
    retrying = [line for line in lines if "retrying" in line]
    assert len(retrying) == 1, lines
    assert re.fullmatch(r"\[0-1\] \[W1203 16:06:28\.60[01]863991 TCPStore\.cpp:340\] retrying", retrying[0]), lines
    warned = [line for line in lines if "same warning" in line]
    assert len(warned) == 1 and warned[0].startswith("[0-1] 20"), lines


# --- displays from ranks ---------------------------------------------------------------------


def test_update_display_and_display_handles_on_ranks_update_in_place(mesh_kernel: Kernel):
    ex = mesh_kernel.ok(
        "%%mesh\nfrom IPython.display import display, update_display\n"
        "display(f'step 0 on {rank}', display_id='status')\n"
        "for i in range(1, 4):\n    update_display(f'step {i} on {rank}', display_id='status')\n"
        "h = display('epoch 0', display_id=True)\nh.update(f'epoch 1 on {rank}')"
    )
    assert sorted(rendered(ex)) == [
        "[0] 'epoch 1 on 0'", "[0] 'step 3 on 0'", "[1] 'epoch 1 on 1'", "[1] 'step 3 on 1'"
    ]
    assert len(ex.of_type("display_data")) == 4 and ex.of_type("update_display_data")
    first = {d["transient"]["display_id"] for d in ex.of_type("display_data")}
    later = mesh_kernel.ok("%%mesh\nfrom IPython.display import update_display\n"
                           "update_display('done', display_id='status')")
    assert later.of_type("display_data") == []
    assert {u["transient"]["display_id"] for u in later.of_type("update_display_data")} < first, (
        "a later cell updates the displays in the earlier one, as in IPython"
    )


def test_clear_output_in_a_rank_loop_keeps_one_updated_frame_per_rank(mesh_kernel: Kernel):
    ex = mesh_kernel.ok(
        "%%mesh\nfrom IPython.display import clear_output, display\nprint('start')\n"
        "for i in range(3):\n    clear_output(wait=True)\n    display(f'frame {i} of {rank}')"
    )
    lines = rendered(ex)
    assert ranks_showing(lines, "start") == {0, 1}
    assert sorted(line for line in lines if "frame" in line) == ["[0] 'frame 2 of 0'", "[1] 'frame 2 of 1'"]
    assert "\x1b" not in all_text(ex), "no escape shown as text"
    assert not [m for m in ex.outputs if m["msg_type"] == "clear_output"], "other ranks' output stays"


def test_figures_left_open_on_several_ranks_are_shown_in_rank_order(mesh_kernel: Kernel):
    """Rank 0 finishes last, so its figure is the last to arrive: shown first all the same."""
    pytest.importorskip("matplotlib")
    ex = mesh_kernel.ok(
        "%%mesh\nimport time\nimport matplotlib.pyplot as plt\n"
        "plt.plot([0, rank]); plt.title(f'rank {rank}')\n"
        "if rank == 0:\n    time.sleep(1)\n    print('rank 0 done')"
    )
    figures = [d for d in ex.of_type("display_data") if "image/png" in d["data"]]
    assert [d["metadata"]["viceroy"]["rank"] for d in figures] == [0, 1]
    lines = rendered(ex)
    assert lines.index("[0] rank 0 done") < lines.index("[0] <Figure size 640x480 with 1 Axes>"), lines


def test_widgets_from_ranks_are_never_sent_as_widgets(mesh_kernel: Kernel):
    pytest.importorskip("tqdm")
    pytest.importorskip("ipywidgets")
    ex = mesh_kernel.ok(
        "%%mesh\nfrom tqdm.notebook import tqdm\nimport time\n"
        "for i in tqdm(range(3), desc='nb'):\n    time.sleep(0.1)\n"
        "import ipywidgets\ndisplay(ipywidgets.IntSlider(value=rank))"
    )
    assert "widget-view" not in str([m["content"] for m in ex.outputs]), "a model only the rank has"
    lines = rendered(ex)
    assert ranks_showing(lines, "nb: 100%") == {0, 1}, lines
    assert ranks_showing(lines, "IntSlider(value=") == {0, 1}, lines
    assert len([line for line in lines if "widget" in line]) == 1, lines
