"""Checks examples/town_documents: answers are verbatim spans, unanswerable facts are absent."""

import collections
import json
import pathlib
import re

HERE = pathlib.Path(__file__).parent
CORPUS = HERE / "corpus"
KINDS = {
    "who",
    "what",
    "when",
    "where",
    "which",
    "how many",
    "how much",
    "how long",
    "what time",
    "descriptive",
    "unanswerable",
}


def paragraphs(path):
    text = path.read_text(encoding="utf-8")
    paras = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.splitlines() if not (path.suffix == ".md" and line.startswith("#"))]
        if lines:
            paras.append("\n".join(lines))
    return paras


def span_in(answer, para):  # exact case, on word boundaries
    return re.search(r"(?<!\w)" + re.escape(answer) + r"(?!\w)", para) is not None


docs = {p.name: paragraphs(p) for p in sorted(CORPUS.iterdir())}
alltext = "\n".join(p.read_text(encoding="utf-8") for p in CORPUS.iterdir())
files = sorted(docs)
expected_split = {f: ("dev" if i < len(files) // 2 else "test") for i, f in enumerate(files)}

# Patterns that must NOT occur anywhere if the unanswerable question is really unanswerable,
# plus broader words whose hits are printed for a manual look.
ABSENT = {
    "How much is a monthly pass for line 4?": (r"monthly|month pass|season ticket|subscription", r"ticket"),
    "What's the gate code for the garden?": (r"code (is|:) *\d|\b\d{4}\b#", r"gate code"),
    "When will the new skatepark be built?": (r"skate", r"park\b"),
    "What's the wifi password?": (r"password(:| is (?!printed))", r"password"),
    "What is my library card number?": (r"card number|membership number|member number", r"card"),
    "Who was the first mayor of Quillhaven?": (r"first mayor|mayors", r"mayor"),
    "What special exhibition is the museum planning for next year?": (r"exhibition", r"next year"),
    "What's the fine for putting the wrong stuff in the recycling?": (r"\bfine[sd]?\b|penalt", r"wrong"),
    "How much is a parking permit for a second car?": (
        r"second (car|vehicle)|additional (car|vehicle)|further (car|vehicle)",
        r"vehicle",
    ),
    "Who won the club regatta this year?": (r"\bwon\b|winner|champion", r"regatta"),
    "What is my son's teacher's email address?": (r"@", r"email"),
    "When will I be able to pay for parking through the app?": (
        r"pay(ing)? for parking|parking (fee|payment|ticket)",
        r"parking",
    ),
}

rows = [json.loads(line) for line in (HERE / "questions.jsonl").read_text(encoding="utf-8").splitlines()]
errors = []
for i, r in enumerate(rows, 1):
    if set(r) != {"question", "answers", "file", "kind", "split"}:
        errors.append(f"line {i}: fields {sorted(r)}")
    if r["file"] not in docs:
        errors.append(f"line {i}: no file {r['file']}")
        continue
    if r["kind"] not in KINDS:
        errors.append(f"line {i}: kind {r['kind']}")
    if r["split"] != expected_split[r["file"]]:
        errors.append(f"line {i}: split {r['split']}")
    if (r["kind"] == "unanswerable") != (r["answers"] == []):
        errors.append(f"line {i}: kind/answers mismatch")
    if r["answers"] and not 1 <= len(r["answers"]) <= 3:
        errors.append(f"line {i}: {len(r['answers'])} answers")
    for a in r["answers"]:
        if not 1 <= len(a.split()) <= 6:
            errors.append(f"line {i}: answer length {a!r}")
        if not any(span_in(a, p) for p in docs[r["file"]]):
            errors.append(f"line {i}: {a!r} not in one paragraph of {r['file']}")
    if r["kind"] == "unanswerable":
        forbid, review = ABSENT[r["question"]]
        for m in re.finditer(forbid, alltext, re.I):
            errors.append(f"line {i}: forbidden {m.group(0)!r} found")
        hits = [
            alltext[max(0, m.start() - 40) : m.end() + 40].replace("\n", " ")
            for m in re.finditer(review, alltext, re.I)
        ]
        print(f"[review] {r['question']}  ({len(hits)} hits of /{review}/)")
        for h in hits:
            print("    ...", h, "...")

print("\nwords per file:")
for f in files:
    print(f"  {f:40s} {len((CORPUS / f).read_text(encoding='utf-8').split()):5d}  {expected_split[f]}")
print(f"  {'total':40s} {len(alltext.split()):5d}")
kinds = collections.Counter(r["kind"] for r in rows)
print("\nkinds:", dict(sorted(kinds.items())), "total", len(rows))
for s in ("dev", "test"):
    sub = [r for r in rows if r["split"] == s]
    print(
        s,
        len(sub),
        "questions,",
        sum(1 for r in sub if not r["answers"]),
        "unanswerable,",
        dict(collections.Counter(r["file"] for r in sub)),
    )
print("\nERRORS:" if errors else "\nall checks passed", *errors, sep="\n")
