#!/usr/bin/env python3
"""Open a Snakemake HTML report in a headless Chromium and check that it works.

    .venv/bin/python tools/check_report.py report.html --screenshot docs/report/screenshot.png

Checks: the report's app renders (the navigation and the rule graph); every image result, shown
the way the report shows it (the app's own view), loads (naturalWidth > 0); the browser logs no
JavaScript error; every result has a caption, without reStructuredText errors or unrendered
templates. Prints one line per result (category, file, type, caption's opening words) for a
reader to judge the captions, and exits 1 if a check fails.

Needs Chromium and its WebDriver (Debian: `apt-get install chromium chromium-driver`) and
Selenium (`pip install selenium`).
"""

import argparse
import html
import re
import sys
import time
from pathlib import Path

IMAGE_TYPES = {"image/png", "image/jpeg", "image/svg+xml"}  # what the report shows as <img>


def browser(width: int, height: int, chromium: str, driver_path: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver_path), options=options)


def wait_for(driver, script: str, timeout: float, *args):
    """Poll a JavaScript expression until it returns something other than null/false."""
    deadline = time.time() + timeout
    while True:
        value = driver.execute_script(script, *args)
        if value not in (None, False) or time.time() > deadline:
            return value
        time.sleep(0.1)


def plain(caption_html: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", caption_html or "")).split())


def show_image(driver, path: str, timeout: float) -> int | None:
    """Show one image result as the report does; its naturalWidth once loaded (0: broken)."""
    driver.execute_script(
        "const p = arguments[0];"
        "app.setView({navbarMode: 'resultinfo', resultPath: p, content: 'img', contentPath: results[p].data_uri});",
        path)
    return wait_for(driver,
                    "const uri = results[arguments[0]].data_uri;"
                    "const img = Array.from(document.images).find(i => i.getAttribute('src') === uri);"
                    "return img && img.complete ? img.naturalWidth : null;",
                    timeout, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--screenshot", type=Path, help="save a PNG of the report showing one figure")
    parser.add_argument("--home", type=Path, help="save a PNG of the start page (the rule graph) as well")
    parser.add_argument("--show", default="figure7",
                        help="the figure to show in the screenshot: a substring of its path (default: %(default)s)")
    parser.add_argument("--size", default="1400x950", help="window size WxH (default: %(default)s)")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    parser.add_argument("--timeout", type=float, default=60)
    args = parser.parse_args(argv)

    width, height = map(int, args.size.split("x"))
    driver = browser(width, height, args.chromium, args.chromedriver)
    problems = []
    try:
        driver.get(args.report.resolve().as_uri())
        rendered = wait_for(driver, "return typeof app !== 'undefined' && "
                                    "document.querySelector('#app nav, #app [class*=\"navbar\"], #app div') !== null",
                            args.timeout)
        if not rendered:
            problems.append("the report's app did not render")
            raise SystemExit
        graph = wait_for(driver, "return document.querySelector('#app svg, #app canvas') !== null", args.timeout)
        if not graph:
            problems.append("no rule graph (svg or canvas) on the start page")
        if args.home:
            time.sleep(1)  # the rule graph's layout settles
            args.home.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(args.home))
            print(f"screenshot of the start page: {args.home}")
        for src, width_px in driver.execute_script(
                "return Array.from(document.images).map(i => [i.getAttribute('src').slice(0, 60), i.naturalWidth])"):
            if not width_px:
                problems.append(f"broken image on the start page: {src}...")

        entries = driver.execute_script(
            "const where = {};"
            "for (const [cat, subs] of Object.entries(categories))"
            "  for (const [sub, paths] of Object.entries(subs)) for (const p of paths) where[p] = cat + ' / ' + sub;"
            "return Object.entries(results).map(([p, r]) => [p, r.mime_type, r.caption || '', where[p] || '?']);")
        print(f"{args.report}: {len(entries)} results")
        for path, mime, caption, where in sorted(entries, key=lambda e: (e[3], e[0])):
            status = ""
            if mime in IMAGE_TYPES:
                natural = show_image(driver, path, args.timeout)
                if not natural:
                    problems.append(f"broken image: {path}")
                status = f"{natural}px wide" if natural else "BROKEN"
            text = plain(caption)
            if not text:
                problems.append(f"no caption: {path}")
            elif re.search(r"system-message|System Message|Unknown interpreted|\{\{|\{%", caption):
                problems.append(f"caption with reStructuredText errors or an unrendered template: {path}")
            print(f"  [{where}] {path} ({mime}{', ' + status if status else ''})\n      {text[:160]}")

        if args.screenshot:
            shown = next((e[0] for e in entries if args.show in e[0] and e[1] in IMAGE_TYPES), None)
            if shown is None:
                problems.append(f"no image result matches --show {args.show!r}")
            else:
                show_image(driver, shown, args.timeout)
                time.sleep(0.5)
                args.screenshot.parent.mkdir(parents=True, exist_ok=True)
                driver.save_screenshot(str(args.screenshot))
                print(f"screenshot of {shown}: {args.screenshot}")
    except SystemExit:
        pass
    finally:
        for entry in driver.get_log("browser"):
            if entry["level"] == "SEVERE":
                problems.append(f"browser console: {entry['message'][:300]}")
        driver.quit()
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print("report OK" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
