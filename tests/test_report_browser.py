"""`bench report` in a real headless browser: the self-contained HTML loads, renders and stays offline.

One real run of the tiny suite (inline executor) plus a second run made from its records (every
median doubled, as in test_report.py), so the side-by-side view is rendered too. The report is
opened as file:// in Debian's headless chromium through selenium and the system chromedriver.
The first screen (1280×800) must hold the findings and a figure; it is saved to
/tmp/report_first_screen.png to be looked at.

`page_problems` is the checker; `test_checker_flags_broken_pages` feeds it deliberately broken
copies of the report so every one of its checks is shown to be able to fail.

Without chromium/chromedriver (apt-get install chromium chromium-driver) the tests are skipped;
with BENCH_REQUIRE_BROWSER=1 (as .ci/run sets) they fail instead.
"""
from __future__ import annotations

import http.server
import io
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from harness.store.db import Store
from tests.helpers import invoke, store_slower_copy

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHECKS = ("loads", "console", "js-errors", "figures", "page-blank", "figure-blank", "network")
FIRST_SCREEN = (1280, 800)
FIRST_SCREEN_PNG = Path("/tmp/report_first_screen.png")
HEX16 = re.compile(r"\b[0-9a-f]{16}\b")

# collects uncaught errors and failed loads before any page script runs
ERROR_HOOK = """
window.__benchErrors = [];
window.addEventListener('error', e => window.__benchErrors.push(
    e.message || ('failed to load ' + ((e.target && (e.target.src || e.target.href)) || '?'))), true);
window.addEventListener('unhandledrejection', e => window.__benchErrors.push('rejection: ' + e.reason));
"""


def _missing_browser() -> str | None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not (os.access(p, os.X_OK) or shutil.which(Path(p).name))]
    if missing:
        return (f"headless-browser test needs {' and '.join(missing)} "
                "(apt-get install chromium chromium-driver)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "headless-browser test needs selenium (pip install -e '.[test]')"
    return None


def _binary(path: str) -> str:
    return path if os.access(path, os.X_OK) else shutil.which(Path(path).name)


@pytest.fixture(scope="module")
def driver():
    reason = _missing_browser()
    if reason:
        if os.environ.get("BENCH_REQUIRE_BROWSER") == "1":
            pytest.fail(f"BENCH_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _binary(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,2000",
                "--disable-dev-shm-usage", "--hide-scrollbars"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    drv = webdriver.Chrome(service=Service(_binary(CHROMEDRIVER)), options=options)
    try:
        drv.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": ERROR_HOOK})
        yield drv
    finally:
        drv.quit()


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_store) -> tuple[Path, set[str]]:
    """The report of two runs and the claims, and the case keys of those runs: the first is this module's copy of
    the tiny run measured once per process (tests/conftest.py's ``tiny_store``)."""
    tmp = tmp_path_factory.mktemp("browser")
    _, url = tiny_store
    store = Store(url, create=False)
    first = store.get_run("latest")
    second = store_slower_copy(store, first)             # the same suite "on another machine": medians × 2
    claims = tmp / "claims.html"               # cheap claims (computed directly), C33 with a chart
    result = invoke("claims", "--quick", "--only", "C12,C26,C33", "--store", url, "-o", str(claims))
    assert result.exit_code == 0, result.output
    out = tmp / "report.html"
    result = invoke("report", first.id, second, "--store", url, "--claims", str(claims.with_suffix(".json")),
                    "-o", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text(encoding="utf-8")
    assert text.count("<svg") >= 3 and 'class="aligned"' in text     # a figure per run + a claim's, aligned
    assert 'id="claims"' in text and 'id="C33"' in text
    keys = {r.case_key for ref in (first.id, second) for r in store.records(ref)}
    return out, keys


@pytest.fixture(scope="module")
def report_html(built) -> Path:
    return built[0]


# ---------------------------------------------------------------- the checker

def _nonblank(png: bytes) -> tuple[float, int]:
    """(fraction of pixels that differ from the most common colour, number of distinct colours)."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    total = img.width * img.height
    counts = img.getcolors(maxcolors=total)          # [(count, colour), ...]
    n_background = max(n for n, _ in counts)
    return 1 - n_background / total, len(counts)


def _looks_blank(png: bytes) -> str | None:
    differ, colours = _nonblank(png)
    if differ <= 0.01 or colours <= 8:
        return f"{differ:.2%} of pixels differ from the background, {colours} distinct colours"
    return None


def _full_screenshot(drv) -> bytes:
    import base64

    metrics = drv.execute_cdp_cmd("Page.getLayoutMetrics", {})
    size = metrics.get("cssContentSize") or metrics["contentSize"]
    shot = drv.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}})
    return base64.b64decode(shot["data"])


def page_problems(drv, path: Path, checks: tuple[str, ...] = CHECKS) -> dict[str, list[str]]:
    """Open ``path`` as file:// and return what is wrong with it, per check (empty lists: all good). ``checks``: the
    ones asked for (the screenshots of the two blank checks cost most of a page's ~3 s, and are taken only for them)."""
    from selenium.webdriver.common.by import By

    drv.get_log("browser")           # drop entries left by an earlier page
    drv.get_log("performance")
    url = path.resolve().as_uri()
    drv.get(url)
    problems: dict[str, list[str]] = {name: [] for name in CHECKS}

    # loads: the document finished loading (within 60 s: a loaded machine is slow, not broken), with a title
    # and a heading
    deadline = time.monotonic() + 60
    state = drv.execute_script("return document.readyState")
    while state != "complete" and time.monotonic() < deadline:
        time.sleep(0.1)
        state = drv.execute_script("return document.readyState")
    if state != "complete":
        problems["loads"].append(f"readyState {state}")
    if not drv.title.strip():
        problems["loads"].append("empty <title>")
    headings = [h.text for h in drv.find_elements(By.TAG_NAME, "h1") if h.is_displayed() and h.text.strip()]
    if not headings:
        problems["loads"].append("no visible <h1>")

    # console: nothing at level SEVERE (uncaught exceptions, failed loads, ...)
    problems["console"] = [e["message"] for e in drv.get_log("browser") if e["level"] == "SEVERE"]

    # js-errors: what the pre-load hook caught (error events, unhandled rejections)
    problems["js-errors"] = list(drv.execute_script("return window.__benchErrors || ['hook missing']"))

    # figures: every inline <svg> is displayed with a non-zero size
    figures = drv.find_elements(By.CSS_SELECTOR, "svg")
    if not figures:
        problems["figures"].append("no <svg> figure")
    for i, svg in enumerate(figures):
        size = svg.size
        if not svg.is_displayed() or size["width"] <= 0 or size["height"] <= 0:
            problems["figures"].append(f"svg #{i} not displayed ({size['width']}x{size['height']})")

    # page-blank / figure-blank: the screenshots show something
    blank = _looks_blank(_full_screenshot(drv)) if "page-blank" in checks else None
    if blank:
        problems["page-blank"].append(f"full page: {blank}")
    shown = [svg for svg in figures if svg.size["width"] > 0 and svg.size["height"] > 0]
    if not shown:
        problems["figure-blank"].append("no figure to screenshot")
    for i, svg in enumerate(shown if "figure-blank" in checks else ()):
        drv.execute_script("arguments[0].scrollIntoView({block: 'center'})", svg)
        blank = _looks_blank(svg.screenshot_as_png)
        if blank:
            problems["figure-blank"].append(f"svg #{i}: {blank}")

    # network: no resource fetched other than data: and file: (Resource Timing and the DevTools log)
    local = ("data:", "file:", "about:")
    fetched = drv.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)")
    problems["network"] += [f"resource {u}" for u in fetched if not u.startswith(local)]
    for entry in drv.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            u = msg["params"]["request"]["url"]
            if not u.startswith(local):
                problems["network"].append(f"request {u}")
    return {name: problems[name] for name in checks}


# ---------------------------------------------------------------- the tests

def test_report_renders_in_headless_chromium(driver, report_html):
    problems = page_problems(driver, report_html)
    assert {k: v for k, v in problems.items() if v} == {}
    assert "tiny" in driver.title or "report" in driver.title.lower()
    assert len(driver.find_elements("css selector", "svg")) >= 2          # at least one figure per run
    assert driver.find_elements("css selector", "table.aligned")          # the aligned multi-run view
    verdicts = driver.find_elements("css selector", "table.verdicts tr")   # the claims section: header + 3
    assert len(verdicts) == 4 and driver.find_element("id", "C33").is_displayed()


FIRST_SCREEN_JS = """
const vh = window.innerHeight, vw = window.innerWidth;
const inside = r => r.top >= 0 && r.bottom <= vh && r.height > 0;
const findings = [...document.querySelectorAll('.headline li')].filter(li => inside(li.getBoundingClientRect()));
const sides = [...document.querySelectorAll('table.side')].filter(t => inside(t.getBoundingClientRect()))
    .map(t => t.innerText);
const figures = [...document.querySelectorAll('svg')].map(s => s.getBoundingClientRect())
    .filter(r => r.height > 0 && r.top >= 0 && Math.min(r.bottom, vh) - r.top >= 0.6 * r.height);
return {vh: vh, vw: vw, findings: findings.map(li => li.innerText), figures: figures.length, sides: sides,
        scrollY: window.scrollY};
"""


def test_first_screen_holds_the_side_by_side_table(driver, report_html):
    """The report's lines are variants of one model (MHA, MQA): it opens on them side by side against the
    reference, each line's time ratio with its interval (the fits and figures follow below it)."""
    width, height = FIRST_SCREEN
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    try:
        driver.get(report_html.resolve().as_uri())
        seen = driver.execute_script(FIRST_SCREEN_JS)
        png = driver.get_screenshot_as_png()
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    FIRST_SCREEN_PNG.write_bytes(png)
    assert (seen["vw"], seen["vh"], seen["scrollY"]) == (width, height, 0)
    assert seen["sides"] and "time ÷ ref [95% CI]" in seen["sides"][0], seen
    assert re.search(r"\d× \[[\d.]+, [\d.]+\]", seen["sides"][0]), seen     # a ratio with its interval
    assert _looks_blank(png) is None


def test_no_case_key_in_the_visible_text(driver, built):
    path, keys = built
    driver.get(path.resolve().as_uri())
    text = driver.execute_script("return document.body.innerText")
    assert "MHA" in text and "seq_len" in text
    assert not HEX16.findall(text)
    assert not [k for k in keys if k in text]
    opened = driver.execute_script(
        "document.querySelectorAll('details').forEach(d => d.open = true); return document.body.innerText")
    assert "raw samples" in opened and not HEX16.findall(opened)    # nor in the raw statistics, opened


@pytest.fixture(scope="module")
def png_server():
    """A local HTTP server with one image, so a broken page can make a real network request."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4), "red").save(buf, "PNG")
    body = buf.getvalue()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/x.png"
    server.shutdown()
    server.server_close()


def _breakages(png_url: str) -> dict[str, tuple[str, str]]:
    """check -> (what to find in the report, what to replace it with), so that check must fail."""
    return {
        "loads": ("<h1>", '<h1 style="display:none">'),
        "console": ("</body>", "<script>throw new Error('x')</script></body>"),
        "js-errors": ("</body>", "<script>Promise.reject(new Error('y'))</script></body>"),
        "figures": ("</style>", "svg { display: none !important; }</style>"),
        "page-blank": ("</style>", "body { visibility: hidden; }</style>"),
        "figure-blank": ("</style>", "svg { opacity: 0 !important; }</style>"),
        "network": ("</body>", f'<img src="{png_url}" alt=""></body>'),
    }


@pytest.mark.parametrize("check", CHECKS)
def test_checker_flags_broken_pages(driver, report_html, png_server, tmp_path, check):
    old, new = _breakages(png_server)[check]
    text = report_html.read_text(encoding="utf-8")
    assert old in text
    broken = tmp_path / f"broken-{check}.html"
    broken.write_text(text.replace(old, new, 1), encoding="utf-8")
    problems = page_problems(driver, broken, checks=(check,))
    assert problems[check], f"the {check!r} check missed a deliberately broken page: {problems}"
