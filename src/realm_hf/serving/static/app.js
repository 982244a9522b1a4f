// realm-hf serve: asks POST api/ask and renders the answers. Every piece of text (questions, answers, titles,
// evidence: the user's corpus) goes into the page as a DOM text node, never as HTML.
"use strict";

const form = document.getElementById("ask-form");
const questionInput = document.getElementById("question");
const topKInput = document.getElementById("top-k");
const askButton = document.getElementById("ask");
const statusLine = document.getElementById("status");
const results = document.getElementById("results");

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function setStatus(message, isError) {
  statusLine.textContent = message;
  statusLine.classList.toggle("error", Boolean(isError));
}

// The evidence with the answer in a <mark>. The offsets count Unicode code points (Python's str) while JS strings
// index UTF-16 units, so the text is split into code points first.
function highlightedEvidence(evidence, start, end) {
  const chars = Array.from(evidence || "");
  const paragraph = element("p", "evidence");
  paragraph.append(chars.slice(0, start).join(""));
  if (end > start) paragraph.append(element("mark", "", chars.slice(start, end).join("")));
  paragraph.append(chars.slice(end).join(""));
  return paragraph;
}

// Why the model is not sure of an answer: a short label for its badge and a sentence for the badge's tooltip.
function abstentionReason(answer) {
  const names = Array.isArray(answer.unknown_names) ? answer.unknown_names : [];
  const asker = Array.isArray(answer.about_the_asker) ? answer.about_the_asker : [];
  const missing = Array.isArray(answer.missing_units) ? answer.missing_units : [];
  const guess = ": this answer is a guess.";
  if (names.length) return ["not in the documents", "No document mentions " + names.join(", ") + guess];
  if (asker.length) {
    return ["about you", "The question asks about you (" + asker.join(", ") + "), and these documents are not about you" + guess];
  }
  const units = {money: ["no amount found", "an amount of money"], clock: ["no time found", "a time of day"],
    temperature: ["no temperature found", "a temperature"], email: ["no email address found", "an email address"]};
  for (const unit of missing) {
    const [label, words] = units[unit] || ["no " + unit + " found", unit];
    return [label, "The question asks for " + words + ", and no passage read holds one" + guess];
  }
  if (answer.yes_or_no === true) {
    return ["yes-or-no question", "The question asks for a yes or a no; answers here are words of the passages: read the evidence."];
  }
  if (typeof answer.confidence === "number" && typeof answer.threshold === "number") {
    return ["low confidence", "The model's confidence (" + answer.confidence.toFixed(2) + ") is below its abstention threshold (" +
      answer.threshold.toFixed(2) + "): this answer may well be wrong."];
  }
  return ["low confidence", "The model's confidence is below its abstention threshold: this answer may well be wrong."];
}

function renderAnswer(answer) {
  const article = element("article", "answer");
  article.dataset.rank = answer.rank;
  const head = element("div", "answer-head");
  head.append(element("span", "rank", "#" + answer.rank));
  head.append(element("strong", "answer-text", answer.answer || "(no answer)"));
  if (typeof answer.score === "number") head.append(element("span", "score", "score " + answer.score.toFixed(3)));
  if (answer.abstained === true) {
    const [label, why] = abstentionReason(answer);
    const badge = element("span", "badge low-confidence", label);
    badge.title = why;
    head.append(badge);
  }
  article.append(head);
  const source = element("div", "source");
  if (answer.title) source.append(element("span", "doc-title", answer.title), " · ");
  source.append("block " + answer.block_id);
  if (typeof answer.source === "string" && answer.source) source.append(" · " + answer.source);
  article.append(source);
  article.append(highlightedEvidence(answer.evidence, answer.start, answer.end));
  return article;
}

function renderResults(items) {
  results.replaceChildren();
  for (const item of items) {
    const section = element("section", "result");
    section.append(element("h2", "question", item.question));
    if (!item.answers.length) section.append(element("p", "no-answer", "No answer found in the passages read."));
    for (const answer of item.answers) section.append(renderAnswer(answer));
    results.append(section);
  }
}

async function ask(question) {
  const topK = Number.parseInt(topKInput.value, 10) || 1;
  askButton.disabled = true;
  setStatus("Asking…", false);
  try {
    const response = await fetch("api/ask", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ questions: [question], top_k: topK }),
    });
    const payload = await response.json().catch(() => ({ error: "the server sent no JSON (status " + response.status + ")" }));
    if (!response.ok) {
      results.replaceChildren();
      setStatus(payload.error || "the request failed with status " + response.status, true);
      return;
    }
    renderResults(payload);
    setStatus("", false);
  } catch (error) {
    setStatus("Could not reach the server: " + error, true);
  } finally {
    askButton.disabled = false;
  }
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  ask(questionInput.value);
});

fetch("api/info")
  .then((response) => response.json())
  .then((info) => {
    document.getElementById("model-name").textContent = info.model || "(unnamed)";
    topKInput.max = String(info.max_top_k);
    const examples = document.getElementById("examples");
    for (const example of info.examples || []) {
      const button = element("button", "", example);
      button.type = "button";
      button.addEventListener("click", () => {
        questionInput.value = example;
        ask(example);
      });
      examples.append(button);
    }
    examples.hidden = !(info.examples || []).length;
  })
  .catch(() => setStatus("Could not reach the server.", true));
