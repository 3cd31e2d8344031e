// What the statistics are called on the page: the API's keys (entropy_norm, first, ...) mapped to names a
// person reads, with units; the head roles and their badges; the labelling thresholds as sentences; and the
// rule that puts a badge only on heads that stand out. Pure (no DOM), so tests/js/ imports it as the page does.

// key -> column header with its unit. A key the page does not know yet is shown through readableKey.
export const STAT_NAMES = Object.freeze({
  entropy: "Entropy (nats)",
  entropy_norm: "Entropy (normalised, 0–1)",
  distance: "Mean distance (tokens)",
  self: "Attention to itself (share)",
  previous: "Attention to previous token (share)",
  next: "Attention to next token (share)",
  local: "Attention to nearby tokens (share)",
  forward: "Attention to later tokens (share)",
  special: "Attention to special tokens (share)",
  punctuation: "Attention to punctuation (share)",
  first: "Attention to first token (share)",
  max: "Max weight (row mean, 0–1)",
  previous_token: "Previous-token score (share)",
  duplicate_token: "Duplicate-token score (share)",
  induction: "Induction score (share)",
  change: "Change A→B (JS divergence, nats)",
});

// The table's own columns, beside the statistics.
export const INDEX_NAMES = Object.freeze({ layer: "Layer", head: "Head", "kv group": "KV group", label: "Role" });

/** "entropy_norm" -> "Entropy norm": the fallback for a key without a name of its own. */
export function readableKey(key) {
  const words = String(key).replace(/[_-]+/g, " ").trim();
  return words ? words[0].toUpperCase() + words.slice(1) : String(key);
}

/** The header a person reads for a table column or statistic key. */
export function statName(key) {
  return STAT_NAMES[key] ?? INDEX_NAMES[key] ?? readableKey(key);
}

// A head's share of weight on its role's target from which its badge shows: four fifths of every row's
// weight on one kind of token is a head that plainly does one thing; the labels' own cut (over half) puts
// "special-sink" on most heads of a BERT model, where a badge is noise.
export const BADGE_MIN_SHARE = 0.8;

// label (mha.analysis.head_labels) -> its badge on the grid, the statistic that decides it, and what it means.
// broad and mixed carry no badge: spread attention and no clear pattern are the common case, not a finding.
export const ROLES = Object.freeze({
  "previous-token": { badge: "prev", stat: "previous", meaning: "looks at the token just before it" },
  "next-token": { badge: "next", stat: "next", meaning: "looks at the token just after it" },
  self: { badge: "self", stat: "self", meaning: "looks at itself" },
  "special-sink": { badge: "spec", stat: "special", meaning: "looks at special tokens ([CLS], [SEP], <s>, …)" },
  "first-token-sink": { badge: "1st", stat: "first", meaning: "looks at the first token (an attention sink)" },
  punctuation: { badge: "punc", stat: "punctuation", meaning: "looks at punctuation" },
  induction: { badge: "ind", stat: "induction", meaning: "looks at the token after an earlier copy of its own" },
  local: { badge: "local", stat: "local", meaning: "looks at tokens near it" },
  broad: { badge: "", stat: "entropy_norm", meaning: "spreads its attention over most tokens" },
  mixed: { badge: "", stat: "", meaning: "no single pattern above the thresholds" },
});

const POINTERS = ["previous-token", "next-token", "self", "special-sink", "first-token-sink", "punctuation"];

function percent(share) {
  return `${Math.round(share * 100)}%`;
}

/**
 * The API's `thresholds` ({pointer, broad, local, induction, induction_margin}) as sentences, one per rule,
 * in the order head_labels applies them. A threshold the answer lacks is left out rather than guessed.
 */
export function thresholdSentences(thresholds = {}) {
  const out = [];
  if (Number.isFinite(thresholds.induction) && Number.isFinite(thresholds.induction_margin)) {
    out.push(
      `A head is an induction head when its induction score is at least ${thresholds.induction} and at least ` +
        `${thresholds.induction_margin} above what attention spread evenly over the same keys would score.`,
    );
  }
  if (Number.isFinite(thresholds.pointer)) {
    out.push(
      `A head gets a pointer role (${POINTERS.join(", ")}) when more than ${percent(thresholds.pointer)} of ` +
        "its weight, on average over its rows, goes to that kind of token; the largest share wins.",
    );
  }
  if (Number.isFinite(thresholds.broad)) {
    out.push(`Otherwise it is broad when its normalised entropy is at least ${thresholds.broad}.`);
  }
  if (Number.isFinite(thresholds.local)) {
    out.push(`Otherwise it is local when at least ${percent(thresholds.local)} of its weight stays on nearby tokens.`);
  }
  if (out.length) out.push("Any other head is mixed.");
  return out;
}

/** The badge rule as the glossary states it. */
export function badgeRule() {
  return (
    `A badge marks a head that stands out: at least ${percent(BADGE_MIN_SHARE)} of its weight on its role's ` +
    "target. Heads that merely pass the role's threshold keep their role in the table but carry no badge."
  );
}

/**
 * L x H badge texts ("" for none) of an analysis answer ({labels, stats}): a head's role badge only when its
 * deciding statistic reaches BADGE_MIN_SHARE. Unknown roles get no badge.
 */
export function standoutBadges({ labels = [], stats = {} }) {
  return labels.map((row, layer) =>
    row.map((label, head) => {
      const role = ROLES[label];
      if (!role?.badge) return "";
      const share = stats[role.stat]?.[layer]?.[head];
      return Number.isFinite(share) && share >= BADGE_MIN_SHARE ? role.badge : "";
    }),
  );
}

/** The roles whose badges appear in `badges` (L x H), in ROLES order: what the glossary must explain. */
export function badgesShown(badges) {
  const present = new Set(badges.flat().filter(Boolean));
  return Object.entries(ROLES).filter(([, role]) => role.badge && present.has(role.badge));
}
