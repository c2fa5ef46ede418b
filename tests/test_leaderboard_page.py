"""The static HTML leaderboard: self-contained, escaped, and working in a real browser.

The browser tests drive Debian's headless Chromium through its own chromedriver (never
selenium-manager, which would download one) and skip, saying what is missing, where either
or selenium is not installed.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from synthbench.report.leaderboard import ONE_SEED_NOTE, build, interval_notes
from synthbench.report.page import to_html

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOT_COPY = Path("/tmp/leaderboard_screenshot.png")

WEIRD = "<b>bold</b> & \"quoted\" 'single'"
BREAKOUT = "</script><script>alert(1)</script>"

# category -> tasks, and per mechanism its level per category: linear wins Memory and yat
# Reasoning, so a category sort differs from the overall ranking; linear and yat have the
# same overall level, so one of them is marked "not significantly above the next"
TASKS = {"Basic": ["b1", "b2"], "Memory": ["m1", "m2"], "Reasoning": ["r1"]}
LEVELS = {
    "softmax": {"Basic": 0.95, "Memory": 0.70, "Reasoning": 0.85},
    "linear": {"Basic": 0.60, "Memory": 0.92, "Reasoning": 0.65},
    "yat": {"Basic": 0.80, "Memory": 0.50, "Reasoning": 0.87},
    WEIRD: {"Basic": 0.55, "Memory": 0.60, "Reasoning": 0.40},
}


def _runs(levels: dict, n_seeds: int = 3, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = [
        (category, task, mechanism, s, level[category] + rng.normal(0, 0.01))
        for mechanism, level in levels.items()
        for category, tasks in TASKS.items()
        for task in tasks
        for s in range(n_seeds)
    ]
    return pd.DataFrame(rows, columns=["category", "task", "mechanism", "seed", "score"])


@pytest.fixture(scope="module")
def boards():
    runs = _runs(LEVELS)
    # an incomplete mechanism: all of Memory, one Basic task, no Reasoning
    partial = [
        ("Basic", "b1", BREAKOUT, 0, 0.3),
        ("Memory", "m1", BREAKOUT, 0, 0.65),
        ("Memory", "m2", BREAKOUT, 0, 0.65),
    ]
    runs = pd.concat([runs, pd.DataFrame(partial, columns=runs.columns)], ignore_index=True)
    core = build(runs, "core", 1, "target")
    other = {"softmax": LEVELS["softmax"], "mamba-ish": LEVELS["linear"]}
    long = build(_runs(other, n_seeds=1), "long", 2, "exact_match")
    assert core.table["same_as_next"].any()  # else the ≈ checks would check nothing
    return [core, long]


@pytest.fixture(scope="module")
def page(boards):
    return to_html(boards)


def _embedded(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="leaderboard-data">(.*?)</script>', page)
    assert match, "no embedded data"
    return json.loads(match.group(1))


# --- the page as text ---------------------------------------------------------------------


def test_fetches_nothing(page):
    assert "http://" not in page and "https://" not in page
    assert re.search(r"\b(src|href)\s*=", page) is None  # no external script/style/image/link
    assert "url(" not in page and "@import" not in page and "<link" not in page


def test_states_protocol_metric_seeds_and_date(page, boards):
    core = boards[0]
    assert 'id="protocol-name">core<' in page
    assert ">v1<" in page
    assert 'id="metric">target<' in page
    assert 'id="n-seeds">3<' in page
    assert f">{core.generated}<" in page
    # the selector's options come from the data: both protocols are there
    assert [b["protocol"] for b in _embedded(page)["boards"]] == ["core", "long"]


def test_names_are_escaped(boards):
    page = to_html(boards, title='<i>T&"</i>')
    assert "&lt;i&gt;T&amp;&quot;&lt;/i&gt;" in page and '<i>T&"' not in page
    assert WEIRD not in page and "<b>bold" not in page
    names = [r["mechanism"] for r in _embedded(page)["boards"][0]["rows"]]
    assert WEIRD in names  # JSON.parse gives the name back exactly


def test_script_in_a_name_does_not_end_the_data(page, boards):
    assert page.count("</script>") == 2  # the data element's and the script's own
    data = _embedded(page)
    names = [r["mechanism"] for r in data["boards"][0]["rows"]]
    assert names == boards[0].table["mechanism"].tolist()
    assert BREAKOUT in names


def test_missing_values_are_null_never_zero(page):
    assert "NaN" not in page
    rows = {r["mechanism"]: r for r in _embedded(page)["boards"][0]["rows"]}
    partial = rows[BREAKOUT]
    assert partial["rank"] is None and partial["score"] is None and not partial["complete"]
    assert partial["categories"][0] is None  # Basic: b2 is missing
    assert partial["categories"][1] == pytest.approx(0.65)  # Memory is complete
    assert rows["softmax"]["rank"] == 1


def test_says_how_the_score_and_its_interval_are_made(page, boards):
    """The legend states the normalisation and the t-interval; the one-seed board has no
    interval in its data."""
    assert "Chance-normalised: (accuracy - chance) / (1 - chance)" in page
    assert "Student-t" in page  # the score's interval; the rank's is the bootstrap's
    data = _embedded(page)["boards"]
    assert data[0]["score_note"].startswith("Chance-normalised")
    ranked = [r for r in data[0]["rows"] if r["complete"]]
    assert all(r["ci_low"] < r["score"] < r["ci_high"] for r in ranked)
    assert all(r["ci_low"] is None for r in data[1]["rows"])  # one seed: no interval
    # the rank intervals and tiers: said in the 3-seed board's notes, as in its Markdown
    assert data[0]["notes"] == interval_notes(boards[0]) and "bootstrap" in data[0]["notes"][0]
    ranks = [(r["rank"], r["rank_low"], r["rank_high"], r["tier"]) for r in data[0]["rows"]]
    table = boards[0].table
    assert ranks == [
        (None if pd.isna(r) else int(r), *(None if pd.isna(v) else int(v) for v in (lo, hi, t)))
        for r, lo, hi, t in zip(table["rank"], table["rank_low"], table["rank_high"],
                                table["tier"], strict=True)
    ]  # fmt: skip
    assert data[1]["notes"] == [] and all(r["rank_low"] is None for r in data[1]["rows"])
    raw = to_html([build(_runs(LEVELS), "core", 1, "long_token_acc")])
    assert _embedded(raw)["boards"][0]["score_note"].startswith("Raw long_token_acc")


def test_one_board_and_no_board(boards):
    single = to_html(boards[:1])
    assert 'id="protocol-control" hidden' in single
    assert len(_embedded(single)["boards"]) == 1
    with pytest.raises(ValueError):
        to_html([])


# --- the page in headless Chromium ----------------------------------------------------------


def _missing_browser() -> str | None:
    """What is missing for the browser tests, or None."""
    missing = []
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("no selenium: pip install selenium")
    if not CHROMIUM.exists():
        missing.append(f"no Chromium ({CHROMIUM}): install Debian's chromium package")
    if not CHROMEDRIVER.exists():
        missing.append(f"no chromedriver ({CHROMEDRIVER}): install Debian's chromium-driver")
    return "; ".join(missing) or None


@pytest.fixture(scope="module")
def browser(page, tmp_path_factory):
    """One headless Chromium for the whole module, with the page written to a file."""
    reason = _missing_browser()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service

    tmp = tmp_path_factory.mktemp("leaderboard_page")
    path = tmp / "leaderboard.html"
    path.write_text(page, encoding="utf-8")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,900",
        f"--user-data-dir={tmp / 'profile'}",
    ):
        options.add_argument(flag)
    # the performance log records every request, so the test can see none leaves
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    except WebDriverException as error:  # installed but cannot start here
        pytest.skip(f"Chromium did not start: {error.msg}")
    driver.set_page_load_timeout(30)
    # leave Chromium's own start page (its chrome:// resources would fill the request log)
    driver.get("about:blank")
    driver.page_file = path  # read by _open
    yield driver
    driver.quit()


def _open(driver):
    driver.get(driver.page_file.as_uri())
    return driver


def _names(driver) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#leaderboard tbody tr'))"
        ".map(tr => tr.getAttribute('data-mechanism'));"
    )


def _column(driver, key: str) -> list[float | None]:
    """The raw values of one column, top to bottom (None where missing)."""
    values = driver.execute_script(
        "return Array.from(document.querySelectorAll('#leaderboard tbody td'))"
        ".filter(td => td.getAttribute('data-key') === arguments[0])"
        ".map(td => td.getAttribute('data-value'));",
        key,
    )
    return [float(v) if v else None for v in values]


def _header(driver, key: str):
    from selenium.webdriver.common.by import By

    for th in driver.find_elements(By.CSS_SELECTOR, "#leaderboard thead th"):
        if th.get_attribute("data-key") == key:
            return th
    raise AssertionError(f"no column {key!r}")


def _header_keys(driver) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#leaderboard thead th'))"
        ".map(th => th.getAttribute('data-key'));"
    )


def _filter(driver, value: str):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, "category-filter")).select_by_value(value)


def test_ranking_in_rank_order(browser, boards):
    driver = _open(browser)
    table = boards[0].table
    assert _names(driver) == table["mechanism"].tolist()
    assert _names(driver)[-1] == BREAKOUT  # the unranked one, at the bottom
    assert driver.find_element("id", "protocol-name").text == "core"
    assert driver.find_element("id", "generated").text == boards[0].generated
    rows = driver.execute_script(
        "return Array.from(document.querySelectorAll('#leaderboard tbody tr')).map(tr => ({"
        " name: tr.querySelector('.name').textContent,"
        " rank: tr.querySelector('td[data-key=rank]').textContent,"
        " score: tr.querySelector('td[data-key=score]').textContent,"
        " tie: tr.querySelector('.tie') ? tr.querySelector('.tie').title : null}));"
    )
    assert [r["name"] for r in rows] == table["mechanism"].tolist()  # shown as text, exactly
    assert rows[-1]["rank"] == "--" and rows[-1]["score"] == "--"
    for row, same in zip(rows, table["same_as_next"], strict=True):
        assert (row["tie"] is not None) == bool(same)
        if same:
            assert "not significantly above" in row["tie"]
    # the names injected no markup: no <b>, no third <script>
    assert driver.execute_script("return document.querySelectorAll('tbody b').length") == 0
    assert driver.execute_script("return document.scripts.length") == 2
    # the best value of a column is bold: softmax overall, linear on Memory
    best = driver.execute_script(
        "return Array.from(document.querySelectorAll('td.best'))"
        ".map(td => [td.getAttribute('data-key'), td.parentNode.getAttribute('data-mechanism')]);"
    )
    assert ["score", "softmax"] in best and ["cat:Memory", "linear"] in best
    assert ["cat:Reasoning", "yat"] in best


def test_sort_by_a_category_column_and_back(browser, boards):
    driver = _open(browser)
    key = "cat:Memory"
    memory = dict(zip(boards[0].table["mechanism"], boards[0].table["Memory"], strict=True))
    by_memory = sorted(memory, key=lambda m: -memory[m])

    _header(driver, key).click()  # numbers sort best (highest) first
    values = _column(driver, key)
    assert None not in values
    assert values == sorted(values, reverse=True)
    assert _names(driver) == by_memory
    assert _names(driver)[0] == "linear"  # not the overall winner
    assert _header(driver, key).get_attribute("aria-sort") == "descending"
    assert "\u25bc" in _header(driver, key).text
    assert _header(driver, "rank").get_attribute("aria-sort") is None

    _header(driver, key).click()  # again: reversed
    assert _column(driver, key) == sorted(values)
    assert _names(driver) == by_memory[::-1]
    assert _header(driver, key).get_attribute("aria-sort") == "ascending"
    assert "\u25b2" in _header(driver, key).text

    # a column with a missing value keeps it last both ways
    _header(driver, "cat:Basic").click()
    assert _column(driver, "cat:Basic")[-1] is None
    _header(driver, "cat:Basic").click()
    basic = _column(driver, "cat:Basic")
    assert basic[-1] is None and basic[:-1] == sorted(basic[:-1])
    assert (
        driver.execute_script(
            "return document.querySelector('td.missing[data-key=\"cat:Basic\"]').textContent"
        )
        == "--"
    )


def test_category_filter_shows_its_tasks(browser, boards):
    driver = _open(browser)
    _filter(driver, "Memory")
    keys = _header_keys(driver)
    assert "task:Memory/m1" in keys and "task:Memory/m2" in keys
    assert not any(k.startswith("task:Basic") or k == "cat:Basic" for k in keys)
    assert _header(driver, "task:Memory/m1").text.endswith("m1")
    # sorted by the category's score, best first
    assert _header(driver, "cat:Memory").get_attribute("aria-sort") == "descending"
    values = _column(driver, "cat:Memory")
    assert values == sorted(values, reverse=True)
    m1 = boards[0].tasks.loc[("Memory", "m1")]
    assert _column(driver, "task:Memory/m1") == pytest.approx([m1[name] for name in _names(driver)])

    _filter(driver, "")  # all categories: the overall ranking again
    keys = _header_keys(driver)
    assert not any(k.startswith("task:") for k in keys)
    assert {"cat:Basic", "cat:Memory", "cat:Reasoning"} <= set(keys)
    assert _names(driver) == boards[0].table["mechanism"].tolist()


def test_protocol_selector_switches_boards(browser, boards):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = _open(browser)
    assert driver.find_element(By.ID, "protocol-control").is_displayed()
    Select(driver.find_element(By.ID, "protocol")).select_by_visible_text("long v2")
    assert driver.find_element(By.ID, "protocol-name").text == "long"
    assert driver.find_element(By.ID, "metric").text == "exact_match"
    assert _names(driver) == boards[1].table["mechanism"].tolist()  # never mixed with core
    assert driver.find_element(By.ID, "note-one-seed").is_displayed()
    meta = driver.find_element(By.ID, "meta").text  # counted in words: "1 seed", "3 seeds"
    assert "up to 1 seed ·" in meta and "1 seeds" not in meta
    assert "2 of 2 mechanisms ranked on 5 tasks in 3 categories" in meta

    # one board: no selector
    single = driver.page_file.with_name("single.html")
    single.write_text(to_html(boards[:1]), encoding="utf-8")
    driver.get(single.as_uri())
    assert not driver.find_element(By.ID, "protocol-control").is_displayed()
    assert not driver.find_element(By.ID, "note-one-seed").is_displayed()
    assert "up to 3 seeds ·" in driver.find_element(By.ID, "meta").text
    assert _names(driver) == boards[0].table["mechanism"].tolist()


def test_screenshot(browser, tmp_path):
    driver = _open(browser)
    target = tmp_path / "leaderboard.png"
    assert driver.save_screenshot(str(target))
    data = target.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000
    shutil.copyfile(target, SCREENSHOT_COPY)  # kept for a person to look at


def test_no_request_leaves_the_machine(browser):
    browser.get_log("performance")  # drop what came before, e.g. Chromium's own start page
    driver = _open(browser)
    _header(driver, "cat:Reasoning").click()
    _filter(driver, "Basic")
    urls = [
        message["params"]["request"]["url"]
        for entry in driver.get_log("performance")
        for message in [json.loads(entry["message"])["message"]]
        if message["method"] == "Network.requestWillBeSent"
    ]
    assert any(url.startswith("file:") for url in urls)  # the log did record the page load
    assert all(url.startswith(("file:", "data:", "about:")) for url in urls), urls


def test_rank_intervals_tiers_and_notes_in_the_browser(browser, boards):
    """Each ranked row shows its rank interval; in the rank order a rule opens each new tier
    (and the unranked below); sorted by a category, no tier rule; the board's notes are
    listed, and the one-seed board says why it has no interval."""
    from selenium.webdriver.common.by import By

    driver = _open(browser)
    table = boards[0].table
    rows = driver.execute_script(
        "return Array.from(document.querySelectorAll('#leaderboard tbody tr')).map(tr => ["
        " tr.querySelector('td[data-key=rank]').textContent,"
        " tr.querySelector('td[data-key=tier]').textContent,"
        " tr.classList.contains('tier-start')]);"
    )
    for (rank, tier, _), (_, row) in zip(rows, table.iterrows(), strict=True):
        if pd.isna(row["rank"]):
            assert (rank, tier) == ("--", "--")
        else:
            assert rank == f"{row['rank']} [{row['rank_low']}, {row['rank_high']}]"
            assert tier == str(row["tier"])
    tiers = [str(t) for _, t, _ in rows]
    assert [s for _, _, s in rows] == [i > 0 and tiers[i] != tiers[i - 1] for i in range(len(rows))]
    assert any(s for _, _, s in rows)  # a rule is drawn somewhere: the check checks something
    notes = [li.text for li in driver.find_elements(By.CSS_SELECTOR, "#board-notes li")]
    assert notes == interval_notes(boards[0])
    _header(driver, "cat:Memory").click()
    assert not driver.find_elements(By.CSS_SELECTOR, "tr.tier-start")
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, "protocol")).select_by_visible_text("long v2")
    assert driver.find_element(By.ID, "note-one-seed").text == ONE_SEED_NOTE
    assert not driver.find_elements(By.CSS_SELECTOR, "#board-notes li")
