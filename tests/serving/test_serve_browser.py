"""`realm-hf serve` in a real headless browser (Debian's chromium + chromedriver, driven by selenium): type a question,
submit, see the answer highlighted in its evidence; corpus markup shows as text and runs nothing; the low-confidence
badge; an empty question. A screenshot is kept as a test artefact (in the test's tmp dir, printed; also copied to
$REALM_HF_SCREENSHOT_DIR/serve.png when that is set).

Needs `apt-get install -y chromium chromium-driver` and `pip install selenium` (the test extra); skipped without them.
"""

import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the serve extra: pip install 'realm_hf[serve]'")
pytest.importorskip("uvicorn", reason="the serve extra: pip install 'realm_hf[serve]'")
pytest.importorskip("selenium", reason="selenium (the test extra) drives the browser: pip install selenium")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402
from serving_helpers import HOSTILE_RECORDS, QUESTION, build_tiny_open_qa, live_server  # noqa: E402

from realm_hf.serving import PipelineAnswerer, create_app  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
pytestmark = pytest.mark.skipif(
    not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)),
    reason="no chromium/chromedriver: apt-get install -y chromium chromium-driver",
)
WAIT_SECONDS = 60  # every wait below is bounded by this


@pytest.fixture(scope="module")
def tiny_open_qa(tmp_path_factory):
    return build_tiny_open_qa(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1100,900", "--no-first-run", "--disable-extensions"):  # fmt: skip
        options.add_argument(argument)
    # Selenium Manager would look for (and download) drivers: Debian's are named, and it is told to stay offline.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SE_OFFLINE", "true")
        driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT_SECONDS)
    try:
        yield driver
    finally:
        driver.quit()


def _flag_all_but_the_best(answerer):
    """An answer function that flags every answer but the best one as abstained, as a calibrated pipeline would flag
    low-confidence ones: the page must show the badge on those and only those."""

    def answer_fn(questions, top_k):
        # The third also names a word no document holds, as the pipeline says of "Who is the king of Zanzanryx?"; the
        # fourth asks about its asker, as the pipeline says of "Who is the CEO of my company?" over an encyclopedia.
        return [[{**answer, "abstained": answer["rank"] > 1, "unknown_names": ["Zanzanryx"] * (answer["rank"] == 3),
                  "about_the_asker": ["my"] * (answer["rank"] == 4)}
                 for answer in answers] for answers in answerer(questions, top_k)]  # fmt: skip

    return answer_fn


def _submit(browser, question: str, top_k: int) -> None:
    wait = WebDriverWait(browser, WAIT_SECONDS)
    wait.until(lambda driver: driver.find_element(By.ID, "model-name").text != "…")  # the page has loaded its info
    box = browser.find_element(By.ID, "question")
    box.clear()
    box.send_keys(question)
    top_k_box = browser.find_element(By.ID, "top-k")
    top_k_box.clear()
    top_k_box.send_keys(str(top_k))
    browser.find_element(By.ID, "ask").click()


def test_a_question_is_answered_with_its_evidence_highlighted(browser, tiny_open_qa, tmp_path):
    answerer = PipelineAnswerer(tiny_open_qa)
    expected = answerer([QUESTION], 4)[0]
    app = create_app(_flag_all_but_the_best(answerer), model_name="tiny-hostile-corpus")
    with live_server(app) as url:
        browser.get(url)
        _submit(browser, QUESTION, top_k=4)
        wait = WebDriverWait(browser, WAIT_SECONDS)
        wait.until(expected_conditions.presence_of_all_elements_located((By.CSS_SELECTOR, "#results article.answer")))
        wait.until(lambda driver: driver.find_element(By.ID, "ask").is_enabled())
        screenshot = tmp_path / "serve.png"
        assert browser.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 0
        print(f"screenshot: {screenshot}")
        if os.environ.get("REALM_HF_SCREENSHOT_DIR"):  # where CI keeps its artefacts
            Path(os.environ["REALM_HF_SCREENSHOT_DIR"]).mkdir(parents=True, exist_ok=True)
            shutil.copy(screenshot, Path(os.environ["REALM_HF_SCREENSHOT_DIR"]) / "serve.png")

        assert browser.find_element(By.CSS_SELECTOR, "#results h2.question").get_property("textContent") == QUESTION
        articles = browser.find_elements(By.CSS_SELECTOR, "#results article.answer")
        assert len(articles) == len(expected) == 4
        for article, answer in zip(articles, expected, strict=True):
            evidence = article.find_element(By.CSS_SELECTOR, "p.evidence")
            marks = evidence.find_elements(By.TAG_NAME, "mark")
            assert len(marks) == 1
            # The <mark> holds the answer, exactly, at its place in the evidence: the text before it is the evidence
            # up to the answer's start (offsets count characters, and every title starts with an astral one).
            assert marks[0].get_property("textContent") == answer["answer"] != ""
            assert evidence.get_property("textContent") == answer["evidence"]
            before = browser.execute_script("return arguments[0].previousSibling.textContent", marks[0])
            assert before == answer["evidence"][: answer["start"]]
            assert (
                article.find_element(By.CSS_SELECTOR, ".answer-text").get_property("textContent") == answer["answer"]
            )
            assert article.find_element(By.CSS_SELECTOR, ".doc-title").get_property("textContent") == answer["title"]
            assert article.find_element(By.CSS_SELECTOR, ".score").text == f"score {answer['score']:.3f}"
            badges = article.find_elements(By.CSS_SELECTOR, ".badge.low-confidence")
            shown = {1: [], 2: ["low confidence"], 3: ["not in the documents"], 4: ["about you"]}[answer["rank"]]
            assert [badge.text for badge in badges] == shown
            if answer["rank"] == 3:
                assert "No document mentions Zanzanryx" in badges[0].get_attribute("title")
            if answer["rank"] == 4:
                assert "asks about you (my)" in badges[0].get_attribute("title")
        # The corpus's markup is text on the page: no element of it was created, none of its scripts ran.
        titles = {record["title"] for record in HOSTILE_RECORDS}
        assert {answer["title"] for answer in expected} <= titles
        for tag in ("img", "script", "b", "h1", "i", "u"):
            assert browser.find_elements(By.CSS_SELECTOR, f"#results {tag}") == [], tag
        assert browser.execute_script("return window.injected === undefined")
        assert "<img src=x onerror=" in browser.find_element(By.ID, "results").text


def test_an_empty_question_shows_a_message_on_the_page(browser, tiny_open_qa):
    with live_server(create_app(PipelineAnswerer(tiny_open_qa))) as url:
        browser.get(url)
        _submit(browser, QUESTION, top_k=1)
        wait = WebDriverWait(browser, WAIT_SECONDS)
        wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "#results article.answer")))
        wait.until(lambda driver: driver.find_element(By.ID, "ask").is_enabled())
        _submit(browser, "   ", top_k=1)
        wait.until(expected_conditions.text_to_be_present_in_element((By.ID, "status"), "is empty"))
        status = browser.find_element(By.ID, "status")
        assert status.text == "the question is empty: type a question."
        assert "error" in status.get_attribute("class").split()
        assert browser.find_elements(By.CSS_SELECTOR, "#results article") == []  # the old answers are cleared


def test_each_reason_to_abstain_has_its_badge(browser, tiny_open_qa):
    """The reasons the pipeline gives beside `abstained` (`missing_units`, `yes_or_no`) each name themselves on the
    badge, and its tooltip says why."""
    answerer = PipelineAnswerer(tiny_open_qa)
    reasons = {1: {"missing_units": ["temperature"]}, 2: {"yes_or_no": True}, 3: {"missing_units": ["clock"]},
               4: {"missing_units": ["money"]}}  # fmt: skip

    def answer_fn(questions, top_k):
        return [[{**answer, "abstained": True, **reasons[answer["rank"]]} for answer in answers]
                for answers in answerer(questions, top_k)]  # fmt: skip

    with live_server(create_app(answer_fn)) as url:
        browser.get(url)
        _submit(browser, QUESTION, top_k=4)
        wait = WebDriverWait(browser, WAIT_SECONDS)
        wait.until(expected_conditions.presence_of_all_elements_located((By.CSS_SELECTOR, "#results article.answer")))
        wait.until(lambda driver: driver.find_element(By.ID, "ask").is_enabled())
        badges = browser.find_elements(By.CSS_SELECTOR, "#results article.answer .badge.low-confidence")
        assert [badge.text for badge in badges] == [
            "no temperature found",
            "yes-or-no question",
            "no time found",
            "no amount found",
        ]
        assert "asks for a temperature, and no passage read holds one" in badges[0].get_attribute("title")
        assert "asks for a yes or a no" in badges[1].get_attribute("title")
        assert "asks for an amount of money" in badges[3].get_attribute("title")
