"""A new training state (the initialisers' compile and run, the optimiser state) is built in a
thread while the step compiles for placeholders of it: the compile must not wait for it, the
executable must take the state once built (weak types and shardings as the placeholders
said) and compute what jax's own jitted step computes on the same arrays, and a state that
cannot be built must fail the run where its first step would, leaving nothing behind."""

import threading
from concurrent.futures import Future

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from builders import ROOT, tiny_program, tiny_recipe_sets

import vit.training.program as program_module

GATE_S = 60  # a compile that waited for the state would stop here, and the test fail


def _gated_state(monkeypatch) -> threading.Event:
    """`new_state` made to wait for the returned event before building the state."""
    gate, real = threading.Event(), program_module.new_state

    def gated(*args, **kwargs):
        assert gate.wait(GATE_S), "the state was never let through"
        return real(*args, **kwargs)

    monkeypatch.setattr(program_module, "new_state", gated)
    return gate


@pytest.mark.parametrize("sets", [(), ("train.ema_decay=0.9", "optim.trainable=blocks.*")],
                         ids=["plain", "ema-and-frozen"])
def test_the_step_compiles_before_the_state_exists_and_then_takes_it(sets, monkeypatch):
    gate = _gated_state(monkeypatch)
    program, batch = tiny_program("optim.warmup_steps=0", *sets)
    program.compile(batch)
    assert not gate.is_set() and isinstance(program.built, Future)
    assert not program.built.done()  # compiled while the state was still waiting
    gate.set()
    # jax's own jitted step on copies of the same arguments (the step donates its inputs)
    copies = jax.tree.map(lambda x: jnp.copy(x) if isinstance(x, jax.Array) else x,
                          program.args(batch))
    before = jax.tree.map(np.array, program.state.params)
    want_params, want_opt, _, want_metrics = program.step_fn(*copies)
    metrics = program(batch)  # the executable compiled for the placeholders
    np.testing.assert_allclose(float(metrics["loss"]), float(want_metrics["loss"]), rtol=1e-6)
    moved = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != b)),
                         program.state.params, before)
    assert any(jax.tree.leaves(moved))  # the step changed weights: the comparison compares
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 (program.state.params, program.state.opt_state), (want_params, want_opt))


def test_a_state_that_cannot_be_built_fails_where_it_is_first_used(monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("no state for you")

    monkeypatch.setattr(program_module, "new_state", broken)
    program, batch = tiny_program()
    program.compile(batch)  # the compile never needed it
    program.wait()  # returns: the failure belongs to whoever asks for the state
    with pytest.raises(ValueError, match="no state for you"):
        program(batch)


def test_a_new_run_whose_state_runs_out_of_memory_is_one_line_and_leaves_nothing(
        tmp_path, monkeypatch, run_vit):
    def no_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(program_module, "new_state", no_memory)
    argv = ["train", "--config", ROOT / "configs" / "digits.py", "--workdir", tmp_path / "new"]
    for item in tiny_recipe_sets():
        argv += ["--set", item]
    code, err = run_vit(argv)
    assert code == 2, err
    assert err[-1].startswith("vit train: error: the first training step does not fit in "
                              "memory"), err
    assert not (tmp_path / "new").exists()
