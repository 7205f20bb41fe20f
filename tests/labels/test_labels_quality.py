"""Supervision quality: max target score among BM25's top-K, averaged over query chunks (paper Fig. scored_ds)."""

import numpy as np
import pytest

from rpt.labels.quality import max_target_curve, plot_supervision_quality

nan = np.nan


def test_curve_on_a_hand_computed_case():
    target = np.array([[-1.0, 2.0, 0.5, nan],  # running max -1, 2, 2, 2
                       [0.3, -4.0, nan, nan],  # 0.3, 0.3, 0.3, 0.3 (fewer candidates: keeps its max)
                       [nan, nan, nan, nan],  # no candidates: not counted
                       [-2.0, -1.0, -3.0, 1.0]])  # -2, -1, -1, 1
    curve = max_target_curve(target)
    np.testing.assert_allclose(curve, [(-1 + 0.3 - 2) / 3, (2 + 0.3 - 1) / 3, (2 + 0.3 - 1) / 3, (2 + 0.3 + 1) / 3])
    assert max_target_curve(target, max_k=2).shape == (2,)
    assert np.isnan(max_target_curve(np.full((3, 4), nan))).all()


def test_curve_never_decreases_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(0)
    target = rng.normal(size=(200, 20)).astype(np.float32)
    target[rng.random((200, 20)) < 0.1] = nan
    target[:, 0] = rng.normal(size=200)
    curve = max_target_curve(target)
    assert curve.shape == (20,) and (np.diff(curve) >= 0).all()
    png = plot_supervision_quality({"random": curve, "shifted": curve - 1}, tmp_path / "q" / "scored_ds.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
