"""The restricted unpickler of DeepSpeed states admits an explicit list of
globals, judged by name before any module is imported: a torch module class or an unknown module
is refused, and the unknown module is never imported."""

import sys

import pytest

pytestmark = pytest.mark.unit


def _state(tmp_path, payload: bytes):
    root = tmp_path / "ckpt"
    step = root / "global_step3"
    step.mkdir(parents=True)
    (step / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(payload)
    return root


@pytest.mark.parametrize("module,name", [("torch.nn.modules.linear", "Linear"), ("torch.utils.data", "DataLoader"),
                                         ("deepspeed.launcher.runner", "main"),
                                         ("whetstone_planted_module_35", "Anything")])
def test_only_the_listed_globals_load_and_nothing_is_imported_first(tmp_path, monkeypatch, module, name):
    from whetstone.trainer_agent.recipes.errors import PlatformError
    from whetstone.trainer_agent.recipes.safe_load import verify_checkpoint_pickles

    # a module whose import alone would act (a planted one on the path)
    marker = tmp_path / "imported"
    (tmp_path / "whetstone_planted_module_35.py").write_text(f"open({str(marker)!r}, 'w').close()\nAnything = dict\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # a legacy (non-zip) pickle naming one global and calling it with no arguments
    payload = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b")R."
    with pytest.raises(PlatformError, match=f"global {module}.{name} is not admitted"):
        verify_checkpoint_pickles(_state(tmp_path, payload))
    assert not marker.exists() and "whetstone_planted_module_35" not in sys.modules   # judged by name, unimported


def test_deepspeed_zero_state_objects_still_load(tmp_path):
    from collections import OrderedDict

    import torch
    from whetstone.trainer_agent.recipes.safe_load import verify_checkpoint_pickles

    loss_scaler = pytest.importorskip("deepspeed.runtime.fp16.loss_scaler")
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    root = tmp_path / "ds"
    step = root / "global_step1"
    step.mkdir(parents=True)
    torch.save({"loss_scaler": loss_scaler.DynamicLossScaler(2.0 ** 16, 1000, 1.0, 2, True),
                "static": loss_scaler.LossScaler(1.0), "zero_stage": ZeroStageEnum.gradients,
                "param_slice_mappings": [OrderedDict(w=fragment_address(numel=4, start=0))],
                "p": torch.nn.Parameter(torch.zeros(2)), "t": torch.zeros(2, dtype=torch.bfloat16),
                "shape": torch.Size([2]), "device": torch.device("cpu"), "steps": {1, 2}},
               step / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    assert len(verify_checkpoint_pickles(root)) == 1
