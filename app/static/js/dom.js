// The one map of DOM selectors. Other modules ask for elements by name, never by raw selector,
// so the template and the scripts can only drift apart in this file.

export const SELECTORS = Object.freeze({
  initialState: "#initial-state",
  form: "#input-form",
  examples: "#examples",
  text: "#text",
  textPair: "#text-pair",
  target: "#target",
  targetField: "#target-field",
  kindSwitch: "#kind-switch",
  model: "#model",
  run: "#run",
  status: "#status",
  error: "#error",
  stateNotice: "#state-notice",
  staleBanner: "#stale-banner",
  workspace: ".workspace",
  grid: "#grid",
  gridBox: "#grid-box",
  gridScroll: "#grid-scroll",
  detailPanel: ".detail-panel",
  detailTitle: "#detail-title",
  detailCaption: "#detail-caption",
  exact: "#exact",
  detailScroll: "#detail-scroll",
  headDetail: "#head-detail",
  cellReadout: "#cell-readout",
  tokenView: "#token-view",
  tokenLines: "#token-lines",
  linesMode: "#lines-mode",
  linesOneLabel: "#lines-one-label",
  linesAllLabel: "#lines-all-label",
  linesPairs: "#lines-pairs",
  linesPairsField: "#lines-pairs-field",
  linesNote: "#lines-note",
  linesSwatches: "#lines-swatches",
  linesReadout: "#lines-readout",
  tabs: ".tabs [data-view]",
  exportPng: "#export-png",
  exportSvg: "#export-svg",
  exportJson: "#export-json",
  analysis: "#analysis",
  analysisBody: "#analysis-body",
  words: "#words",
  weightingSwitch: "#weighting-switch",
  gridWeighting: "#grid-weighting",
  statsWeighting: "#stats-weighting",
  compare: "#compare",
  compareInputs: "#compare-inputs",
  textB: "#text-b",
  modelB: "#model-b",
  similar: "#similar",
  insightStatus: "#insight-status",
  colorBy: "#color-by",
  colorLegend: "#color-legend",
  statsTable: "#stats-table",
  rollout: "#rollout",
  rolloutPanel: "#rollout-panel",
  rolloutLayer: "#rollout-layer",
  rolloutLayerValue: "#rollout-layer-value",
  rolloutCaption: "#rollout-caption",
  flowRun: "#flow-run",
  flowMessage: "#flow-message",
  flowNormalized: "#flow-normalized",
  flow: "#flow",
  comparePanel: "#compare-panel",
  probePanel: "#probe-panel",
  probeSeed: "#probe-seed",
  probeSequences: "#probe-sequences",
  probeRun: "#probe-run",
  probeInput: "#probe-input",
  probeInputText: "#probe-input-text",
  probeInputBack: "#probe-input-back",
  probeCancel: "#probe-cancel",
  probeProgress: "#probe-progress",
  probeMessage: "#probe-message",
  probeX: "#probe-x",
  probeY: "#probe-y",
  probeCsv: "#probe-csv",
  probeJson: "#probe-json",
  probePlot: "#probe-plot",
  probeCaption: "#probe-caption",
  probeTop: "#probe-top",
  effectsPanel: "#effects-panel",
  effectsRun: "#effects-run",
  effectsCancel: "#effects-cancel",
  effectsProgress: "#effects-progress",
  effectsMessage: "#effects-message",
  effectsOutputField: "#effects-output-field",
  effectsOutput: "#effects-output",
  effectsCaption: "#effects-caption",
  effectsMap: "#effects-map",
  effectsLegend: "#effects-legend",
  effectsRanking: "#effects-ranking",
  effectsTop: "#effects-top",
  compareSummary: "#compare-summary",
  compareRanking: "#compare-ranking",
  compareHeadCaption: "#compare-head-caption",
  compareA: "#compare-a",
  compareB: "#compare-b",
  compareDiff: "#compare-diff",
  newTokens: "#new-tokens",
  newTokensField: "#new-tokens-field",
  chat: "#chat",
  chatField: "#chat-field",
  hideFirst: "#hide-first",
  written: "#written",
  writtenTokens: "#written-tokens",
  writtenCaption: "#written-caption",
  writtenPrompt: "#written-prompt",
  writtenTop: "#written-top",
  showBadges: "#show-badges",
  tableScroll: "#table-scroll",
  tableScrollCue: "#table-scroll-cue",
  glossaryBody: "#glossary-body",
  exportJsonHead: "#export-json-head",
  exportHtml: "#export-html",
  exportPngReason: "#export-png-reason",
  copyLink: "#copy-link",
  shareStatus: "#share-status",
  notice: "#notice",
  colorScale: "#color-scale",
  colorScaleNote: "#color-scale-note",
  similarGroup: "#similar-group",
  tabTokens: "#tab-tokens",
  traceProgress: "#trace-progress",
  traceLabel: "#trace-label",
  traceBar: "#trace-bar",
  traceCancel: "#trace-cancel",
  longView: "#long-view",
  longDetail: "#long-detail",
  longReadout: "#long-readout",
  longText: "#long-text",
  longTextCaption: "#long-text-caption",
  longTextTop: "#long-text-top",
  longTextTokens: "#long-text-tokens",
  longTextCursor: "#long-text-cursor",
  longInsight: "#long-insight",
  // The Corpus view (app/templates/corpus.html)
  corpusRun: "#corpus-run",
  corpusStat: "#corpus-stat",
  corpusPlotKind: "#corpus-plot-kind",
  corpusAll: "#corpus-all",
  corpusEmpty: "#corpus-empty",
  corpusNotice: "#corpus-notice",
  corpusSummary: "#corpus-summary",
  corpusGrid: "#corpus-grid",
  corpusLegend: "#corpus-legend",
  corpusHeadTitle: "#corpus-head-title",
  corpusHeadSummary: "#corpus-head-summary",
  corpusPlot: "#corpus-plot",
  corpusPoint: "#corpus-point",
  corpusTop: "#corpus-top",
  corpusBottom: "#corpus-bottom",
  corpusLinkNote: "#corpus-link-note",
  corpusWorkspace: "#corpus-workspace",
  corpusHeadPanel: ".corpus-head",
});

/** The element registered under `name`; throws if the template lacks it (a bug, not a user error). */
export function $(name) {
  const selector = SELECTORS[name];
  if (!selector) throw new Error(`unknown DOM name ${JSON.stringify(name)}`);
  const el = document.querySelector(selector);
  if (!el) throw new Error(`template has no element for ${name} (${selector})`);
  return el;
}

/** All elements registered under `name`. */
export function $all(name) {
  const selector = SELECTORS[name];
  if (!selector) throw new Error(`unknown DOM name ${JSON.stringify(name)}`);
  return Array.from(document.querySelectorAll(selector));
}

/**
 * Create an element. `text` goes in through textContent only: user strings never become markup.
 * `attrs` values are set with setAttribute (string) or as dataset entries under `data`.
 */
export function el(tag, { className, text, attrs, data } = {}, children = []) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  if (attrs) for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (data) for (const [k, v] of Object.entries(data)) node.dataset[k] = String(v);
  for (const child of children) node.append(child);
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";

/** Create an SVG element with attributes; text via textContent. */
export function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}
