"""The start form's presets in a real browser (the system's Chromium, headless): the form
opens with the default preset's settings, and choosing another preset fills every setting with
its value, or with the run settings' default where it sets none."""

from __future__ import annotations

import pytest

from fedrecgel.config import SIMULATOR_ONLY
from fedrecgel.presets import FIXED_PRIVATE_CLIP, PRESETS_FILE, stored
from fedrecgel.run_config import RunConfig
from harness.browser import chromium
from harness.dashboard import FakeAggregator, served

pytestmark = pytest.mark.browser


def test_choosing_a_preset_fills_the_start_form() -> None:
    default = stored(PRESETS_FILE)["default"]["settings"]
    private = stored(PRESETS_FILE)["private"]["settings"]
    fields = {n: f for n, f in RunConfig.model_fields.items() if n not in SIMULATOR_ONLY}
    own = RunConfig.model_fields
    with served(FakeAggregator(3)) as url, chromium() as browser:
        page = browser.new_page()
        page.goto(url)
        page.wait_for_selector("#conn:has-text('Live')")
        page.click("#start-details summary")
        page.fill("#op-token", "any-operator-token-0123456789")
        page.press("#op-token", "Enter")
        page.wait_for_selector("#start-fields:not([disabled])")

        def shown(name: str) -> str:
            value: str = page.input_value(f"#cfg-{name}")
            return value

        assert page.input_value("#cfg-preset") == "default"
        assert float(shown("server_lr")) == default["server_lr"]
        assert int(shown("rounds")) == default["rounds"]
        page.fill("#cfg-n_items", "80")
        page.select_option("#cfg-preset", "paper")
        for name, field in fields.items():  # the run settings' own defaults, all of them
            if field.is_required():
                continue
            want = field.default
            want = "" if want is None else str(want).lower() if isinstance(want, bool) else want
            assert shown(name) == str(want), name
        assert shown("n_items") == "80"  # the catalogue's size is no preset's
        page.select_option("#cfg-preset", "private")
        assert float(shown("server_lr")) == private["server_lr"]
        assert shown("optimizer") == private["optimizer"]
        assert float(shown("dp_clip")) == FIXED_PRIVATE_CLIP  # fixed: the aggregator keeps C
        assert int(shown("rank_fit_steps")) == own["rank_fit_steps"].default  # not the private's
        page.select_option("#cfg-preset", "default")
        assert float(shown("server_lr")) == default["server_lr"]
        assert float(shown("dp_clip")) == own["dp_clip"].default  # the private's is undone
