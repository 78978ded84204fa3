"""Anyone who can reach a socket but lacks the mesh key runs nothing."""


import socket

import zmq

from tests.conftest import wait_until
from viceroy.runtime.links import encode
from viceroy.runtime.wire import Signer, new_key


def _forgeries(marker):
    code = f"open({str(marker)!r}, 'w').write('pwned')"
    forged = Signer(new_key()).pack({"op": "run", "id": 99, "ranks": [[0, 2]], "code": code, "filename": "<x>"})
    unsigned = [forged[0][32:]]
    garbage = [b"\x00" * 5]
    return [forged, unsigned, garbage]


def test_forged_messages_to_an_agent_are_dropped_counted_and_run_nothing(start_mesh, tmp_path):
    mesh = start_mesh(hosts=2, gpus=1)  # agents that relay: their ranks' links are theirs
    marker = tmp_path / "pwned"
    endpoints = mesh._controller.agent_info[0]["endpoints"]
    ctx = zmq.Context()
    link = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        link.connect(endpoints[1])  # the agent's socket for ranks' local links (replies, output)
        dealer = ctx.socket(zmq.DEALER)  # the agent's socket for rank hellos
        dealer.setsockopt(zmq.IDENTITY, b"intruder")
        dealer.connect(endpoints[0])
        for frames in _forgeries(marker):
            link.sendall(b"".join(bytes(b) for b in encode(frames)))
            dealer.send_multipart(frames)
        wait_until(lambda: mesh.stats()["agents"][0]["dropped"] == 6, 5, "the agent to count 6 dropped messages")
        link.sendall(b"\xff" * 64)  # not even framed: the agent hangs up on it
        assert link.recv(1) == b""
        assert not marker.exists()
        assert mesh.run("rank").values() == [0, 1]
    finally:
        link.close()
        ctx.destroy(linger=0)


def test_forged_messages_to_the_controller_are_dropped_and_counted(start_mesh, tmp_path):
    mesh = start_mesh(gpus=1)
    ctx = zmq.Context()
    try:
        push = ctx.socket(zmq.PUSH)
        push.connect(mesh._controller._config["controller_out"])
        fake = Signer(new_key()).pack({"op": "rank_exit", "r": 0, "reason": "SIGKILL"})
        push.send_multipart(fake)
        push.send_multipart([fake[0][32:]])
        # Dropping is decided before a message is handled: once both are counted, neither acted.
        wait_until(lambda: mesh._controller.signer.dropped == 2, 5, "the controller to drop 2 messages")
        assert mesh.states() == {0: "idle"}  # the fake death was not believed
    finally:
        ctx.destroy(linger=0)


def test_ranks_count_dropped_messages_too(start_mesh):
    mesh = start_mesh(gpus=2)
    stats = mesh.stats()
    assert {r: s["dropped"] for r, s in stats["ranks"].items()} == {0: 0, 1: 0}
    assert stats["agents"] == {0: {"dropped": 0}} and stats["controller"] == {"dropped": 0}
