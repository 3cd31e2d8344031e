// Pure helpers of the phone layout: scroll cues, "off screen", the token lines' widths. Run: node --test tests/js/

import assert from "node:assert/strict";
import { test } from "node:test";

import { tokenLayout } from "../../app/static/js/tokens.js";
import { offScreen, scrollCue } from "../../app/static/js/viewport.js";

const box = (over) => ({ scrollLeft: 0, scrollTop: 0, scrollWidth: 800, scrollHeight: 300, clientWidth: 350, clientHeight: 300, ...over });

test("scroll cues: an edge is marked while more lies beyond it", () => {
  assert.deepEqual(scrollCue(box()), { left: false, right: true, top: false, bottom: false });
  assert.deepEqual(scrollCue(box({ scrollLeft: 450 })), { left: true, right: false, top: false, bottom: false });
  assert.deepEqual(scrollCue(box({ scrollLeft: 200, scrollHeight: 500 })), { left: true, right: true, top: false, bottom: true });
  // A sub-pixel remainder (a zoomed screen's fractional scroll position) is not "more".
  assert.deepEqual(scrollCue(box({ scrollLeft: 449.5, scrollTop: 0.5 })), { left: true, right: false, top: false, bottom: false });
  assert.deepEqual(scrollCue(box({ scrollWidth: 350 })), { left: false, right: false, top: false, bottom: false });
});

test("off screen: less than 120 px (or the whole element, when smaller) in view", () => {
  const rect = (top, height) => ({ top, bottom: top + height, height });
  assert.equal(offScreen(rect(900, 600), 844), true); // below the screen
  assert.equal(offScreen(rect(780, 600), 844), true); // only 64 px show
  assert.equal(offScreen(rect(700, 600), 844), false); // 144 px show
  assert.equal(offScreen(rect(-550, 600), 844), true); // scrolled past: 50 px left at the top
  assert.equal(offScreen(rect(800, 40), 844), false); // a small element wholly in view
});

test("token lines take the panel's width: columns up to 150 px, the gap the rest, 60 to 420 px", () => {
  assert.deepEqual(tokenLayout(0), { width: 520, text: 150, gap: 220 }); // not laid out yet
  assert.deepEqual(tokenLayout(352), { width: 352, text: 146, gap: 60 }); // a phone
  assert.deepEqual(tokenLayout(521), { width: 521, text: 150, gap: 221 });
  assert.deepEqual(tokenLayout(1400), { width: 720, text: 150, gap: 420 }); // wider reads worse
});
