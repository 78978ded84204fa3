"""A rank's GPU: every rank of a host sees the same GPUs, as under torchrun, and its own is
the one at its local rank (`viceroy.runtime.devices`).

This machine has no GPU: the agent is shown GPUs through CUDA_VISIBLE_DEVICES, which is all it
reads. That CUDA then really runs on each rank's own GPU is checked by bench/gpu_check.sh."""

import importlib
import sys

import pytest

from viceroy.runtime import devices


def test_the_ranks_of_a_host_share_one_list_of_gpus_and_each_takes_its_local_rank():
    envs = [devices.assign(lr, 4, ["0", "1", "2", "3", "4", "5", "6", "7"]) for lr in range(4)]
    assert [env for env, _ in envs] == [{"CUDA_VISIBLE_DEVICES": "0,1,2,3"}] * 4
    assert [index for _, index in envs] == [0, 1, 2, 3]
    # More ranks than GPUs: they share them round-robin; ids the driver gives as UUIDs stay.
    shared = [devices.assign(lr, 3, ["GPU-a", "GPU-b"]) for lr in range(3)]
    assert [env for env, _ in shared] == [{"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}] * 3
    assert [index for _, index in shared] == [0, 1, 0]
    assert devices.assign(0, 4, []) == ({}, None)


def test_ranks_see_their_hosts_gpus_and_know_their_own(start_mesh, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7,9")
    mesh = start_mesh(hosts=2, gpus=2)
    got = mesh.run(
        "import os, viceroy as vr\n"
        "(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['LOCAL_RANK'], os.environ['LOCAL_WORLD_SIZE'], "
        "vr.context().device)"
    ).values()
    assert got == [("5,7", "0", "2", 0), ("5,7", "1", "2", 1), ("5,7", "0", "2", 0), ("5,7", "1", "2", 1)]


def test_without_gpus_ranks_have_no_device_and_the_environment_is_left_alone(start_mesh, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    mesh = start_mesh(gpus=2)
    got = mesh.run("import os, viceroy as vr\n(os.environ.get('CUDA_VISIBLE_DEVICES'), vr.context().device)")
    assert got.values() == [("", None)] * 2


@pytest.mark.parametrize("preload", [["torch"], []], ids=["torch-preloaded", "torch-imported-by-the-cell"])
def test_torch_is_told_the_ranks_gpu_without_starting_cuda(start_mesh, monkeypatch, preload):
    # What a CPU build of torch lets us see: the call torch.cuda runs when CUDA starts is
    # queued (CUDA never starts here), and importing torch neither starts CUDA nor complains.
    pytest.importorskip("torch")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    mesh = start_mesh(gpus=2, preload=preload)
    got = mesh.run(
        "import sys\npreloaded = 'torch' in sys.modules\nimport torch\n"
        "queued = [c for c, _ in torch.cuda._queued_calls if 'viceroy' in getattr(c, '__module__', '')]\n"
        "(preloaded, len(queued), torch.cuda.is_initialized())"
    ).values()
    assert got == [(bool(preload), 1, False)] * 2


@pytest.fixture
def fresh_modules(tmp_path, monkeypatch):
    """``fresh_modules(name, body)`` writes module `name` where imports find it; the modules and
    any hook still waiting are gone after the test."""
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    made = []

    def write(name, body):
        (tmp_path / f"{name}.py").write_text(body)
        made.append(name)
        return name

    yield write
    for name in made:
        sys.modules.pop(name, None)
    devices._finder.hooks.clear()
    if devices._finder in sys.meta_path:
        sys.meta_path.remove(devices._finder)


def test_a_hook_runs_once_its_module_is_loaded_and_the_module_keeps_its_own_loader(fresh_modules):
    name = fresh_modules("viceroy_probe_a", "VALUE = 41\n")
    seen = []
    devices.after_import(name, lambda m: seen.append(m.VALUE + 1))
    assert devices._finder in sys.meta_path
    module = importlib.import_module(name)
    assert seen == [42]
    assert type(module.__loader__).__name__ == "SourceFileLoader"
    assert module.__spec__.loader is module.__loader__
    importlib.reload(module)  # the hook is spent
    assert seen == [42]
    assert devices._finder not in sys.meta_path  # nothing left to watch: out of every import


def test_a_failing_hook_leaves_the_import_standing(fresh_modules, capsys):
    name = fresh_modules("viceroy_probe_b", "VALUE = 1\n")
    devices.after_import(name, lambda m: 1 / 0)
    assert importlib.import_module(name).VALUE == 1
    assert "after importing viceroy_probe_b: ZeroDivisionError" in capsys.readouterr().err


def test_a_hook_waits_for_a_module_that_is_not_there_yet(fresh_modules):
    seen = []
    devices.after_import("viceroy_probe_c", lambda m: seen.append(m.__name__))
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("viceroy_probe_c")
    fresh_modules("viceroy_probe_c", "")
    importlib.invalidate_caches()
    importlib.import_module("viceroy_probe_c")
    assert seen == ["viceroy_probe_c"]
