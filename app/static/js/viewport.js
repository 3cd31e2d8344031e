// Keeping things in view on small screens: a scroll box says where more of it lies (a fade at that edge),
// and a panel off screen is brought into view when a person asks for it (a thumbnail tap opens the detail).

const SLACK_PX = 1; // sub-pixel scroll positions (zoomed or high-DPI screens) must not read as "more"

/** Which edges of a scroll box have more content beyond them: {left, right, top, bottom} booleans. */
export function scrollCue({ scrollLeft, scrollTop, scrollWidth, scrollHeight, clientWidth, clientHeight }) {
  return {
    left: scrollLeft > SLACK_PX,
    right: scrollLeft + clientWidth < scrollWidth - SLACK_PX,
    top: scrollTop > SLACK_PX,
    bottom: scrollTop + clientHeight < scrollHeight - SLACK_PX,
  };
}

/**
 * Keep `box`'s classes more-left/right/top/bottom in step with where `scroller` (inside it) can still
 * scroll; the stylesheet draws the cues. Follows scrolling and any change of size of the box or its content.
 */
export function bindScrollCue(box, scroller) {
  const refresh = () => {
    for (const [edge, more] of Object.entries(scrollCue(scroller))) box.classList.toggle(`more-${edge}`, more);
  };
  scroller.addEventListener("scroll", refresh, { passive: true });
  const observer = new ResizeObserver(refresh);
  observer.observe(scroller);
  for (const child of scroller.children) observer.observe(child);
  refresh();
  return refresh;
}

/** True when less than `minPx` of `rect` (a DOMRect) lies inside a viewport `height` px tall. */
export function offScreen(rect, height, minPx = 120) {
  const visible = Math.min(rect.bottom, height) - Math.max(rect.top, 0);
  return visible < Math.min(minPx, rect.height);
}

/** Scroll `element` to the top of the screen, but only when it is (nearly) off screen. */
export function reveal(element) {
  if (!offScreen(element.getBoundingClientRect(), window.innerHeight)) return false;
  const smooth = !window.matchMedia("(prefers-reduced-motion: reduce)").matches;
  element.scrollIntoView({ block: "start", behavior: smooth ? "smooth" : "auto" });
  return true;
}
