"""Dequantise a GGUF causal LM once into a Hugging Face folder (fp32 safetensors, its tokenizer beside them).

    python scripts/dequantise_gguf.py SmolLM2-135M-Instruct.Q4_1.gguf backbones/smollm2

Every `rpt train --backbone X.gguf` (and eval, label, generate) dequantises the file again when it loads it, which
takes tens of seconds; a folder loads in about a second and tokenizes identically (the same tokenizer hash). The
folder must not exist yet.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gguf", help="a .gguf file")
    p.add_argument("out", help="the folder to write (must not exist)")
    a = p.parse_args(argv)
    src, out = Path(a.gguf), Path(a.out)
    if src.suffix != ".gguf" or not src.is_file():
        p.error(f"{a.gguf}: not a .gguf file")
    if out.exists():
        p.error(f"{a.out}: exists (choose a new folder)")
    from transformers import AutoModelForCausalLM

    from rpt.model.backbone import load_backbone, load_tokenizer

    model = load_backbone(src)
    cfg = model.config
    if hasattr(cfg, "quantization_config"):  # transformers marks a GGUF-loaded model as quantized: not serialisable
        del cfg.quantization_config
    plain = AutoModelForCausalLM.from_config(cfg)
    plain.load_state_dict(model.state_dict())
    tmp = out.with_name(f".{out.name}.partial")
    plain.save_pretrained(tmp)
    load_tokenizer(src).save_pretrained(tmp)
    tmp.rename(out)
    print(f"dequantised: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
