"""Answer questions with a REALM open-QA model and print the evidence.

python examples/ask.py                       # the built-in demo model (untrained, built on first use)
python examples/ask.py --model DIR_OR_REPO   # e.g. google/realm-orqa-nq-openqa where the Hub is reachable
"""

import argparse

import realm_hf  # noqa: F401  (registers the REALM classes with the Auto classes)
from realm_hf import RealmForOpenQA, RealmRetriever
from realm_hf.cli.main import answer_questions
from realm_hf.demo import ensure_demo_model

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--model", help="directory or Hub repo id (default: the demo model)")
parser.add_argument("questions", nargs="*", default=["What is the capital of France?", "Who wrote Hamlet?"])
args = parser.parse_args()

model_path = args.model or str(ensure_demo_model())
retriever = RealmRetriever.from_pretrained(model_path)
model = RealmForOpenQA.from_pretrained(model_path, retriever=retriever)
for result in answer_questions(model, retriever, args.questions):
    print(f"{result['question']} -> {result['answer']!r}  (block {result['block_id']}: {result['evidence']})")
