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

A span whose wordpieces all stand in the question ("Who wrote Hamlet?" -> "Hamlet") is never the answer: such spans
are left out before the best ones are chosen, and `score` is renormalised over the rest (`exclude_question_spans=False`
keeps them, as `RealmForOpenQA.forward` does). Nor is a span that opens a bracket it does not close ("The Four Seasons
(Vivaldi"; `exclude_unbalanced_spans=False` keeps those), or one that runs on past the end of a sentence ("4 weeks.
After that, clothing"; `exclude_cross_sentence_spans=False`), or one holding a letter's greeting or closing ("Dear Ms.
Lena Okafor", "Yours sincerely"; [`salutation_spans`], `exclude_salutations=False`). A question that asks for a
number ("How many ...", "How long ...", "In what year ...") is answered with a span that holds one where the blocks read have one, and a year with a span
that is one number ("1912", not "15 April 1912"): such spans are ranked first, each with its own probability
([`number_spans`], [`whole_number_spans`]; `prefer_number_answers=False` turns it off). Likewise a question that asks
for someone ("Who ...", "Which scientist ...") is answered with a span that reads like a name where any does ("Who
wrote The Origin of Species?" -> "Charles Darwin", not "1859"; [`name_like_spans`]; `prefer_name_answers=False`).
And a question that names the kind of thing it asks for ("In which country is Machu Picchu?", "Which planet ...?",
"Who founded Microsoft?") is answered, among the reader's first few spans, with one the corpus says is of that kind
("Peru", not "Cusco", a city): an encyclopedia says what its titles are in their first sentence
(`realm_hf.pipelines.answer_types`; `prefer_typed_answers=False`).

A model with a calibration abstains on a question that names something no block of its corpus mentions ("Who is the
king of Zanzanryx?"): whatever it reads, the corpus cannot say ([`unknown_names`]; `abstain_on_unknown_names=False`
turns it off). So does it on a question about its asker ("Who is the CEO of my company?") over a corpus that never
speaks to or as a person, such as an encyclopedia ([`about_the_asker`], [`speaks_in_person`]; a handbook that says
"your" is asked such questions; `abstain_on_personal_questions=False` turns it off). Over a user's own index
(`index=`, `searcher=`) the rule is off by default: their documents are about them, in whatever person they are
written ("How much is my deposit?" over a tenancy agreement that says "the tenant"). And it abstains on a question
asking for an amount of money ("How much did Tovarra pay?"), a time of day ("What time ...?"), a temperature or an
email address where no passage read holds one (`missing_units`, `UNITS_NEVER_GUESSED`; with `prefer_number_answers`,
which finds the amounts). Nor
does it answer a question asking for a yes or a no ("Did I already pay the deposit?", [`asks_yes_or_no`]): its answers
are words of the passages, never a yes or a no (`yes_or_no`); the passage it read is still shown.
"""

import dataclasses
import datetime
import math
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator

import torch
from torch.utils.data import Dataset as TorchDataset
from transformers import Pipeline
from transformers.pipelines.pt_utils import KeyDataset
from transformers.utils import logging

from ..evaluation.calibration import CALIBRATION_FEATURES, CALIBRATION_FILE, MAX_MARGIN, Calibration
from ..loading import check_searcher_fits, find_retrieval, fit_beam_sizes, is_own_index, save_open_qa
from ..modeling import RealmForOpenQA
from ..retrieval.block_records import iter_record_texts, record_text
from ..retrieval.hybrid import searching_for
from ..retrieval.interfaces import BlockOffsets, Retriever, TitledRecords
from .answer_types import TYPED, UNKNOWN, AnswerTypes, answer_type_tiers, asked_type, stored_answer_types
from .questions import check_question, encode_question

logger = logging.get_logger(__name__)


class OpenQAPipeline(Pipeline):
    r"""
    Open-domain question answering with a [`RealmForOpenQA`] model: retrieve blocks from its corpus, read them, and
    return the best answer spans with their evidence. Registered as the "open-qa" task by `import realm_hf`.

    Build it with `transformers.pipeline("open-qa", model=...)`, from a directory or Hub repo id in any layout of
    docs/loading.md (a 4.x checkpoint with block records, a model with `index/` and `documents/`, the default model,
    what [`OpenQAPipeline.save_pretrained`] writes), optionally over another index: `pipeline("open-qa",
    model=..., index="my-index")`; or from objects: `pipeline("open-qa", model=model, tokenizer=tokenizer,
    retriever=retriever)`.

    Args:
        model ([`RealmForOpenQA`]): the model. The pipeline attaches its retriever (and searcher) to it.
        tokenizer (*optional*): encodes the questions; defaults to the retriever's tokenizer.
        retriever (*optional*): a [`Retriever`] (block texts + tokenizer). Defaults to `model.retriever`, else what
            `realm_hf.loading.find_retrieval(model.name_or_path, index)` finds next to the model (a
            [`PreTokenizedRetriever`] over its documents).
        index (`str` or `os.PathLike`, *optional*): an index directory (`realm-hf index build`, or a compressed one
            from `realm-hf index compress`) to search instead of the model's own block embeddings; its `documents/`
            are read when it has them.
        searcher (*optional*): a ready searcher (`ExactSearcher`, `FaissSearcher`, ...) to search instead.
        top_k (`int`, *optional*, defaults to 1): answers per question; a call may override it.
        max_question_length (`int`, *optional*): question tokens kept; defaults to `config.searcher_seq_len`.
        batch_size (`int`, *optional*, defaults to 1): questions per forward pass when given a list.
        exclude_question_spans (`bool`, *optional*, defaults to `True`): leave out candidate spans whose wordpieces
            all stand, in order, in the question (see [`spans_in_question`]); a call may override it.
        exclude_unbalanced_spans (`bool`, *optional*, defaults to `True`): leave out candidate spans whose brackets
            do not pair up (see [`unbalanced_spans`]); a call may override it.
        exclude_cross_sentence_spans (`bool`, *optional*, defaults to `True`): leave out candidate spans that run on
            past the end of a sentence (see [`cross_sentence_spans`]); a call may override it.
        exclude_salutations (`bool`, *optional*, defaults to `True`): leave out candidate spans holding a letter's
            greeting or closing (see [`salutation_spans`]); a call may override it.
        abstain_on_unknown_names (`bool`, *optional*, defaults to `True`): with a calibration, abstain on a question
            naming a word no block holds (see [`unknown_names`]); a call may override it.
        abstain_on_personal_questions (`bool`, *optional*): with a calibration, abstain on a question about its asker
            ("my", see [`about_the_asker`]) over a corpus that never speaks to or as a person ([`speaks_in_person`]);
            by default over the model's own corpus, not over a user's index (`model.searches_own_index`); a call may
            override it.
        prefer_number_answers (`bool`, *optional*, defaults to `True`): answer a question that asks for a number
            ([`asks_for_a_number`]) with a span holding one (see [`number_spans`]), and a year with a span that is one
            number ([`whole_number_spans`]), where any candidate is; a call may override it.
        prefer_name_answers (`bool`, *optional*, defaults to `True`): answer a question that asks for someone
            ([`asks_for_a_name`]) with a span that reads like a name (see [`name_like_spans`]) where any candidate
            does; a call may override it.
        prefer_typed_answers (`bool`, *optional*, defaults to `True`): answer a question that names the kind of its
            answer ([`asked_type`]) with one of the reader's first `TYPE_POOL` spans that a title of that kind reads
            (see [`AnswerTypes`]), where any does; a call may override it.
        exclude_title_spans (`bool`, *optional*): leave out spans that start in a block's title (see
            [`spans_in_titles`]); by default where the corpus' titles are section headings ([`titles_are_headings`]),
            not over an encyclopedia, whose titles are often the answer; a call may override it.
        device: where the model runs, as for every pipeline.

    Each answer is a dict:

    - `answer` (`str`): the span as written in the block text.
    - `score` (`float`): its probability among all (block, span) pairs of the blocks read for this question (spans
      taken from the question left out).
    - `start`, `end` (`int`): character offsets of the answer in `evidence`: `evidence[start:end] == answer`.
    - `block_id` (`int`): corpus id of the block.
    - `title` (`str` or `None`): the document title when the retriever knows it (block records from a
      [`DocumentStore`]); `None` for plain block records such as the Hub's, which hold no titles.
    - `source` (`str` or `None`): the file the block came from, where the documents know it (`realm-hf index build`
      over text or Markdown files, or rows with a `source` column); `None` otherwise.
    - `evidence` (`str`): the block text, as the reader saw it (a titled document store block starts with its title).
    - `confidence` (`float` or `None`): the calibrated probability that the answer is right, from the model's
      `calibration.json` (see `realm_hf.evaluation.calibration`); `None` for a model without one.
    - `abstained` (`bool`): `confidence < threshold` (the calibration's, or `abstention_threshold`), or the question
      names something the corpus never mentions (`unknown_names`), or asks about its asker where the corpus cannot
      say (`about_the_asker`), or for an amount of money, a time of day, a temperature or an email address where no
      passage read holds one (`missing_units`), or asks for a yes or a no (`yes_or_no`): the model does not know;
      `answer` is still its best guess ([`abstains_whatever_the_confidence`]). Always `False` without a calibration,
      and with a threshold of 0.
    - `threshold` (`float` or `None`): the confidence below which this answer is abstained on: the calibration's
      (its documents threshold over a user's own index), or `abstention_threshold`; `None` without a calibration.
    - `unknown_names` (`list[str]`): the question's names (capitalised words after its first) that no block of the
      corpus holds, as written in the question; checked only with a calibration, else `[]`.
    - `about_the_asker` (`list[str]`): the words by which the question asks about its asker ("my"), where the corpus
      never speaks to or as a person; checked only with a calibration, else `[]`.
    - `missing_units` (`list[str]`): `["money"]` where the question asks for an amount of money ("How much ...?",
      "What does ... cost?") and no span of the passages read holds one, `["clock"]` where it asks "What time ...?"
      and none holds a time of day, `["temperature"]` where it asks for a temperature ("What is the boiling point
      of water?") and none holds one, `["email"]` where it asks for an email address and none holds an "@"; else
      `[]`.
    - `yes_or_no` (`bool`): the question asks for a yes or a no ([`asks_yes_or_no`]), which no span of a passage is.

    A call returns one dict per question with `top_k=1`, else a list of up to `top_k` dicts, best first (fewer when
    the blocks read hold fewer spans); a list of questions gives a list of those.
    """

    # The tokenizer comes from the model's files when it can, else from the retriever (see `__init__`).
    _load_tokenizer = None
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_video_processor = False

    def __init__(self, *args, retriever: Retriever | None = None, index=None, searcher=None, **kwargs):
        # Popped here: `pipeline()` keyword arguments that are not its own reach the pipeline class.
        try:
            super().__init__(*args, **kwargs)
        except TypeError as error:  # a misspelt option (`index_path=`): Transformers names its `_sanitize_parameters`
            unknown = [name for name in kwargs if f"unexpected keyword argument '{name}'" in str(error)]
            if not unknown:
                raise
            raise TypeError(self._unknown_option(unknown[0], {"index", "retriever", "searcher", "device"})) from None
        if not isinstance(self.model, RealmForOpenQA):
            raise TypeError(
                f"the open-qa pipeline needs a RealmForOpenQA model, got {type(self.model).__name__}. Load one with "
                "pipeline('open-qa', model=directory_or_repo_id) or pass RealmForOpenQA.from_pretrained(...)."
            )
        if retriever is None and index is None and searcher is None:
            retriever = self.model.retriever
        searcher_given = searcher
        if retriever is None:
            retriever, found_searcher = self._find_retrieval(index, searcher)
            searcher = searcher if searcher is not None else found_searcher
        elif index is not None and searcher is None:
            from ..retrieval import open_searcher

            searcher = open_searcher(index)
        if searcher is not None:
            check_searcher_fits(self.model, searcher, str(index) if index is not None else "the searcher")
            self.model.searcher = searcher
        if index is not None or searcher_given is not None:
            self.model.searches_own_index = is_own_index(self.model.name_or_path or "", index, searcher_given)
        elif searcher is not None:
            # the model's own files, found here: its own index (the searcher found is not one a user gave)
            self.model.searches_own_index = True
        # else as loaded (load_open_qa says whose index it searches)
        fit_beam_sizes(self.model)
        self.model.retriever = retriever
        if self.tokenizer is None:
            self.tokenizer = retriever.tokenizer
        if self.device.type == "cpu" and self.model.dtype == torch.float16:
            # fp16 checkpoints (the default model's) load as fp16; CPUs run fp16 matrix products many times slower.
            logger.info("the open-qa pipeline runs on CPU: casting the fp16 model to float32")
            self.model.float()

    def _find_retrieval(self, index, searcher):
        name_or_path = self.model.name_or_path
        if not name_or_path:
            raise ValueError(
                "the open-qa pipeline needs block records, and this model was not loaded from files that hold them: "
                "pass pipeline('open-qa', model=model, tokenizer=tokenizer, retriever=RealmRetriever(records, tokenizer))."
            )
        found = find_retrieval(name_or_path, index, searcher=searcher, tokenizer=self.tokenizer)
        return found.retriever, found.searcher

    @property
    def retriever(self) -> Retriever:
        """The [`Retriever`] whose block records the answers come from (also `pipeline.model.retriever`)."""
        return self.model.retriever

    def __call__(
        self, questions: str | dict | list[str | dict] | None = None, *, question: str | None = None, **kwargs
    ):
        r"""
        Answers one question or a list of questions.

        Args:
            questions (`str` or `list[str]`): the question(s). A dict with a `"question"` key stands for its question
                (a row of a question file); its other keys are ignored. A `datasets.Dataset` streams its `"question"`
                column (the answers come back as an iterator, one per row, as for `KeyDataset(dataset, "question")`).
            question (`str`, *optional*): one question, by keyword (`qa(question="Who wrote Hamlet?")`), as for the
                "question-answering" pipeline.
            top_k (`int`, *optional*): answers per question (default: the pipeline's, 1).
            max_question_length (`int`, *optional*): question tokens kept (default: `config.searcher_seq_len`).
            batch_size (`int`, *optional*): questions per forward pass.
            abstention_threshold (`float`, *optional*): abstain below this confidence instead of the calibration's
                threshold (0 never abstains; ignored without a calibration).
            calibration (*optional*): a `Calibration`, its dict or a path to `calibration.json`, instead of the
                model's own.
            exclude_question_spans (`bool`, *optional*): leave out answers that only repeat the question (default:
                `True`).
            exclude_unbalanced_spans (`bool`, *optional*): leave out answers whose brackets do not pair up (default:
                `True`).
            exclude_cross_sentence_spans (`bool`, *optional*): leave out answers that run on past the end of a
                sentence (default: `True`).
            exclude_salutations (`bool`, *optional*): leave out answers holding a letter's greeting or closing
                ("Dear Ms. Okafor", "Yours sincerely"; default: `True`).
            abstain_on_unknown_names (`bool`, *optional*): with a calibration, abstain where the question names a word
                no block holds (default: `True`).
            abstain_on_personal_questions (`bool`, *optional*): with a calibration, abstain where the question asks
                about its asker and the corpus never speaks to or as a person (default: over the model's own corpus,
                not over a user's index).
            prefer_number_answers (`bool`, *optional*): answer a question asking for a number with a span holding one,
                where any does (default: `True`).
            prefer_name_answers (`bool`, *optional*): answer a question asking for someone with a span that reads
                like a name, where any does (default: `True`).
            prefer_typed_answers (`bool`, *optional*): answer a question that names a kind of thing ("Which planet
                ...?") with one of the reader's first spans that the corpus says is one, where any is (default: `True`).
            exclude_title_spans (`bool`, *optional*): leave out answers that start in a block's title (default: where
                the corpus' titles are section headings).

        Returns:
            For one question, a dict (`top_k=1`) or a list of dicts, best first; for a list, a list of those. See
            [`OpenQAPipeline`] for the keys.
        """
        if question is not None:
            if questions is not None:
                raise TypeError(
                    "the open-qa pipeline takes its questions once: positionally or as question=, not both"
                )
            questions = question
        if questions is None:
            raise TypeError("the open-qa pipeline expects a question or a list of questions, got none")
        if isinstance(questions, tuple):
            questions = list(questions)
        if _is_hf_dataset(questions):
            questions = _dataset_questions(questions)
        if isinstance(questions, list):
            if not questions:
                raise ValueError("the open-qa pipeline expects a question or a non-empty list of questions, got [].")
            questions = [_question_text(item, f"questions[{index}]") for index, item in enumerate(questions)]
        elif not isinstance(questions, (Iterator, TorchDataset)):
            # Generators and datasets stream, and `preprocess` checks each of their questions.
            questions = _question_text(questions, "the question")
        self._check_call_options(kwargs)
        return super().__call__(questions, **kwargs)

    def _unknown_option(self, name: str, more: set[str] = frozenset()) -> str:
        """The message for an option the pipeline does not take, with the closest one it does (`more`: options of
        `pipeline()` besides the call's)."""
        import difflib
        import inspect

        known = sorted({*inspect.signature(self._sanitize_parameters).parameters, "batch_size", "num_workers", *more})
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]}?" if close else f" (options: {', '.join(known)})"
        return f"the open-qa pipeline got an unexpected option {name!r}{hint}"

    def _check_call_options(self, kwargs: dict) -> None:
        """A misspelt option (`topk=3`) or a batch size that is no positive int is named before any work, instead of
        Transformers' `_sanitize_parameters() got an unexpected keyword argument` or torch's sampler message."""
        import inspect

        known = {*inspect.signature(self._sanitize_parameters).parameters, "batch_size", "num_workers"}
        for name in kwargs:
            if name not in known:
                raise TypeError(self._unknown_option(name))
        batch_size = kwargs.get("batch_size")
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ValueError(f"batch_size must be a positive int (questions per forward pass), got {batch_size!r}")

    def _sanitize_parameters(
        self,
        top_k: int | None = None,
        max_question_length: int | None = None,
        abstention_threshold: float | None = None,
        calibration=None,
        exclude_question_spans: bool | None = None,
        exclude_unbalanced_spans: bool | None = None,
        exclude_cross_sentence_spans: bool | None = None,
        exclude_salutations: bool | None = None,
        abstain_on_unknown_names: bool | None = None,
        abstain_on_personal_questions: bool | None = None,
        prefer_number_answers: bool | None = None,
        exclude_title_spans: bool | None = None,
        prefer_name_answers: bool | None = None,
        prefer_typed_answers: bool | None = None,
    ):
        preprocess_params, forward_params, postprocess_params = {}, {}, {}
        for params, name, value in ((forward_params, "exclude_question_spans", exclude_question_spans),
                                    (forward_params, "exclude_unbalanced_spans", exclude_unbalanced_spans),
                                    (forward_params, "exclude_cross_sentence_spans", exclude_cross_sentence_spans),
                                    (forward_params, "exclude_salutations", exclude_salutations),
                                    (preprocess_params, "abstain_on_unknown_names", abstain_on_unknown_names),
                                    (preprocess_params, "abstain_on_personal_questions",
                                     abstain_on_personal_questions),
                                    (forward_params, "prefer_number_answers", prefer_number_answers),
                                    (forward_params, "exclude_title_spans", exclude_title_spans),
                                    (forward_params, "prefer_name_answers", prefer_name_answers),
                                    (forward_params, "prefer_typed_answers", prefer_typed_answers)):  # fmt: skip
            if value is not None:
                if not isinstance(value, bool):
                    raise ValueError(f"{name} must be True or False, got {value!r}.")
                params[name] = value
        if abstention_threshold is not None:
            if (
                isinstance(abstention_threshold, bool)
                or not isinstance(abstention_threshold, (int, float))
                or not (0.0 <= abstention_threshold <= 1.0)
            ):
                raise ValueError(f"abstention_threshold must be a number in [0, 1], got {abstention_threshold!r}.")
            postprocess_params["abstention_threshold"] = float(abstention_threshold)
        if calibration is not None:
            postprocess_params["calibration"] = _as_calibration(calibration)
            forward_params["idf_coverage"] = IDF_COVERAGE in postprocess_params["calibration"].features
            preprocess_params.setdefault("abstain_on_unknown_names", True)
            preprocess_params.setdefault("abstain_on_personal_questions", self._searches_own_index())
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

    def preprocess(
        self, question: str, max_question_length: int | None = None, abstain_on_unknown_names: bool | None = None,
        abstain_on_personal_questions: bool | None = None,
    ) -> dict:  # fmt: skip
        question = _question_text(question, "the question")
        config = self.model.config
        max_length = min(max_question_length or config.searcher_seq_len, config.max_position_embeddings)
        inputs = dict(encode_question(self.tokenizer, question, max_length))
        if abstain_on_unknown_names is None:  # by default, only where the model's own calibration can abstain
            abstain_on_unknown_names = self._calibration() is not None
        # A list of one list: batches collate it to one list per question, and one question's inputs pass as they are.
        inputs["unknown_names"] = [unknown_names(question, self._document_frequencies()[0])
                                   if abstain_on_unknown_names else []]  # fmt: skip
        if abstain_on_personal_questions is None:  # a user's documents are about them, in whatever person written
            abstain_on_personal_questions = self._calibration() is not None and self._searches_own_index()
        inputs["about_the_asker"] = [_unanswerable_asker_words(question, self._document_frequencies())
                                     if abstain_on_personal_questions else []]  # fmt: skip
        inputs.update(_answer_kinds([question]))
        return inputs

    def _forward(
        self,
        model_inputs: dict[str, torch.Tensor],
        top_k: int = 1,
        exclude_question_spans: bool = True,
        exclude_unbalanced_spans: bool = True,
        exclude_cross_sentence_spans: bool = True,
        exclude_salutations: bool = True,
        idf_coverage: bool | None = None,
        prefer_number_answers: bool = True,
        exclude_title_spans: bool | None = None,
        prefer_name_answers: bool = True,
        prefer_typed_answers: bool = True,
    ) -> dict[str, torch.Tensor]:
        # Only what the tokenizer returned and the question encoder takes: `_ensure_tensor_on_device` keeps the keys.
        inputs = {
            key: model_inputs[key] for key in ("input_ids", "attention_mask", "token_type_ids") if key in model_inputs
        }
        with searching_for(getattr(self.model, "searcher", None), self.tokenizer, inputs["input_ids"]):
            spans = self.model.score_spans(**inputs)
        batch_size, num_read, num_candidates = spans.span_logits.shape
        span_mask = spans.span_mask
        if exclude_question_spans:
            special = torch.tensor(self.tokenizer.all_special_ids, device=inputs["input_ids"].device)
            question_mask = ~torch.isin(inputs["input_ids"], special)
            if "attention_mask" in inputs:
                question_mask &= inputs["attention_mask"].bool()
            # A question whose blocks hold nothing but its own words keeps them: some answer beats none.
            span_mask = _unless_none_left(
                span_mask & ~spans_in_question(spans, inputs["input_ids"], question_mask), spans.span_mask
            )
        if exclude_unbalanced_spans:
            span_mask = _unless_none_left(span_mask & ~unbalanced_spans(spans, self._bracket_ids()), span_mask)
        if exclude_cross_sentence_spans:
            crossing = cross_sentence_spans(spans, *self._sentence_end_ids())
            span_mask = _unless_none_left(span_mask & ~crossing, span_mask)
        if exclude_salutations:
            greeting = salutation_spans(spans, self._salutation_ids())
            span_mask = _unless_none_left(span_mask & ~greeting, span_mask)
        if exclude_title_spans is None:
            exclude_title_spans = self._titles_are_headings()
        if exclude_title_spans:
            span_mask = _unless_none_left(span_mask & ~spans_in_titles(spans, self._title_lengths(spans)), span_mask)
        # Spans ranked after every other valid one, their probabilities untouched (see `number_spans`). Invalid spans
        # are demoted with them: their logit is -inf, so they stay last, where `postprocess` stops.
        demoted = torch.zeros_like(span_mask)
        # (B, U): the units of `UNITS_NEVER_GUESSED` asked for where no span read holds an amount in them
        missing_units = torch.zeros(batch_size, len(UNITS_NEVER_GUESSED), dtype=torch.bool)
        number_rows, number_demoted = None, None  # the number rule's demotion before the unit narrows it (below)
        decoded = []

        def as_read(key: str, test) -> list:
            """`preprocess`'s `key` ([`_answer_kinds`]), or `test` of each question as its wordpieces read (bare
            tokenizer outputs), decoded once for every key."""
            found = model_inputs.get(key)
            if found is None:
                if not decoded:
                    decoded.extend(self.tokenizer.batch_decode(inputs["input_ids"], skip_special_tokens=True))
                found = [test(question) for question in decoded]
            return found

        def asks(key: str, test) -> torch.BoolTensor:
            """`(B,)`: the flag `key` of each question (see `as_read`)."""
            return torch.as_tensor(as_read(key, test)).to(span_mask.device)

        if prefer_number_answers:
            numeric, yearly = asks("asks_for_a_number", asks_for_a_number), asks("asks_for_a_year", asks_for_a_year)
            if bool(numeric.any()):
                digit_ids, word_ids, continuation_ids, digit_continuation_ids = self._number_ids()
                unit_ids = self._unit_ids()
                signed_ids = (unit_ids["sign"], digit_continuation_ids)
                with_number = number_spans(spans, digit_ids, word_ids, continuation_ids, self._code_ids(), signed_ids)
                with_number &= span_mask
                # an amount of money is no time: "When is garden waste collected?" over "Garden waste costs £45 a year
                # and is collected on the last Friday of each month" is not "£45"; nor a count: "How many people came
                # to the summer party?" is not "45 euros per person"
                timely = asks("asks_for_a_time", asks_for_a_time)
                moneyless = timely | asks("asks_for_a_count", asks_for_a_count)
                if bool(moneyless.any()):
                    money = money_spans(spans, unit_ids["money"], unit_ids["sign"], continuation_ids,
                                        torch.cat([digit_ids, digit_continuation_ids]),
                                        unit_ids["separator"]).to(with_number.device)  # fmt: skip
                    with_number &= ~(money & moneyless[:, None, None])
                if bool(yearly.any()):  # a year is one number: where some span is one, the others holding one are not
                    whole = whole_number_spans(spans, digit_ids, digit_continuation_ids, continuation_ids) & span_mask
                    keep_whole = yearly & whole.flatten(1).any(-1)
                    with_number = torch.where(keep_whole[:, None, None], whole, with_number)
                # only where the question asks for a number and some valid span holds one
                demote = numeric & with_number.flatten(1).any(-1)
                number_rows, number_demoted = demote, ~with_number & demote[:, None, None]
                # a number in the unit asked for: where some span holds both, the others holding a number are not
                units = [kind[0] if isinstance(kind, list) else kind for kind in as_read("asked_units", _unit_names)]
                units = [names if asked else "" for names, asked in zip(units, numeric.tolist())]
                in_units, read_units = self._in_asked_units(spans, with_number, units)
                demoted = ~in_units & demote[:, None, None]
                # not "What time ...?", which asks for a time of day: a reader surer of "14 Elm Road" is wrong
                clock_asked = asks("asks_what_time", asks_what_time)
                if bool((timely & demote & ~clock_asked).any()):
                    # A time is often written without a number, or not in the unit asked for ("every Wednesday",
                    # "31 July 2027" for "Until when ...?", which asks for a clock time): where the reader is far surer
                    # of a span of its own than of any the rules put first, its choice stands ("Until when are the
                    # flour prices fixed?" -> "31 July 2027" at 0.99, not "2 pm" at 0.000)
                    span_logits = spans.span_logits.float().to(demoted.device)
                    own = span_logits.masked_fill(~span_mask, float("-inf")).flatten(1).max(-1).values
                    kept = span_logits.masked_fill(demoted | ~span_mask, float("-inf")).flatten(1).max(-1).values
                    yields = timely & demote & ~clock_asked & (own - kept > math.log(TIME_YIELD_RATIO))
                    demoted &= ~yields[:, None, None]
                    number_rows, number_demoted = demote & ~yields, number_demoted & ~yields[:, None, None]
                # "How much did Tovarra pay for Sorrel Glassworks?" over documents that name no sum: no amount of
                # money read, so none to give ("twelve glassblowers joined Tovarra" at confidence 0.40 was)
                # (only where the vocabulary can write such an amount: the demo model's 132 wordpieces cannot); a
                # share of a price is one too ("How much is the upgrade?" -> "50%")
                # Likewise a time of day, asked for by "What time ...?" ("Until when ...?" may want a date): "What
                # time is Tom's appointment?" over blocks holding no time was answered "14 Elm Road" at 0.67. And a
                # temperature: "What is the freezing point of water?" -> "Frost" at 0.99.
                writable = [unit_ids[unit].numel() > 0 for unit in UNITS_NEVER_GUESSED]
                shares = unit_spans(spans, unit_ids["percent"], continuation_ids, None,
                                    torch.cat([digit_ids, digit_continuation_ids])).to(with_number.device)  # fmt: skip
                # what excuses a unit's absence, per question: for money a percentage read; for a time of day any
                # question but "What time ...?"
                excused = {"money": (shares & with_number).flatten(1).any(-1).tolist(),
                           "clock": [not what_time for what_time in clock_asked.tolist()]}  # fmt: skip
                missing_units = torch.tensor([
                    [can and unit in names.split() and not read and not excused.get(unit, [False] * batch_size)[row]
                     for unit, can in zip(UNITS_NEVER_GUESSED, writable)]
                    for row, (names, read) in enumerate(zip(units, read_units))
                ])  # fmt: skip
            # An email address is written with an "@": where a span read holds one it is the answer, and where none
            # does there is none to give ("what's the accountant's email address?" over a letter that gives none was
            # answered "Yours sincerely" at a confidence over the threshold).
            emailed = asks("asks_for_an_email_address", asks_for_an_email_address)
            at_ids = self._unit_ids()["email"]
            if bool(emailed.any()) and at_ids.numel() > 0:
                with_at = _spans_holding(spans, at_ids).to(span_mask.device) & span_mask
                found = with_at.flatten(1).any(-1)
                demoted = demoted | (~with_at & (emailed & found)[:, None, None])
                missing_units[:, UNITS_NEVER_GUESSED.index("email")] = (emailed & ~found).cpu()
        if prefer_name_answers:
            named = asks("asks_for_a_name", asks_for_a_name) & ~demoted.flatten(1).any(-1)
            if bool(named.any()):
                with_name = self._name_spans(spans, named) & span_mask
                demote = named & with_name.flatten(1).any(-1)
                demoted = demoted | (~with_name & demote[:, None, None])
        # The kind features measure the answer among the spans of the kind a number or name rule keeps, not among the
        # few titles the typed rule keeps: those would make a span the reader ranked second sure of itself (Peru at
        # 0.25 came out at confidence 1.00), where the reader's own preference is what the calibration reads. Nor among
        # the amounts in the unit asked for: "24 euros" at a span probability of 0.007 came out at 1.00 too.
        kind_demoted = demoted
        if number_rows is not None:
            kind_demoted = torch.where(number_rows[:, None, None], number_demoted, demoted)
        if prefer_typed_answers:
            # one question's inputs hold [kind]; a batch's, [[kind], [kind], ...] (the pipeline collates lists by item)
            wanted = [kind[0] if isinstance(kind, list) else kind for kind in as_read("asked_type", asked_type)]
            demoted = self._prefer_typed_spans(spans, span_mask, demoted, wanted)
        logits = spans.span_logits.float().masked_fill(~span_mask, float("-inf")).view(batch_size, -1)
        if top_k > logits.shape[1]:
            logger.warning_once(
                f"top_k={top_k} exceeds the {logits.shape[1]} candidate spans of the blocks read; returning at most "
                f"{logits.shape[1]} answers per question."
            )
        probabilities = logits.softmax(dim=-1)  # (B, R * N); NaN only where no span is valid, and then unused
        # A stable sort breaks ties by block, then by span (width, then start): forward's argmax order.
        order = torch.sort(logits, dim=-1, descending=True, stable=True).indices
        # then the demoted spans after the others, each group in that order
        order = order.gather(1, torch.sort(demoted.view(batch_size, -1).gather(1, order).int(), stable=True).indices)
        best = order[:, :top_k]  # (B, k)
        block_index, candidate = best // num_candidates, best % num_candidates
        pool = order[:, : max(top_k, ANSWER_POOL)]
        coverage = _question_coverage(inputs, spans.reader_input_ids, spans.block_mask, self._ignored_ids())
        idf_coverages = self._idf_coverage(inputs["input_ids"], spans.retrieved_block_ids[:, :num_read], idf_coverage)

        def features(span_logits, span_probabilities) -> torch.Tensor:
            return _confidence_features(
                span_logits,
                span_probabilities,
                best,
                block_index,
                spans.retrieved_logits[:, :num_read],
                coverage,
                # The answer's probability as REALM defines it: summed over every span that reads the same.
                _answer_probabilities(span_probabilities, pool, spans, num_candidates)[:, :top_k],  # (B, k)
                idf_coverages,
            )

        plain = features(logits, probabilities)
        kind = plain  # where no rule demoted a span, the spans of the kind asked for are all of them
        if bool(kind_demoted.any()):  # among those spans: the same numbers, renormalised
            kind_logits = logits.masked_fill(kind_demoted.view(batch_size, -1), float("-inf"))
            kind = features(kind_logits, kind_logits.softmax(dim=-1))
        # typed_promoted: a rule narrowed this question past what the kind features read (the typed rule to titles of
        # the kind asked for, the unit rule to amounts in the unit asked for) and kept this answer among those spans.
        # The unit rule counts since it came (session 22): the shipped calibration was fitted so, and over a user's
        # documents, where types are rare, it flags 42% of the right answers and 18% of the wrong ones.
        promoted = (demoted != kind_demoted).view(batch_size, -1).any(dim=-1, keepdim=True)  # (B, 1)
        typed_promoted = (promoted & ~demoted.view(batch_size, -1).gather(1, best)).to(plain.dtype)  # (B, k)
        # The first key sets how the pipeline splits a batch into questions: it must be (B, ...).
        return {
            "scores": probabilities.gather(1, best),  # (B, k)
            "features": torch.cat([plain, kind[..., list(KIND_FEATURE_COLUMNS)], typed_promoted[..., None]], dim=-1),
            "valid": span_mask.view(batch_size, -1).gather(1, best),  # (B, k)
            "block_index": block_index,  # (B, k), into the R blocks read
            "start_token": spans.candidate_starts[candidate],  # (B, k), in the reader input
            "end_token": spans.candidate_ends[candidate],  # (B, k), inclusive
            "block_ids": spans.retrieved_block_ids[:, :num_read].to(best.device),  # (B, R)
            "reader_input_ids": spans.reader_input_ids,  # (B, R, L)
            "block_mask": spans.block_mask,  # (B, R, L)
            "unknown_names": model_inputs.get("unknown_names", [[]] * batch_size),  # B lists of words
            "about_the_asker": model_inputs.get("about_the_asker", [[]] * batch_size),  # B lists of words
            "missing_units": missing_units,  # (B, U)
            "yes_or_no": asks("asks_yes_or_no", asks_yes_or_no),  # (B,)
        }

    def _in_asked_units(
        self, spans, with_number: torch.BoolTensor, units: list[str]
    ) -> tuple[torch.BoolTensor, list[bool]]:
        """`with_number` (`(B, R, N)`) narrowed, for each question asking for a number in a unit (`units`: the names
        of [`asked_units`], joined by spaces; `""` for none), to the spans that also hold the unit ([`unit_spans`])
        and, of those, to the amounts alone ([`amount_spans`]: "11 hours", not "battery lasts about 11 hours on"),
        where any span is; and, for each question, whether some span read holds a number in its unit (`True` where
        it asks for none). A span never ends on a time's ":" ("09:30", not "09:") nor inside a word ("9°C", not
        "9°")."""
        found = [not names for names in units]
        if not any(units):
            return with_number, found
        digit_ids, word_ids, continuation_ids, digit_continuation_ids = self._number_ids()
        unit_ids, letter_ids = self._unit_ids(), self._code_ids()[1]
        reader_ids = spans.reader_input_ids
        last = reader_ids[..., spans.candidate_ends.to(reader_ids.device)]  # (B, R, N)
        # cut short: on a time's colon ("09:"), or inside a word (the "9°" of "9°C": "9", "##°", "##c")
        cut = torch.isin(last, unit_ids["colon"].to(reader_ids.device))
        cut |= _continued(reader_ids, continuation_ids)[..., spans.candidate_ends.to(reader_ids.device)]
        cut = cut.to(with_number.device)
        narrowed = with_number.clone()
        for names in set(units) - {""}:  # each kind of unit once, for the whole batch
            ids = torch.cat([unit_ids[name] for name in names.split()])
            # a sign is a unit whatever follows: "€" of "€45" ("€", "##45"), "°" of "9°C" ("9", "##°", "##c")
            signs = torch.cat([unit_ids["sign"], unit_ids["degree"]])
            in_unit = unit_spans(
                spans, ids, continuation_ids, signs, torch.cat([digit_ids, digit_continuation_ids])
            ).to(with_number.device)
            in_unit &= with_number & ~cut
            ends = ids[~torch.isin(ids, unit_ids["colon"])]
            amounts = amount_spans(spans, digit_ids, word_ids, ends, unit_ids["money"], letter_ids,
                                   digit_continuation_ids, unit_ids["colon"], unit_ids["separator"])  # fmt: skip
            tight = in_unit & amounts.to(with_number.device)
            for row in [row for row, asked in enumerate(units) if asked == names and bool(in_unit[row].any())]:
                narrowed[row] = tight[row] if bool(tight[row].any()) else in_unit[row]
                found[row] = True
        return narrowed, found

    def _name_spans(self, spans, questions: torch.BoolTensor) -> torch.BoolTensor:
        """[`name_like_spans`] of the blocks read for each of `questions` (`(B,)`); `False` for the others."""
        reader_ids = spans.reader_input_ids
        num_read = reader_ids.shape[1]
        kinds = torch.full(reader_ids.shape, NO_WORD, dtype=torch.long)
        block_ids = spans.retrieved_block_ids[:, :num_read].tolist()
        for row in torch.nonzero(questions.cpu(), as_tuple=True)[0].tolist():
            for index in range(num_read):
                text, offsets = self._block_offsets(
                    block_ids[row][index], reader_ids[row, index].cpu(), spans.block_mask[row, index].cpu()
                )
                for position, kind in word_kinds(text, offsets).items():
                    kinds[row, index, position] = kind
        return name_like_spans(spans, kinds.to(reader_ids.device))

    def _prefer_typed_spans(
        self, spans, span_mask: torch.BoolTensor, demoted: torch.BoolTensor, wanted: list[str | None]
    ) -> torch.BoolTensor:
        """`demoted` (`(B, R, N)`) with, for each question that names the kind of its answer (`wanted`, from
        [`asked_type`]), every span that is no title of that kind demoted too, where the reader's first span is none
        and one of its first `TYPE_POOL` spans (its valid spans not demoted yet) with at least
        `TYPE_MIN_PROBABILITY_RATIO` of the first one's probability is: "Peru", a country, over "Cusco"
        for "In which country is Machu Picchu?". Only a title of the kind asked for is promoted: a span the corpus types
        otherwise, or not at all, is never demoted for it, since most right answers have no article of their own.
        See `realm_hf.pipelines.answer_types`."""
        if not any(wanted):
            return demoted
        table = self._answer_types()
        if not len(table):
            return demoted
        batch_size, num_read, num_candidates = span_mask.shape
        logits = spans.span_logits.float().masked_fill(~span_mask | demoted, float("-inf")).view(batch_size, -1)
        starts, ends = spans.candidate_starts.tolist(), spans.candidate_ends.tolist()
        candidates = {(start, end): index for index, (start, end) in enumerate(zip(starts, ends, strict=True))}
        reader_ids, block_ids = spans.reader_input_ids, spans.retrieved_block_ids[:, :num_read].tolist()
        demoted = demoted.clone()
        for row, kind in enumerate(wanted):
            if kind is None:
                continue
            pool = logits[row].topk(min(TYPE_POOL, logits.shape[1])).indices
            # spans within a factor TYPE_MIN_PROBABILITY_RATIO of the first one's probability
            close = logits[row, pool] >= logits[row, pool[0]] + math.log(TYPE_MIN_PROBABILITY_RATIO)
            pool = pool[torch.isfinite(logits[row, pool]) & close].cpu()
            if len(pool) < 2:
                continue
            tiers = torch.full((num_read, num_candidates), UNKNOWN, dtype=torch.long)
            for index in sorted({int(position) // num_candidates for position in pool}):
                text, offsets = self._block_offsets(
                    block_ids[row][index], reader_ids[row, index].cpu(), spans.block_mask[row, index].cpu()
                )
                for candidate, tier in answer_type_tiers(candidates, offsets, text, table, kind).items():
                    tiers[index, candidate] = tier
            pool_tiers = tiers.view(-1)[pool]
            if int(pool_tiers[0]) != TYPED and bool((pool_tiers == TYPED).any()):
                demoted[row] |= (tiers != TYPED).to(demoted.device)
        return demoted

    def _per_corpus(self, name: str, compute):
        """`compute(records)` of the retriever's block records, worked out once per corpus and kept under `name`: again
        only when another index has been attached since."""
        records = self.retriever.block_records
        cache = self.__dict__.setdefault("_corpus_cache", {})
        cached = cache.get(name)
        if cached is None or cached[0] is not records:
            cache[name] = cached = (records, compute(records))
        return cached[1]

    def _answer_types(self) -> AnswerTypes:
        """[`AnswerTypes`] of the retriever's blocks, read on first use ([`stored_answer_types`])."""
        return self._per_corpus(
            "answer_types",
            lambda records: stored_answer_types(records, titles_are_headings=self._titles_are_headings()),
        )

    def _titles_are_headings(self) -> bool:
        """Whether the corpus' titles read as section headings ([`titles_are_headings`]), decided once per corpus."""

        def headings(records) -> bool:
            if not isinstance(records, TitledRecords) or not len(records):
                return False
            return titles_are_headings(records.titles(range(min(len(records), HEADING_SAMPLE))))

        return self._per_corpus("titles_are_headings", headings)

    def _title_lengths(self, spans) -> torch.Tensor:
        """`(B, R)`: the title of each block read, in wordpieces (0 for none)."""
        block_ids = spans.retrieved_block_ids[:, : spans.reader_input_ids.shape[1]].tolist()
        titles = [[self._title(block) if block >= 0 else None for block in row] for row in block_ids]
        return torch.tensor([[len(self.tokenizer.tokenize(title)) if title else 0 for title in row] for row in titles])

    def _idf_coverage(self, question_ids: torch.Tensor, block_ids: torch.Tensor, needed: bool | None) -> torch.Tensor:
        """`(B, R)`: [`idf_coverage`] of each question in each block read, or ones when no calibration reads it
        (`needed=None`: whether the model's own calibration does): it needs the corpus' document frequencies, counted
        over every block on first use (seconds for 50k blocks)."""
        if needed is None:
            calibration = self._calibration()
            needed = calibration is not None and IDF_COVERAGE in calibration.features
        if not needed:
            return torch.ones(block_ids.shape, dtype=torch.float)
        frequencies = self._document_frequencies()
        questions = self.tokenizer.batch_decode(question_ids, skip_special_tokens=True)
        rows = block_ids.tolist()
        return torch.tensor([[idf_coverage(question, record_text(self.retriever.block_records[block]), frequencies)
                              if block >= 0 else 0.0 for block in row] for question, row in zip(questions, rows)],
                            dtype=torch.float)  # fmt: skip

    def _document_frequencies(self) -> tuple[Counter, int]:
        """[`document_frequencies`] of the retriever's blocks, counted on first use (seconds for 50k blocks)."""
        return self._per_corpus("document_frequencies", stored_document_frequencies)

    def _number_ids(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The [`number_spans`] and [`whole_number_spans`] wordpiece ids (cached): digits that start a word ("1912",
        "12" of "12,000"; not "##2" of "K2"), the number words ("ten"), the continuation wordpieces ("##uous", which
        makes "ten" "tenuous"), and those of them made of digits ("##2" of "1492")."""
        ids = getattr(self, "_cached_number_ids", None)
        if ids is None:
            vocab = self.tokenizer.get_vocab().items()
            ids = self._cached_number_ids = tuple(torch.tensor(sorted(found), dtype=torch.long) for found in (
                [index for token, index in vocab if _NUMBER_TOKEN.match(token) or _SIGNED_NUMBER_TOKEN.match(token)],
                [index for token, index in vocab if token.lower() in NUMBER_WORDS],
                [index for token, index in vocab if token.startswith("##")],
                [index for token, index in vocab if _DIGITS_CONTINUED.match(token)],
            ))  # fmt: skip
        return ids

    def _unit_ids(self) -> dict[str, torch.Tensor]:
        """The wordpiece ids of each kind of unit in `UNIT_WORDS` that the vocabulary has, as a word ("am") or as a
        continuation written onto a number ("##am" of "7am", "##km" of "5km"; [`unit_spans`] reads those only after
        digits), and a currency sign with its digits as one wordpiece ("£1" of "£1,325") as money and as a sign; also
        the colon, the currency signs, the degree sign and the separators of a number ("," and ".") (cached)."""
        ids = getattr(self, "_cached_unit_ids", None)
        if ids is None:
            vocab = self.tokenizer.get_vocab()
            signed = [index for token, index in vocab.items() if _SIGNED_NUMBER_TOKEN.match(token)]
            ids = self._cached_unit_ids = {
                name: torch.tensor(sorted({vocab[piece] for word in words for piece in (word, f"##{word}")
                                           if piece in vocab} | set(signed if name in ("money", "sign") else ())),
                                   dtype=torch.long)
                for name, words in {**UNIT_WORDS, "colon": [":"], "sign": CURRENCY_SIGNS, "degree": ["°"],
                                    "separator": [",", "."]}.items()
            }  # fmt: skip
        return ids

    def _code_ids(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The hyphen wordpieces and the wordpieces made of letters, for the codes of [`number_spans`] (cached)."""
        ids = getattr(self, "_cached_code_ids", None)
        if ids is None:
            vocab = self.tokenizer.get_vocab().items()
            ids = self._cached_code_ids = (
                torch.tensor(sorted(index for token, index in vocab if token in HYPHENS), dtype=torch.long),
                torch.tensor(sorted(index for token, index in vocab if token.removeprefix("##").isalpha()),
                             dtype=torch.long),
            )  # fmt: skip
        return ids

    def _bracket_ids(self) -> list[tuple[int, int]]:
        """`(opening, closing)` wordpiece ids of the bracket pairs the tokenizer has as tokens of their own (cached)."""
        pairs = getattr(self, "_cached_bracket_ids", None)
        if pairs is None:
            vocab = self.tokenizer.get_vocab()
            pairs = [(vocab[opening], vocab[closing]) for opening, closing in ("()", "[]", "{}")
                     if opening in vocab and closing in vocab]  # fmt: skip
            self._cached_bracket_ids = pairs
        return pairs

    def _sentence_end_ids(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The wordpiece ids [`cross_sentence_spans`] reads (cached): full stops, exclamation and question marks; the
        words a full stop abbreviates ("St", "Dr", "Inc") or one character; the wordpieces that start with a digit; the
        parts of an address ("com", "uk")."""
        ids = getattr(self, "_cached_sentence_end_ids", None)
        if ids is None:
            vocab = self.tokenizer.get_vocab()
            ends = [vocab[mark] for mark in SENTENCE_END_MARKS if mark in vocab]
            abbreviations = [index for token, index in vocab.items()
                             if len(token) == 1 or token.lower() in ABBREVIATIONS]  # fmt: skip
            digits = [index for token, index in vocab.items() if token[:1].isdigit()]
            domains = [vocab[word] for word in DOMAIN_WORDS if word in vocab]
            ids = self._cached_sentence_end_ids = tuple(
                torch.tensor(sorted(found), dtype=torch.long) for found in (ends, abbreviations, digits, domains)
            )
        return ids

    def _salutation_ids(self) -> torch.Tensor:
        """The wordpiece ids of `SALUTATION_WORDS` the vocabulary holds (cached)."""
        ids = getattr(self, "_cached_salutation_ids", None)
        if ids is None:
            vocab = self.tokenizer.get_vocab()
            ids = self._cached_salutation_ids = torch.tensor(
                sorted(vocab[word] for word in SALUTATION_WORDS if word in vocab), dtype=torch.long
            )
        return ids

    def _ignored_ids(self) -> torch.Tensor:
        """The wordpiece ids [`_question_coverage`] skips: special tokens, stop words and punctuation (cached)."""
        ignored = getattr(self, "_cached_ignored_ids", None)
        if ignored is None:
            vocab = self.tokenizer.get_vocab()
            ids = {index for token, index in vocab.items()
                   if token.lower() in STOP_WORDS or not any(character.isalnum() for character in token)}  # fmt: skip
            ids |= set(self.tokenizer.all_special_ids)
            ignored = self._cached_ignored_ids = torch.tensor(sorted(ids), dtype=torch.long)
        return ignored

    def postprocess(
        self, model_outputs: dict[str, torch.Tensor], top_k: int = 1, abstention_threshold: float | None = None,
        calibration=None,
    ):  # fmt: skip
        # One question: every tensor has a leading batch dim of 1.
        outputs = {key: value[0] for key, value in model_outputs.items()}
        calibration = calibration if calibration is not None else self._calibration()
        confidences = calibration.confidence(outputs["features"]).tolist() if calibration is not None else None
        if abstention_threshold is not None:
            threshold = abstention_threshold
        else:  # over a user's documents, the calibration's threshold for documents where it has one
            threshold = 0 if calibration is None else calibration.threshold_for(
                getattr(self.model, "searches_own_index", True))  # fmt: skip
        names, asker = list(outputs["unknown_names"]), list(outputs["about_the_asker"])
        missing = [unit for unit, flag in zip(UNITS_NEVER_GUESSED, outputs["missing_units"].tolist()) if flag]
        yes_or_no = bool(outputs["yes_or_no"])
        reasons = {"unknown_names": names, "about_the_asker": asker, "missing_units": missing, "yes_or_no": yes_or_no}
        # Only where there is a calibration to abstain with at all, and a threshold that can abstain.
        unknown = confidences is not None and threshold > 0 and abstains_whatever_the_confidence(reasons)
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
            start, end = _whole_address(evidence, start, end)
            answers.append(
                {
                    "answer": evidence[start:end],
                    "score": float(outputs["scores"][rank]),
                    "start": start,
                    "end": end,
                    "block_id": block_ids[index],
                    "title": self._title(block_ids[index]),
                    "source": self._source(block_ids[index]),
                    "evidence": evidence,
                    # Without a calibration there is no confidence, and the model never abstains.
                    "confidence": None if confidences is None else float(confidences[rank]),
                    "abstained": confidences is not None and (confidences[rank] < threshold or unknown),
                    "threshold": None if confidences is None else float(threshold),
                    **reasons,
                }
            )
        if top_k > 1:
            return answers
        if answers:
            return answers[0]
        # No block read holds a single token of text (e.g. empty records): an empty answer from the best block.
        evidence = record_text(self.retriever.block_records[block_ids[0]])
        return {"answer": "", "score": 0.0, "start": 0, "end": 0, "block_id": block_ids[0],
                "title": self._title(block_ids[0]), "source": self._source(block_ids[0]), "evidence": evidence,
                "confidence": None if calibration is None else 0.0, "abstained": calibration is not None,
                "threshold": None if calibration is None else float(threshold), **reasons}  # fmt: skip

    def _searches_own_index(self) -> bool:
        """Whether the model reads its own corpus (no `index=` / `searcher=` given; see `loading.is_own_index`)."""
        return bool(getattr(self.model, "searches_own_index", True))

    def _calibration(self):
        """The model's calibration: `model.calibration` if set, else `calibration.json` beside its weights, else
        `None` (read once)."""
        if not hasattr(self, "_cached_calibration"):
            calibration = getattr(self.model, "calibration", None)
            if calibration is None and self.model.name_or_path:
                from pathlib import Path

                path = Path(self.model.name_or_path) / CALIBRATION_FILE
                calibration = Calibration.load(path) if path.is_file() else None
            self._cached_calibration = None if calibration is None else _as_calibration(calibration)
        return self._cached_calibration

    def _block_offsets(
        self, block_id: int, reader_input_ids: torch.Tensor, block_mask: torch.Tensor
    ) -> tuple[str, dict[int, tuple[int, int]]]:
        """The block's text and, for each block token of the reader input, its `(start, end)` characters in it.

        The reader input holds the block's wordpieces, possibly cut short by `reader_seq_len` (or, with a tokenizer
        that truncates on the left, their end); tokenizing the text alone gives the same wordpieces with offsets.
        """
        positions = torch.nonzero(block_mask, as_tuple=True)[0].tolist()
        read_ids = reader_input_ids[positions].tolist()
        tokenizer = self.retriever.tokenizer
        if isinstance(self.retriever, BlockOffsets):
            # The offsets of the tokenization that built the reader inputs: the block is not tokenized again.
            text, all_offsets = self.retriever.block_offsets(block_id)
            all_offsets = all_offsets.tolist()
            all_ids = None
        else:
            text = record_text(self.retriever.block_records[block_id])
            encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            all_ids, all_offsets = encoding["input_ids"], encoding["offset_mapping"]
        first = max(len(all_offsets) - len(read_ids), 0) if tokenizer.truncation_side == "left" else 0
        if all_ids is not None and all_ids[first : first + len(read_ids)] != read_ids:
            kept = "last" if tokenizer.truncation_side == "left" else "first"
            raise RuntimeError(
                f"block {block_id}: the {len(read_ids)} wordpieces the reader read are not the {kept} ones of the "
                f"block text's {len(all_ids)}, so the answers cannot be located in the text. The reader inputs must "
                "come from the retriever's tokenizer (retriever.tokenizer)."
            )
        return text, {position: tuple(all_offsets[first + i]) for i, position in enumerate(positions)}

    def _source(self, block_id: int) -> str | None:
        # Documents read from files know the file (`source`); other block records do not.
        sources = getattr(self.retriever.block_records, "sources", None)
        return sources([block_id])[0] if callable(sources) else None

    def _title(self, block_id: int) -> str | None:
        # Block records backed by a DocumentStore carry titles; plain records (the Hub's) have none.
        records = self.retriever.block_records
        return (records.titles([block_id])[0] or None) if isinstance(records, TitledRecords) else None

    def save_pretrained(self, save_directory, **kwargs) -> None:
        """Writes the model, the tokenizer, the documents (`documents/` from a `DocumentStore`, else
        `block_records.safetensors`) and, when the model searches an index, the index (`index/`) to `save_directory`,
        which `pipeline("open-qa", model=save_directory)` loads again and answers with identically
        (`realm_hf.loading.save_open_qa`), with the model's calibration (`calibration.json`) when it has one.

        Unlike `Pipeline.save_pretrained`, it writes no `custom_pipelines` entry and no pipeline code: the task comes
        from `import realm_hf`. `kwargs` go to the model's `save_pretrained` (`max_shard_size`, ...).
        """
        save_open_qa(self.model, self.retriever, save_directory, tokenizer=self.tokenizer, **kwargs)
        calibration = self._calibration()
        if calibration is not None:  # the confidence and the abstention threshold travel with the model
            if not getattr(self.model, "searches_own_index", True):
                # the index saved becomes the saved model's own: it keeps the threshold it was read with
                calibration = dataclasses.replace(calibration, threshold=calibration.threshold_for(own_index=False))
            calibration.save(save_directory)


_ADDRESS_BOUNDS = "<>()[]{}\"'“”‘’,;"


def _whole_address(text: str, start: int, end: int) -> tuple[int, int]:
    """`(start, end)` of an answer `text[start:end]`, widened to the whole email address where it holds part of one:
    an address is often longer than the reader's widest span ("madoc@netherbrackwin.co.uk" is 12 wordpieces; the span
    read stopped at "madoc@netherbrackwin"). Up to whitespace or a bracket, quote, comma or semicolon, and not over a
    full stop that ends the sentence after it."""
    if "@" not in text[start:end]:
        return start, end
    while start > 0 and not text[start - 1].isspace() and text[start - 1] not in _ADDRESS_BOUNDS:
        start -= 1
    while end < len(text) and not text[end].isspace() and text[end] not in _ADDRESS_BOUNDS:
        end += 1
    while end > start and text[end - 1] in ".:!?":
        end -= 1
    return start, end


def _is_hf_dataset(value) -> bool:
    """Whether `value` is one of `datasets`' datasets (told without importing `datasets`)."""
    return type(value).__module__.startswith("datasets.") and hasattr(value, "column_names")


def _dataset_questions(dataset):
    """What the pipeline streams of a `datasets` dataset: a `Dataset`'s "question" column, as `KeyDataset(dataset,
    "question")` would; an `IterableDataset`'s rows, whose "question" `preprocess` reads. A `DatasetDict` of splits is
    refused, naming them."""
    columns, kind = dataset.column_names, type(dataset).__name__
    if isinstance(columns, dict):
        raise TypeError(
            f"the open-qa pipeline reads one dataset, not a {kind} of splits {list(columns)}: pass one, as "
            f"dataset[{next(iter(columns), 'train')!r}]"
        )
    if columns is not None and "question" not in columns:
        raise TypeError(f"the open-qa pipeline reads a dataset's 'question' column; this one has {columns}")
    return KeyDataset(dataset, "question") if hasattr(dataset, "__len__") else iter(dataset)


def _question_text(item, name: str) -> str:
    """The question `item` asks: itself, or a dict's `"question"`; checked ([`check_question`])."""
    if isinstance(item, dict):
        if "question" not in item:
            raise TypeError(
                f"{name}: expected a question as str or a dict with a 'question' key, received a dict with keys "
                f"{sorted(map(str, item))!r:.120}"
            )
        item, name = item["question"], f"{name}['question']"
    return check_question(item, name)


def _as_calibration(calibration) -> Calibration:
    if isinstance(calibration, Calibration):
        return calibration
    if isinstance(calibration, dict):
        return Calibration.from_dict(calibration)
    if isinstance(calibration, (str, os.PathLike)):
        return Calibration.load(calibration)
    raise TypeError(
        f"calibration must be a Calibration, a dict or a path to calibration.json, got {type(calibration).__name__}."
    )


def spans_in_question(
    spans, question_ids: torch.Tensor, question_mask: torch.Tensor | None = None
) -> torch.BoolTensor:
    """Which candidate spans only repeat the question: `(B, R, N)`, `True` where every wordpiece of span `n` of block
    `r` stands, in the same order and contiguously, among the question's wordpieces.

    Such a span is almost never the answer ("Who wrote Hamlet?" -> "Hamlet"; "What will the weather be in Paris
    tomorrow?" -> "Paris"), yet readers fine-tuned on title questions give them high scores. The match is on wordpiece
    ids, so it is as case-insensitive as the tokenizer.

    Args:
        spans ([`RealmForOpenQASpanScores`]): what `RealmForOpenQA.score_spans` returned for the questions.
        question_ids (`torch.LongTensor` of shape `(B, Q)`): the questions' wordpieces (the question encoder's input).
        question_mask (`torch.BoolTensor` of shape `(B, Q)`, *optional*): which of them count; pass `False` for
            padding and special tokens (`[CLS]`, `[SEP]`) so that a span is never matched against them.
    """
    reader_ids = spans.reader_input_ids  # (B, R, L)
    question_ids = question_ids.to(reader_ids.device)
    if question_mask is None:
        question_mask = torch.ones_like(question_ids, dtype=torch.bool)
    # equal[b, r, p, j]: token p of block read r is the question's token j.
    equal = (reader_ids[..., :, None] == question_ids[:, None, None, :]) & question_mask.to(reader_ids.device)[
        :, None, None, :
    ]
    widths = spans.candidate_ends - spans.candidate_starts  # (N,), 0 for one wordpiece
    length, positions = reader_ids.shape[-1], equal.shape[-1]
    # run: a match of the last `width + 1` tokens ending at p with the question tokens ending at j.
    run = equal
    ends_in_question = [run.any(-1)]  # per width: (B, R, L)
    for width in range(1, int(widths.max()) + 1 if widths.numel() else 1):
        shifted = torch.zeros_like(equal)
        if width < min(length, positions):
            shifted[..., width:, width:] = equal[..., : length - width, : positions - width]
        run = run & shifted
        ends_in_question.append(run.any(-1))
    by_width = torch.stack(ends_in_question, dim=-1)  # (B, R, L, W)
    return by_width[..., spans.candidate_ends, widths]  # (B, R, N)


# Titles read to decide whether a corpus' titles are headings: the first ones, enough to see repeats.
HEADING_SAMPLE = 50_000


def titles_are_headings(titles: list[str]) -> bool:
    """Whether titles name sections of documents rather than the things the blocks are about: at least half of the
    titled blocks share their title (up to its first ": ") with another block ("K-300 smart kettle: app", "K-300 smart
    kettle: warranty"; `read_text_files` writes "file: heading"). Encyclopedia articles have a title each: 4.6% of the
    default model's 43,829 blocks share one (split paragraphs of long factbook fields), 96% of a 25-passage product
    manual did."""
    keys = [title.split(": ", 1)[0] for title in titles if title]
    counts = Counter(keys)
    return bool(keys) and sum(counts[key] > 1 for key in keys) >= len(keys) / 2


def spans_in_titles(spans, title_lengths: torch.Tensor) -> torch.BoolTensor:
    """Which candidate spans start in a block's title (or the ":" after it): `(B, R, N)`.

    A titled block reads `title: text`. Where titles are section headings ("K-300 smart kettle: app", "manual:
    Cleaning"), a heading is what a passage is about, not an answer in it, yet a reader fine-tuned on title questions
    scores it high: "What is the pairing code for the app?" -> "K-300 smart kettle" (confidence 0.95), "How often should
    I descale the K2?" -> "Cleaning" (0.90). Spans that start in the title and run on into the text go too; the same
    words in the text stay candidates. The pipeline leaves these spans out where [`titles_are_headings`]; over an
    encyclopedia the title is often the answer (the default model's title dev EM fell 0.60 -> 0.19 without them).

    Args:
        spans ([`RealmForOpenQASpanScores`]): what `RealmForOpenQA.score_spans` returned.
        title_lengths (`torch.LongTensor` of shape `(B, R)`): each block's title in wordpieces (0: no title); the
            separator's ":" after it counts with the title.
    """
    device = spans.reader_input_ids.device
    first = spans.block_mask.to(device).int().argmax(-1)  # (B, R): the block's first token, where its title starts
    starts = spans.candidate_starts.to(device)
    end = (first + title_lengths.to(device) + (title_lengths > 0).to(device).long())[..., None]
    return (starts >= first[..., None]) & (starts < end)  # (B, R, N)


def _unless_none_left(kept: torch.BoolTensor, fallback: torch.BoolTensor) -> torch.BoolTensor:
    """`kept` `(B, R, N)` for each question that keeps at least one span, else its `fallback`."""
    return torch.where(kept.flatten(1).any(-1)[:, None, None], kept, fallback)


def _span_positions(starts: torch.Tensor, ends: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For spans `starts[...]..ends[...]` (inclusive) of a sequence of `length` tokens: the positions of their tokens,
    `(..., W)` with `W` the widest span, clamped into the sequence, and which of those lie inside the span."""
    width = int((ends - starts).max()) + 1 if starts.numel() else 1
    positions = starts[..., None] + torch.arange(width, device=starts.device)
    return positions.clamp(max=length - 1), positions <= ends[..., None]


NUMBER_WORDS = frozenset(
    """zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen
    eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million billion trillion
    dozen""".split()
)
HYPHENS = frozenset("-\u2010\u2011\u2012\u2013")
_YEAR = r"(?:what|which)\s+year"
# A time is written with digits too ("13:00", "19 June", "1945"): "When ...", "What time ...", "How late ...". Not a
# "When" clause before another question word ("When it is spring in the north, what season is it in the south?").
_ASKS_FOR_A_TIME = (
    r"^\W*when\b(?!.*\b(?:what|who|whom|which|where|how)\b)"
    r"|\b(?:(?:from|since|until|till|by)\s+when|what\s+time|how\s+(?:late|early|soon))\b"
)
# A number to call, written in digits ("0800 4411 260", "extension 312"): "What number do I ring ...?", "What is the
# phone number of ...?" (not "What number of people ...?"). A small reader picks the e-mail beside it.
_ASKS_FOR_A_PHONE = (
    r"\b(?:phone|telephone|mobile|fax)\s+(?:number|no)\b"
    r"|\b(?:what|which)(?:'s|\s+is)?\s+(?:the\s+)?number\b(?!\s+of\b)"
)
_ASKS_FOR_A_NUMBER = re.compile(
    rf"\b(?:how\s+(?:many|much|long|old|far|tall|high|deep|wide|heavy|large|big|often|frequently)|{_YEAR})\b"
    rf"|{_ASKS_FOR_A_TIME}|{_ASKS_FOR_A_PHONE}",
    re.IGNORECASE,
)
# The units whose absence makes a calibrated model abstain: a question asking for an amount of money ("How much did
# ... pay?") where no span read holds one, nor a percentage (`missing_units`). A price is written with its currency;
# over the document sets an answer to such a question without one was right once ("50%", of an upgrade's price) and
# otherwise wrong or its question unanswerable (6 of 7, session 28).
# A time of day too, where the question asks "What time ...?": of the 148 such questions of the document sets one
# answer holds no clock time ("half past eight"), and a walkthrough's "What time is Tom Reyes's dentist appointment?"
# over blocks holding none was answered "14 Elm Road" at 0.67. Durations are left out: "How long ...?" -> "a
# fortnight" holds no unit.
# A temperature too ("What is the boiling point of water?", "How hot ...?"): the default model answered "Water vapor",
# "Frost" (0.99) and "Wrought iron" (0.99) for three points of water and iron; the document sets' golds for such
# questions all hold one ("9°C", "between 5°C and 20°C").
# And an email address ("What's the accountant's email address?"), which holds an "@" (`asks_for_an_email_address`).
UNITS_NEVER_GUESSED = ("money", "clock", "temperature", "email")
# How much more probable the reader's own span must be than every span holding a number for a question asking when to
# keep it (the number rule yields): over the calibration sets' 47 time questions, 100 gained 2 answers and lost none
# (10 gained 3 and lost "07:48" to "14 days", at 54 times); see docs/default-model.md (session 28).
TIME_YIELD_RATIO = 100.0
# The units a number may be asked in, as whole words of an uncased vocabulary.
UNIT_WORDS = {
    "duration": frozenset("second seconds minute minutes min mins hour hours hr hrs day days week weeks month months "
                          "year years decade decades century centuries".split()),
    "length": frozenset("mm cm m km metre metres meter meters kilometre kilometres kilometer kilometers mile miles mi "
                        "ft foot feet inch inches yard yards".split()),
    "mass": frozenset("g kg gram grams kilogram kilograms tonne tonnes ton tons lb lbs pound pounds ounce ounces "
                      "oz".split()),
    # "pounds" weighs too, but a question that asks what something costs means sterling ("a deposit of 1325 pounds")
    "money": frozenset("€ $ £ ¥ euro euros eur dollar dollars usd cent cents pence gbp pound pounds quid yen franc "
                       "francs krona kronor krone kroner rupee rupees yuan peso pesos ruble rubles rouble roubles lira "
                       "dinar dinars dirham dirhams riyal riyals baht zloty forint shekel shekels".split()),
    "percent": frozenset(["%", "percent"]),
    "clock": frozenset([":", "am", "pm", "noon", "midnight"]),  # "13:00", "9 am"
    "temperature": frozenset("° °c °f degree degrees kelvin celsius fahrenheit".split()),  # "100 °C", "9°C"
    "email": frozenset(["@"]),  # not an amount: see `asks_for_an_email_address`
}  # fmt: skip
# What a question asks its number in, first match first: "How long ...?" a duration or a length; "How much does it
# cost?", "What do you charge for ...?" an amount of money ("Who is in charge?" asks for none).
_ASKED_UNITS = [
    (re.compile(r"\b(?:what\s+time|(?:until|till|by)\s+when|how\s+(?:late|early))\b", re.IGNORECASE), ("clock",)),
    (re.compile(r"\bhow\s+long\b|\bhow\s+much\s+(?:time|notice)\b", re.IGNORECASE), ("duration", "length")),
    (re.compile(r"\bhow\s+(?:far|tall|high|deep|wide)\b", re.IGNORECASE), ("length",)),
    (re.compile(r"\bhow\s+heavy\b|\bweigh(?:s|ed)?\b", re.IGNORECASE), ("mass",)),
    # "What is the boiling point of water?" (not "the highest point"), "What temperature ...?", "How hot ...?"
    # (not "What is the SI unit of temperature?", "What is the lowest theoretical temperature?": names)
    (re.compile(r"\b(?:boiling|melting|freezing|dew|flash|smoke)\s+points?\b|\b(?:what|which)\s+temperatures?\b"
                r"|\bwhat(?:'s|\s+is|\s+was|\s+are|\s+were)\s+the\s+temperatures?\s+(?:of|in|at|on|inside|outside)\b"
                r"|\bhow\s+(?:hot|cold|warm)\b", re.IGNORECASE), ("temperature",)),
    # money, where a price is asked for ("What does the lamp cost?"), not where the words name something ("electric
    # charge", "price determination", "low-cost airline")
    (re.compile(r"\bhow\s+much\b.*\b(?:costs?|prices?|pay|paid|spend|spent|charge[sd]?|fees?)\b"
                r"|\b(?:do|does|did|will|would|should)\s+(?:\S+\s+){0,8}?cost\b"
                r"|\bwhat\s+(?:is|was|are|were)\s+the\s+(?:price|cost|fee|charge)s?\b"
                r"|\b(?:do|does|did|will|you|they|we)\s+charge\b|\bcharge[sd]?\s+for\b"
                # "How much is the junior membership?", "How much are the tickets?"
                r"|\bhow\s+much\s+(?:is|are|was|were)\s+(?:a|an|the|my|our|your|one|it|this|that|these|those)\b",
                re.IGNORECASE), ("money",)),
    (re.compile(r"\bpercent(?:age)?\b|\bwhat\s+share\b", re.IGNORECASE), ("percent",)),
]  # fmt: skip
CURRENCY_SIGNS = frozenset("€$£¥")
_NUMBER_TOKEN = re.compile(r"^\d[\d,.]*$")  # a wordpiece that starts a number: not "##2" of "K2"
# A wordpiece that is a currency sign and the digits after it, which some vocabularies hold whole: "£1" of "£1,325"
# ("£1", ",", "325") and of "£12.50" ("£1", "##2", ".", "50"), "£5". It starts a number and is a sign of money.
_SIGNED_NUMBER_TOKEN = re.compile(r"^[€$£¥]\d[\d,.]*$")
_DIGITS_CONTINUED = re.compile(r"^##\d+$")  # the "##2" of "1492" (wordpieces "149", "##2")
_ASKS_FOR_A_YEAR = re.compile(rf"\b{_YEAR}\b", re.IGNORECASE)
_YEAR_NUMBER = re.compile(r"\b(?<![\d.,])([12]\d{3})\b(?![.,]\d)")  # "2055", not the "2055" of "12,055" or "2055.5"


@torch.no_grad()
def answers_with_features(
    open_qa: OpenQAPipeline, questions: list[str], batch_size: int = 8, progress: bool = False
) -> list[dict]:
    """Each question's best answer as `open_qa` gives it (`answer`, `evidence`), with every calibration feature
    (`features`, in `CALIBRATION_FEATURES` order, whatever calibration the model has), the names no document
    mentions (`unknown_names`) and the words asking about the asker where the corpus cannot say (`about_the_asker`):
    what fitting a calibration reads (`realm-hf calibrate`, examples/evaluate_question_sources.py). `progress`: a
    progress bar on stderr."""
    from tqdm.auto import tqdm

    frequencies = open_qa._document_frequencies()
    tokenizer, config = open_qa.tokenizer, open_qa.model.config
    results = []
    with tqdm(total=len(questions), desc="answering", unit="question", disable=not progress) as bar:
        for start in range(0, len(questions), batch_size):
            batch = questions[start : start + batch_size]
            inputs = dict(tokenizer(batch, padding=True, truncation=True, max_length=config.searcher_seq_len,
                                    return_tensors="pt"))  # fmt: skip
            inputs.update(_answer_kinds(batch))  # as the pipeline asks them
            outputs = open_qa.forward(inputs, top_k=1, idf_coverage=True)  # every feature, whatever the calibration
            for index, question in enumerate(batch):
                one = {key: value[index : index + 1] for key, value in outputs.items()}
                answer = open_qa.postprocess(one, top_k=1)
                results.append({"answer": answer["answer"], "evidence": answer["evidence"],
                                "features": one["features"][0, 0].tolist(),
                                "unknown_names": unknown_names(question, frequencies[0]),
                                "about_the_asker": _unanswerable_asker_words(question, frequencies)
                                if open_qa._searches_own_index() else [],
                                "missing_units": answer["missing_units"],
                                "yes_or_no": answer["yes_or_no"]})  # fmt: skip
            bar.update(len(batch))
    return results


def _answer_kinds(questions: list[str]) -> dict:
    """The kinds of answer each question asks for, as `_forward` reads them, from the text as written (its wordpieces
    may be `[UNK]`, and decoding them loses case): `(B,)` flags, and the kind each names ([`asked_type`]), a list."""
    return {
        "asks_for_a_number": torch.tensor([asks_for_a_number(question) for question in questions]),
        "asks_for_a_year": torch.tensor([asks_for_a_year(question) for question in questions]),
        "asks_for_a_time": torch.tensor([asks_for_a_time(question) for question in questions]),
        "asks_what_time": torch.tensor([asks_what_time(question) for question in questions]),
        "asks_for_a_count": torch.tensor([asks_for_a_count(question) for question in questions]),
        "asks_for_a_name": torch.tensor([asks_for_a_name(question) for question in questions]),
        "asks_yes_or_no": torch.tensor([asks_yes_or_no(question) for question in questions]),
        "asks_for_an_email_address": torch.tensor([asks_for_an_email_address(question) for question in questions]),
        "asked_type": [asked_type(question) for question in questions],
        "asked_units": [_unit_names(question) for question in questions],
    }


def asks_for_a_number(question: str) -> bool:
    """Whether a question asks for a number: "How many ...", "How long ...", "How old ...", "In what year ...",
    "... in which year?", a number to call ("What number do I ring ...?", "What is the phone number of ...?"), a time
    ("When ...", "What time ...", "How late ...": "13:00", "19 June", "1945") or an amount
    in a unit ("What does the lamp cost?", see [`asked_units`]). Where no span read holds a number ("When did the
    Renaissance begin?" -> "during the Middle Ages"), the reader's own choice stands."""
    return bool(_ASKS_FOR_A_NUMBER.search(question)) or bool(asked_units(question))


def _unit_names(question: str) -> str:
    """[`asked_units`] as `_answer_kinds` passes them: names joined by spaces."""
    return " ".join(asked_units(question))


def asked_units(question: str) -> tuple[str, ...]:
    """The kinds of unit (keys of `UNIT_WORDS`) a question asks its number in, or `()`: "How long is the warranty?" ->
    `("duration", "length")`, "How far ...?" -> `("length",)`, "What does the lamp cost?" and "How much is the junior
    membership?" -> `("money",)`, "What percentage ...?" -> `("percent",)`, "What time ...?" -> `("clock",)` ("13:00",
    "9 am"); a date ("From when ...?") none. Among the spans holding a number, one holding such a unit is the answer
    where any is ("11 hours", not "2200" of "2200 mAh"; see [`unit_spans`]). A count in a unit ("How many metres
    ...?") is not asked in it: answers that say "100" are as right, and question sets write them so."""
    clock, *amounts = _ASKED_UNITS
    if clock[0].search(question):
        return clock[1]
    if asks_for_a_time(question) or asks_for_a_year(question):
        return ()  # "From when does the lamp cost 149 euros?" asks for a date
    for pattern, units in amounts:
        if pattern.search(question):
            return units
    return ()


def asks_for_a_time(question: str) -> bool:
    """Whether a question asks when ("When ...?", "What time ...?", "How late ...?", "Since when ...?"): a date, a
    time or a period, answered with a number where one is read ("13:00", "19 June", "1945") but never with an amount of
    money ("£45 a year" beside "collected on the last Friday of each month"); where no other span holds a number the
    reader's own choice stands."""
    return bool(re.search(_ASKS_FOR_A_TIME, question, re.IGNORECASE))


def asks_for_a_count(question: str) -> bool:
    """Whether a question asks how many of something there are ("How many people came?", not "How many euros does
    it cost?"): answered with a number where one is read, but never with an amount of money ("45 euros per person"
    beside the party's guests; over the document sets no count was ever answered right with one)."""
    found = _ASKS_FOR_A_COUNT.match(question)
    return bool(found) and found.group(1).lower() not in UNIT_WORDS["money"]


_ASKS_FOR_A_COUNT = re.compile(r"^\W*how\s+many\b\s*(\w*)", re.IGNORECASE)


def asks_what_time(question: str) -> bool:
    """Whether a question asks "What time ...?": a time of day, which documents write as one ("9:40 am", "noon"); a
    calibrated model abstains where no passage read holds one (`missing_units`: `["clock"]`)."""
    return bool(re.search(r"\bwhat\s+time\b", question, re.IGNORECASE))


def asks_for_a_year(question: str) -> bool:
    """Whether a question asks for a year ("In what year ...", "... in which year?"): its answer is one number, not a
    date or a phrase holding one (see [`whole_number_spans`])."""
    return bool(_ASKS_FOR_A_YEAR.search(question))


# A question asking for a yes or a no opens with a verb ("Did I ...?", "Is there ...?", "Will solar panels ...?").
_OPENING_VERB = re.compile(
    r"^\W*(?:am|is|are|was|were|do|does|did|has|have|had|can|could|will|would|shall|should|may|might|must"
    r"|(?:is|are|was|were|do|does|did|has|have|had|can|could|wo|would|should|must)n['’]t)\b",
    re.IGNORECASE,
)
# ... unless it asks for something besides ("Do I have to pay to join the choir? How much is it?") or offers a choice
# ("Is the meeting on Monday or Tuesday?"; "... or not?" offers none), or asks politely for something ("Can you tell
# me ...?", "Do you know ...?")
_ASKS_FOR_MORE = re.compile(
    r"\b(?:what|which|when|where|who|whom|whose|why|how)\b|\bor\b(?!\s+(?:not|no)\b)"
    r"|^\W*\w+\s+(?:you|anyone|anybody)\s+(?:please\s+)?(?:tell|give|show|send|let|list|explain|remind|find|know|"
    r"say|name|help)\b",
    re.IGNORECASE,
)


def asks_yes_or_no(question: str) -> bool:
    """Whether a question asks for a yes or a no: it opens with a verb ("Did I already pay the deposit?", "Is there a
    discount if I pay up front?", "Will solar panels be cheaper next year?") and asks for nothing besides (no "what",
    "when", "how", ...), offers no choice ("Is it on Monday or Tuesday?") and asks for nothing politely ("Can you tell
    me the price of ...?"). Its answer is never a span of a passage, so a calibrated model abstains (`yes_or_no`): the
    28 such questions of the ten document sets read for calibration and evaluation are all unanswerable there (the
    sets ask them so), and the model shipped in session 28 answered 7 of them over its threshold, at confidences of
    0.15 to 0.36; of the 31 of the training sets, 3 have a span for an answer ("Is my bike covered if I leave it
    outside the shops?" -> "locked to a fixed object"). No question of the encyclopedic question sets is one."""
    return bool(_OPENING_VERB.search(question)) and not _ASKS_FOR_MORE.search(question)


_ASKS_FOR_AN_EMAIL_ADDRESS = re.compile(
    r"\be-?mail\s+address(?:es)?\b|\b(?:what|which)\s+e-?mail\s+(?:address\s+)?(?:do|does|should|can|is)\b",
    re.IGNORECASE,
)


def asks_for_an_email_address(question: str) -> bool:
    """Whether a question asks for an email address ("What's the accountant's email address?", "What email do I send
    photos of the damage to?"): answered with a span holding an "@" where one is read; where none is, a calibrated
    model abstains (`missing_units`: `["email"]`). Of the document sets' ten such questions, the three with an answer
    have one with an "@" ("care@tarrowby.example"); of the seven without, the four read for calibration were all
    answered over the threshold by the model shipped in session 28 ("Yours sincerely", "01872 445 227")."""
    return bool(_ASKS_FOR_AN_EMAIL_ADDRESS.search(question))


def abstains_whatever_the_confidence(answer: dict) -> bool:
    """Whether a calibrated model abstains on an answer whatever its confidence, from the reasons the pipeline gives
    with it: its question names something no document mentions (`unknown_names`), asks about its asker where the
    documents cannot say (`about_the_asker`), asks for an amount of money, a time of day, a temperature or an email
    address that no passage read holds (`missing_units`), or asks for a yes or a no (`yes_or_no`)."""
    return bool(answer.get("unknown_names") or answer.get("about_the_asker") or answer.get("missing_units")
                or answer.get("yes_or_no"))  # fmt: skip


_ASKS_FOR_A_NAME = re.compile(
    r"^\W*(?:who\b(?!se)|(?:which|what)\s+(?:scientist|composer|author|writer|painter|artist|poet|philosopher|"
    r"president|king|queen|emperor|pharaoh|explorer|inventor|leader|man|woman|person|actor|actress|singer)s?\b)",
    re.IGNORECASE,
)
# Lower-case words that belong in names: "Joan of Arc", "Leonardo da Vinci", "Ludwig van Beethoven".
NAME_PARTICLES = frozenset("of the da de di del della der van von la le du al bin ibn y".split())


def asks_for_a_name(question: str) -> bool:
    """Whether a question asks for someone's name: it starts with "Who" ("Who wrote Hamlet?", not "Whose ...") or with
    "Which"/"What" and a kind of person ("Which scientist ...?")."""
    return bool(_ASKS_FOR_A_NAME.search(question))


# What starts at a wordpiece, for [`name_like_spans`]: nothing (inside a word, a hyphen, a full stop), a capitalised
# word, a one-letter capital word ("G." of "Alexander G. Bell"), a name particle ("of" of "Joan of Arc"), or anything
# else a name does not hold (a word starting with a digit or a lower-case letter; a semicolon, colon or bracket).
NO_WORD, CAPITAL, INITIAL, PARTICLE, NOT_IN_NAMES = range(5)
_BREAKS_NAMES = frozenset(';:!?()[]{}"')


def word_kinds(text: str, offsets: dict[int, tuple[int, int]]) -> dict[int, int]:
    """For each reader position of a block (`offsets`: position -> its characters in `text`), what starts there:
    `NO_WORD`, `CAPITAL`, `INITIAL`, `PARTICLE` or `NOT_IN_NAMES` (see above)."""
    kinds = {}
    for position, (start, end) in offsets.items():
        character = text[start] if start < len(text) else ""
        if character in _BREAKS_NAMES:
            kinds[position] = NOT_IN_NAMES
        elif not character.isalnum() or (start > 0 and text[start - 1].isalnum()):
            kinds[position] = NO_WORD
        elif character.isupper():
            one_letter = start + 1 >= len(text) or not text[start + 1].isalnum()
            kinds[position] = INITIAL if one_letter else CAPITAL
        elif character.isalpha() and text[start:end].lower() in NAME_PARTICLES:
            kinds[position] = PARTICLE
        else:
            kinds[position] = NOT_IN_NAMES
    return kinds


def name_like_spans(spans, kinds: torch.Tensor) -> torch.BoolTensor:
    """Which candidate spans read like a name: `(B, R, N)`, `True` where span `n` of block `r` starts with a capitalised
    word or an initial, holds nothing a name does not, does not end on a particle ("Joan of") and is not one initial
    alone ("G"). `kinds` (`(B, R, L)`) says what starts at each wordpiece ([`word_kinds`])."""
    device = spans.reader_input_ids.device
    starts, ends = spans.candidate_starts.to(device), spans.candidate_ends.to(device)
    if starts.numel() == 0:
        return torch.zeros(kinds.shape[:-1] + starts.shape, dtype=torch.bool, device=device)
    kinds = kinds.to(device)
    clean = _count_in_spans(kinds == NOT_IN_NAMES, starts, ends) == 0
    first, last = kinds[..., starts], kinds[..., ends]
    alone = (first == INITIAL) & (ends == starts)
    return ((first == CAPITAL) | (first == INITIAL)) & clean & (last != PARTICLE) & ~alone


def number_spans(
    spans,
    digit_ids: torch.Tensor,
    word_ids: torch.Tensor,
    continuation_ids: torch.Tensor,
    code_ids: tuple[torch.Tensor, torch.Tensor] | None = None,
    signed_ids: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.BoolTensor:
    """Which candidate spans hold a number, written in digits or in words: `(B, R, N)`, `True` where a wordpiece of
    span `n` of block `r` is among `digit_ids` ("1912", "30"; not the "2" of "K2", a continuation wordpiece), or among
    `word_ids` and not followed by one of `continuation_ids` (the "two" of "two-year"; not the "ten" of "tenuous"), or
    is digits continuing a currency sign (the "##45" of "€45").

    A question asking for a number ("How long is the warranty?") is answered with such a span where any is a
    candidate: a small reader often prefers the name next to the number (over a product manual, "Acme K2 kettle",
    where "two-year" came 4th). The other spans are ranked after them, and every span keeps its probability, so the
    confidence says how much the reader itself believes the answer.

    Args:
        spans ([`RealmForOpenQASpanScores`]): what `RealmForOpenQA.score_spans` returned.
        digit_ids (`torch.LongTensor`): the wordpieces of digits that start a word.
        word_ids (`torch.LongTensor`): the number words.
        continuation_ids (`torch.LongTensor`): the wordpieces that continue a word ("##...").
        code_ids (`tuple` of two `torch.LongTensor`, *optional*): hyphens and letter wordpieces: digits after a hyphen
            that follows letters are part of a name ("K-300", "F-16"), not a number.
        signed_ids (`tuple` of two `torch.LongTensor`, *optional*): currency signs and the continuation wordpieces made
            of digits: "€45" is read "€", "##45", and its digits are a number.
    """
    reader_ids = spans.reader_input_ids  # (B, R, L)
    device = reader_ids.device
    starts, ends = spans.candidate_starts.to(device), spans.candidate_ends.to(device)
    if starts.numel() == 0:
        return torch.zeros(reader_ids.shape[:-1] + starts.shape, dtype=torch.bool, device=device)
    continued = _continued(reader_ids, continuation_ids)
    numbers = torch.isin(reader_ids, digit_ids.to(device)) | (torch.isin(reader_ids, word_ids.to(device)) & ~continued)
    if code_ids is not None:
        hyphens, letters = (torch.isin(reader_ids, ids.to(device)) for ids in code_ids)
        after_code = torch.nn.functional.pad(hyphens[..., 1:-1] & letters[..., :-2], (2, 0))  # (B, R, L)
        numbers &= ~after_code
    if signed_ids is not None:
        signs, continued_digits = signed_ids
        numbers |= torch.isin(reader_ids, continued_digits.to(device)) & _preceded(reader_ids, signs)
    return _count_in_spans(numbers, starts, ends) > 0


def _count_in_spans(flags: torch.BoolTensor, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """`(..., N)`: how many of `flags` (`(..., L)`) are set in each span `starts[n]..ends[n]` (inclusive): a
    difference of two prefix sums, not a loop over spans."""
    counts = torch.nn.functional.pad(flags.long().cumsum(-1), (1, 0))  # counts[..., p] = flags among positions < p
    return counts[..., ends + 1] - counts[..., starts]


def _continued(reader_ids: torch.Tensor, continuation_ids: torch.Tensor) -> torch.BoolTensor:
    """`(B, R, L)`: whether the next wordpiece continues the word ("ten" before "##uous"); `False` at the end."""
    following = torch.isin(reader_ids[..., 1:], continuation_ids.to(reader_ids.device))
    return torch.nn.functional.pad(following, (0, 1))


def _preceded(reader_ids: torch.Tensor, ids: torch.Tensor) -> torch.BoolTensor:
    """`(B, R, L)`: whether the wordpiece before is among `ids` (the "€" before "##45"); `False` at the start."""
    preceding = torch.isin(reader_ids[..., :-1], ids.to(reader_ids.device))
    return torch.nn.functional.pad(preceding, (1, 0))


def unit_spans(
    spans,
    unit_ids: torch.Tensor,
    continuation_ids: torch.Tensor,
    sign_ids: torch.Tensor | None = None,
    number_ids: torch.Tensor | None = None,
) -> torch.BoolTensor:
    """Which candidate spans hold one of `unit_ids` as a whole word (not the "m" of "m##Ah") or as one of `sign_ids`,
    whatever follows (the "€" of "€45", read "€", "##45"): `(B, R, N)`. A unit that is itself a continuation
    wordpiece ("##am" of "7am", "##km" of "5km") counts right after one of `number_ids` only (not the "##am" of a
    word), and not at all without them.

    Of the spans holding a number, a question asking for one in a unit ([`asked_units`]) is answered with one that
    holds the unit where any is: "How long does the battery last?" over "a 2200 mAh battery ... lasts about 11 hours"
    -> "about 11 hours", not "2200"; "What does the lamp cost?" -> "149 euros", not "4-year"."""
    reader_ids = spans.reader_input_ids  # (B, R, L)
    device = reader_ids.device
    starts, ends = spans.candidate_starts.to(device), spans.candidate_ends.to(device)
    if starts.numel() == 0:
        return torch.zeros(reader_ids.shape[:-1] + starts.shape, dtype=torch.bool, device=device)
    whole = ~_continued(reader_ids, continuation_ids)
    if sign_ids is not None:
        whole |= torch.isin(reader_ids, sign_ids.to(device))
    units = torch.isin(reader_ids, unit_ids.to(device)) & whole
    # written onto a number ("7am": "7", "##am"), or not a unit at all (the "##m" of a word)
    attached = torch.isin(reader_ids, continuation_ids.to(device))
    after_number = _preceded(reader_ids, number_ids) if number_ids is not None else torch.zeros_like(attached)
    units &= ~attached | after_number
    return _count_in_spans(units, starts, ends) > 0


def money_spans(
    spans,
    money_ids: torch.Tensor,
    sign_ids: torch.Tensor,
    continuation_ids: torch.Tensor,
    number_ids: torch.Tensor,
    separator_ids: torch.Tensor | None = None,
) -> torch.BoolTensor:
    """Which candidate spans hold an amount of money: `(B, R, N)`, a unit of money (`money_ids`: "euros", "£") as
    [`unit_spans`] reads it, digits written onto a currency sign (`sign_ids`) whose sign the span leaves out (the
    "30" of "€30", read "€", "##30", where the span starts at "##30"), a number (`number_ids`) whose unit of money
    follows the span (the "45" of "45 euros per person"), or, given `separator_ids` ("," and "."), the digits that go
    on after a separator in an amount (the "325" of "£1,325", read "£1", ",", "325")."""
    reader_ids = spans.reader_input_ids  # (B, R, L)
    device = reader_ids.device
    starts, ends = spans.candidate_starts.to(device), spans.candidate_ends.to(device)
    held = unit_spans(spans, money_ids, continuation_ids, sign_ids, number_ids)
    if starts.numel() == 0:
        return held
    number = torch.isin(reader_ids, number_ids.to(device))
    signed = torch.isin(reader_ids, continuation_ids.to(device)) & _preceded(reader_ids, sign_ids)
    money = torch.isin(reader_ids, money_ids.to(device))
    following = torch.nn.functional.pad(money[..., 1:], (0, 1))  # the next wordpiece is a unit of money
    amount = signed | (number & following) | money
    if separator_ids is not None:  # forward only: "2019, 45 euros" reads like "2,045 euros" backwards
        separated = _preceded(reader_ids, separator_ids)
        for _ in range(3):  # "£1,325,000.50": each group of digits after the one before
            after_amount = torch.nn.functional.pad(amount[..., :-2], (2, 0))
            amount = amount | (number & separated & after_amount)
    return held | (_count_in_spans((amount & number) | signed, starts, ends) > 0)


def amount_spans(
    spans,
    digit_ids: torch.Tensor,
    word_ids: torch.Tensor,
    unit_ids: torch.Tensor,
    money_ids: torch.Tensor,
    letter_ids: torch.Tensor,
    digit_continuation_ids: torch.Tensor | None = None,
    colon_ids: torch.Tensor | None = None,
    separator_ids: torch.Tensor | None = None,
) -> torch.BoolTensor:
    """Which candidate spans are one amount and nothing around it: `(B, R, N)`, `True` where span `n` of block `r`
    starts with a number (`digit_ids`, `word_ids`) and ends with one of `unit_ids` ("11 hours", "4-year", "5.50 euros",
    "7 working days", "three months") or, given `colon_ids`, with the digits after a colon ("10:30"), or starts with a
    currency sign among `money_ids` and ends with digits ("$ 5", "€12.50", and "€45", read "€", "##45", given
    `digit_continuation_ids`), and holds no digits after a word (`letter_ids`: "5,200 mAh battery lasts about 11 hours"
    is two), and does not stop inside a number: not before digits that continue it (given `digit_continuation_ids`:
    the "£1" of "£12.50", read "£1", "##2", ".", "50") nor, given `separator_ids` ("," and "."), before a separator and
    digits (the "£1" of "£1,325"), nor, given `colon_ids`, start inside a time (the "40 am" of "9:40 am"). A question
    asking for a number in a unit is answered with such a span where one holds the unit; see [`unit_spans`]."""
    reader_ids = spans.reader_input_ids  # (B, R, L)
    device = reader_ids.device
    starts, ends = spans.candidate_starts.to(device), spans.candidate_ends.to(device)
    if starts.numel() == 0:
        return torch.zeros(reader_ids.shape[:-1] + starts.shape, dtype=torch.bool, device=device)
    first, last = reader_ids[..., starts], reader_ids[..., ends]  # (B, R, N)
    number = torch.cat([digit_ids, word_ids]).to(device)
    starts_with_number = torch.isin(first, number)
    ends_with_unit = torch.isin(last, unit_ids.to(device))
    if colon_ids is not None:  # "10:30": digits after a colon
        ends_with_unit |= (torch.isin(reader_ids, number) & _preceded(reader_ids, colon_ids))[..., ends]
    signed = torch.cat([number, digit_continuation_ids.to(device)]) if digit_continuation_ids is not None else number
    amount = (starts_with_number & ends_with_unit) | (
        torch.isin(first, money_ids.to(device)) & torch.isin(last, signed)
    )
    # one amount: no number after a word ("5,200 mAh battery lasts about 11 hours" holds two)
    positions, inside = _span_positions(starts, ends, reader_ids.shape[-1])  # (N, W)
    digits_at = torch.isin(reader_ids, digit_ids.to(device))[..., positions] & inside  # (B, R, N, W)
    words_at = (torch.isin(reader_ids, letter_ids.to(device)) & ~torch.isin(reader_ids, number))[..., positions]
    words_at &= inside
    order = torch.arange(positions.shape[-1], device=device)
    first_word = torch.where(words_at, order, positions.shape[-1]).amin(-1)
    last_digits = torch.where(digits_at, order, -1).amax(-1)
    # a number cut short: digits, or a separator and digits, right after the span's last wordpiece
    digits = torch.isin(reader_ids, torch.cat([digit_ids, digit_continuation_ids]).to(device) if
                        digit_continuation_ids is not None else digit_ids.to(device))  # fmt: skip
    cut = torch.zeros_like(digits)
    if digit_continuation_ids is not None:
        cut |= torch.nn.functional.pad(torch.isin(reader_ids[..., 1:], digit_continuation_ids.to(device)), (0, 1))
    if separator_ids is not None:
        separated = torch.isin(reader_ids[..., 1:-1], separator_ids.to(device)) & digits[..., 2:]
        cut |= torch.nn.functional.pad(separated, (0, 2))
    if colon_ids is not None:  # nor a time cut after its colon: the "40 am" of "9:40 am"
        after_digits = torch.nn.functional.pad(digits[..., :-2], (2, 0))
        cut_before = _preceded(reader_ids, colon_ids) & after_digits
        amount &= ~cut_before[..., starts]
    return amount & (last_digits < first_word) & ~cut[..., ends]


def whole_number_spans(
    spans, digit_ids: torch.Tensor, digit_continuation_ids: torch.Tensor, continuation_ids: torch.Tensor
) -> torch.BoolTensor:
    """Which candidate spans are one number in digits and nothing else: `(B, R, N)`, `True` where span `n` of block
    `r` starts with one of `digit_ids` ("1912", "149"), goes on only with `digit_continuation_ids` (the "##2" of
    "1492") and is not followed by another continuation wordpiece (not the "149" of "1492").

    A question asking for a year is answered with such a span where any is a candidate ("In which year did the Titanic
    sink?" -> "1912", not "15 April 1912", which holds a number too); see [`number_spans`] for the ranking.

    Args:
        spans ([`RealmForOpenQASpanScores`]): what `RealmForOpenQA.score_spans` returned.
        digit_ids (`torch.LongTensor`): the wordpieces of digits that start a word.
        digit_continuation_ids (`torch.LongTensor`): the continuation wordpieces made of digits ("##2").
        continuation_ids (`torch.LongTensor`): every continuation wordpiece ("##...").
    """
    reader_ids = spans.reader_input_ids  # (B, R, L)
    device = reader_ids.device
    starts, ends = spans.candidate_starts.to(device), spans.candidate_ends.to(device)
    if starts.numel() == 0:
        return torch.zeros(reader_ids.shape[:-1] + starts.shape, dtype=torch.bool, device=device)
    first = torch.isin(reader_ids, digit_ids.to(device))[..., starts]  # (B, R, N)
    # every wordpiece after the first a digit continuation ("##2")
    digits = torch.isin(reader_ids, digit_continuation_ids.to(device))
    rest = _count_in_spans(digits, starts + 1, ends) == (ends - starts)
    return first & rest & ~_continued(reader_ids, continuation_ids)[..., ends]


def unbalanced_spans(spans, bracket_ids: list[tuple[int, int]]) -> torch.BoolTensor:
    """Which candidate spans open a bracket they do not close or close one they did not open: `(B, R, N)`.

    An answer is a phrase, and a phrase keeps its brackets paired; a span like "The Four Seasons (Vivaldi", cut from
    a block titled "The Four Seasons (Vivaldi)", is never the answer ("Who composed The Four Seasons?" -> "Antonio
    Vivaldi"). Matched on wordpiece ids, each kind of bracket on its own.

    Args:
        spans ([`RealmForOpenQASpanScores`]): what `RealmForOpenQA.score_spans` returned.
        bracket_ids (`list[tuple[int, int]]`): `(opening, closing)` wordpiece ids, one pair per kind of bracket.
    """
    reader_ids = spans.reader_input_ids  # (B, R, L)
    starts, ends = spans.candidate_starts.to(reader_ids.device), spans.candidate_ends.to(reader_ids.device)
    unbalanced = torch.zeros(reader_ids.shape[:-1] + starts.shape, dtype=torch.bool, device=reader_ids.device)
    if not bracket_ids or starts.numel() == 0:
        return unbalanced
    positions, inside = _span_positions(starts, ends, reader_ids.shape[-1])  # (N, W)
    for opening, closing in bracket_ids:
        step = (reader_ids == opening).to(torch.int8) - (reader_ids == closing).to(torch.int8)  # (B, R, L)
        depth = (step[..., positions] * inside).cumsum(-1)  # (B, R, N, W): open brackets after each span token
        unbalanced |= (depth.min(-1).values < 0) | (depth[..., -1] != 0)
    return unbalanced


SENTENCE_END_MARKS = (".", "!", "?")
# The parts of an address a full stop comes before without ending a sentence ("madoc@netherbrackwin.co.uk",
# "www.example.com"): an uncased sentence does not start with them.
DOMAIN_WORDS = frozenset("com org net edu gov ac co uk io eu de fr nl ie info biz example".split())
# Words a full stop abbreviates without ending the sentence ("St. Louis", "Dr. Watson", "Acme Inc. in Ohio").
ABBREVIATIONS = frozenset(
    """mr mrs ms messrs dr prof st mt ft jr sr gen col capt cpt lt sgt adm cmdr rev fr gov sen rep pres no nos vs etc
    inc ltd co corp bros dept univ assn ave blvd rd approx est fig figs vol vols ed eds pp op cf al ca jan feb mar apr
    jun jul aug sep sept oct nov dec""".split()
)


def cross_sentence_spans(
    spans,
    end_ids: torch.Tensor,
    abbreviation_ids: torch.Tensor,
    digit_ids: torch.Tensor,
    domain_ids: torch.Tensor | None = None,
) -> torch.BoolTensor:
    """Which candidate spans run on past the end of a sentence: `(B, R, N)`, `True` where span `n` of block `r` holds
    one of `end_ids` (".", "!", "?") before its last wordpiece, after a word that is not among `abbreviation_ids`
    (one character, "St", "Inc": "J. R. R. Tolkien", "St. Louis" stay) and not before a wordpiece among `digit_ids`
    ("5.50 euros" stays) or `domain_ids` ("madoc@netherbrackwin.co.uk" stays whole).

    An answer lies within one sentence: over a handbook, "When will the canteen be shut?" was answered "4 weeks. After
    that, clothing", a span the reader rated above "2 to 13 November". Of 4,265 answers to the default model's whole dev
    sets, 3 ran across a sentence end, all wrong ("Luxembourg. Government. Capital: name: Luxembourg").

    Args:
        spans ([`RealmForOpenQASpanScores`]): what `RealmForOpenQA.score_spans` returned.
        end_ids (`torch.LongTensor`): the wordpieces that end a sentence.
        abbreviation_ids (`torch.LongTensor`): the wordpieces a full stop after does not end a sentence.
        digit_ids (`torch.LongTensor`): the wordpieces starting with a digit.
        domain_ids (`torch.LongTensor`, *optional*): the parts of an address a full stop comes before (`DOMAIN_WORDS`).
    """
    reader_ids = spans.reader_input_ids  # (B, R, L)
    device = reader_ids.device
    starts, ends = spans.candidate_starts.to(device), spans.candidate_ends.to(device)
    if starts.numel() == 0 or end_ids.numel() == 0:
        return torch.zeros(reader_ids.shape[:-1] + starts.shape, dtype=torch.bool, device=device)
    marks = torch.isin(reader_ids, end_ids.to(device))
    # not after an abbreviation ("St."), not before digits ("5.50") nor, given `domain_ids`, a part of an address
    # ("co" of "brackwin.co.uk")
    boundaries = marks & ~_preceded(reader_ids, abbreviation_ids) & ~_continued(reader_ids, digit_ids)  # (B, R, L)
    if domain_ids is not None:
        boundaries &= ~_continued(reader_ids, domain_ids)
    # a boundary among the span's wordpieces before its last: positions starts..ends-1
    return _count_in_spans(boundaries, starts, ends - 1) > 0


# The words of a letter's greeting and closing, as an uncased vocabulary holds them.
SALUTATION_WORDS = ("dear", "sincerely", "faithfully", "regards")


def salutation_spans(spans, salutation_ids: torch.Tensor) -> torch.BoolTensor:
    """Which candidate spans hold one of `salutation_ids` (`SALUTATION_WORDS`: "dear", "sincerely", ...): `(B, R, N)`.

    A letter's greeting or closing answers nothing: a name in the question pulls the reader to the greeting that
    repeats it ("When does Lena Okafor's membership start?" -> "Dear Ms. Lena Okafor", in a walkthrough over a gym's
    letter), and "Yours sincerely" stood in for an address the letter did not give. No answer of the document sets
    holds one of these words."""
    return _spans_holding(spans, salutation_ids)


def _spans_holding(spans, ids: torch.Tensor) -> torch.BoolTensor:
    """`(B, R, N)`: which candidate spans hold one of the wordpieces `ids`."""
    reader_ids = spans.reader_input_ids  # (B, R, L)
    device = reader_ids.device
    starts, ends = spans.candidate_starts.to(device), spans.candidate_ends.to(device)
    if starts.numel() == 0 or ids.numel() == 0:
        return torch.zeros(reader_ids.shape[:-1] + starts.shape, dtype=torch.bool, device=device)
    return _count_in_spans(torch.isin(reader_ids, ids.to(device)), starts, ends) > 0


# How many of the most probable spans [`_answer_probabilities`] groups: spans further down add nothing measurable.
ANSWER_POOL = 64
# The reader's first spans among which the typed-answer rule looks for one of the kind asked for: it reorders the
# reader's best few, never promotes a span it ranked far down (with 10, capitals of other countries the blocks read
# mention were promoted over the right one, which has no article).
TYPE_POOL = 5
# ... and only a span the reader gives at least this share of its first span's probability. Chosen on the default
# model's dev sets (docs/default-model.md, "Answers of the kind asked for"): every span the rule promoted from below
# 0.002 of the first one's probability was a wrong answer ("Canberra" -> "Melbourne"), every one above 0.099 but
# two a right one.
TYPE_MIN_PROBABILITY_RATIO = 0.05


def _answer_probabilities(probabilities, pool, spans, num_candidates: int) -> torch.Tensor:
    """`(B, P)`: for each span of `pool` (`(B, P)` flat indices into the `R * N` candidates, most probable first), the
    summed probability of the spans in `pool` with the same wordpieces, in any block read.

    REALM's answer probability is a sum over blocks (Guu et al. 2020, eq. 2): "Berlin" read in three blocks has the
    probability of all three, while one span's probability is a third of it, and a question whose blocks agree looks
    less certain than one that found a single block. Equal wordpieces stand for equal answers (as case-insensitive as
    the tokenizer)."""
    reader_ids = spans.reader_input_ids  # (B, R, L)
    device = reader_ids.device
    pool = pool.to(device)
    block, candidate = pool // num_candidates, pool % num_candidates  # (B, P)
    positions, inside = _span_positions(
        spans.candidate_starts.to(device)[candidate], spans.candidate_ends.to(device)[candidate], reader_ids.shape[-1]
    )  # (B, P, W)
    rows = reader_ids[torch.arange(reader_ids.shape[0], device=device)[:, None], block]  # (B, P, L)
    words = rows.gather(-1, positions).masked_fill(~inside, -1)  # (B, P, W)
    pooled = torch.nan_to_num(probabilities.gather(1, pool.to(probabilities.device)), nan=0.0).to(device)
    summed = torch.empty_like(pooled)
    for row in range(words.shape[0]):  # group equal spans by sorting, not by comparing every pair: top_k may be large
        _, group = torch.unique(words[row], dim=0, return_inverse=True)
        totals = torch.zeros(int(group.max()) + 1 if group.numel() else 0, dtype=pooled.dtype, device=device)
        summed[row] = totals.index_add_(0, group, pooled[row])[group]
    return summed


# Words a question shares with almost any passage: they say nothing about whether the passage is about the question.
STOP_WORDS = frozenset(
    "a an the of in on at to for from by with about into as is are was were be been being do does did has have had "
    "what which who whom whose when where why how and or not no this that these those it its their there here "
    "i me my mine we us our you your yours he him his she her they them will would can could should shall may might "
    "must than then so if".split()
)


IDF_COVERAGE = "question_idf_coverage"
_WORD = re.compile(r"\w+")


def _words(text: str) -> set[str]:
    r"""Lower-cased `\w+` words without accents: the same for a block as for an uncased tokenizer's decoded question."""
    return set(_WORD.findall(_lower_plain(text)))


def _lower_plain(text: str) -> str:
    """`text` lower-cased, without accents."""
    text = text.lower()
    if not text.isascii():  # most blocks are: decomposing them costs half the time of a whole corpus' count
        text = "".join(c for c in unicodedata.normalize("NFD", text) if not unicodedata.combining(c))
    return text


# A word and the number of one to three digits after it, as a product or a model is named ("Wren 4", "Apollo 11",
# "Stride-50"); a year ("Olympics 2024") is left out: a corpus may write it before the word.
_NUMBERED = r"([^\W\d_]{3,})[ -](\d{1,3}[^\W\d_]?)\b"
_NUMBERED_WORDS = re.compile(rf"\b{_NUMBERED}")
_NUMBERED_NAME = re.compile(rf"\b(?=[A-Z][a-z]){_NUMBERED}")  # in a question: a name and its number


def document_frequencies(texts: Iterable[str]) -> tuple[Counter, int]:
    r"""`(blocks holding each word, number of blocks)` over a corpus' block texts, words as [`idf_coverage`] splits;
    and each word followed by a number of one to three digits ("Wren 4", "room 12"), lower-cased without accents and
    joined by one space ("wren 4", a key no word can be), which [`unknown_names`] looks up."""
    counts, total = Counter(), 0
    for text in texts:
        plain = _lower_plain(text)
        counts.update(set(_WORD.findall(plain)))
        counts.update({f"{word} {number}" for word, number in _NUMBERED_WORDS.findall(plain)})
        total += 1
    return counts, total


def stored_document_frequencies(records) -> tuple[Counter, int]:
    """[`document_frequencies`] of block records, kept as JSON under `$REALM_HF_HOME/word_counts` for records of a
    document store (keyed by its fingerprint and whether titles are read): counted once (1.6 s for the default
    model's 43,829 blocks), read back after (0.2 s). Other records are counted each time."""
    from ..home import kept_for_corpus

    return kept_for_corpus(
        records,
        "word_counts",
        # "-numbered": counted with the numbered words (session 29); counts kept before lack them
        ("titles" if getattr(records, "include_title", True) else "texts") + "-numbered",
        lambda: document_frequencies(iter_record_texts(records)),
        lambda value: {"blocks": value[1], "counts": value[0]},
        lambda stored: (Counter(stored["counts"]), int(stored["blocks"])),
        "the corpus' word counts",
    )


def unknown_names(question: str, frequencies: Counter) -> list[str]:
    """The names a question asks about that no block holds: its capitalised words after the first (at least 3
    letters, not a stop word), as written, whose every word (as [`_words`] splits it) has no block in `frequencies`
    ([`document_frequencies`]).

    "Who is the king of Zanzanryx?" -> ["Zanzanryx"] over an encyclopedia; a corpus that never mentions a name cannot
    answer a question about it, however well a passage on kings reads. Lower-case words are left alone: a corpus may
    say "written" where the question says "wrote", but a name has no other spelling. Over the default model's dev
    questions, 3 of 3,922 answerable ones name a word their corpus lacks ("RBC", "Wessex": a description's words), and
    48 of 138 unanswerable ones do (the fictional places). Abbreviations (two capitals or more: "CEO", "WiFi") are
    not names here: a corpus may spell them out; none of those 48 is flagged for one, and "RBC" was one of the 3.

    A year to come that no block holds is one too ("Who will win the 2055 Nobel Prize?"): a corpus may tell of plans
    ("the 2030 World Cup"), but not of a year it never names. Years past are not: a question may date what its
    answer's block does not ("Who was the English theologian (1328–1384)?"); 23 of the title dev and test questions
    do.

    So is a name and its number that no block holds together ("How much does the Wren 4 cost?" over a catalogue of
    the Wren 3, answered "89 euros" at a confidence of 0.83), outside quotation marks: of the 189 names with a number
    of one to three digits in the question sets ("Marten 2", "Apollo 11"), the three no block holds are in
    unanswerable questions; four more, all quoted titles ("The Rubaiyat of Omar Khayyam 71"), are answerable (session
    29)."""
    names = []
    this_year = datetime.date.today().year
    for year in _YEAR_NUMBER.findall(question):
        if int(year) > this_year and frequencies.get(year, 0) == 0 and year not in names:
            names.append(year)
    for word in _WORD.findall(question)[1:]:
        if sum(character.isupper() for character in word) > 1:
            continue  # an abbreviation ("CEO", "WiFi") may stand spelled out in the corpus ("chief executive")
        if len(word) >= 3 and word.isalpha() and word[0].isupper() and word.lower() not in STOP_WORDS:
            # a plural is known where its singular is ("Is the gym open on Sundays?" over "Sunday: 9am to 4pm")
            forms = [word, word[:-1]] if len(word) > 3 and word.endswith("s") else [word]
            if all(frequencies.get(part, 0) == 0 for form in forms for part in _words(form)) and word not in names:
                names.append(word)
    for found in _NUMBERED_NAME.finditer(question):
        before = question[: found.start()]
        if before.count('"') % 2 or before.count("“") > before.count("”"):
            continue  # a title quoted ("The Rubaiyat of Omar Khayyam 71") numbers what a corpus need not
        name, number = found.groups()
        known = any(frequencies.get(part, 0) for part in _words(name))  # else the name alone is unknown (above)
        if known and frequencies.get(f"{_lower_plain(name)} {number.lower()}", 0) == 0 and found[0] not in names:
            names.append(found[0])
    return names


# How a question speaks of its asker: "Who is the CEO of my company?", "Where did I park?". "I" counts only after a verb
# that asks ("did I", "should I"): elsewhere in questions it is mostly a regnal number ("Mary I", "World War I"). "me"
# after "tell" or "show" asks for nothing of the asker's ("Tell me who wrote Hamlet"). "our" and "we" are left out:
# "our solar system", "Why do we dream?" ask about everyone.
_ASKER_WORDS = frozenset({"my", "me", "myself"})
_ASKING_VERBS = frozenset("am do did can could should shall will would may might must have had was".split())
_POLITE_VERBS = frozenset("tell show give explain remind help let".split())
# A corpus that speaks in the first or second person ("your password", "my notes") in at least this share of its blocks
# may answer a question about its reader; an encyclopedia does not (the default model's: 0.09% of 43,829 blocks).
PERSONAL_CORPUS_SHARE = 0.01


def about_the_asker(question: str) -> list[str]:
    """The words by which a question asks about its asker ("my", "me", "myself", and "I" after a verb that asks), as
    written, each once; `[]` for a question about the world.

    "Who is the CEO of my company?" -> ["my"]; "Where did I park?" -> ["I"]; "Who was Mary I?", "Tell me who wrote
    Hamlet", "Who directed My Fair Lady?" (a title: "My" capitalised after the first word) -> []."""
    words = _WORD.findall(question)
    found = []
    for index, word in enumerate(words):
        previous = words[index - 1].lower() if index else ""
        if word == "I":
            asker = index == 0 or previous in _ASKING_VERBS
        else:
            asker = (word.islower() or index == 0) and word.lower() in _ASKER_WORDS
            asker = asker and not (word.lower() == "me" and previous in _POLITE_VERBS)
        if asker and word not in found:
            found.append(word)
    return found


def _unanswerable_asker_words(question: str, frequencies: tuple[Counter, int]) -> list[str]:
    """[`about_the_asker`] of `question` where the corpus of `frequencies` cannot answer such a question (it does not
    [`speaks_in_person`]), else `[]`: the words that make a calibrated model abstain."""
    asker = about_the_asker(question)
    return asker if asker and not speaks_in_person(frequencies) else []


def speaks_in_person(frequencies: tuple[Counter, int]) -> bool:
    """Whether a corpus speaks to or as a person: "you", "your" or "my" in at least `PERSONAL_CORPUS_SHARE` of its
    blocks ([`document_frequencies`]). A handbook ("reset your password") or a diary may answer a question about its
    reader; an encyclopedia cannot, however well a passage on chief executives reads."""
    counts, total = frequencies
    return total > 0 and sum(counts.get(word, 0) for word in ("you", "your", "my")) >= PERSONAL_CORPUS_SHARE * total


def idf_coverage(question: str, block: str, frequencies: tuple[Counter, int]) -> float:
    """The share of the question's content words (not stop words) found in the block, each word weighted by its inverse
    document frequency in the corpus, `log((N + 1) / (df + 0.5))`; 1 for a question without content words.

    Rare words carry the question: "Who is the king of Zanzanryx?" draws a block about a king, which holds "king" but not
    the word no block holds (0.28 over the default model's corpus); "Who wrote Hamlet?" covers 0.60 of its answer's
    block, which says "written". Unlike [`_question_coverage`], a common word the block lacks costs little."""
    counts, total = frequencies
    words = [word for word in _words(question) if word not in STOP_WORDS]
    if not words:
        return 1.0
    weights = {word: math.log((total + 1) / (counts.get(word, 0) + 0.5)) for word in words}
    present = _words(block)
    return sum(weight for word, weight in weights.items() if word in present) / sum(weights.values())


def _question_coverage(inputs, reader_input_ids, block_mask, ignored: torch.Tensor) -> torch.Tensor:
    """`(B, R)`: for each block read, the share of the question's content wordpieces (not special, not a stop word,
    not punctuation) that occur among the block's own wordpieces; 1 for a question without content wordpieces. An
    unanswerable question ("What is my neighbour's favourite colour?") often draws a passage on some of its words
    only."""
    question = inputs["input_ids"].to(reader_input_ids.device)  # (B, Lq)
    content = ~torch.isin(question, ignored.to(question.device))
    if "attention_mask" in inputs:
        content &= inputs["attention_mask"].to(question.device).bool()
    blocks = reader_input_ids.masked_fill(~block_mask.bool(), -1)  # (B, R, L), -1 outside the block's own tokens
    present = (question[:, None, :, None] == blocks[:, :, None, :]).any(dim=-1)  # (B, R, Lq)
    counted = content.sum(dim=-1, keepdim=True)  # (B, 1)
    found = (present & content[:, None, :]).sum(dim=-1)  # (B, R)
    return torch.where(counted > 0, found / counted.clamp(min=1), torch.ones_like(found, dtype=torch.float))


# Of the plain features, those computed again among the spans of the kind asked for, as the features that follow them
# in CALIBRATION_FEATURES (log_kind_span_probability, kind_margin, log_kind_answer_probability).
KIND_FEATURE_COLUMNS = tuple(
    CALIBRATION_FEATURES.index(name) for name in ("log_span_probability", "margin", "log_answer_probability")
)


def _confidence_features(
    logits, probabilities, best, block_index, retrieval_logits, coverage, answer_probabilities, idf_coverages
) -> torch.Tensor:
    """`(B, k, 8)`: for each of the `k` best spans, the first eight numbers a calibration reads (see
    `realm_hf.evaluation.calibration.CALIBRATION_FEATURES`; the last three are `KIND_FEATURE_COLUMNS` of these over
    the spans of the kind asked for); `coverage` `(B, R)` is [`_question_coverage`], `answer_probabilities` `(B, k)`
    [`_answer_probabilities`], `idf_coverages` `(B, R)` [`idf_coverage`]."""
    span_logit = logits.gather(1, best)  # (B, k)
    top_two = torch.topk(logits, k=min(2, logits.shape[1]), dim=-1).values  # (B, 2)
    # The best span's margin is over the runner-up; every other span's is its (negative) gap to the best.
    runner_up = top_two[:, 1:2] if top_two.shape[1] > 1 else torch.full_like(top_two[:, :1], float("-inf"))
    other = torch.where(torch.arange(best.shape[1], device=best.device) == 0, runner_up, top_two[:, :1])
    margin = (span_logit - other).clamp(max=MAX_MARGIN)
    block_log_probability = (
        retrieval_logits.float().log_softmax(dim=-1).gather(1, block_index.to(retrieval_logits.device))
    )
    features = torch.stack([
        probabilities.gather(1, best).clamp(min=1e-30).log(),
        span_logit,
        margin,
        block_log_probability.to(span_logit.device),
        retrieval_logits.float().max(dim=-1).values.unsqueeze(1).expand_as(span_logit).to(span_logit.device),
        coverage.float().gather(1, block_index.to(coverage.device)).to(span_logit.device),
        answer_probabilities.float().to(span_logit.device).clamp(min=1e-30).log(),
        idf_coverages.float().to(block_index.device).gather(1, block_index).to(span_logit.device),
    ], dim=-1)  # fmt: skip
    return torch.nan_to_num(features, nan=0.0, posinf=MAX_MARGIN, neginf=-1e4)


__all__ = [
    "OpenQAPipeline",
    "about_the_asker",
    "abstains_whatever_the_confidence",
    "amount_spans",
    "answers_with_features",
    "asked_units",
    "asks_for_a_count",
    "asks_for_a_number",
    "asks_for_a_time",
    "asks_for_a_year",
    "asks_what_time",
    "asks_yes_or_no",
    "cross_sentence_spans",
    "document_frequencies",
    "idf_coverage",
    "money_spans",
    "number_spans",
    "salutation_spans",
    "spans_in_question",
    "speaks_in_person",
    "unbalanced_spans",
    "unit_spans",
    "unknown_names",
    "whole_number_spans",
]
