"""Retrieval: the corpus (document store, block records), block-embedding indexes and the searchers over them, and
the retriever that turns retrieved block ids into reader inputs."""

import importlib

from .block_records import BlockRecords, UnsafeBlockRecordsError, load_block_records, save_block_records
from .distributed import ShardedSearcher, merge_search_results, shard_ranges
from .embedding import embed_blocks, encode_blocks
from .evaluation import recall_at_k
from .faiss_search import FaissSearcher
from .interfaces import ReaderInputs, Retriever, Searcher, SearchResult
from .retriever import RealmRetriever
from .serving import is_searcher_directory, open_searcher
from .torch_search import ExactSearcher

# Imported on first use: `datasets`/`pyarrow` (the document store) cost about 1 s and 100 MB at import, which
# loading and asking a model never needs.
_LAZY = {
    "DocumentStore": "document_store",
    "DocumentStoreBlockRecords": "document_store",
    "block_text": "document_store",
    "add_documents": "index_builder",
    "add_to_index": "index_builder",
    "build_index": "index_builder",
    "compress_open_qa": "serving",
    "offload_block_embeddings": "index_builder",
    "write_index": "index_builder",
    "HybridSearcher": "hybrid",
    "PreTokenizedBlocks": "pretokenized",
    "PreTokenizedRetriever": "pretokenized",
    "TokenizedBlockCache": "pretokenized",
    "tokenize_corpus": "pretokenized",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BlockRecords",
    "DocumentStore",
    "DocumentStoreBlockRecords",
    "ExactSearcher",
    "FaissSearcher",
    "HybridSearcher",
    "PreTokenizedBlocks",
    "PreTokenizedRetriever",
    "ReaderInputs",
    "RealmRetriever",
    "Retriever",
    "SearchResult",
    "Searcher",
    "ShardedSearcher",
    "TokenizedBlockCache",
    "UnsafeBlockRecordsError",
    "add_documents",
    "add_to_index",
    "block_text",
    "build_index",
    "compress_open_qa",
    "embed_blocks",
    "encode_blocks",
    "is_searcher_directory",
    "load_block_records",
    "merge_search_results",
    "offload_block_embeddings",
    "open_searcher",
    "recall_at_k",
    "save_block_records",
    "shard_ranges",
    "tokenize_corpus",
    "write_index",
]
