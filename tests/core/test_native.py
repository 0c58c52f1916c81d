"""The compiled client step (fedrecgel.native) against the torch code it replaces.

Where the kernels cannot be built (no C++ compiler), these tests skip; CI sets
FEDREC_NATIVE=1, so there a missing build fails them instead."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedrecgel.model import ModelConfig, init_shared
from fedrecgel.native import NativeSettingError, check, mode
from fedrecgel.native import ops as native
from fedrecgel.passes import Layout, SharedGrads, make_layout
from fedrecgel.sam import (
    PrivateState,
    SAMConfig,
    _group_step,
    client_rng,
    client_samples,
    cohort_step,
)

REL = 1e-5  # against each tensor's norm: float32 sums in another order

#: the layout, the weighted upload, the private gradients and the losses of one group step
Step = tuple[Layout, dict[str, torch.Tensor], dict[str, torch.Tensor], torch.Tensor]
Group = tuple[
    ModelConfig,
    dict[str, torch.Tensor],
    np.ndarray,
    PrivateState,
    list[tuple[np.ndarray, np.ndarray]],
]


@pytest.fixture(scope="module")
def ops() -> Any:
    k = native.kernels()
    if k is None:
        if os.environ.get("FEDREC_NATIVE") == "1":
            pytest.fail("FEDREC_NATIVE=1 but the native kernels are not available")
        pytest.skip("the native kernels cannot be built here (no C++ compiler or ninja)")
    return k


def _group(
    layers: int = 3,
    factor: int = 8,
    n_users: int = 13,
    n_items: int = 60,
    empty: tuple[int, ...] = (),
    seed: int = 5,
) -> Group:
    """A group of clients with repeated items (several samples per (client, item) pair) and,
    for the indices in ``empty``, clients without samples."""
    cfg = ModelConfig(n_items=n_items, kind="ncf", factor=factor, layers=layers)
    shared = init_shared(cfg, seed=1)
    users = np.arange(20, 20 + n_users)
    rng = np.random.default_rng(seed)
    samples = []
    for i, u in enumerate(users):
        if i in empty:
            samples.append((np.zeros(0, np.int64), np.zeros(0, np.float32)))
            continue
        pos = rng.choice(n_items, size=int(rng.integers(1, 25)), replace=True)
        samples.append(client_samples(pos, n_items, 4, client_rng(0, 1, int(u))))
    state = PrivateState.fresh(cfg, 0, users)
    return cfg, shared, users, state, samples


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / max(float(want.norm()), 1e-30))


def _both(
    ops: Any,
    cfg: ModelConfig,
    shared: dict[str, torch.Tensor],
    state: PrivateState,
    samples: list[tuple[np.ndarray, np.ndarray]],
    hp: SAMConfig,
    weights: torch.Tensor,
) -> list[Step]:
    out: list[Step] = []
    for step in (None, ops):
        shapes = cfg.shared_shapes()
        tables = {t: torch.zeros(shapes[t]) for t in cfg.item_tables()}
        with torch.no_grad():
            if step is None:
                lay, up, priv, loss = _group_step(
                    cfg, shared, state.params, samples, hp, weights, tables
                )
                assert not isinstance(up, SharedGrads)  # weights given: their weighted sum
                out.append((lay, up, priv, loss))
            else:
                rho = (hp.rho_sh, hp.rho_ns)
                out.append(
                    native.group_step(
                        step,
                        cfg,
                        shared,
                        state.params,
                        samples,
                        rho,
                        hp.chunk_size,
                        weights,
                        tables,
                    )
                )
    return out


@pytest.mark.parametrize(
    ("layers", "factor", "rho_ns", "empty"),
    [(3, 8, 0.02, ()), (3, 8, 0.0, ()), (1, 4, 0.02, ()), (2, 16, 0.5, (0, 6)), (4, 4, 0.02, ())],
)
def test_group_step_matches_the_torch_passes(
    ops: Any, layers: int, factor: int, rho_ns: float, empty: tuple[int, ...]
) -> None:
    cfg, shared, users, state, samples = _group(layers, factor, empty=empty)
    lay_n = sum(len(s[0]) for s in samples)
    hp = SAMConfig(rho_sh=0.3, rho_ns=rho_ns)
    weights = torch.from_numpy(np.random.default_rng(2).random(len(users)).astype(np.float32))
    (lay, up_t, priv_t, loss_t), (_, up_n, priv_n, loss_n) = _both(
        ops, cfg, shared, state, samples, hp, weights
    )
    assert len(lay.items) == lay_n
    assert len(lay.pair_items) < lay_n  # some (client, item) pairs have several samples
    assert set(up_n) == set(up_t)
    for k in up_t:
        assert up_n[k].shape == up_t[k].shape
        assert _rel(up_n[k], up_t[k]) < REL, k
    for k in priv_t:
        assert _rel(priv_n[k], priv_t[k]) < REL, k
    np.testing.assert_allclose(loss_n.numpy(), loss_t.numpy(), rtol=1e-5, atol=1e-6)
    for i in empty:
        assert float(loss_n[i]) == 0.0
        assert not priv_n["user_gmf"][i].any() and not priv_n["user_mlp"][i].any()


def test_a_large_perturbation_changes_the_upload(ops: Any) -> None:
    """The comparison above would pass for a kernel that ignored pass 2's perturbation only if
    the perturbation did not matter: here it does."""
    cfg, shared, users, state, samples = _group()
    w = torch.full((len(users),), 1.0 / len(users))
    small = _both(ops, cfg, shared, state, samples, SAMConfig(rho_sh=1e-6), w)[1][1]
    large = _both(ops, cfg, shared, state, samples, SAMConfig(rho_sh=2.0), w)[1][1]
    assert _rel(large["tower.0.weight"], small["tower.0.weight"]) > 1e-2


def test_the_bytes_do_not_depend_on_the_thread_count(ops: Any) -> None:
    cfg, shared, users, state, samples = _group(n_users=40)
    w = torch.full((len(users),), 1.0 / len(users))
    hp = SAMConfig()
    threads = torch.get_num_threads()
    runs: list[list[Step]] = []
    try:
        for t in (1, 2, 2):
            torch.set_num_threads(t)
            runs.append(_both(ops, cfg, shared, state, samples, hp, w))
    finally:
        torch.set_num_threads(threads)
    (_, up_t, _, _), (_, up_1, priv_1, _) = runs[0]
    for _, (_, up, priv, _) in runs[1:]:
        for k in up_1:
            assert torch.equal(up[k], up_1[k]), k
        for k in priv_1:
            assert torch.equal(priv[k], priv_1[k]), k
    for k in up_1:
        assert _rel(up_1[k], up_t[k]) < REL, k


def test_cohort_step_uses_the_kernels_and_off_turns_them_off(
    ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, shared, users, state, samples = _group()
    calls: list[int] = []
    real = native.group_step

    def counted(*a: Any) -> Any:
        calls.append(1)
        return real(*a)

    monkeypatch.setattr(native, "group_step", counted)
    w = np.full(len(users), 1.0 / len(users))
    hp = SAMConfig(max_batch_samples=200)  # several groups
    got = cohort_step(cfg, shared, users, state, samples, hp, w)
    n_native = len(calls)
    assert n_native > 1
    with native.off():
        want = cohort_step(cfg, shared, users, state, samples, hp, w)
    assert len(calls) == n_native
    assert got.aggregate is not None and want.aggregate is not None
    for k in want.aggregate:
        assert _rel(got.aggregate[k], want.aggregate[k]) < REL, k
    for k in want.state.params:
        assert _rel(got.state.params[k], want.state.params[k]) < REL, k
    # per-client uploads, MF and rho_sh = 0 always take the torch code
    cohort_step(cfg, shared, users, state, samples, hp)
    cohort_step(cfg, shared, users, state, samples, replace(hp, rho_sh=0.0), w)
    assert len(calls) == n_native


def test_wrong_tensors_are_refused_with_a_message(ops: Any) -> None:
    cfg, shared, users, state, samples = _group()
    bad = dict(shared)
    bad["item_gmf"] = shared["item_gmf"].double()
    tables = {t: torch.zeros(s) for t, s in cfg.shared_shapes().items() if t in cfg.item_tables()}
    w = torch.full((len(users),), 0.1)
    with pytest.raises(RuntimeError, match="item_gmf must be a contiguous float32"):
        native.group_step(ops, cfg, bad, state.params, samples, (0.1, 0.1), 128, w, tables)


def test_the_mode_variable_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDREC_NATIVE", "yes")
    with pytest.raises(NativeSettingError, match="FEDREC_NATIVE must be one of auto, 0, 1"):
        mode()
    assert check() == "FEDREC_NATIVE must be one of auto, 0, 1, not 'yes'"
    monkeypatch.setenv("FEDREC_NATIVE", "0")
    assert check() is None


def _fresh(tmp_path: Path, mode: str, path: str) -> subprocess.CompletedProcess[str]:
    """kernels() in a fresh process with an empty build folder and the given PATH."""
    env = {
        **os.environ,
        "FEDREC_NATIVE": mode,
        "FEDREC_NATIVE_DIR": str(tmp_path),
        "PATH": path,
    }
    code = "from fedrecgel.native import ops; print(ops.kernels() is None)"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )


def test_without_a_compiler_auto_falls_back_and_1_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    r = _fresh(tmp_path / "build", "auto", str(empty))
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr
    r = _fresh(tmp_path / "build", "1", str(empty))
    assert r.returncode != 0
    assert "NativeUnavailable: the native kernels could not be built or loaded" in r.stderr
    r = _fresh(tmp_path / "build", "0", os.environ["PATH"])
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr


def test_commands_refuse_a_bad_setting_with_a_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {**os.environ, "FEDREC_NATIVE": "fast"}
    r = subprocess.run(
        [sys.executable, "-m", "services.cli", "train", "--rounds", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2
    assert "error: FEDREC_NATIVE must be one of auto, 0, 1, not 'fast'" in r.stderr
    assert "Traceback" not in r.stderr
    from services.client_sim.cli import main as worker_main

    monkeypatch.setenv("FEDREC_NATIVE", "fast")
    assert worker_main([]) == 2
    assert "FEDREC_NATIVE must be one of" in capsys.readouterr().err


def test_a_layout_with_an_index_out_of_range_is_refused_before_any_write(ops: Any) -> None:
    cfg, shared, _, state, samples = _group()
    lay = make_layout(samples, cfg.n_items, 128)
    c, n = lay.n_clients, len(lay.items)
    layers = range(cfg.layers)
    acc_w = [torch.zeros_like(shared[f"tower.{k}.weight"]) for k in layers]
    acc_b = [torch.zeros_like(shared[f"tower.{k}.bias"]) for k in layers]
    row_gmf = torch.zeros(n, cfg.factor)

    def call(items: torch.Tensor, sample_pair: torch.Tensor) -> None:
        ops.ncf_group_step(
            torch.from_numpy(lay.offsets),
            torch.from_numpy(np.asarray(lay.pair_offsets, dtype=np.int64)),
            sample_pair,
            lay.pair_items,
            items,
            lay.labels,
            lay.weights,
            torch.full((c,), 0.1),
            state.params["user_gmf"],
            state.params["user_mlp"],
            [shared[f"tower.{k}.weight"] for k in layers],
            [shared[f"tower.{k}.bias"] for k in layers],
            shared["predict.weight"].reshape(-1),
            shared["predict.bias"],
            shared["item_gmf"],
            shared["item_mlp"],
            0.1,
            0.1,
            acc_w,
            acc_b,
            torch.zeros(shared["predict.weight"].numel()),
            torch.zeros(1),
            row_gmf,
            torch.zeros(n, cfg.mlp_dim),
            torch.zeros(c, cfg.factor),
            torch.zeros(c, cfg.mlp_dim),
            torch.zeros(c),
        )

    far = lay.items.clone()
    far[-1] = cfg.n_items  # one past the tables
    with pytest.raises(RuntimeError, match="outside its client's range"):
        call(far, lay.sample_pair)
    other = lay.sample_pair.clone()
    other[0] = lay.pair_offsets[1]  # the first client's sample pointing at the second's pair
    with pytest.raises(RuntimeError, match="outside its client's range"):
        call(lay.items, other)
    assert not row_gmf.any() and not any(t.any() for t in acc_w)
    call(lay.items, lay.sample_pair)
    assert row_gmf.any() and all(t.any() for t in acc_w)


def test_a_failed_build_is_not_tried_again_by_auto(tmp_path: Path) -> None:
    """In a fresh build folder, a build that fails leaves its note; ``auto`` then uses the
    torch code at once in later processes instead of compiling again in each."""
    code = (
        "import sys, torch.utils.cpp_extension as x\n"
        "def load(*a, **k):\n"
        "    print('compiling')\n"
        "    raise RuntimeError('compiler exploded')\n"
        "x.load = load\n"
        "from fedrecgel.native import ops\n"
        "print(ops.kernels() is None)\n"
    )
    env = {**os.environ, "FEDREC_NATIVE": "auto", "FEDREC_NATIVE_DIR": str(tmp_path)}
    runs = [
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr
    assert runs[0].stdout.split() == ["compiling", "True"]
    assert "compiler exploded" in runs[0].stderr  # the warning says why
    assert runs[1].stdout.split() == ["True"]  # no second attempt
    (note,) = tmp_path.glob("*/build-failed")
    assert "compiler exploded" in note.read_text()


def test_a_library_left_by_a_killed_build_is_built_again_not_loaded(tmp_path: Path) -> None:
    """A build killed while linking leaves a library file but no note that it finished: the
    next process builds again instead of loading the broken file."""
    code = (
        "import torch.utils.cpp_extension as x\n"
        "def load(*a, **k):\n"
        "    print('compiling')\n"
        "    raise RuntimeError('stopped here')\n"
        "x.load = load\n"
        "from fedrecgel.native import ops\n"
        "d = ops.build_dir(); d.mkdir(parents=True)\n"
        "(d / 'fedrecgel_native.so').write_bytes(b'half a library')\n"
        "print(ops.kernels() is None)\n"
    )
    env = {**os.environ, "FEDREC_NATIVE": "auto", "FEDREC_NATIVE_DIR": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["compiling", "True"]
    assert "half a library" not in r.stderr
