// The statistics table's glossary, shown open beside it: every column by the name its header shows, what
// it measures (the API's stat_descriptions), the roles with their thresholds as sentences, and every badge
// with the rule that decides who carries one. Text goes in through textContent only.

import { el } from "./dom.js";
import { describeStat, statTable } from "./insight.js";
import { ROLES, badgeRule, statName, thresholdSentences } from "./names.js";
import { SINK_BY_WEIGHTING, parseWeighting, readsLine } from "./weighting.js";

// The API's descriptions start in lower case ("mean row entropy in nats: ..."); a definition list reads as sentences.
function entry(term, definition) {
  const text = definition ? definition[0].toUpperCase() + definition.slice(1) : "";
  return [el("dt", { text: term }), el("dd", { text })];
}

/**
 * Fill `container` (the glossary's body) for `analysis` and its comparison (which adds the change column);
 * `weighting` ("weight" or "norm"), the map the statistics read: the sink paragraph of that one comes first.
 */
export function renderGlossary(container, analysis, compare = null, weighting = "weight") {
  const columns = el("dl", { className: "glossary-list" }, [
    ...entry(statName("layer"), "Layer index, 0 = nearest the input."),
    ...entry(statName("head"), "Head index within its layer."),
    ...entry(statName("label"), "What the head mostly does (see Roles below)."),
    ...Object.keys(statTable(analysis, compare)).flatMap((key) => entry(statName(key), describeStat(analysis, key))),
  ]);
  const roles = el(
    "dl",
    { className: "glossary-list glossary-roles" },
    Object.entries(ROLES).flatMap(([label, role]) => {
      const term = el("dt", {}, [el("span", { text: label })]);
      if (role.badge) {
        term.append(" ", el("span", { className: "badge", text: role.badge, data: { badge: role.badge } }));
      }
      return [term, el("dd", { text: `The head ${role.meaning}.` })];
    }),
  );
  container.replaceChildren(
    el("h4", { text: "Columns" }),
    columns,
    el("h4", { text: "Roles and badges" }),
    ...thresholdSentences(analysis.thresholds).map((sentence) => el("p", { text: sentence })),
    el("p", { className: "badge-rule", text: badgeRule() }),
    roles,
    el("h4", { text: "Weights and value norms: sink heads" }),
    el("p", { text: readsLine(weighting) }),
    ...sinkOrder(weighting).map((key) => el("p", { className: "sink-by", text: SINK_BY_WEIGHTING[key], data: { weighting: key } })),
  );
}

/** The weightings' sink paragraphs, the one the statistics read first. */
function sinkOrder(weighting) {
  return parseWeighting(weighting) === "norm" ? ["norm", "weight"] : ["weight", "norm"];
}

/**
 * Show `cue` while `box` hides columns beyond its right edge (and not once a person scrolled to the end),
 * checked when the box resizes, scrolls, or its table is rebuilt (call the returned function).
 */
export function watchOverflow(box, cue) {
  const check = () => {
    cue.hidden = box.scrollLeft + box.clientWidth >= box.scrollWidth - 1; // 1 px: sub-pixel widths round
  };
  new ResizeObserver(check).observe(box);
  box.addEventListener("scroll", check, { passive: true });
  return check;
}
