"""Adapts a `RealmForOpenQA` (with its retriever) to [`OpenQAEvaluator`]: `answer`, `retrieve`, `reader_beam_size`.

Unlike the rest of `realm_hf.evaluation`, this module imports the model code.
"""

from pathlib import Path

import torch

from ..modeling import RealmForOpenQA
from ..retrieval import RealmRetriever


class RealmOpenQASystem:
    r"""
    A REALM/ORQA open-QA system as the evaluator calls it.

    - `answer(questions)`: the best answer span per question, through the "open-qa" pipeline.
    - `retrieve(questions, k)`: the top-`k` block texts per question, best first, by exact maximum inner product
      against `block_emb` (or through `model.searcher` when the model has one), for any `k` up to the number of
      blocks: not capped at `reader_beam_size` as `RealmForOpenQA.forward` is in eval mode, so recall@k is real.
    - `reader_beam_size`: blocks the reader reads (`config.reader_beam_size`), for the reader oracle.

    Args:
        model ([`RealmForOpenQA`]): the model; put in eval mode.
        retriever ([`RealmRetriever`], *optional*): the block records; defaults to `model.retriever`.
        batch_size (`int`, *optional*, defaults to 8): questions per forward pass.
    """

    def __init__(self, model: RealmForOpenQA, retriever: RealmRetriever | None = None, batch_size: int = 8):
        retriever = retriever if retriever is not None else model.retriever
        if retriever is None:
            raise ValueError("RealmOpenQASystem needs the block records: pass retriever=RealmRetriever.from_pretrained"
                             "(path) or load the model with one.")  # fmt: skip
        self.model = model.eval()
        self.model.retriever = retriever
        self.retriever = retriever
        self.batch_size = batch_size
        self.reader_beam_size = model.config.reader_beam_size
        self._pipeline = None

    @classmethod
    def from_pretrained(
        cls, name_or_path: str | Path | None, batch_size: int = 8, index: str | Path | None = None
    ) -> "RealmOpenQASystem":
        """Loads model and retriever from a directory or Hub repo id in any layout of docs/loading.md (the default
        model when `None`), searching `index` instead of the model's own embeddings when given."""
        from ..loading import load_open_qa

        model, retriever = load_open_qa(name_or_path, index)
        return cls(model, retriever, batch_size=batch_size)

    def answer(self, questions: list[str]) -> list[str]:
        """The best answer span per question, as written in its evidence block."""
        if self._pipeline is None:
            from transformers import pipeline

            self._pipeline = pipeline("open-qa", model=self.model, tokenizer=self.retriever.tokenizer,
                                      retriever=self.retriever, device=self.model.device)  # fmt: skip
        outputs = self._pipeline(list(questions), batch_size=self.batch_size, top_k=1)
        return [output["answer"] for output in outputs]

    @torch.no_grad()
    def retrieve_ids(self, questions: list[str], k: int) -> torch.LongTensor:
        """The top-`k` block ids per question, best first: `(num_questions, min(k, num_blocks))`."""
        if k < 1:
            raise ValueError(f"k must be a positive number of blocks, got {k}.")
        inputs = self.retriever.tokenizer(
            list(questions), padding=True, truncation=True, max_length=self.model.config.searcher_seq_len,
            return_tensors="pt",
        ).to(self.model.device)  # fmt: skip
        inputs = {key: inputs[key] for key in ("input_ids", "attention_mask", "token_type_ids") if key in inputs}
        question_embedding = self.model.embedder(**inputs, return_dict=True).projected_score.float()  # (Q, D)
        searcher = self.model.searcher
        if searcher is not None:
            from ..retrieval.hybrid import searching_for

            with searching_for(searcher, self.retriever.tokenizer, inputs["input_ids"]):  # as the pipeline searches
                ids = searcher.search(question_embedding, min(k, searcher.num_blocks)).ids
            return torch.as_tensor(ids).to(torch.long).cpu()
        block_emb = self.model.block_emb
        scores = question_embedding.to(block_emb.device, block_emb.dtype) @ block_emb.T  # (Q, num_blocks)
        return torch.topk(scores, k=min(k, block_emb.shape[0]), dim=-1).indices.cpu()  # (Q, k)

    def retrieve(self, questions: list[str], k: int) -> list[list[str]]:
        """The top-`k` block texts per question, best first."""
        questions = list(questions)
        texts = []
        for start in range(0, len(questions), self.batch_size):
            for row in self.retrieve_ids(questions[start : start + self.batch_size], k).tolist():
                texts.append(
                    [_block_text(self.retriever.block_records[block_id]) for block_id in row if block_id >= 0]
                )
        return texts


def _block_text(record) -> str:
    return record.decode("utf-8") if isinstance(record, bytes) else str(record)


__all__ = ["RealmOpenQASystem"]
