"""RPT: the Retrieval-Pretrained Transformer (Rubin & Berant, TACL) in PyTorch.

    from rpt import RPT, RPTConfig
    model = RPT(RPTConfig.from_preset("tiny", variant="rpt-sem", vocab_size=V))
    logits = model(input_ids).logits  # [B, T, V]

Exported models (`rpt export`) load with transformers' AutoModelForCausalLM once rpt is imported (rpt.hf_auto).
"""

from rpt import hf_auto
from rpt.config import RPTConfig

__all__ = ["RPT", "RPTConfig"]
__version__ = "0.1.0"

hf_auto.install()  # registers with transformers' Auto classes when transformers loads (rpt/hf_auto.py)


def __getattr__(name: str):
    # The model imports torch; keep `import rpt` (config, CLI start-up) light.
    if name == "RPT":
        from rpt.model.rpt import RPT

        return RPT
    raise AttributeError(name)
