#!/usr/bin/env python3
"""What answers of the kind asked for cost: the "open-qa" pipeline with `prefer_typed_answers` off (the baseline) and
on, the same questions in the same batches, in one run, on the default model.

Every question names a kind ("In which country is ...?", "Which planet ...?", "Who wrote ...?"), so the rule looks
at each one: it types the titles in the blocks of the reader's first 5 spans. The table on the answer types read from
the corpus once, on first use, is timed apart (`AnswerTypes.from_records`). Each mode is warmed up on one batch, then
timed `--repeats` times; the best time counts.

    PYTHONPATH=src .venv/bin/python benchmarks/typed_answers.py                  # 48 questions, batches of 8
"""

from __future__ import annotations

import argparse
import time

from pipeline_speed import best_time  # warm up on one batch, then the best of `repeats` timed runs

SUBJECTS = ["Machu Picchu", "the Taj Mahal", "the Eiffel Tower", "Angkor Wat", "the Alhambra", "Petra",
            "the Acropolis", "Chichen Itza"]  # fmt: skip
TEMPLATES = ["In which country is {}?", "Which city is near {}?", "Who built {}?", "Which river flows near {}?",
             "Which planet can be seen from {}?", "What language is spoken near {}?"]  # fmt: skip


def make_questions(count: int) -> list[str]:
    questions = [template.format(subject) for subject in SUBJECTS for template in TEMPLATES]
    return (questions * (count // len(questions) + 1))[:count]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-questions", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)

    from transformers import pipeline

    from realm_hf.default_model import default_model_dir
    from realm_hf.pipelines.answer_types import AnswerTypes, asked_type

    open_qa = pipeline("open-qa", model=str(default_model_dir()), device="cpu")
    questions = make_questions(args.num_questions)
    assert all(asked_type(question) for question in questions), "every benchmark question names a kind"
    start = time.perf_counter()
    table = AnswerTypes.from_records(
        open_qa.retriever.block_records, titles_are_headings=open_qa._titles_are_headings()
    )
    build = time.perf_counter() - start
    open_qa._answer_types()  # the pipeline's own table, read before the timed runs
    batches = [questions[i : i + args.batch_size] for i in range(0, len(questions), args.batch_size)]
    seconds = {}
    for mode, on in (("rule off (baseline)", False), ("rule on", True)):
        seconds[mode] = best_time(
            lambda batch, on=on: open_qa(batch, batch_size=args.batch_size, prefer_typed_answers=on),
            batches,
            args.repeats,
        )
    baseline = seconds["rule off (baseline)"]
    print(f"answer types of {len(open_qa.retriever.block_records):,} blocks: {len(table):,} titles typed in "
          f"{build:.1f} s (once per corpus, on the first question that names a kind)\n")  # fmt: skip
    print(
        f"| pipeline, {len(questions)} questions naming a kind, batches of {args.batch_size} | s | questions/s | "
        "time vs baseline |"
    )
    print("|---|---:|---:|---:|")
    for mode, value in seconds.items():
        print(f"| {mode} | {value:.2f} | {len(questions) / value:.1f} | {value / baseline:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
