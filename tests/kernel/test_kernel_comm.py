"""Mesh state reaches the side-panel comm and the MeshView widget through a real kernel, in seq
order, and their requests (traceback, restart) are answered."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from kernel_harness import Execution, Kernel, wait_until

RAISE_ON_2 = "%%mesh --no-fail-fast\nprint('step', rank)\nif rank == 2:\n    x = 1 / 0\n"
_ids = itertools.count()


class Model:
    """What a front end holds: the last snapshot with every diff applied, checking seq order."""

    def __init__(self) -> None:
        self.seq = 0
        self.state: dict[str, Any] | None = None
        self.replies: list[dict[str, Any]] = []

    def feed(self, msg: dict[str, Any]) -> None:
        if msg.get("type") == "state":
            assert msg["seq"] == self.seq + 1, f"snapshot out of order: {msg['seq']} after {self.seq}"
            self.seq, self.state = msg["seq"], msg
        elif msg.get("type") == "diff":
            assert self.state is not None, "a diff before any snapshot"
            assert msg["seq"] == self.seq + 1, f"gap: diff {msg['seq']} after {self.seq}"
            self.seq = msg["seq"]
            for rank, fields in msg["ranks"].items():
                self.state["ranks"][int(rank)].update(fields)
            for key in ("calls", "auto", "summary"):
                self.state[key] = msg[key]
        else:
            self.replies.append(msg)

    def states(self) -> list[str]:
        return [r["state"] for r in (self.state or {}).get("ranks", [])]


class Watcher:
    """Feeds a Model from every iopub message of one comm (the panel's, or the widget's)."""

    def __init__(self, kernel: Kernel, comm_id: str | None = None, widget: bool = False) -> None:
        self.kernel, self.comm_id, self.widget = kernel, comm_id, widget
        self.model = Model()

    def see(self, msg: dict[str, Any]) -> None:
        if msg["msg_type"] != "comm_msg" or msg["content"]["comm_id"] != self.comm_id:
            return
        data = msg["content"]["data"]
        if not self.widget:
            self.model.feed(data)
        elif data.get("method") == "custom":
            self.model.feed(data["content"])
        elif data.get("method") == "update" and "state" in data.get("state", {}):
            self.model.feed(data["state"]["state"])

    def run(self, code: str, timeout: float = 60) -> Execution:
        ex = self.kernel.execute(code, timeout, hook=self.see)
        stray, self.kernel.stray = self.kernel.stray, []
        for msg in stray:
            self.see(msg)
        return ex

    def until(self, cond: Callable[[Model], bool], what: str, timeout: float = 15) -> Model:
        if cond(self.model):
            return self.model

        def seen(msg: dict[str, Any]) -> bool:
            self.see(msg)
            return cond(self.model)

        self.kernel.iopub_until(seen, timeout, what)
        return self.model

    def send(self, data: dict[str, Any]) -> None:
        kc = self.kernel.kc
        payload = {"method": "custom", "content": data} if self.widget else data
        kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": self.comm_id, "data": payload}))

    def reply(self, kind: str, timeout: float = 15) -> dict[str, Any]:
        model = self.until(lambda m: any(r["type"] == kind for r in m.replies), f"a {kind!r} reply", timeout)
        return next(r for r in model.replies if r["type"] == kind)


def open_panel(kernel: Kernel) -> Watcher:
    w = Watcher(kernel, f"panel-{next(_ids)}")
    kc = kernel.kc
    kc.shell_channel.send(kc.session.msg("comm_open", {"comm_id": w.comm_id, "target_name": "viceroy.mesh", "data": {}}))
    w.until(lambda m: m.state is not None, "the panel's first snapshot")
    return w


def ended(pred: Callable[[dict[str, Any]], bool]) -> Callable[[Model], bool]:
    return lambda m: m.state is not None and len(m.states()) == 4 and pred(m.state)


def error_on_2(snap: dict[str, Any]) -> bool:
    return [r["state"] for r in snap["ranks"]] == ["done", "done", "error", "done"]


def test_the_panel_sees_a_mesh_come_up_fail_on_one_rank_lose_a_rank_and_restart_it(kernel: Kernel):
    panel = open_panel(kernel)
    assert panel.model.state is not None and panel.model.state["dims"] is None
    panel.run("%mesh up gpus=4 --preload none", timeout=120)
    model = panel.until(ended(lambda s: s["dims"] == {"gpus": 4}), "the 4-rank snapshot")
    assert model.states() == ["idle"] * 4
    assert [r["coords"] for r in model.state["ranks"]] == [{"gpus": g} for g in range(4)]  # type: ignore[index]

    ex = panel.run(RAISE_ON_2)
    assert ex.status == "error"
    model = panel.until(ended(error_on_2), "rank 2 in error, the others done")
    ranks = model.state["ranks"]  # type: ignore[index]
    assert ranks[2]["error"] == "ZeroDivisionError: division by zero"
    assert [r["error"] for r in ranks if r["rank"] != 2] == [None] * 3
    assert all(r["label"] == "%%mesh print('step', rank)" and r["elapsed"] is not None for r in ranks)
    assert ranks[3]["last_line"] == "step 3"
    assert model.state["summary"] == {"total": 4, "alive": 4, "running": 0, "starting": 0, "failed": 1}  # type: ignore[index]
    assert model.state["calls"] == []  # type: ignore[index]

    panel.send({"request": "traceback", "rank": 2})
    tb = panel.reply("traceback")
    assert tb["rank"] == 2 and "x = 1 / 0" in tb["text"] and "ZeroDivisionError" in tb["text"]
    assert "site-packages" not in tb["text"] and "viceroy/runtime" not in tb["text"]

    # memory: polled about every 2 s while a front end is open
    panel.until(lambda m: all(isinstance(r["rss"], int) and r["rss"] > 0 for r in m.state["ranks"]),  # type: ignore[index]
                "every rank's RSS", timeout=15)

    # a rank dies; the panel's restart request brings back only that one
    ex = panel.run("%%mesh --ranks 3\nimport os\nos._exit(3)")
    assert ex.status == "error"
    model = panel.until(lambda m: m.states()[3] == "dead", "rank 3 dead")
    assert model.state["summary"]["failed"] >= 1 and model.state["ranks"][3]["pid"] is None  # type: ignore[index]
    panel.send({"request": "restart_failed"})
    assert panel.reply("restarted", timeout=60)["ranks"] == [3]
    model = panel.until(lambda m: m.states()[3] == "idle", "rank 3 idle again")
    assert isinstance(model.state["ranks"][3]["pid"], int)  # type: ignore[index]
    panel.send({"request": "logs", "rank": 0, "tail": 5})
    assert "step 0" in panel.reply("logs")["text"]


def test_the_widget_opens_with_mesh_up_and_receives_diffs(kernel: Kernel):
    w = Watcher(kernel, widget=True)
    ex = w.run("%mesh up gpus=4 --preload none", timeout=120)
    opens = [m for _, m in ex.messages if m["msg_type"] == "comm_open"
             and m["content"]["data"].get("state", {}).get("_model_name") == "AnyModel"]
    assert len(opens) == 1, "%mesh up shows one MeshView"
    w.comm_id = opens[0]["content"]["comm_id"]
    w.model.feed(opens[0]["content"]["data"]["state"]["state"])
    assert w.model.seq == 1 and len(w.model.states()) == 4
    shown = [m["content"] for _, m in ex.messages if m["msg_type"] == "display_data"]
    assert any(d["data"].get("application/vnd.jupyter.widget-view+json", {}).get("model_id") == w.comm_id
               and "text/html" in d["data"] for d in shown)

    shown = w.run("mesh").of_type("execute_result")[0]["data"]
    assert "application/vnd.jupyter.widget-view+json" in shown, "`mesh` as a cell's value shows the view"
    assert shown["text/plain"].startswith("mesh gpus=4 · 4/4 alive")

    w.run("%%mesh\nprint('ok', rank)")
    w.until(ended(lambda s: [r["state"] for r in s["ranks"]] == ["done"] * 4), "every rank done")
    w.run(RAISE_ON_2)
    model = w.until(ended(error_on_2), "rank 2 in error in the widget")
    assert model.state["ranks"][2]["error"] == "ZeroDivisionError: division by zero"  # type: ignore[index]
    assert model.seq > 2, "updates arrived as custom diff messages"

    w.send({"request": "traceback", "rank": 2})
    assert "x = 1 / 0" in w.reply("traceback")["text"]

    # an interrupt from the view stops a call the Python API left running
    w.run("fut = mesh.run('import time; time.sleep(60)', block=False)")
    w.until(ended(lambda s: [r["state"] for r in s["ranks"]] == ["running"] * 4), "every rank running")
    w.send({"request": "interrupt"})
    assert w.reply("interrupted")["ranks"] == [0, 1, 2, 3]
    w.until(ended(lambda s: [r["state"] for r in s["ranks"]] == ["interrupted"] * 4), "every rank interrupted")


def test_requests_sent_on_a_subshell_are_answered_while_a_cell_runs(kernel: Kernel):
    """JupyterLab sends comm messages on a subshell, so the panel answers while the notebook is
    busy; the kernel must not queue them behind the running cell (ipykernel routes a comm's
    messages to the subshell of its last reply, and ours are sent from worker threads)."""
    kc = kernel.kc
    kernel.ok("%mesh up gpus=2 --preload none", timeout=120)
    _, send = on_a_subshell(kernel)

    def reply_of(kind: str, what: str) -> dict[str, Any]:
        return kernel.iopub_until(
            lambda m: m["msg_type"] == "comm_msg" and m["content"]["data"].get("type") == kind, 30, what
        )["content"]["data"]

    comm_id = f"subshell-panel-{next(_ids)}"
    send("comm_open", {"comm_id": comm_id, "target_name": "viceroy.mesh", "data": {}})
    reply_of("state", "the first snapshot")
    kernel.ok("%%mesh\nprint('rank step', rank)")
    reply_of("diff", "a diff, sent from the kernel's worker thread")
    busy = kc.execute("import time\nprint('controller busy', flush=True)\ntime.sleep(60)")
    kernel.iopub_until(
        lambda m: m["msg_type"] == "stream" and "controller busy" in m["content"]["text"], 30, "the cell to run"
    )
    started = time.monotonic()
    send("comm_msg", {"comm_id": comm_id, "data": {"request": "logs", "rank": 1}})
    assert "rank step 1" in reply_of("logs", "the logs reply")["text"]
    send("comm_msg", {"comm_id": comm_id, "data": {"request": "interrupt"}})
    assert reply_of("interrupted", "the interrupt reply")["ranks"] == []  # nothing ran on the mesh
    assert time.monotonic() - started < 10, "the replies waited for the cell"
    kernel.km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == busy and reply["content"]["status"] == "error"


def test_a_side_panel_that_stops_saying_it_is_alive_gets_its_comm_closed(kernel: Kernel):
    """A page that dies without closing its comm (a crashed tab) stops saying "alive"; the kernel
    closes the comm rather than stream to it for good. The silence allowed is cut to a second
    here (180 s by default)."""
    kc = kernel.kc
    kernel.ok(
        "from viceroy.extension import current_session\nfrom viceroy.extension.comm import channel_for\n"
        "channel = channel_for(current_session(get_ipython()))\nchannel.silence = 1.0"
    )
    comm_id = f"silent-panel-{next(_ids)}"
    kc.shell_channel.send(kc.session.msg("comm_open", {"comm_id": comm_id, "target_name": "viceroy.mesh", "data": {}}))
    kernel.iopub_until(lambda m: m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id, 30, "the snapshot")
    kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {"request": "alive"}}))
    kernel.iopub_until(lambda m: m["msg_type"] == "comm_close" and m["content"]["comm_id"] == comm_id, 30,
                       "the kernel to close the silent comm")
    assert kernel.ok("print(channel.front_ends)").stream().strip() == "0"


def test_a_close_sent_on_a_subshell_the_page_deleted_first_still_closes(kernel: Kernel):
    """A page going away closes its comm on its subshell and deletes the subshell; the deletion
    (control channel) may overtake the close (shell channel). The close must still detach the
    front end, or the kernel streams to the gone page (until its silence times it out)."""
    kc = kernel.kc
    kernel.ok("from viceroy.extension import current_session\nfrom viceroy.extension.comm import channel_for\n"
              "channel = channel_for(current_session(get_ipython()))")
    subshell, send = on_a_subshell(kernel)

    comm_id = f"leaving-panel-{next(_ids)}"
    send("comm_open", {"comm_id": comm_id, "target_name": "viceroy.mesh", "data": {}})
    kernel.iopub_until(lambda m: m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id, 30, "the snapshot")
    assert kernel.ok("print(channel.front_ends)").stream().strip() == "1"
    kc.control_channel.send(kc.session.msg("delete_subshell_request", {"subshell_id": subshell}))
    assert kc.control_channel.get_msg(timeout=30)["content"]["status"] == "ok"
    send("comm_close", {"comm_id": comm_id, "data": {}})
    wait_until(lambda: kernel.ok("print(channel.front_ends)").stream().strip() == "0", 30,
               "the close to detach the front end")


def on_a_subshell(kernel: Kernel) -> tuple[str, Callable[[str, dict[str, Any]], None]]:
    """A new subshell of `kernel`, and a function sending shell messages on it (as JupyterLab
    sends a page's comm messages)."""
    kc = kernel.kc
    kc.control_channel.send(kc.session.msg("create_subshell_request", {}))
    subshell = kc.control_channel.get_msg(timeout=30)["content"]["subshell_id"]

    def send(msg_type: str, content: dict[str, Any]) -> None:
        msg = kc.session.msg(msg_type, content)
        msg["header"]["subshell_id"] = subshell
        kc.shell_channel.send(msg)

    return subshell, send
