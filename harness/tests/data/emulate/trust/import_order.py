"""Allocates N bytes on the emulated GPU after importing torch in the way argv[1] names; prints
EXPECT with what PyTorch itself saw (stderr under --json)."""
import importlib
import importlib.util
import json
import sys

how, n = sys.argv[1], int(sys.argv[2])
if how == "find_spec":
    assert importlib.util.find_spec("torch") is not None
    import torch
elif how == "import_module":
    torch = importlib.import_module("torch")
elif how == "from_import":
    from torch import empty, uint8  # noqa: F401
    torch = sys.modules["torch"]
elif how == "transformers_first":
    import torch
    import transformers  # noqa: F401  (imports torch itself, after probing for it)
else:
    raise SystemExit(f"unknown order {how}")
x = torch.empty(n, dtype=torch.uint8, device="cuda")
print("EXPECT " + json.dumps({"allocated": torch.cuda.max_memory_allocated(),
                              "cudnn": torch.backends.cudnn.enabled}), flush=True)
