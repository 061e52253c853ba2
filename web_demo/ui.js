// DOM rendering helpers: status, error banner, event log, capability list and
// number formatting. No protocol or audio logic lives here.

export const $ = (id) => document.getElementById(id);

const STATUS_TEXT = {
  connecting: "Connecting…",
  ready: "Ready",
  busy: "Server busy",
  offline: "Disconnected",
  error: "Error",
};

/** The connection pill in the top bar. `state` drives its colour. */
export function setStatus(state, text = STATUS_TEXT[state]) {
  $("status").dataset.state = state;
  $("status-text").textContent = text;
}

export function showError(title, detail = "", level = "error") {
  const banner = $("banner");
  banner.dataset.level = level;
  $("banner-title").textContent = title;
  $("banner-detail").textContent = detail;
  banner.hidden = false;
}

export function clearError() {
  $("banner").hidden = true;
}

const LOG_LIMIT = 400;
const startedAt = performance.now();

/** One line in the event log. `dir` is "in" (from server), "out" (to server) or "local". */
export function log(dir, type, detail = "", level = "info") {
  const list = $("log");
  const item = document.createElement("li");
  item.dataset.dir = dir;
  item.dataset.level = level;
  const seconds = ((performance.now() - startedAt) / 1000).toFixed(3);
  const arrow = { in: "←", out: "→", local: "·" }[dir];
  item.innerHTML = `<time></time><span class="arrow"></span><b></b><span class="detail"></span>`;
  item.children[0].textContent = seconds;
  item.children[1].textContent = arrow;
  item.children[2].textContent = type;
  item.children[3].textContent = detail;
  const pinned = list.scrollTop + list.clientHeight >= list.scrollHeight - 4;
  list.append(item);
  while (list.childElementCount > LOG_LIMIT) list.firstElementChild.remove();
  if (pinned) list.scrollTop = list.scrollHeight; // follow the tail unless the reader scrolled up
}

/** The `hello` capabilities as a definition list. */
export function renderCapabilities(hello) {
  if (!hello) {
    const row = document.createElement("div");
    row.innerHTML = "<dt>Model</dt><dd>not connected</dd>";
    $("caps").replaceChildren(row);
    return;
  }
  const limits = hello.limits ?? {};
  const rows = [
    ["Model", `${hello.model?.name ?? "?"} · ${formatRate(hello.model?.sample_rate)} native`],
    ["Protocol", hello.protocol ?? "?"],
    ["Formats", (hello.formats ?? []).join(", ")],
    ["Sample rates", (hello.sample_rates ?? []).map(formatRate).join(", ")],
    ["Max contexts", limits.max_contexts],
    ["Max text", limits.max_text_chars != null ? `${limits.max_text_chars.toLocaleString("en")} chars` : undefined],
    ["Max message", limits.max_message_bytes != null ? formatBytes(limits.max_message_bytes) : undefined],
    ["Idle timeout", limits.idle_timeout_s != null ? `${limits.idle_timeout_s} s` : undefined],
    ["Session", hello.session_id],
  ];
  const caps = $("caps");
  caps.replaceChildren();
  for (const [name, value] of rows) {
    if (value === undefined || value === null || value === "") continue;
    const row = document.createElement("div");
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = name;
    dd.textContent = String(value);
    row.append(dt, dd);
    caps.append(row);
  }
}

/** Replace a <select>'s options; `disabled` lists values shown but not selectable. */
export function fillSelect(select, values, { label = String, disabled = new Set(), selected } = {}) {
  select.replaceChildren();
  for (const value of values) {
    const option = new Option(label(value), String(value));
    option.disabled = disabled.has(value);
    select.append(option);
  }
  if (selected !== undefined) select.value = String(selected);
}

export function formatRate(rate) {
  if (!rate) return "?";
  return rate % 1000 === 0 ? `${rate / 1000} kHz` : `${(rate / 1000).toFixed(1)} kHz`;
}

export function formatBytes(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / 1024 / 1024).toFixed(2)} MiB`;
}

export function formatMs(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return "—";
  return ms >= 10000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms)} ms`;
}
