"""FSDP keeps its weights: two CPU processes (gloo) train a tiny Llama under accelerate's FSDP2 with the
shipped configs/accelerate/fsdp.yaml settings, checkpoint, resume to a larger train.max_steps (the
override after --resume), and the checkpoint holds every decoder layer's LoRA tensors, which change the
exported model; the clipped gradient norm is the whole model's (it matches one process with the same
global batch). FSDP1's wrapped parameter names are tested in-process (FSDP1 does not run on CPUs)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from ropescale.training.checkpoints import TRAINABLE_FILE, select_trainable, unwrapped_name
from ropescale.training.export import merged_model
from ropescale.training.modeling import CausalLMLoss, wrap_lora
from ropescale.training.trainer import Trainer
from tests.conftest import tiny_model
from tests.training.conftest import recipe

ROOT = Path(__file__).resolve().parents[2]
LAYERS, PROJ = 2, ("q_proj", "k_proj", "v_proj", "o_proj")


def fsdp_env(config_file: Path) -> dict[str, str]:
    """What ``accelerate launch --config_file`` exports for the file's fsdp_config, on CPU processes."""
    data = yaml.safe_load(config_file.read_text())
    env = {"ACCELERATE_USE_FSDP": "true", "ACCELERATE_USE_CPU": "true"}
    for key, value in data["fsdp_config"].items():
        env["FSDP_" + key.removeprefix("fsdp_").upper()] = str(value).lower() if isinstance(value, bool) else str(value)
    env["FSDP_SYNC_MODULE_STATES"] = "false"  # accelerate's broadcast of rank 0's weights needs an accelerator
    return env


def _launch(args: list[str], env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **env_extra}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.run(
        [*cmd, str(ROOT / "tests" / "training" / "fsdp_cpu_main.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc


def _metrics(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def test_fsdp2_checkpoint_resume_export_keep_every_layer(tmp_path, model_dir):
    from safetensors.torch import load_file

    text = tmp_path / "text.txt"
    text.write_text("The cat sat on the mat and looked at the rain. " * 200)
    raw = {
        "model": {"name": str(model_dir), "attn_implementation": "sdpa"},
        "scaling": {"method": "yarn", "factor": 4},
        "lora": {"r": 4, "alpha": 8, "trainable": ["norm"]},
        "data": {"source": str(text), "seq_len": 32},
        "optim": {"lr": 1e-2, "warmup_steps": 1, "schedule": "constant", "max_grad_norm": 0.05},  # clipping active
        "train": {"max_steps": 2, "save_every": 1, "gradient_checkpointing": True},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    run = tmp_path / "fsdp"
    env = fsdp_env(ROOT / "configs" / "accelerate" / "fsdp.yaml")
    cli = ["train", "--config", str(path), "--no-progress", "--output-dir", str(run)]
    _launch(cli, env)
    assert (run / "checkpoints" / "step-00000002" / "optimizer.bin").is_file()  # the FSDP optimizer file
    _launch([*cli, "--resume", "train.max_steps=4"], env)  # resume to train longer, override after the flag

    saved = load_file(run / "checkpoints" / "step-00000004" / TRAINABLE_FILE)
    for i in range(LAYERS):
        for proj in PROJ:
            for ab in ("lora_A", "lora_B"):
                assert f"base_model.model.model.layers.{i}.self_attn.{proj}.{ab}.default.weight" in saved
    config = recipe(tmp_path, model={"name": str(model_dir)}, lora=raw["lora"])
    expected = {n for n, p in wrap_lora(tiny_model("llama"), config).named_parameters() if p.requires_grad}
    assert set(saved) == expected

    merged = merged_model(run)
    base = tiny_model("llama")
    for i in range(LAYERS):
        for proj in PROJ:
            got = getattr(merged.model.layers[i].self_attn, proj).weight
            assert (got - getattr(base.model.layers[i].self_attn, proj).weight).abs().amax() > 1e-4, (i, proj)

    # one process with the same global batch (2 windows): same clipped gradient norms and weights
    one = recipe(tmp_path / "one", model={"name": str(model_dir)}, **{k: raw[k] for k in ("lora", "data", "optim")})
    one.train.max_steps, one.train.batch_size, one.train.gradient_checkpointing = 4, 2, True
    Trainer(one, progress=False).train()
    fsdp_norms = [m["grad_norm"] for m in _metrics(run) if "loss" in m]
    one_norms = [m["grad_norm"] for m in _metrics(one.output_dir) if "loss" in m]
    assert fsdp_norms == pytest.approx(one_norms, rel=1e-4) and all(n > 0.05 for n in one_norms)
    single = load_file(one.output_dir / "checkpoints" / "step-00000004" / TRAINABLE_FILE)
    for name in single:
        torch.testing.assert_close(saved[name], single[name], rtol=0, atol=1e-5, msg=name)


def test_fsdp1_wrapped_names_are_matched_unwrapped(tmp_path, monkeypatch):
    """FSDP1 (use_orig_params) puts ``_fsdp_wrapped_module.`` inside every decoder layer's parameter
    names; the checkpoint filter must still find every trainable tensor (it used to keep only the
    final norm). One gloo process: FSDP1 wraps on CPU but does not compute there."""
    import torch.distributed as dist
    import torch.distributed.fsdp._init_utils as init_utils
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    real = init_utils._get_compute_device

    def cpu_compute(module, ignored, device, rank, handle):  # FSDP1 assumes an accelerator here
        return (
            torch.device("cpu")
            if device is not None and device.type == "cpu"
            else real(module, ignored, device, rank, handle)
        )

    monkeypatch.setattr(init_utils, "_get_compute_device", cpu_compute)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        peft_model = wrap_lora(
            tiny_model("llama", attn_implementation="sdpa"), recipe(tmp_path, lora={"trainable": ["norm"]})
        )
        names = [n for n, p in peft_model.named_parameters() if p.requires_grad]
        layer = type(peft_model.get_base_model().model.layers[0])
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer})
        module = FSDP(
            CausalLMLoss(peft_model), use_orig_params=True, device_id=torch.device("cpu"), auto_wrap_policy=policy
        )
        with FSDP.state_dict_type(module, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)):
            full = module.state_dict()  # what accelerate's get_state_dict gathers: clean keys
        after = {f"model.{n}" for n, p in peft_model.named_parameters() if p.requires_grad}  # names once wrapped
        assert sum("_fsdp_wrapped_module." in n for n in after) == len(names) - 1  # all but the final norm
        assert {k for k in full if k in after} == {"model.base_model.model.model.norm.weight"}  # the old filter
        assert set(select_trainable(full, names, prefix="model.")) == set(names)
        wrapped = dict(module.named_parameters())  # wrapped names, root prefix included
        assert set(select_trainable(wrapped, names, prefix="model.")) == set(names)
        assert len(names) == 2 * LAYERS * 4 + 2 * LAYERS + 1
        assert unwrapped_name("a._fsdp_wrapped_module.b._checkpoint_wrapped_module.c") == "a.b.c"
    finally:
        dist.destroy_process_group()
