"""``executor: auto`` (evotrainer.executor.choose_executor): Ray's branches side by side only where Ray is installed,
two branches fit the CPUs, and the available memory holds their fp32 AdamW state; every refusal says why."""

from __future__ import annotations

import importlib.util

import pytest

from evotrainer import executor
from evotrainer.executor import BRANCH_OVERHEAD_BYTES, ExecutorError, choose_executor

SMOLLM2 = 538_090_408  # bytes of SmolLM2-135M-Instruct's fp32 model.safetensors, as the local backend saves it
GIB = 1 << 30


@pytest.fixture
def machine(monkeypatch):
    """This process's CPUs and MemAvailable, as the test sets them (both read from the host otherwise)."""
    state = {"cpus": 2, "avail": 16 * GIB}
    monkeypatch.setattr(executor, "_cpus", lambda: state["cpus"])
    monkeypatch.setattr(executor, "_mem_available", lambda: state["avail"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "ray" and state.get("ray", True) else
                        None if name == "ray" else real(name, *a))
    return state


def test_inline_and_ray_are_taken_as_given(machine):
    machine.update(cpus=1, avail=0, ray=False)
    assert choose_executor("inline") == ("inline", "executor: inline (the config's)")
    assert choose_executor("ray") == ("ray", "executor: ray (the config's)")
    with pytest.raises(ExecutorError, match=r"executor='thread': allowed: auto, inline, ray"):
        choose_executor("thread")


def test_auto_takes_ray_on_two_cpus_with_the_memory_of_two_smollm2_branches(machine):
    # per branch: 4 x 538,090,408 (weights, gradients, two AdamW moments) + 1 GiB = 3,226,103,456 bytes; x2 = 6.01 GiB
    assert 2 * (4 * SMOLLM2 + BRANCH_OVERHEAD_BYTES) == 6_452_206_912
    machine["avail"] = 6_452_206_912
    assert choose_executor("auto", weights_bytes=SMOLLM2) == (
        "ray", "executor auto: ray, 2 branches of 1 thread(s) side by side (~6.0 GiB of 6.0 GiB available)")
    machine["avail"] = 6_452_206_911
    assert choose_executor("auto", weights_bytes=SMOLLM2) == (
        "inline", "executor auto: inline (2 branches side by side need ~6.0 GiB, 6.0 GiB available)")
    machine["avail"] = 5 * GIB
    assert choose_executor("auto", weights_bytes=SMOLLM2)[1] == (
        "executor auto: inline (2 branches side by side need ~6.0 GiB, 5.0 GiB available)")
    # weights unknown (no root checkpoint yet): the overhead alone, 2 GiB
    assert choose_executor("auto")[0] == "ray"
    machine["avail"] = None  # no /proc/meminfo: not refused for memory
    assert choose_executor("auto", weights_bytes=SMOLLM2) == (
        "ray", "executor auto: ray, 2 branches of 1 thread(s) side by side (~6.0 GiB of an unknown available)")


def test_auto_counts_branches_by_cpus_and_threads(machine):
    machine["cpus"] = 1
    assert choose_executor("auto") == (
        "inline", "executor auto: inline (1 CPU(s) for branches of 1 thread(s): fewer than 2 side by side)")
    machine["cpus"] = 2
    assert choose_executor("auto", threads=2)[0] == "inline"  # one 2-thread branch at a time
    machine["cpus"] = 16
    assert choose_executor("auto", max_parallel=4, threads=2, weights_bytes=SMOLLM2)[1].startswith(
        "executor auto: ray, 4 branches of 2 thread(s) side by side (~12.0 GiB")
    assert choose_executor("auto", max_parallel=8, threads=4, weights_bytes=SMOLLM2)[1].startswith(
        "executor auto: ray, 4 branches of 4 thread(s)")  # 16 CPUs hold 4 such branches, not 8


def test_auto_stays_inline_without_ray_or_for_openrlhf(machine):
    machine["ray"] = False
    assert choose_executor("auto") == ("inline", "executor auto: inline (Ray is not installed: pip install "
                                                 "'ray>=2.40' to train branches side by side)")
    machine["ray"] = True
    assert choose_executor("auto", backend="openrlhf") == (
        "inline", "executor auto: inline (the openrlhf backend: set executor: ray to run its jobs on Ray)")


def test_the_default_config_asks_for_auto_and_a_tiny_config_for_inline():
    from evotrainer.config import RunConfig, load_run_config

    assert load_run_config("examples/default.yaml").executor == "auto"
    assert RunConfig().executor == "inline"  # a config that says nothing keeps one process
