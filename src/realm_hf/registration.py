"""The only code that touches Transformers' Auto registries and its pipeline registry. `register()` is idempotent."""

from collections import OrderedDict
from collections.abc import Mapping

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer
from transformers.models.auto.auto_factory import _BaseAutoModelClass, _LazyAutoMapping, auto_class_update
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
from transformers.pipelines import PIPELINE_REGISTRY

from .checkpoints import explain_load_failure
from .modeling import RealmConfig, RealmEmbedder, RealmForOpenQA, RealmKnowledgeAugEncoder, RealmTokenizer
from .modeling.modeling_realm import RealmPreTrainedModel
from .pipelines import OpenQAPipeline
from .retro import RetroConfig, RetroForCausalLM, RetroModel

OPEN_QA_TASK = "open-qa"


class AutoModelForOpenQA(_BaseAutoModelClass):
    # Starts empty: plugins fill it through `AutoModelForOpenQA.register(config_class, model_class)`.
    _model_mapping = _LazyAutoMapping(CONFIG_MAPPING_NAMES, OrderedDict())


AutoModelForOpenQA = auto_class_update(
    AutoModelForOpenQA, checkpoint_for_example="google/realm-orqa-nq-openqa", head_doc="open-domain question answering"
)


class _InstalledDefaultModel(Mapping):
    """The "open-qa" task's default, `{"model": (directory, None)}`: the installed default model, looked up when a
    pipeline is made without `model=` (so `$REALM_HF_DEFAULT_MODEL` set later counts); nothing is downloaded."""

    def __getitem__(self, key: str):
        if key != "model":
            raise KeyError(key)
        from .default_model import default_model_dir

        directory = default_model_dir()
        if directory is None:
            raise ValueError(f'pipeline("{OPEN_QA_TASK}") without model=: expected the default model '
                             "(models/realm-minilm-factbook, or $REALM_HF_DEFAULT_MODEL), which is not installed; "
                             "pass model= (a model directory or Hub repo id)")  # fmt: skip
        return str(directory), None

    def __contains__(self, key) -> bool:
        # Without the lookup: `register_pipeline` asks `"model" in default` at import, when no default model need be
        # installed (a wheel has none), and Mapping's own `in` would look it up and raise.
        return key == "model"

    def __iter__(self):
        return iter(("model",))

    def __len__(self) -> int:
        return 1


def _push_model_to_hub(model, repo_id: str, **kwargs):
    # The card and upload code (hub.py) is imported only when a push happens.
    from .hub import push_model_to_hub

    return push_model_to_hub(model, repo_id, **kwargs)


def register() -> None:
    """Registers the REALM classes with `AutoConfig`, `AutoTokenizer`, `AutoModel` (the embedder),
    `AutoModelForMaskedLM` (the knowledge-augmented encoder) and `AutoModelForOpenQA`, and the "open-qa" pipeline
    task (`OpenQAPipeline`), and gives the REALM models the file and Hub I/O modeling/ leaves out (naming a damaged
    weights file; `push_to_hub` with realm_hf's model card). Safe to call repeatedly."""
    RealmPreTrainedModel._realm_hf_hooks.update(
        explain_load_failure=explain_load_failure, push_to_hub=_push_model_to_hub
    )
    AutoConfig.register(RealmConfig.model_type, RealmConfig, exist_ok=True)
    AutoTokenizer.register(RealmConfig, tokenizer_class=RealmTokenizer, exist_ok=True)
    AutoModel.register(RealmConfig, RealmEmbedder, exist_ok=True)
    AutoModelForMaskedLM.register(RealmConfig, RealmKnowledgeAugEncoder, exist_ok=True)
    AutoModelForOpenQA.register(RealmConfig, RealmForOpenQA, exist_ok=True)
    AutoConfig.register(RetroConfig.model_type, RetroConfig, exist_ok=True)
    AutoModel.register(RetroConfig, RetroModel, exist_ok=True)
    AutoModelForCausalLM.register(RetroConfig, RetroForCausalLM, exist_ok=True)
    # `register_pipeline` has no exist_ok (it logs "Overwriting" instead). The default is the installed default model.
    if OPEN_QA_TASK not in PIPELINE_REGISTRY.get_supported_tasks():
        PIPELINE_REGISTRY.register_pipeline(
            OPEN_QA_TASK, pipeline_class=OpenQAPipeline, pt_model=AutoModelForOpenQA,
            default=_InstalledDefaultModel(), type="text",
        )  # fmt: skip


__all__ = ["AutoModelForOpenQA", "register"]
