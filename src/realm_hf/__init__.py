"""realm_hf: REALM and ORQA retrieval-augmented models as a Transformers 5 plugin.

`import realm_hf` registers the REALM classes with Transformers' Auto classes and the "open-qa" pipeline task; it has
no other side effect.
"""

__version__ = "0.1.0"

from .loading import load_open_qa
from .modeling import (
    RealmConfig,
    RealmEmbedder,
    RealmEmbedderOutput,
    RealmForOpenQA,
    RealmForOpenQAOutput,
    RealmKnowledgeAugEncoder,
    RealmPreTrainedModel,
    RealmReader,
    RealmReaderOutput,
    RealmScorer,
    RealmScorerOutput,
    RealmTokenizer,
    RealmTokenizerFast,
)
from .pipelines import OpenQAPipeline
from .registration import AutoModelForOpenQA, register
from .retrieval import RealmRetriever
from .retro import RetroConfig, RetroForCausalLM, RetroModel

register()

__all__ = [
    "AutoModelForOpenQA",
    "OpenQAPipeline",
    "RealmConfig",
    "RealmEmbedder",
    "RealmEmbedderOutput",
    "RealmForOpenQA",
    "RealmForOpenQAOutput",
    "RealmKnowledgeAugEncoder",
    "RealmPreTrainedModel",
    "RealmReader",
    "RealmReaderOutput",
    "RealmRetriever",
    "RealmScorer",
    "RealmScorerOutput",
    "RealmTokenizer",
    "RealmTokenizerFast",
    "RetroConfig",
    "RetroForCausalLM",
    "RetroModel",
    "__version__",
    "load_open_qa",
    "register",
]
