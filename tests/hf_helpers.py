"""Loading an exported folder by its own code (configuration_rpt.py, modeling_rpt.py, ...: rpt.hf.bundle), as
transformers does with trust_remote_code=True: in this process (`load_copy`), or in a fresh one where `import rpt`
fails (`generate_without_rpt`)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

# A meta-path finder that refuses rpt: rpt is installed in the environment (editable), so it must be blocked
NO_RPT = '''
import importlib.abc, sys
class _NoRpt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "rpt" or name.startswith("rpt."):
            raise ImportError(f"No module named {name!r} (blocked: this process runs without rpt)")
sys.meta_path.insert(0, _NoRpt())
'''

CHILD = NO_RPT + '''
import json
try:
    import rpt
    raise SystemExit("rpt was imported")
except ImportError:
    pass
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, prompt, n, text = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
ids = AutoTokenizer.from_pretrained(folder, trust_remote_code=True).encode(text) if text else []
print(json.dumps({"module": type(model).__module__, "tokens": out[0, len(prompt):].tolist(), "encoded": ids,
                  "rpt": sorted(m for m in sys.modules if m == "rpt" or m.startswith("rpt."))}))
'''


def generate_without_rpt(folder: Path, prompt: list[int], n_new: int, tmp: Path, text: str = "") -> dict:
    """In a fresh Python where `import rpt` fails: AutoModelForCausalLM.from_pretrained(folder,
    trust_remote_code=True) and greedy generate(); also AutoTokenizer's ids of `text` (trust_remote_code=True too:
    without it, transformers asks whether to run the folder's code). Returns {"module": the model's
    module, "tokens": the new tokens, "encoded": those ids, "rpt": rpt modules imported (none)}."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(tmp / "hf_modules"), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error",
               OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", CHILD, str(folder), json.dumps(prompt), str(n_new), text], cwd=tmp,
                         env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    last = (out.stdout.strip().splitlines() or [""])[-1]
    assert last.startswith("{"), out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(last)


def load_copy(folder: Path, root: Path, monkeypatch) -> ModuleType:
    """The folder's modeling_rpt module as transformers loads it with trust_remote_code=True: the files auto_map names
    and those they import relatively (found by transformers' own `get_relative_import_files`), copied into a package
    of their own under `root`. Nothing of rpt is reachable from the loaded modules (checked)."""
    from transformers.dynamic_module_utils import get_relative_import_files

    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    package = f"exported_{abs(hash(str(folder))):x}"
    target = root / package
    target.mkdir(parents=True)
    (target / "__init__.py").touch()
    for ref in auto_map.values():
        module_file = folder / f"{ref.split('.')[0]}.py"
        for f in [module_file, *map(Path, get_relative_import_files(module_file))]:
            shutil.copyfile(f, target / f.name)
    monkeypatch.syspath_prepend(str(root))
    module = importlib.import_module(f"{package}.modeling_rpt")
    for name, mod in list(sys.modules.items()):
        if name.startswith(package):
            for value in vars(mod).values():
                owner = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
                assert not (isinstance(owner, str) and (owner == "rpt" or owner.startswith("rpt."))), (name, value)
    return module
