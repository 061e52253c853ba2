// Page wiring: one Connection, one Player, and the turns (contexts) a person
// starts from the form. Protocol details live in protocol.js/connection.js,
// audio in player.js and the worklet, voices in voices.js; this file only decides
// what to send when a button is pressed and what to show when the server answers.

import { HttpApi } from "./api.js";
import { conditioningSettings, fillConditioning, setConditioningEnabled } from "./conditioning.js";
import { Connection } from "./connection.js";
import { OpusDecoder } from "./decoders.js";
import { LevelMeter } from "./meter.js";
import { Player } from "./player.js";
import { errorTitle, socketUrl } from "./protocol.js";
import { TokenFeeder, tokenize } from "./tokens.js";
import * as ui from "./ui.js";
import { VoicePanel } from "./voices.js";

const { $ } = ui;

const FORMAT_LABELS = { opus: "Opus", pcm_s16le: "PCM s16", pcm_f32le: "PCM f32", mulaw: "μ-law" };
const FINAL = new Set(["done", "cancelled", "failed"]);
const RETRY_MAX_MS = 10000;
// AudioWorklet and WebCodecs exist only in secure contexts: https, or http on localhost.
const SECURE_CONTEXT_HINT =
  "Browsers allow audio worklets and decoders only over https or on localhost; " +
  "for a remote server, tunnel it: ssh -L 8000:localhost:8000 HOST, then open http://localhost:8000/";
const PING_EVERY_MS = 10000;
// The keys are kept for this tab only, so a reload does not ask again; ?token=KEY in the page URL sets the API key.
const KEY_STORAGE = "voxstream.apiKey";
const ADMIN_KEY_STORAGE = "voxstream.adminKey";

const api = new HttpApi();
api.key = new URLSearchParams(window.location.search).get("token") ?? sessionStorage.getItem(KEY_STORAGE) ?? "";
api.adminKey = sessionStorage.getItem(ADMIN_KEY_STORAGE) ?? "";
const conn = new Connection(socketUrl(window.location, api.key));
const player = new Player();
const meter = new LevelMeter($("meter"));
const voices = new VoicePanel(api);

const state = {
  hello: null,
  opusSupported: false,
  mode: "speak",
  turns: new Map(), // ctx -> Turn, this session only
  current: null, // the Turn that Flush and End act on
  feeder: null,
  turnCount: 0,
  retryDelayMs: 1000,
  retryTimer: null,
  pingTimer: null,
  connectionBanner: false, // the banner shows a connection problem (cleared on reconnect)
};

class Turn {
  constructor(ctx, mode) {
    this.ctx = ctx;
    this.mode = mode;
    this.status = "creating"; // creating, queued, streaming, speaking, ending, done, cancelled, failed
    this.ended = false; // context.end sent
    this.firstTextAt = null;
    this.appends = 0;
    this.queuePosition = null;
    this.metrics = null;
  }

  get live() {
    return !FINAL.has(this.status);
  }
}

// ---- test hook: read-only figures, so browser tests need no knowledge of internals

const received = []; // every JSON message from the server, in order
const errors = []; // every `error` message and every failed connection, in order
window.__ttsDemo = {
  get status() {
    return $("status").dataset.state;
  },
  get hello() {
    return state.hello;
  },
  get voices() {
    return voices.ids;
  },
  messages: received,
  errors,
  stats: () => ({
    ...player.snapshot(),
    turns: Object.fromEntries([...state.turns].map(([ctx, t]) => [ctx, { status: t.status, metrics: t.metrics }])),
  }),
};

// ---- connection

function connect() {
  clearTimeout(state.retryTimer);
  ui.setStatus("connecting");
  conn.open();
}

conn.addEventListener("open", () => ui.log("local", "connected", socketUrl(window.location)));
conn.addEventListener("frame", (event) => player.receive(event.detail));
conn.addEventListener("message", (event) => onMessage(event.detail));
conn.addEventListener("sent", (event) => logSent(event.detail));
conn.addEventListener("closed", (event) => onClosed(event.detail));

function onClosed({ wasOpen, busy, unauthorised, text, code, retryAfterS }) {
  state.hello = null;
  clearInterval(state.pingTimer);
  abandonTurns();
  setControls();
  errors.push({ code: `close_${code}`, message: text, busy });
  ui.log("local", wasOpen ? "closed" : "refused", `${code} · ${text}`, busy ? "warn" : "error");
  ui.renderCapabilities(null);
  if (unauthorised) {
    // The same key would be refused again: wait for Apply instead of retrying.
    $("api-key").setAttribute("aria-invalid", "true");
    ui.showError("Not authorised", "This server needs an API key: enter it in the Server panel, then Apply.");
    state.connectionBanner = true;
    ui.setStatus("offline", text);
    return;
  }
  // Exponential backoff, but never sooner than the server's Retry-After.
  const delay = Math.max(state.retryDelayMs, (retryAfterS ?? 0) * 1000);
  state.retryDelayMs = Math.min(RETRY_MAX_MS, state.retryDelayMs * 2);
  const advice = "The page reconnects by itself; nothing you typed is lost.";
  const detail = `${text.replace(/^Server busy: /, "")}. ${advice}`;
  ui.showError(busy ? "Server busy" : "Not connected", detail, busy ? "warn" : "error");
  state.connectionBanner = true;
  countdown(busy ? "busy" : "offline", text, delay);
}

/** Show "… · retrying in N s" in the status pill and reconnect when it reaches zero. */
function countdown(status, text, delayMs) {
  const until = performance.now() + delayMs;
  const tick = () => {
    const left = Math.ceil((until - performance.now()) / 1000);
    if (left <= 0) return connect();
    ui.setStatus(status, `${text} · retrying in ${left} s`);
    state.retryTimer = setTimeout(tick, 250);
  };
  tick();
}

/** The session is gone: its contexts are over, and nothing more of them will arrive. */
function abandonTurns() {
  stopFeeder();
  for (const turn of state.turns.values()) {
    player.cancel(turn.ctx);
    if (turn.live) turn.status = "failed";
  }
  state.turns.clear();
  state.current = null;
}

// ---- server messages

function onMessage(msg) {
  received.push(msg);
  const handler = HANDLERS[msg.type];
  if (handler) handler(msg);
  else ui.log("in", msg.type, JSON.stringify(msg));
  setControls();
}

const HANDLERS = {
  hello(msg) {
    state.hello = msg;
    state.retryDelayMs = 1000;
    if (state.connectionBanner) ui.clearError();
    state.connectionBanner = false;
    ui.renderCapabilities(msg);
    fillOptions(msg);
    fillConditioning(msg);
    $("api-key").removeAttribute("aria-invalid");
    voices.connected(msg);
    ui.setStatus("ready");
    ui.log("in", "hello", `${msg.model?.name} · ${msg.formats?.length} formats · ${msg.voices?.length} voices`);
    clearInterval(state.pingTimer);
    state.pingTimer = setInterval(() => conn.send({ type: "ping", t: performance.now() }), PING_EVERY_MS);
    conn.send({ type: "ping", t: performance.now() });
  },

  pong(msg) {
    if (typeof msg.t === "number") $("rtt").textContent = `round trip ${(performance.now() - msg.t).toFixed(1)} ms`;
  },

  "session.updated"(msg) {
    ui.log("in", msg.type, JSON.stringify(msg.effective));
  },

  "context.created"(msg) {
    let turn = state.turns.get(msg.ctx);
    if (!turn) {
      turn = new Turn(msg.ctx, "server");
      state.turns.set(msg.ctx, turn);
    }
    if (turn.status === "creating") turn.status = turn.mode === "stream" ? "streaming" : "speaking";
    player.open(msg.ctx, msg.handle, msg.output);
    const out = msg.output;
    const rate = ui.formatRate(out.sample_rate);
    ui.log("in", msg.type, `${msg.ctx} · handle ${msg.handle} · ${out.format} ${rate} · ${out.frame_ms} ms frames`);
  },

  "segment.started"(msg) {
    setCaption(msg.text, msg.ctx, msg.segment);
    ui.log("in", msg.type, `${msg.ctx} #${msg.segment} · ${JSON.stringify(clip(msg.text, 90))}`);
  },

  "queue.status"(msg) {
    const turn = state.turns.get(msg.ctx);
    if (turn) turn.queuePosition = msg.position;
    ui.log("in", msg.type, `${msg.ctx} · position ${msg.position}`, "warn");
    refreshBusy();
  },

  "context.flushed"(msg) {
    ui.log("in", msg.type, `${msg.ctx} · segment ${msg.segment}`);
  },

  "context.done"(msg) {
    const turn = state.turns.get(msg.ctx);
    if (turn) {
      turn.status = "done";
      turn.metrics = msg.metrics ?? null;
    }
    player.end(msg.ctx);
    player.release(msg.ctx);
    const m = msg.metrics ?? {};
    const figures = [
      `last seq ${msg.last_seq}`,
      `${ui.formatMs(msg.audio_ms)} audio`,
      `server first audio ${ui.formatMs(m.ttfa_ms)}`,
      `queue ${ui.formatMs(m.queue_ms)}`,
      `RTF ${m.rtf?.toFixed?.(2) ?? "—"}`,
    ];
    ui.log("in", msg.type, `${msg.ctx} · ${figures.join(" · ")}`);
    refreshBusy();
  },

  "context.cancelled"(msg) {
    const turn = state.turns.get(msg.ctx);
    if (turn) turn.status = "cancelled";
    player.cancel(msg.ctx); // a no-op when we asked for it; covers a server-side cancel
    player.release(msg.ctx);
    const counts = player.context(msg.ctx);
    // The fence: no frame of this context may have a seq beyond last_seq.
    const fenced = !counts || counts.lastSeq <= msg.last_seq || msg.last_seq === -1;
    ui.log("in", msg.type, `${msg.ctx} · last seq ${msg.last_seq}`, fenced ? "info" : "error");
    refreshBusy();
  },

  error(msg) {
    errors.push(msg);
    const where = msg.ctx ? ` (context ${msg.ctx})` : "";
    ui.log("in", "error", `${msg.code}${where} · ${msg.message ?? ""}${msg.fatal ? " · fatal" : ""}`, "error");
    // Errors about a context.create may not name the context; the server answers in order, so it is
    // the oldest turn still waiting for its context.created.
    const turn = msg.ctx ? state.turns.get(msg.ctx) : [...state.turns.values()].find((t) => t.status === "creating");
    if (turn && !player.context(turn.ctx)) {
      // We pipeline text and End right behind context.create; when the create is refused, their
      // unknown_ctx errors are echoes of the first error, which stays on screen.
      if (turn.status === "failed" && msg.code === "unknown_ctx") return;
      turn.status = "failed";
    }
    if (turn && turn === state.current) stopFeeder();
    const tail = msg.fatal ? " The server will close the connection." : "";
    const detail = msg.message ? msg.message.replace(/\.?$/, ".") : "";
    ui.showError(errorTitle(msg.code), `${detail}${msg.ctx ? ` Context ${msg.ctx}.` : ""}${tail}`);
  },

  warning(msg) {
    ui.showError(`Warning: ${msg.code}`, msg.message ?? "", "warn");
    ui.log("in", "warning", `${msg.code} · ${msg.message ?? ""}`, "warn");
  },
};

/** queue.status counts as "server busy" until the queued turns get audio or end. */
function refreshBusy() {
  if (!state.hello) return;
  const queued = [...state.turns.values()].filter(
    (t) => t.live && t.queuePosition > 0 && !player.context(t.ctx)?.firstFrameAt,
  );
  if (queued.length === 0) ui.setStatus("ready");
  else ui.setStatus("busy", `Server busy · queued for the engine (position ${queued[0].queuePosition})`);
}

player.addEventListener("firstaudio", () => refreshBusy());
player.addEventListener("status", (event) => meter.push(event.detail.peaks));
player.addEventListener("underrun", ({ detail }) => {
  ui.log("local", "underrun", `${detail.ctx} · playback ran dry`, "warn");
});
player.addEventListener("finished", ({ detail }) => {
  if (detail.cancelled) ui.log("local", "faded out", `${detail.ctx} · stopped by Cancel`);
  else if (detail.played === 0) ui.log("local", "played", `${detail.ctx} · no audio`);
  else ui.log("local", "played", `${detail.ctx} · played to the end`);
});
player.addEventListener("error", ({ detail }) => {
  errors.push({ code: "decoder", message: String(detail.error) });
  ui.showError("Audio decoder failed", `${detail.error?.message ?? detail.error} (context ${detail.ctx})`);
});

// ---- what we send

function logSent(msg) {
  if (msg.type === "ping") return;
  if (msg.type === "text.append") {
    const turn = state.turns.get(msg.ctx);
    if (turn && turn.appends > 1) return; // one line per streamed turn; the progress bar shows the rest
    ui.log("out", msg.type, `${msg.ctx} · ${JSON.stringify(msg.text)} …`);
    return;
  }
  const { type, ctx, text, ...rest } = msg;
  const parts = [ctx, text === undefined ? null : `${text.length} chars`];
  if (Object.keys(rest).length) parts.push(JSON.stringify(rest));
  ui.log("out", type, parts.filter(Boolean).join(" · "));
}

/** What `context.create` carries from the form: the voice, the conditioning the model offers, the output. */
function contextSettings() {
  const format = $("format").value;
  const rate = $("rate").value === "custom" ? Number($("rate-custom").value) : Number($("rate").value);
  return { voice: $("voice").value, ...conditioningSettings(), output: { format, sample_rate: rate } };
}

function newTurn(mode) {
  state.turnCount += 1;
  const turn = new Turn(`turn-${state.turnCount}`, mode);
  state.turns.set(turn.ctx, turn);
  state.current = turn;
  return turn;
}

async function go() {
  const text = $("text").value;
  if (!text.trim()) {
    ui.showError("Nothing to say", "Type or paste some text first.", "warn");
    return;
  }
  ui.clearError();
  state.connectionBanner = false;
  setCaption(null);
  try {
    await player.start(); // inside the click: browsers only allow audio after a gesture
  } catch (error) {
    ui.showError("Cannot play audio", `${error.message ?? error}. ${SECURE_CONTEXT_HINT}`);
    return;
  }
  if (state.mode === "speak") speak(text);
  else streamTokens(text);
  setControls();
}

function speak(text) {
  const turn = newTurn("speak");
  turn.firstTextAt = performance.now();
  conn.send({ type: "context.create", ctx: turn.ctx, ...contextSettings(), text });
  conn.send({ type: "context.end", ctx: turn.ctx });
  turn.ended = true;
}

function streamTokens(text) {
  stopFeeder();
  const turn = newTurn("stream");
  conn.send({ type: "context.create", ctx: turn.ctx, ...contextSettings() });
  const feeder = new TokenFeeder(tokenize(text), Number($("token-rate").value), (token) => {
    turn.firstTextAt ??= performance.now();
    turn.appends += 1;
    conn.send({ type: "text.append", ctx: turn.ctx, text: token });
  });
  feeder.addEventListener("progress", () => showProgress(feeder));
  feeder.addEventListener("done", () => {
    state.feeder = null;
    $("text").readOnly = false;
    if ($("auto-end").checked && turn.live && !turn.ended) endTurn(turn);
    setControls();
  });
  state.feeder = feeder;
  $("text").readOnly = true;
  feeder.start();
}

function clip(text, max) {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

function stopFeeder() {
  state.feeder?.stop();
  state.feeder = null;
  $("text").readOnly = false;
}

function endTurn(turn) {
  if (!turn || turn.ended || !turn.live) return;
  conn.send({ type: "context.end", ctx: turn.ctx });
  turn.ended = true;
  if (turn.status === "streaming") turn.status = "ending";
}

function flush() {
  const turn = state.current;
  if (turn?.live && !turn.ended) conn.send({ type: "context.flush", ctx: turn.ctx });
}

function end() {
  stopFeeder();
  endTurn(state.current);
  setControls();
}

/** Barge-in: silence every turn now; the server's acks arrive afterwards. */
function cancel() {
  stopFeeder();
  for (const turn of state.turns.values()) {
    const counts = player.context(turn.ctx);
    const audible = counts && !counts.cancelled && !counts.finished;
    if (!turn.live && !audible) continue;
    player.cancel(turn.ctx); // local fence first: nothing more of it is decoded or played
    if (turn.live) conn.send({ type: "context.cancel", ctx: turn.ctx });
  }
  setCaption(null);
  setControls();
}

// ---- form state

function fillOptions(hello) {
  const formats = hello.formats ?? [];
  const unplayable = new Set(formats.filter((f) => !(f in FORMAT_LABELS) || (f === "opus" && !state.opusSupported)));
  const preferred = ["opus", "pcm_s16le"].find((f) => formats.includes(f) && !unplayable.has(f)) ?? formats[0];
  const previous = $("format").value;
  ui.fillSelect($("format"), formats, {
    label: (f) => `${FORMAT_LABELS[f] ?? f}${unplayable.has(f) ? " (not playable here)" : ""}`,
    disabled: unplayable,
    selected: formats.includes(previous) && !unplayable.has(previous) ? previous : preferred,
  });
  fillRates();
}

/** Rates the server advertises, preselecting the natural one for the format; "Other" allows any. */
function fillRates() {
  const hello = state.hello;
  if (!hello) return;
  const format = $("format").value;
  const rates = hello.sample_rates ?? [];
  const natural = { opus: 48000, mulaw: 8000 }[format] ?? hello.model?.sample_rate;
  const selected = rates.includes(natural) ? natural : rates.at(-1);
  ui.fillSelect($("rate"), [...rates, "custom"], {
    label: (r) => (r === "custom" ? "Other…" : `${r.toLocaleString("en")} Hz`),
    selected,
  });
  $("rate-custom").hidden = true;
}

function setMode(mode) {
  state.mode = mode;
  for (const button of document.querySelectorAll(".segmented [data-mode]")) {
    button.setAttribute("aria-checked", String(button.dataset.mode === mode));
  }
  for (const el of document.querySelectorAll("[data-show-in]")) el.hidden = el.dataset.showIn !== mode;
  $("go").textContent = mode === "speak" ? "Speak" : "Start streaming";
  setControls();
}

function setControls() {
  const ready = Boolean(state.hello) && conn.isOpen;
  const turn = state.current;
  const open = Boolean(turn?.live && !turn.ended);
  const anyAudible = Object.values(player.snapshot().contexts).some(
    (c) => !c.cancelled && !c.finished,
  );
  const anyLive = [...state.turns.values()].some((t) => t.live);
  $("go").disabled = !ready;
  for (const id of ["voice", "format", "rate"]) $(id).disabled = !ready;
  setConditioningEnabled(ready);
  $("flush").disabled = !ready || !open;
  $("end").disabled = !ready || !open;
  $("cancel").disabled = !(anyLive || anyAudible);
  updateCharCount();
}

function updateCharCount() {
  const length = $("text").value.length;
  const max = state.hello?.limits?.max_text_chars;
  const counter = $("char-count");
  counter.textContent = max
    ? `${length.toLocaleString("en")} / ${max.toLocaleString("en")} characters`
    : `${length.toLocaleString("en")} characters`;
  const over = Boolean(max && length > max);
  counter.classList.toggle("over", over);
  counter.title = over ? "Longer than the server accepts in one context: it will answer with an error" : "";
}

function showProgress(feeder) {
  const bar = $("token-bar");
  bar.hidden = false;
  bar.max = feeder.total;
  bar.value = feeder.sent;
  $("token-progress").hidden = false;
  $("token-progress").textContent = `${feeder.sent} / ${feeder.total} tokens sent`;
}

function setCaption(text, ctx, segment) {
  const caption = $("caption");
  if (text === null || text === undefined) {
    caption.innerHTML = '<span class="caption-hint">Captions of the segment being spoken appear here.</span>';
    return;
  }
  caption.replaceChildren();
  const tag = document.createElement("span");
  tag.className = "caption-tag";
  tag.textContent = `${ctx} · segment ${segment}`;
  caption.append(tag, document.createTextNode(text));
}

// ---- live figures (10 Hz; the meter draws on its own)

function renderFigures() {
  const stats = player.snapshot();
  const turn = state.current;
  const counts = turn ? stats.contexts[turn.ctx] : null;
  const since = (t) => (t != null && turn?.firstTextAt != null ? t - turn.firstTextAt : null);
  $("fig-ttfa").textContent = ui.formatMs(since(counts?.firstFrameAt));
  const heard = since(counts?.playbackStartedAt);
  $("fig-ttfa-sub").textContent = heard != null ? `heard after ${ui.formatMs(heard)}` : "from first text sent";
  $("fig-buffer").textContent = stats.audioContextState === "not started" ? "—" : ui.formatMs(stats.bufferedMs);
  $("fig-buffer-sub").textContent = `starts at ${player.prebufferMs} ms`;
  $("fig-underruns").textContent = String(stats.underruns);
  $("fig-underruns").parentElement.classList.toggle("alert", stats.underruns > 0);
  $("fig-frames").textContent = stats.framesReceived.toLocaleString("en");
  $("fig-frames-sub").textContent = counts ? `${counts.framesReceived} in ${turn.ctx}` : "received";
  $("fig-bytes").textContent = ui.formatBytes(stats.bytesReceived);
  const rate = counts?.decodedRate ?? counts?.sampleRate;
  $("fig-bytes-sub").textContent = counts ? `${counts.format} · ${ui.formatRate(counts.sampleRate)}` : "received";
  $("fig-decoded").textContent = counts && rate ? `${(counts.samplesDecoded / rate).toFixed(2)} s` : "0.00 s";
  $("fig-decoded-sub").textContent = counts ? `${counts.samplesDecoded.toLocaleString("en")} samples` : "of audio";
  const db = meter.levelDb;
  $("level").textContent = Number.isFinite(db) ? `${db.toFixed(0)} dB` : "−∞ dB";
  $("level").classList.toggle("clip", db >= 0); // at or above full scale: the output is clipping
  renderTurnState(turn, counts);
  if (stats.playing === null) setControls();
}

function renderTurnState(turn, counts) {
  const pill = $("ctx-state");
  let text = "idle";
  let status = "idle";
  if (turn) {
    status = turn.status;
    text = `${turn.ctx} · ${turn.status}`;
    if (turn.status === "queued" || (turn.queuePosition > 0 && !counts?.firstFrameAt && turn.live)) {
      status = "queued";
      text = `${turn.ctx} · queued #${turn.queuePosition}`;
    } else if (turn.status === "done" && counts && !counts.cancelled && !counts.finished) {
      status = "speaking";
      text = `${turn.ctx} · playing out`;
    }
  }
  pill.dataset.state = status;
  pill.textContent = text;
}

/** New keys: HTTP requests carry them from now on, and the next WebSocket handshake the API key. */
function applyKeys(event) {
  event.preventDefault();
  api.key = remember(KEY_STORAGE, $("api-key").value.trim());
  api.adminKey = remember(ADMIN_KEY_STORAGE, $("admin-key").value.trim());
  $("api-key").removeAttribute("aria-invalid");
  $("admin-key").removeAttribute("aria-invalid");
  ui.log("local", "keys", `API key ${api.key ? "set" : "none"} · admin key ${api.adminKey ? "set" : "none"}`);
  conn.url = socketUrl(window.location, api.key);
  // An open session stays (its key was accepted); only a refused or lost one reconnects now.
  if (conn.isOpen) voices.refresh();
  else connect();
}

function remember(name, value) {
  if (value) sessionStorage.setItem(name, value);
  else sessionStorage.removeItem(name);
  return value;
}

// ---- start

function bind() {
  $("go").addEventListener("click", go);
  $("flush").addEventListener("click", flush);
  $("end").addEventListener("click", end);
  $("cancel").addEventListener("click", cancel);
  $("banner-close").addEventListener("click", ui.clearError);
  $("key-form").addEventListener("submit", applyKeys);
  $("api-key").value = api.key;
  $("admin-key").value = api.adminKey;
  voices.addEventListener("error", ({ detail: { error, admin } }) => {
    errors.push({ code: error.code, message: error.message, status: error.status });
    if (error.status === 401) $(admin ? "admin-key" : "api-key").setAttribute("aria-invalid", "true");
  });
  $("log-clear").addEventListener("click", () => $("log").replaceChildren());
  $("text").addEventListener("input", updateCharCount);
  $("format").addEventListener("change", fillRates);
  $("rate").addEventListener("change", () => {
    $("rate-custom").hidden = $("rate").value !== "custom";
    if (!$("rate-custom").hidden) $("rate-custom").focus();
  });
  $("prebuffer").addEventListener("change", () => (player.prebufferMs = Number($("prebuffer").value)));
  $("token-rate").addEventListener("input", () => {
    const rate = Number($("token-rate").value);
    $("token-rate-value").textContent = `${rate} tokens/s`;
    if (state.feeder) state.feeder.rate = rate;
  });
  for (const button of document.querySelectorAll(".segmented [data-mode]")) {
    button.addEventListener("click", () => setMode(button.dataset.mode));
  }
  // Keyboard: Ctrl/Cmd+Enter speaks, Escape barges in.
  document.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && !$("go").disabled) go();
    if (event.key === "Escape" && !$("cancel").disabled) cancel();
  });
}

async function main() {
  bind();
  setMode("speak");
  state.opusSupported = await OpusDecoder.isSupported().catch(() => false);
  if (!window.isSecureContext) ui.showError("Audio will not play on this page", SECURE_CONTEXT_HINT, "warn");
  setInterval(renderFigures, 100);
  connect();
  voices.load();
}

main();
