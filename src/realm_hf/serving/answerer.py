"""The answer function of `realm-hf serve` over an "open-qa" pipeline."""

from collections.abc import Sequence


class PipelineAnswerer:
    r"""
    Answers batches of questions with an "open-qa" pipeline, in the shape [`create_app`] takes:
    `answerer(questions, top_k)` returns, for each question in order, its answers best first, each the pipeline's
    answer dict (`answer`, `score`, `start`, `end`, `block_id`, `title`, `evidence`, and `abstained` when the pipeline
    gives it) with its `rank` (1 = best).

    Args:
        open_qa ([`OpenQAPipeline`]): the pipeline.
        batch_size (`int`, defaults to 8): questions per forward pass.
    """

    def __init__(self, open_qa, batch_size: int = 8):
        self.pipeline = open_qa
        self.batch_size = batch_size

    @classmethod
    def from_model(cls, model, retriever, batch_size: int = 8) -> "PipelineAnswerer":
        """The answerer of `pipeline("open-qa", model=model, retriever=retriever)` on the model's device."""
        from transformers import pipeline

        open_qa = pipeline("open-qa", model=model, tokenizer=retriever.tokenizer, retriever=retriever,
                           device=model.device)  # fmt: skip
        return cls(open_qa, batch_size=batch_size)

    def __call__(self, questions: Sequence[str], top_k: int = 1) -> list[list[dict]]:
        outputs = self.pipeline(list(questions), batch_size=self.batch_size, top_k=top_k)
        results = []
        for answers in outputs:
            answers = [answers] if isinstance(answers, dict) else answers
            results.append([{"rank": rank, **answer} for rank, answer in enumerate(answers, start=1)])
        return results


__all__ = ["PipelineAnswerer"]
