"""The "open-qa" pipeline: questions in; answer spans out, as written in the evidence block, with scores and offsets.

```python
>>> import realm_hf
>>> from transformers import pipeline
>>> qa = pipeline("open-qa", model="google/realm-orqa-nq-openqa")
>>> qa("Who is the pioneer in modern computer science?")
{'answer': 'Alan Mathison Turing', 'score': 0.93, 'start': 0, 'end': 20, 'block_id': 1234, 'title': None,
 'evidence': 'Alan Mathison Turing ... was an English mathematician, ...'}
```

Every answer is a span of its block's original text: `evidence[start:end] == answer`, found through the tokenizer's
offset mapping rather than by decoding (lower-cased) wordpieces. `score` is a probability: a softmax over every
candidate span of every block read (`reader_beam_size` blocks per question) of the reader's span logit plus the
block's retrieval logit, the distribution REALM's reader loss is trained on.
"""

import os
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.data import Dataset as TorchDataset
from transformers import Pipeline

from ..modeling import RealmForOpenQA
from ..retrieval import RealmRetriever


class OpenQAPipeline(Pipeline):
    r"""
    Open-domain question answering with a [`RealmForOpenQA`] model: retrieve blocks from its corpus, read them, and
    return the best answer spans with their evidence. Registered as the "open-qa" task by `import realm_hf`.

    Build it with `transformers.pipeline("open-qa", model=...)`, from a directory or Hub repo id holding the model,
    tokenizer and block records (as [`OpenQAPipeline.save_pretrained`] writes them), or from objects:
    `pipeline("open-qa", model=model, tokenizer=tokenizer, retriever=retriever)`.

    Args:
        model ([`RealmForOpenQA`]): the model. The pipeline attaches its retriever to it (`model.retriever`).
        tokenizer (*optional*): encodes the questions; defaults to the retriever's tokenizer.
        retriever ([`RealmRetriever`], *optional*): the block records. Defaults to `model.retriever`, else
            `RealmRetriever.from_pretrained(model.name_or_path)`: the files next to the model, main revision.
        index (`str`, `os.PathLike` or a searcher, *optional*): the index to search instead of `block_emb`, opened
            with `realm_hf.retrieval.open_searcher` (a faiss index from `realm-hf index compress`, or an exact one).
            A model without `block_emb` (`store_block_emb: false`) searches its directory's `index/` by default.
        top_k (`int`, *optional*, defaults to 1): answers per question; a call may override it.
        max_question_length (`int`, *optional*): question tokens kept; defaults to `config.searcher_seq_len`.
        batch_size (`int`, *optional*, defaults to 1): questions per forward pass when given a list.
        device: where the model runs, as for every pipeline.

    Each answer is a dict:

    - `answer` (`str`): the span as written in the block text.
    - `score` (`float`): its probability among all (block, span) pairs of the blocks read for this question.
    - `start`, `end` (`int`): character offsets of the answer in `evidence`: `evidence[start:end] == answer`.
    - `block_id` (`int`): corpus id of the block.
    - `title` (`str` or `None`): the document title when the retriever knows it (block records from a
      [`DocumentStore`]); `None` for plain block records such as the Hub's, which hold no titles.
    - `evidence` (`str`): the block text, as the reader saw it (a titled document store block starts with its title).

    A call returns one dict per question with `top_k=1`, else a list of up to `top_k` dicts, best first (fewer when
    the blocks read hold fewer spans); a list of questions gives a list of those.
    """

    # The tokenizer comes from the model's files when it can, else from the retriever (see `__init__`).
    _load_tokenizer = None
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_video_processor = False

    def __init__(self, *args, retriever: RealmRetriever | None = None, index=None, **kwargs):
        # `retriever` and `index` are popped here: `pipeline()` keyword arguments that are not its own reach the
        # pipeline class.
        super().__init__(*args, **kwargs)
        if not isinstance(self.model, RealmForOpenQA):
            raise TypeError(
                f"the open-qa pipeline needs a RealmForOpenQA model, got {type(self.model).__name__}. Load one with "
                "pipeline('open-qa', model=directory_or_repo_id) or pass RealmForOpenQA.from_pretrained(...)."
            )
        self._attach_searcher(index)
        if retriever is None:
            retriever = self.model.retriever
        if retriever is None:
            retriever = self._load_retriever()
        self.model.retriever = retriever
        if self.tokenizer is None:
            self.tokenizer = retriever.tokenizer

    def _attach_searcher(self, index) -> None:
        """`index=DIR` (or, for a model without block_emb, its directory's `index/`): search it with `open_searcher`."""
        from ..retrieval import is_searcher_directory, open_searcher

        if index is None and self.model.searcher is None and self.model.block_emb.shape[0] == 0:
            candidate = Path(self.model.name_or_path or "") / "index"
            index = candidate if self.model.name_or_path and is_searcher_directory(candidate) else None
        if index is not None:
            self.model.searcher = open_searcher(index) if isinstance(index, (str, os.PathLike)) else index

    def _load_retriever(self) -> RealmRetriever:
        name_or_path = self.model.name_or_path
        if not name_or_path:
            raise ValueError(
                "the open-qa pipeline needs block records, and this model was not loaded from files that hold them: "
                "pass pipeline('open-qa', model=model, tokenizer=tokenizer, retriever=RealmRetriever(records, tokenizer))."
            )
        return RealmRetriever.from_pretrained(name_or_path, tokenizer=self.tokenizer)

    @property
    def retriever(self) -> RealmRetriever:
        """The [`RealmRetriever`] whose block records the answers come from (also `pipeline.model.retriever`)."""
        return self.model.retriever

    def __call__(self, questions: str | list[str], **kwargs):
        r"""
        Answers one question or a list of questions.

        Args:
            questions (`str` or `list[str]`): the question(s).
            top_k (`int`, *optional*): answers per question (default: the pipeline's, 1).
            max_question_length (`int`, *optional*): question tokens kept (default: `config.searcher_seq_len`).
            batch_size (`int`, *optional*): questions per forward pass.

        Returns:
            For one question, a dict (`top_k=1`) or a list of dicts, best first; for a list, a list of those. See
            [`OpenQAPipeline`] for the keys.
        """
        if isinstance(questions, tuple):
            questions = list(questions)
        if isinstance(questions, list):
            if not questions:
                raise ValueError("the open-qa pipeline expects a question or a non-empty list of questions, got [].")
            for index, question in enumerate(questions):
                _check_question(question, f"questions[{index}]")
        elif not isinstance(questions, (Iterator, TorchDataset)):
            # Generators and datasets stream, and `preprocess` checks each of their questions.
            _check_question(questions, "the question")
        return super().__call__(questions, **kwargs)

    def _sanitize_parameters(self, top_k: int | None = None, max_question_length: int | None = None):
        preprocess_params, forward_params, postprocess_params = {}, {}, {}
        if top_k is not None:
            if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
                raise ValueError(f"top_k must be a positive int (answers per question), got {top_k!r}.")
            forward_params["top_k"] = top_k
            postprocess_params["top_k"] = top_k
        if max_question_length is not None:
            if (
                isinstance(max_question_length, bool)
                or not isinstance(max_question_length, int)
                or max_question_length < 3
            ):
                raise ValueError(
                    "max_question_length must be an int >= 3 ([CLS], one question token, [SEP]), got "
                    f"{max_question_length!r}."
                )
            preprocess_params["max_question_length"] = max_question_length
        return preprocess_params, forward_params, postprocess_params

    def preprocess(self, question: str, max_question_length: int | None = None) -> dict[str, torch.Tensor]:
        _check_question(question, "the question")
        max_length = max_question_length or self.model.config.searcher_seq_len
        return dict(self.tokenizer(question, truncation=True, max_length=max_length, return_tensors="pt"))

    def _forward(self, model_inputs: dict[str, torch.Tensor], top_k: int = 1) -> dict[str, torch.Tensor]:
        # Only what the tokenizer returned and the question encoder takes: `_ensure_tensor_on_device` keeps the keys.
        inputs = {
            key: model_inputs[key] for key in ("input_ids", "attention_mask", "token_type_ids") if key in model_inputs
        }
        spans = self.model.score_spans(**inputs)
        batch_size, num_read, num_candidates = spans.span_logits.shape
        logits = spans.span_logits.float().masked_fill(~spans.span_mask, float("-inf")).view(batch_size, -1)
        probabilities = logits.softmax(dim=-1)  # (B, R * N); NaN only where no span is valid, and then unused
        # A stable sort breaks ties by block, then by span (width, then start): forward's argmax order.
        best = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :top_k]  # (B, k)
        block_index, candidate = best // num_candidates, best % num_candidates
        # The first key sets how the pipeline splits a batch into questions: it must be (B, ...).
        return {
            "scores": probabilities.gather(1, best),  # (B, k)
            "valid": spans.span_mask.view(batch_size, -1).gather(1, best),  # (B, k)
            "block_index": block_index,  # (B, k), into the R blocks read
            "start_token": spans.candidate_starts[candidate],  # (B, k), in the reader input
            "end_token": spans.candidate_ends[candidate],  # (B, k), inclusive
            "block_ids": spans.retrieved_block_ids[:, :num_read].to(best.device),  # (B, R)
            "reader_input_ids": spans.reader_input_ids,  # (B, R, L)
            "block_mask": spans.block_mask,  # (B, R, L)
        }

    def postprocess(self, model_outputs: dict[str, torch.Tensor], top_k: int = 1):
        # One question: every tensor has a leading batch dim of 1.
        outputs = {key: value[0] for key, value in model_outputs.items()}
        block_ids = outputs["block_ids"].tolist()
        blocks = {}  # block index -> (text, character offsets of its tokens in the reader input)
        answers = []
        for rank in range(outputs["scores"].shape[0]):
            if not bool(outputs["valid"][rank]):
                break  # sorted: every later span is invalid too
            index = int(outputs["block_index"][rank])
            if index not in blocks:
                blocks[index] = self._block_offsets(
                    block_ids[index], outputs["reader_input_ids"][index], outputs["block_mask"][index]
                )
            evidence, offsets = blocks[index]
            start = offsets[int(outputs["start_token"][rank])][0]
            end = offsets[int(outputs["end_token"][rank])][1]
            answers.append(
                {
                    "answer": evidence[start:end],
                    "score": float(outputs["scores"][rank]),
                    "start": start,
                    "end": end,
                    "block_id": block_ids[index],
                    "title": self._title(block_ids[index]),
                    "evidence": evidence,
                }
            )
        if top_k > 1:
            return answers
        if answers:
            return answers[0]
        # No block read holds a single token of text (e.g. empty records): an empty answer from the best block.
        evidence = _block_text(self.retriever.block_records[block_ids[0]])
        return {"answer": "", "score": 0.0, "start": 0, "end": 0, "block_id": block_ids[0],
                "title": self._title(block_ids[0]), "evidence": evidence}  # fmt: skip

    def _block_offsets(
        self, block_id: int, reader_input_ids: torch.Tensor, block_mask: torch.Tensor
    ) -> tuple[str, dict[int, tuple[int, int]]]:
        """The block's text and, for each block token of the reader input, its `(start, end)` characters in it.

        The reader input holds the block's wordpieces, possibly cut short by `reader_seq_len` (or, with a tokenizer
        that truncates on the left, their end); tokenizing the text alone gives the same wordpieces with offsets.
        """
        text = _block_text(self.retriever.block_records[block_id])
        positions = torch.nonzero(block_mask, as_tuple=True)[0].tolist()
        read_ids = reader_input_ids[positions].tolist()
        tokenizer = self.retriever.tokenizer
        encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        all_ids, all_offsets = encoding["input_ids"], encoding["offset_mapping"]
        first = max(len(all_ids) - len(read_ids), 0) if tokenizer.truncation_side == "left" else 0
        if all_ids[first : first + len(read_ids)] != read_ids:
            kept = "last" if tokenizer.truncation_side == "left" else "first"
            raise RuntimeError(
                f"block {block_id}: the {len(read_ids)} wordpieces the reader read are not the {kept} ones of the "
                f"block text's {len(all_ids)}, so the answers cannot be located in the text. The reader inputs must "
                "come from the retriever's tokenizer (retriever.tokenizer)."
            )
        return text, {position: tuple(all_offsets[first + i]) for i, position in enumerate(positions)}

    def _title(self, block_id: int) -> str | None:
        # Block records backed by a DocumentStore carry titles; plain records (the Hub's) have none.
        store = getattr(self.retriever.block_records, "store", None)
        if store is not None and hasattr(store, "titles"):
            return store.titles([block_id])[0] or None
        return None

    def save_pretrained(self, save_directory, **kwargs) -> None:
        """Writes the model, the tokenizer and the retriever's block records (`block_records.safetensors`) to
        `save_directory`, which `pipeline("open-qa", model=save_directory)` loads again.

        Unlike `Pipeline.save_pretrained`, it writes no `custom_pipelines` entry and no pipeline code: the task comes
        from `import realm_hf`. `kwargs` go to the model's `save_pretrained` (`max_shard_size`, ...).
        """
        self.model.save_pretrained(save_directory, **kwargs)
        # The retriever writes its tokenizer too; the pipeline's (which encodes the questions) is written last.
        self.retriever.save_pretrained(save_directory)
        self.tokenizer.save_pretrained(save_directory)


def _check_question(question, name: str) -> None:
    if not isinstance(question, str):
        raise TypeError(
            f"the open-qa pipeline expects questions as str; {name} is {type(question).__name__}: {question!r:.80}"
        )
    if not question.strip():
        raise ValueError(f"the open-qa pipeline expects non-empty questions; {name} is {question!r}.")


def _block_text(record) -> str:
    return record.decode("utf-8") if isinstance(record, bytes) else str(record)


__all__ = ["OpenQAPipeline"]
