"""`import realm_hf` registers the REALM classes with the Auto classes, idempotently, and does nothing else."""

import os
import subprocess
import sys

import torch
from conftest import tiny_config
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM

import realm_hf
import realm_hf.default_model
from realm_hf import AutoModelForOpenQA, RealmConfig, RealmEmbedder, RealmForOpenQA, RealmKnowledgeAugEncoder


def test_auto_classes_resolve_realm(tmp_path):
    config = tiny_config()
    config.save_pretrained(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)) is RealmConfig
    assert type(AutoModel.from_config(config)) is RealmEmbedder
    assert type(AutoModelForMaskedLM.from_config(config)) is RealmKnowledgeAugEncoder
    assert type(AutoModelForOpenQA.from_config(config)) is RealmForOpenQA


def test_auto_model_for_open_qa_loads_saved_weights(tmp_path):
    model = RealmForOpenQA(tiny_config())
    model.save_pretrained(tmp_path)
    loaded = AutoModelForOpenQA.from_pretrained(tmp_path)
    assert type(loaded) is RealmForOpenQA
    assert torch.equal(loaded.block_emb, model.block_emb)


def test_register_is_idempotent():
    realm_hf.register()
    realm_hf.register()
    assert type(AutoModel.from_config(tiny_config())) is RealmEmbedder


def test_import_has_no_side_effects():
    # A fresh interpreter: importing realm_hf changes no environment variable, warning filter or logging handler.
    # Dependencies go first: torch and transformers have import-time effects of their own.
    script = (
        "import os, warnings, logging, json, numpy, torch, transformers, huggingface_hub, safetensors\n"
        "import transformers.models.bert.modeling_bert, transformers.models.auto.auto_factory\n"
        "env, filters, handlers = dict(os.environ), list(warnings.filters), list(logging.getLogger().handlers)\n"
        "import realm_hf\n"
        "print(json.dumps([dict(os.environ) == env, list(warnings.filters) == filters,"
        " list(logging.getLogger().handlers) == handlers]))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[true, true, true]"


def test_the_open_qa_pipeline_task_is_registered_once():
    from transformers.pipelines import PIPELINE_REGISTRY

    from realm_hf import OpenQAPipeline

    realm_hf.register()
    realm_hf.register()
    assert list(PIPELINE_REGISTRY.get_supported_tasks()).count("open-qa") == 1
    _, task, _ = PIPELINE_REGISTRY.check_task("open-qa")
    assert task["impl"] is OpenQAPipeline
    assert task["pt"] == (AutoModelForOpenQA,) and task["type"] == "text"
    assert dict(task["default"]) == {"model": (str(realm_hf.default_model.default_model_dir()), None)}


def test_a_pipeline_without_a_model_reads_the_installed_default_model(tmp_path, monkeypatch):
    import pytest
    from transformers import pipeline

    import realm_hf.default_model
    from realm_hf.demo import ensure_demo_model

    demo = ensure_demo_model(tmp_path / "demo")
    monkeypatch.setenv("REALM_HF_DEFAULT_MODEL", str(demo))  # looked up when the pipeline is made, not at import
    open_qa = pipeline("open-qa", device="cpu")
    assert open_qa.model.name_or_path == str(demo)
    assert open_qa("What is the capital of France?")["answer"]
    monkeypatch.setattr(realm_hf.default_model, "default_model_dir", lambda: None)
    with pytest.raises(ValueError, match=r'pipeline\("open-qa"\) without model=: expected the default model'):
        pipeline("open-qa", device="cpu")


def test_registering_needs_no_installed_default_model(monkeypatch):
    """A wheel has no models/ folder: `import realm_hf` registers the task all the same (it raised, and every command
    with it), and only a pipeline made without `model=` says the default model is missing."""
    import pytest
    from transformers import pipeline
    from transformers.pipelines import PIPELINE_REGISTRY

    import realm_hf.default_model

    monkeypatch.setattr(realm_hf.default_model, "default_model_dir", lambda: None)
    monkeypatch.delitem(PIPELINE_REGISTRY.supported_tasks, "open-qa")
    realm_hf.register()
    assert "open-qa" in PIPELINE_REGISTRY.get_supported_tasks()
    with pytest.raises(ValueError, match=r"expected the default model .* which is not installed"):
        pipeline("open-qa", device="cpu")
