import os

import pytest
import torch

# Two cores here: one thread per test process keeps timings stable and avoids oversubscription.
torch.set_num_threads(int(os.environ.get("RPT_TEST_THREADS", "1")))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
