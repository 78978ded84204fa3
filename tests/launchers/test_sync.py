"""`%mesh sync` edge cases: paths with spaces, rsync missing here, a host that cannot be
reached (the others are still synced, and the one at fault is named)."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from tests.launchers.conftest import _free_port
from viceroy.extension.launching import sync_hosts, sync_report
from viceroy.runtime.ssh import SshLauncher


class _Mesh:
    """What sync_hosts reads from a mesh: its controller's launcher and lost hosts."""

    def __init__(self, launcher: SshLauncher, lost: dict[int, str] | None = None) -> None:
        self._controller = type("C", (), {"launcher": launcher, "lost_hosts": lambda _self: dict(lost or {})})()


def _launcher(sshd, tmp_path, monkeypatch, hosts: list[str]) -> SshLauncher:
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host closed\n  HostName 127.0.0.1\n  Port {_free_port()}\n"
        f"Host *\n  Port {sshd.port}\n  IdentityFile {sshd.identity}\n"
        "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
    )
    monkeypatch.setenv("VICEROY_SSH_OPTIONS", f"-F {config}")
    return SshLauncher(hosts)


def test_sync_handles_spaces_in_paths(sshd, tmp_path, monkeypatch):
    src, dest = tmp_path / "my project", tmp_path / "remote dir" / "my project"
    (src / "a b").mkdir(parents=True)
    (src / "a b" / "c d.py").write_text("X = 1\n")
    mesh = _Mesh(_launcher(sshd, tmp_path, monkeypatch, ["127.0.0.1"]))
    assert list(map(str, sync_hosts(mesh, str(src), str(dest), False))) == [f"127.0.0.1:{dest}"]
    assert (dest / "a b" / "c d.py").read_text() == "X = 1\n"


def test_sync_names_the_host_it_cannot_reach_and_still_syncs_the_others(sshd, tmp_path, monkeypatch):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "f.py").write_text("1\n")
    mesh = _Mesh(_launcher(sshd, tmp_path, monkeypatch, ["closed", "127.0.0.1"]))
    with pytest.raises(UsageError, match=r"(?s)rsync to closed:.*failed.*Connection refused") as e:
        sync_hosts(mesh, str(src), str(dest), False)
    assert f"127.0.0.1:{dest}" in str(e.value)  # the reachable host was synced, and says so
    assert (dest / "f.py").read_text() == "1\n"


def test_sync_skips_a_lost_host_saying_so(sshd, tmp_path, monkeypatch):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "f.py").write_text("1\n")
    mesh = _Mesh(_launcher(sshd, tmp_path, monkeypatch, ["closed", "127.0.0.1"]), lost={0: "host 0 (closed, via ssh) lost: …"})
    lines = sync_hosts(mesh, str(src), str(dest), False)
    assert list(map(str, lines)) == ["closed: skipped (host 0 is lost; sync again after mesh.restart(failed_only=True))", f"127.0.0.1:{dest}"]
    assert sync_report(str(src), lines).splitlines() == [  # what %mesh sync prints
        "not synced to closed: skipped (host 0 is lost; sync again after mesh.restart(failed_only=True))",
        f"synced {src} -> 127.0.0.1:{dest}",
    ]


def test_sync_without_rsync_here_says_to_install_it(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(UsageError, match=r"%mesh sync: rsync is not installed on this machine .*apt-get install rsync"):
        sync_hosts(_Mesh(SshLauncher(["node1"])), str(src), None, False)


def test_sync_of_a_missing_directory_names_it(tmp_path):
    with pytest.raises(UsageError, match=r"%mesh sync: .*nope is not a directory"):
        sync_hosts(_Mesh(SshLauncher(["node1"])), str(tmp_path / "nope"), None, False)


def test_sync_leaves_out_python_environments_whatever_their_name(sshd, tmp_path, monkeypatch):
    src, dest = tmp_path / "src", tmp_path / "dest"
    for env, marker in (("py311", "pyvenv.cfg"), ("conda-env", "conda-meta/history")):
        (src / env / marker).parent.mkdir(parents=True, exist_ok=True)
        (src / env / marker).write_text("")
        (src / env / "lib.py").write_text("big\n")
    (src / "env.py").write_text("1\n")  # a file named like one is still copied
    (src / "sub" / "py311").mkdir(parents=True)
    (src / "sub" / "py311" / "data.txt").write_text("kept\n")  # not an environment: kept
    mesh = _Mesh(_launcher(sshd, tmp_path, monkeypatch, ["127.0.0.1"]))
    assert list(map(str, sync_hosts(mesh, str(src), str(dest), True))) == [f"127.0.0.1:{dest} (would copy 2 file(s))"]
    sync_hosts(mesh, str(src), str(dest), False)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == ["env.py", "sub/py311/data.txt"]
