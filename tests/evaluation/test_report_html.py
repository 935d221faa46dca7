"""The report's page (csd/report/html.py): its structure read with html.parser, and the page itself in headless
Chromium (loads without console errors, sorts a table on a click, shows one image per run in a prompt's row)."""

from __future__ import annotations

import base64
import io
import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from PIL import Image

from csd.records import COMMIT_ACCEPTED, COMMIT_FORCED, COMMIT_RELAXED, COMMIT_SAMPLED
from csd.report import build_report
from csd.report.html import HTML_FILE, KINDS, acceptance_map, choose_prompts, commit_layout
from tests.evaluation.test_eval_fixtures import eval_cfg
from tests.evaluation.test_report import fixture_sweep

#: the fixture sweep's runs, in the table's order (tests/evaluation/test_report.py)
RUNS = 4
CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"), shutil.which("google-chrome"))
                 if p), None)
CHROMEDRIVER = shutil.which("chromedriver")
#: set (CI): a missing browser fails the browser test instead of skipping it
REQUIRE_BROWSER = "CSD_REQUIRE_BROWSER"


class Page(HTMLParser):
    """The elements of a page as (tag, attributes, enclosing elements' (tag, attributes)), plus each table's cells."""

    VOID = {"img", "meta", "br", "link", "input", "hr"}

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], list[tuple[str, dict[str, str]]]]] = []
        self.stack: list[tuple[str, dict[str, str]]] = []
        self.cells: dict[str, list[list[str]]] = {}
        self.scripts: list[str] = []
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        self.elements.append((tag, attributes, list(self.stack)))
        if tag == "tr":
            table = next(a.get("id", "") for t, a in reversed(self.stack) if t == "table")
            self.cells.setdefault(table, []).append([])
        if tag in ("td", "th"):
            self._cell = []
        if tag not in self.VOID:
            self.stack.append((tag, attributes))

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            table = next(a.get("id", "") for t, a in reversed(self.stack) if t == "table")
            self.cells[table][-1].append("".join(self._cell).strip())
            self._cell = None
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self.stack and self.stack[-1][0] == "script":
            self.scripts.append(data)

    def find(self, tag: str, cls: str | None = None, inside: dict[str, str] | None = None) -> list[dict[str, str]]:
        """Attributes of every ``tag`` (with class ``cls``) inside an element whose attributes include ``inside``."""
        return [a for t, a, stack in self.elements
                if t == tag and (cls is None or cls in a.get("class", "").split())
                and (inside is None or any(inside.items() <= b.items() for _, b in stack))]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("html")
    sweep = fixture_sweep(tmp / "sweep", tmp)
    return build_report(sweep, eval_cfg(tmp))


def test_page_is_one_file_with_table_figures_prompts_and_card(report: Path) -> None:
    text = (report / HTML_FILE).read_text(encoding="utf-8")
    page = Page(text)
    ids = {a["id"] for _, a, _ in page.elements if "id" in a}
    # nothing from elsewhere: every image inline, every link an anchor of the page or a file next to it
    assert all(a["src"].startswith("data:image/") for a in page.find("img"))
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)
    assert all(a["href"][1:] in ids for a in page.find("a") if a["href"].startswith("#"))
    assert all((report / a["href"]).is_file() for a in page.find("a") if not a["href"].startswith("#"))
    # the compact table: a header per column, a row per run whose method links to its section
    head, *rows = page.cells["table-toy"]
    assert head[:2] == ["method", "knobs"] and {"speed-up", "step compression"} <= set(head)
    assert [r[0] for r in rows] == ["ar", "sjd", "csd", "csd"] and len(rows) == RUNS
    links = page.find("a", inside={"id": "table-toy"})
    assert len(links) == RUNS and len({a["href"] for a in links}) == RUNS
    assert page.find("table", inside={"open": ""}) == [] and len(page.find("details")) >= 1  # full table folded
    assert len(page.cells["table-toy-full"]) == RUNS + 1
    assert any("pareto" in a.get("alt", "") for a in page.find("img"))
    # the fixture's 4 prompts (fewer than 16), each a row with every run's image and acceptance map
    prompts = page.find("div", "prompt-row")
    assert [a["data-prompt"] for a in prompts] == ["p000", "p001", "p002", "p003"]
    for attrs in prompts:
        assert len(page.find("img", "sample", inside=attrs)) == RUNS
        assert len(page.find("img", "amap", inside=attrs)) == RUNS
    card = [row[0] for row in page.cells[""] if row]  # the protocol card has no id
    assert {"model", "dataset", "prompts", "seed", "metrics", "commit"} <= set(card)
    assert page.scripts and "addEventListener" in "".join(page.scripts)


def test_no_prompts_when_asked_for_none(tmp_path: Path) -> None:
    sweep = fixture_sweep(tmp_path / "sweep", tmp_path)
    out = build_report(sweep, eval_cfg(tmp_path, **{"eval.report.html_prompts": 0}))
    page = Page((out / HTML_FILE).read_text(encoding="utf-8"))
    assert page.find("div", "prompt-row") == [] and page.cells["table-toy"]


def test_a_run_whose_images_cannot_be_decoded_is_shown_without_them(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    sweep = fixture_sweep(tmp_path / "sweep", tmp_path)
    run = sweep / "2_csd"
    shutil.rmtree(run / "images")  # no PNGs, and a model that cannot be built here
    (run / "config.yaml").write_text("model:\n  _target_: nowhere.to_be.found\n  name: toy\n")
    out = build_report(sweep, eval_cfg(tmp_path))
    page = Page((out / HTML_FILE).read_text(encoding="utf-8"))
    for attrs in page.find("div", "prompt-row"):
        assert len(page.find("img", "sample", inside=attrs)) == RUNS - 1
        assert len(page.find("img", "amap", inside=attrs)) == RUNS  # the maps need only the records
    assert sum("images not decoded for the HTML report" in r.message for r in caplog.records) == 1


def test_runs_of_one_model_share_the_model_that_decodes_their_images(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import csd.report.html as page_module

    sweep = fixture_sweep(tmp_path / "sweep", tmp_path)
    for run in sweep.glob("*_*"):
        shutil.rmtree(run / "images")  # every image decoded from its record
    built = []

    def fake_adapter(run_dir: Path, device: str | None = None) -> Any:
        built.append(run_dir)
        return SimpleNamespace(layout=SimpleNamespace(length=16), device="cpu",
                               decode_images=lambda ids: torch.full((len(ids), 8, 8, 3), 7, dtype=torch.uint8))

    monkeypatch.setattr(page_module, "load_run_adapter", fake_adapter)
    out = build_report(sweep, eval_cfg(tmp_path))
    page = Page((out / HTML_FILE).read_text(encoding="utf-8"))
    assert len(built) == 1  # one model for the four runs
    assert all(len(page.find("img", "sample", inside=a)) == RUNS for a in page.find("div", "prompt-row"))


def test_choose_prompts_first_then_most_different_from_ar() -> None:
    def run(verdicts: list[bool | None]) -> dict[str, Any]:
        return {"per_image": [{"prompt_id": f"p{i}", "sample": 0, "scene_overall": v} for i, v in enumerate(verdicts)]}

    ar = run([True] * 8)
    a = run([True, True, True, False, True, False, True, True])
    b = run([True, True, True, False, True, True, None, False])
    keys = choose_prompts([ar, a, b], 0, "scene_overall", 4)
    assert keys == [("p0", 0), ("p1", 0), ("p3", 0), ("p5", 0)]  # p3: both runs differ, then p5 before p7
    assert choose_prompts([ar, ar], 0, "scene_overall", 4) == [("p0", 0), ("p1", 0), ("p2", 0), ("p3", 0)]
    assert choose_prompts([a, b], None, "scene_overall", 3) == [("p0", 0), ("p1", 0), ("p5", 0)]  # spread
    assert choose_prompts([ar], 0, None, 0) == []


def test_acceptance_map_colours_each_token_by_its_commit() -> None:
    kinds = [COMMIT_SAMPLED, COMMIT_ACCEPTED, COMMIT_RELAXED, COMMIT_ACCEPTED, COMMIT_SAMPLED, COMMIT_SAMPLED]
    record = {"prompt_id": "p", "grid": [2, 3], "commit_kind": kinds, "commit_iter": [0, 0, 0, 1, 2, 4]}
    pixels = np.asarray(acceptance_map(record))
    assert pixels.shape == (5, 3, 3)  # iterations, a white row, kinds
    assert (pixels[2] == 255).all()
    assert [tuple(p) for p in pixels[3:].reshape(-1, 3)] == [KINDS[k][1] for k in kinds]
    assert tuple(pixels[0, 0]) != tuple(pixels[1, 2])  # first and last iteration
    # forced end-of-line tokens (Lumina-mGPT): shown in place as an extra column
    eol = {"prompt_id": "p", "grid": [2, 2], "commit_kind": [0, 1, COMMIT_FORCED, 0, 1, COMMIT_FORCED],
           "commit_iter": [0, 0, 0, 1, 1, 1]}
    assert commit_layout(eol, "commit_kind").shape == (2, 3)


# -- the page in a browser ---------------------------------------------------------------------------------------

def chrome(tmp_path: Path) -> Any:
    """Headless Chromium through chromedriver (Debian's chromium and chromium-driver), its console logged."""
    missing = ("no chromium / chromedriver binary (Debian: apt-get install chromium chromium-driver)"
               if CHROMIUM is None or CHROMEDRIVER is None else None)
    try:
        from selenium import webdriver
    except ImportError:
        missing = missing or "selenium not installed (pip install -e '.[dev]')"
    if missing:
        if os.environ.get(REQUIRE_BROWSER):  # CI installs them (.ci/run): there a skip would hide the test
            pytest.fail(f"{REQUIRE_BROWSER} is set and {missing}")
        pytest.skip(missing)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000",
                f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))


def console_errors(driver: Any, page: Path) -> list[str]:
    """Open ``page`` and return the console's errors (a script that does not parse, an exception, a missing file)."""
    driver.get(page.resolve().as_uri())
    driver.execute_script("return document.readyState")
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def column(driver: Any, table: str, header: str) -> list[str]:
    from selenium.webdriver.common.by import By

    heads = [th.text.strip(" ▲▼") for th in driver.find_elements(By.CSS_SELECTOR, f"#{table} thead th")]
    rows = driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")
    return [row.find_elements(By.TAG_NAME, "td")[heads.index(header)].text for row in rows]


@pytest.mark.slow
def test_page_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    driver = chrome(tmp_path)
    try:
        assert console_errors(driver, report / HTML_FILE) == []
        # a click on a header sorts by that column, a second click reverses
        before = column(driver, "table-toy", "method")
        header = next(th for th in driver.find_elements(By.CSS_SELECTOR, "#table-toy thead th")
                      if th.text.strip() == "speed-up")
        header.click()
        up = [float(v.split()[0]) for v in column(driver, "table-toy", "speed-up")]
        assert up == sorted(up)
        header.click()
        down = [float(v.split()[0]) for v in column(driver, "table-toy", "speed-up")]
        assert down == sorted(up, reverse=True) and column(driver, "table-toy", "method") != before
        # a prompt's row: one image per run, every one decoded by the browser
        row = driver.find_element(By.CSS_SELECTOR, ".prompt-row[data-prompt='p001']")
        images = row.find_elements(By.CSS_SELECTOR, "img.sample")
        assert len(images) == RUNS
        assert all(driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", img)
                   for img in images)
        shot = tmp_path / "report.png"
        assert driver.save_screenshot(str(shot))
        assert Image.open(shot).size[0] > 0
        # the check can fail: a page whose script does not parse, and one with a broken image
        broken = tmp_path / "broken.html"
        broken.write_text((report / HTML_FILE).read_text(encoding="utf-8").replace("(function () {", "(function () {{"),
                          encoding="utf-8")
        assert any("SyntaxError" in e or "Unexpected" in e for e in console_errors(driver, broken))
        missing = tmp_path / "missing.html"
        missing.write_text('<!DOCTYPE html><img src="nothing.png">', encoding="utf-8")
        assert console_errors(driver, missing)
    finally:
        driver.quit()


def test_embedded_images_are_the_runs_pixels(report: Path) -> None:
    """The image of AR's first prompt on the page is that run's PNG, pixel for pixel."""
    page = Page((report / HTML_FILE).read_text(encoding="utf-8"))
    row = page.find("div", "prompt-row")[0]
    src = page.find("img", "sample", inside=row)[0]["src"]
    embedded = np.asarray(Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).convert("RGB"))
    run = report.parent / "0_ar"
    assert np.array_equal(embedded, np.asarray(Image.open(run / "images" / "p000_s0.png").convert("RGB")))


def test_a_large_image_is_a_thumbnail_linking_to_its_file(tmp_path: Path) -> None:
    """A run's 512 px images are shown as thumbnails of at most THUMB px (JPEG) whose link opens the run's PNG (a
    path relative to the page); images the page shows as they are (the toy's) carry no link."""
    from csd.report.html import THUMB

    sweep = fixture_sweep(tmp_path / "sweep", tmp_path)
    big = sweep / "0_ar"
    for png in (big / "images").glob("*.png"):
        with Image.open(png) as im:
            im.convert("RGB").resize((512, 512), Image.NEAREST).save(png)
    report = build_report(sweep, eval_cfg(tmp_path))
    page = Page((report / HTML_FILE).read_text(encoding="utf-8"))
    rows = page.find("div", "prompt-row")
    assert rows
    for row in rows:
        links = page.find("a", "full", inside=row)
        assert len(links) == 1, "one run has large images"
        target = (report / links[0]["href"]).resolve()
        assert target.parent == (big / "images").resolve() and target.is_file()
        thumb = page.find("img", "sample", inside=links[0])
        assert len(thumb) == 1 and thumb[0]["src"].startswith("data:image/jpeg")
        with Image.open(io.BytesIO(base64.b64decode(thumb[0]["src"].split(",", 1)[1]))) as im:
            assert max(im.size) <= THUMB
        assert len(page.find("img", "sample", inside=row)) == RUNS
