"""Load a transformers-4.x REALM checkpoint unchanged and use it as before (here: the golden test checkpoint).

    python examples/load_hub_checkpoint.py [DIR_OR_REPO]

With network access, pass google/realm-orqa-nq-openqa: the same code loads the 7.9 GB Hub checkpoint.
"""

import sys

import realm_hf  # noqa: F401
from realm_hf import RealmForOpenQA, RealmRetriever, RealmTokenizer

path = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/realm4/openqa"
retriever = RealmRetriever.from_pretrained(path)  # reads block_records.npy through the restricted loader
tokenizer = RealmTokenizer.from_pretrained(path)
model = RealmForOpenQA.from_pretrained(path, retriever=retriever)

question_ids = tokenizer(["what is the capital of france ?"], return_tensors="pt")
reader_output, predicted_answer_ids = model(**question_ids, return_dict=False)  # the 4.x calling convention
print("answer:", tokenizer.decode(predicted_answer_ids))

# New in realm_hf: a batch of questions, one answer each, and everything saves as safetensors without pickle.
batch = tokenizer(
    ["what is the capital of france ?", "where does the river flow ?"], padding=True, return_tensors="pt"
)
print("batch:", [tokenizer.decode(ids) for ids in model(**batch).predicted_answer_ids])
