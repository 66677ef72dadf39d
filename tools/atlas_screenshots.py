"""Screenshots of a head atlas page in headless Chromium: the overview and one head's card.

    PYTHONPATH=src .venv/bin/python tools/atlas_screenshots.py results/multi30k_en_de/atlas/index.html \
        --overview docs/figures/atlas_overview.png --card docs/figures/atlas_head_card.png \
        --head enc_self/0/2 --colour lrp --setting all --lambda-step 3

Needs the `dev` extra (selenium) and Debian's chromium and chromium-driver.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from headcount.report.atlas.browser import headless_chromium, open_page  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page")
    parser.add_argument("--overview", help="PNG of the overview (controls, grids, legends)")
    parser.add_argument("--card", help="PNG of the head's card")
    parser.add_argument("--head", default="enc_self/0/0", help="the card's head, type/layer/head (0-based)")
    parser.add_argument("--colour", help="colour the grid by this score column (or 'role')")
    parser.add_argument("--setting", help="show this pruning setting's runs")
    parser.add_argument("--lambda-step", type=int, default=0, help="slider position (0: the smallest lambda)")
    parser.add_argument("--view", choices=["matrix", "lines"], default="matrix")
    args = parser.parse_args()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    driver = headless_chromium(width=1500, height=1000)
    try:
        open_page(driver, args.page)
        if args.colour:
            Select(driver.find_element(By.ID, "colour-by")).select_by_value(args.colour)
        if args.setting:
            Select(driver.find_element(By.ID, "pruning-setting")).select_by_value(args.setting)
            for _ in range(args.lambda_step):
                driver.find_element(By.ID, "lambda-slider").send_keys(Keys.ARROW_RIGHT)
        if args.overview:  # the page from its top to the end of the grids' legends (the table left out)
            import io

            from PIL import Image

            bottom = driver.execute_script("return document.getElementById('planted').getBoundingClientRect().bottom")
            driver.set_window_size(1500, int(bottom) + 400)
            image = Image.open(io.BytesIO(driver.get_screenshot_as_png()))
            image.crop((0, 0, image.width, min(image.height, int(bottom) + 16))).save(args.overview)
            driver.set_window_size(1500, 1000)
        if args.card:
            driver.find_element(By.CSS_SELECTOR, f'rect.head[data-key="{args.head}"]').click()
            if args.view == "lines":
                driver.find_element(By.CSS_SELECTOR, '#card input[value="lines"]').click()
            card = driver.find_element(By.ID, "card")
            height = driver.execute_script("return arguments[0].scrollHeight", card)
            driver.set_window_size(1500, max(1000, height + 120))
            driver.execute_script("arguments[0].style.maxHeight = 'none'; arguments[0].style.position = 'static'",
                                  card)
            card.screenshot(args.card)
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
