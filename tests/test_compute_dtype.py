"""A recipe's `model.dtype='auto'`: bfloat16 where the host has the arithmetic (a CPU with
AVX512_BF16 or AMX, a GPU, a TPU), float32 elsewhere; resolved where the recipe becomes the
model's fields, printed once with the flag that overrides it, and reported by the dry run. The
host is played by a patched feature check, both ways."""

from pathlib import Path

import pytest
from builders import tiny_recipe

from vit.errors import ConfigError
from vit.recipes.load import _run_recipe
from vit.training.from_recipe import dtype_line, model_fields, resolved_dtype

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.stem for p in (ROOT / "configs").glob("*.py"))


@pytest.fixture
def host(monkeypatch):
    """-> set(features, backend="cpu"): this host's bfloat16 features and jax backend."""
    import jax

    def set_host(features: tuple[str, ...], backend: str = "cpu"):
        monkeypatch.setattr("vit.cpu.features.cpu_bfloat16_features", lambda: features)
        monkeypatch.setattr(jax, "default_backend", lambda: backend)

    return set_host


@pytest.mark.parametrize("features, backend, dtype", [
    (("avx512_bf16", "amx_bf16"), "cpu", "bfloat16"),
    ((), "cpu", "float32"),
    ((), "gpu", "bfloat16"),
    ((), "tpu", "bfloat16"),
])
def test_auto_resolves_by_the_host(host, features, backend, dtype):
    host(features, backend)
    config = tiny_recipe("model.dtype=auto")
    assert config.model.dtype == "auto"  # the recipe keeps it: config.json says auto
    assert model_fields(config)["dtype"] == dtype
    assert resolved_dtype(config)[0] == dtype


def test_a_named_dtype_is_kept_whatever_the_host(host):
    host(())
    config = tiny_recipe("model.dtype=bfloat16")
    assert model_fields(config)["dtype"] == "bfloat16"
    assert resolved_dtype(config) == ("bfloat16", None) and dtype_line(config) is None
    assert "dtype" not in model_fields(tiny_recipe())  # unset: ViTConfig's default


def test_the_start_up_line_names_the_choice_why_and_the_override(host):
    host(())
    assert dtype_line(tiny_recipe("model.dtype=auto")) == (
        "compute dtype: float32 (auto: this CPU has no bfloat16 arithmetic; "
        "--set model.dtype=bfloat16 to override)")
    host(("avx512_bf16", "amx_bf16"))
    assert dtype_line(tiny_recipe("model.dtype=auto")) == (
        "compute dtype: bfloat16 (auto: this CPU has bfloat16 arithmetic: avx512_bf16, "
        "amx_bf16; --set model.dtype=float32 to override)")
    host((), "gpu")
    assert dtype_line(tiny_recipe("model.dtype=auto")) == (
        "compute dtype: bfloat16 (auto: the backend is gpu; --set model.dtype=float32 to "
        "override)")


def test_an_unknown_dtype_is_one_line_listing_auto():
    with pytest.raises(ConfigError) as err:
        model_fields(tiny_recipe("model.dtype=bfloat"))
    assert str(err.value) == ("model.dtype='bfloat' is not valid; choose one of auto, float32, "
                              "bfloat16, float16")


def test_the_shipped_recipes_let_the_host_choose_bfloat16():
    """A recipe that computes narrow for speed says `auto`, so a CPU without bfloat16
    arithmetic computes in float32."""
    for name in RECIPES:
        model = _run_recipe(ROOT / "configs" / f"{name}.py").get_config().model
        assert model.get("dtype", "float32") in ("auto", "float32"), name
        if model.get("dtype") == "auto":
            doc = (ROOT / "configs" / f"{name}.py").read_text().split('"""')[1]
            assert "auto" in doc, f"configs/{name}.py: its docstring does not say auto"


def test_a_recipe_with_auto_dry_runs_printing_the_choice_once(host, capsys):
    from vit.training.dry_run import dry_run

    host(())
    lines = []
    dry_run(tiny_recipe("model.dtype=auto"), measure=False, out=lines.append)
    printed = capsys.readouterr().out.splitlines()
    assert printed.count("compute dtype: float32 (auto: this CPU has no bfloat16 arithmetic; "
                         "--set model.dtype=bfloat16 to override)") == 1, printed
    model = next(line for line in lines if line.startswith("model:"))
    assert "float32 compute (auto)" in model, model
